"""`inject` on generated manifests raises nothing but InputError (one line, exit 2). The controllers' own
examples and a few hand-made jobs, each mutated at a random place (a value of any type, an annotation setting
any key to any value), written as YAML or JSON; a value refused anywhere must be refused with InputError, never
with a traceback (exit 70)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent import __version__
from agent.core.adoption.injection import INJECTED, KEYS, PREFIX, Settings
from agent.errors import InputError
from agent.runtime.commands.inject import inject_text

ROOT = Path(__file__).resolve().parents[2]
HANDMADE = [
    {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": {
        PREFIX + "ssh-secret": "s", PREFIX + "trainer-match": "python", PREFIX + "sidecar": "true"}},
     "spec": {"shareProcessNamespace": True, "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
              "containers": [{"name": "t", "image": "x", "securityContext": {"runAsUser": 1000},
                              "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
              "volumes": [{"name": "data", "emptyDir": {}}]}},
    {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {"parallelism": 2, "template": {
        "metadata": {"annotations": {INJECTED: "0.0.9"}}, "spec": {
            "subdomain": "s", "initContainers": [{"name": "topology-agent", "image": "old", "args": ["init"],
                                                  "volumeMounts": [{"name": "topology-agent-shared",
                                                                    "mountPath": "/shared"}]}],
            "containers": [{"name": "t", "image": "x", "volumeMounts": [{"name": "topology-agent-shared",
                                                                        "mountPath": "/shared"}]}],
            "volumes": [{"name": "topology-agent-shared", "emptyDir": {}}]}}}},
    {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "e"}, "spec": {
            "elasticPolicy": {"minReplicas": 1, "maxReplicas": 3}, "pytorchReplicaSpecs": {"Worker": {
                "replicas": 2, "template": {"spec": {"containers": [{"name": "pytorch", "image": "x"}]}}}}}}]},
]
BASES = HANDMADE + [d for p in sorted((ROOT / "tests" / "upstream").glob("*.yaml"))
                    for d in yaml.safe_load_all(p.read_text()) if d]

ODD_TEXT = ["", " ", "x", "/", "..", "/a/../b", "Bad_Name!", "no/such secret", " spaced ", "2:4", "-1", "0",
            "1.5e400", "true", "topology-agent-shared", "topology-agent", "emptyDir", "a\nb", "\x00", "é", "a" * 300,
            "[", "{", "*", "&a", "#", "---"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=False), st.sampled_from([float("inf"), -float("inf"), 2**31, 2**31 - 1]),
                    st.text(max_size=12), st.sampled_from(ODD_TEXT))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.one_of(st.text(max_size=8), st.sampled_from(["name", "spec", "kind"])),
                                        inner, max_size=3), max_leaves=8)
# A field of the wrong type is what a real mistake looks like: a string for a list, a list for a map, a float
# for an ID; half the replacements are one of these.
CONFUSED = ["x", "", 0, 1, -1, 2**31, 2**63, float("inf"), 1.5, True, None, [], {}, [1, 2], ["x"], {"a": 1},
            {"name": "topology-agent-shared", "emptyDir": {}}, [{"name": "topology-agent"}]]
replacements = st.one_of(st.sampled_from(CONFUSED), values)


# The same examples each run (derandomized): a CI failure is one anyone can run again; under 10 s in all.
FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


def paths(value: Any, here: tuple = ()) -> list[tuple]:
    """Every place in a document a value could be replaced at (the root excluded)."""
    found = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        found.append((*here, key))
        found += paths(child, (*here, key))
    return found


# The fields the transform reads or edits: most mutations land on one of these (or under one).
SHAPING = {"metadata", "annotations", "spec", "template", "containers", "initContainers", "volumes", "volumeMounts",
           "securityContext", "runAsUser", "runAsGroup", "name", "mountPath", "items", "tasks", "replicatedJobs",
           "pytorchReplicaSpecs", "mpiReplicaSpecs", "elasticPolicy", "leaderWorkerTemplate", "replicas", "env",
           "parallelism", "subdomain", "serviceAccountName", "kind", "apiVersion", INJECTED}


def shaping_paths(doc: Any) -> list[tuple]:
    found = [p for p in paths(doc) if p[-1] in SHAPING or (len(p) > 1 and p[-2] in SHAPING)]
    return found or paths(doc)


def annotated_places(doc: dict) -> list[tuple]:
    """The metadata of the document and of each pod template in it: where settings are read."""
    return [p[:-1] for p in paths(doc) if p[-1] == "metadata"] or [()]


@st.composite
def manifests(draw: st.DrawFn) -> tuple[Any, bool]:
    doc = copy.deepcopy(draw(st.sampled_from(BASES + HANDMADE * 3)))  # the hand-made ones read more fields
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            place = draw(st.sampled_from(shaping_paths(doc)))
            parent = doc
            for key in place[:-1]:
                parent = parent[key]
            parent[place[-1]] = copy.deepcopy(draw(replacements))
        else:
            target = doc
            for key in draw(st.sampled_from(annotated_places(doc))):
                target = target[key]
            if isinstance(target, dict):
                meta = target.setdefault("metadata", {})
                if isinstance(meta, dict):
                    annotations = meta.setdefault("annotations", {})
                    if isinstance(annotations, dict):
                        key = draw(st.sampled_from(sorted(KEYS | {"injected", "nope"})))
                        annotations[PREFIX + key] = copy.deepcopy(draw(st.one_of(scalars, replacements)))
    return doc, draw(st.booleans())


@pytest.mark.slow
@FUZZ
@given(manifests())
def test_inject_refuses_a_bad_manifest_with_input_error_only(case):
    doc, as_json = case
    text = json.dumps(doc) if as_json else yaml.safe_dump(doc, sort_keys=False)
    try:
        inject_text(text, Settings(), version=__version__)
    except InputError as err:
        assert "\n" not in str(err).strip()


TEXTS = [p.read_text() for p in sorted((ROOT / "tests" / "upstream").glob("*.yaml"))] \
    + [json.dumps(d, indent=2) for d in HANDMADE]
PIECES = ["{", "}", "[", "]", ":", "- ", "? ", "&a ", "*a", "<<: ", "!!binary ", "!!python/object ", "!foo ", "|", ">",
          "'", '"', "\t", "\r\n", "\n", "#", "---\n", "...\n", "%YAML 1.1\n", "\ufeff", "\x00", "\x85", "1e400",
          "null", "~", "true", "0o17", ".nan", "topology-agent.io/image: ", "topology-agent-shared",
          "\n? k:\n    - 1\n: v\n", "\n&b k: *b\n"]


@st.composite
def mutated_texts(draw: st.DrawFn) -> str:
    """A manifest's text with a few pieces of YAML syntax put in, spans cut out, or lines repeated."""
    text = draw(st.sampled_from(TEXTS))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        edit = draw(st.sampled_from(["insert", "cut", "repeat"]))
        if edit == "insert":
            text = text[:at] + draw(st.sampled_from(PIECES)) + text[at:]
        elif edit == "cut":
            text = text[:at] + text[at + draw(st.integers(1, 20)):]
        else:
            lines = text.splitlines(keepends=True)
            line = lines[min(at, len(lines) - 1)] if lines else ""
            text = text[:at] + line + text[at:]
    return text


@pytest.mark.slow
@FUZZ
@given(mutated_texts())
@example("\x00" + TEXTS[0])  # ruamel's reader error spans two lines
@example("apiVersion: v1\nkind: ConfigMap\n? metadata:\n    name: [c]\n: x\n")  # a key that is a mapping: TypeError
def test_inject_refuses_broken_text_with_input_error_only(text):
    try:
        inject_text(text, Settings(), version=__version__)
    except InputError as err:
        assert "\n" not in str(err).strip()


FLOW_AND_BLOCK = [p.read_text() for p in sorted((ROOT / "tests" / "upstream").rglob("*.yaml"))]


@st.composite
def commented_texts(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A controller's or kubernetes/website's example with comments put on lines of their own, at any indentation,
    and after the content of some lines."""
    lines = draw(st.sampled_from(FLOW_AND_BLOCK)).splitlines()
    own_lines = []
    for n in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(lines)))
        mark = f"# note {n}"
        if draw(st.booleans()) or at == len(lines):
            lines.insert(at, " " * draw(st.integers(0, 12)) + mark)
            own_lines.append(mark)
        else:
            lines[at] += "  " + mark
    return "\n".join(lines) + "\n", own_lines


@pytest.mark.slow
@settings(FUZZ, max_examples=30)  # two runs of ruamel over a whole example each: ~60 ms an example
@given(commented_texts())
def test_comments_anywhere_stay_and_a_second_run_changes_nothing(case):
    """Flow style, and what the agent adds to lists: a comment written on a line of its own is never
    lost, and inject of inject's output is that output, whatever the layout and wherever the comments are."""
    text, own_lines = case

    def run(text: str) -> str:
        return inject_text(text, Settings(), version=__version__)[0]

    try:
        once = run(text)
    except InputError:
        return
    assert run(once) == once
    assert [mark for mark in own_lines if mark not in once] == []


@pytest.mark.parametrize("key", ["address", "rank-order", "view", "master-port"])
def test_an_annotation_value_with_a_line_break_is_refused_on_one_line(key):
    """A value an option check quotes (a choice, a port) is shown escaped, so the refusal stays one line."""
    doc = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "annotations": {PREFIX + key: "bad\nvalue"}},
           "spec": {"containers": [{"name": "t", "image": "x"}]}}
    with pytest.raises(InputError) as caught:
        inject_text(json.dumps(doc), Settings(), version=__version__)
    assert "\n" not in str(caught.value) and "bad\\nvalue" in str(caught.value)
