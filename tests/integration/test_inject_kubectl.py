"""kubectl reads what `topology-agent inject` writes as the strings the agent meant: its decoder (go-yaml v2, in
sigs.k8s.io/yaml) takes a plain `on`, `y` or `n` for a bool and `0o17` or `1e3` for a number. Every setting the
agent writes into a pod (tests/runtime/test_inject_yaml11.py reads the same output with PyYAML) goes through
`kubectl create --dry-run=client -o json`, which needs a server only to map the kinds: the sandbox's."""

from __future__ import annotations

import json

from agent import __version__
from agent.core.adoption.injection import Settings
from agent.runtime.commands.inject import inject_text
from agent.runtime.quoting import is_misread_by_go_yaml_v2
from tests.runtime.test_inject_yaml11 import CASES, ELASTIC, annotated, template_of, written


def objects(stream: str) -> list[dict]:
    """The objects kubectl printed, one JSON document after another."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while stream[at:].strip():
        item, end = decoder.raw_decode(stream, at + len(stream[at:]) - len(stream[at:].lstrip()))
        found.append(item)
        at = end
    return found


def test_kubectl_reads_every_value_inject_adds_as_the_string_it_is(kubectl):
    jobs = []
    for i, (setting, value) in enumerate(CASES):
        jobs.append(inject_text(annotated({setting: value}, name=f"case-{i}"), Settings(), version=__version__)[0])
    run = kubectl("create", "--dry-run=client", "-o", "json", "-f", "-", input="---\n".join(jobs))
    by_name = {item["metadata"]["name"]: item for item in objects(run.stdout)}
    assert len(by_name) == len(CASES)
    for i, (setting, value) in enumerate(CASES):
        template = template_of(by_name[f"case-{i}"])
        got = written(template, setting)
        assert got and got == [value] * len(got), (setting, value, got)
        assert written(template, "elastic") == [ELASTIC] * 2, (setting, value)


# Plain scalars and whether go-yaml v2 reads them as something else: its words, and its ints and floats (with
# underscores, base prefixes in either case, a leading 0 as octal or else a float) beside look-alikes it keeps.
GO_YAML_V2 = [("on", True), ("ON", True), ("y", True), ("N", True), ("off", True), ("~", True), ("null", True),
              ("0o17", True), ("0O17", True), ("0x1F", True), ("-0x1F", True), ("0X1F", True), ("0b101", True),
              ("0B1", True), ("-0b1", True), ("1_000", True), ("1__", True), ("09", True), ("0777", True),
              ("08.5", True), ("1e3", True), ("1.", True), ("1.e5", True), (".5", True), ("+5", True), ("2001", True),
              ("1:2", False), ("ono", False), ("yes-no", False), ("0o18", False), ("0x", False), ("1:2:a", False),
              ("1.2.3", False), ("_1", False), ("v1.2", False), ("2001-01-01x", False)]


def test_the_go_yaml_v2_table_says_what_kubectl_reads(kubectl):
    """The rule quoting.py keeps for go-yaml v2, held to kubectl's own reading of each text written plain."""
    items = "".join(f"  - {text}\n" for text, _ in GO_YAML_V2)
    job = f"apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata:\n  name: table\nspec:\n  texts:\n{items}"
    run = kubectl("create", "--dry-run=client", "--validate=false", "-o", "json", "-f", "-", input=job)
    read = json.loads(run.stdout)["spec"]["texts"]
    assert len(read) == len(GO_YAML_V2)
    for (text, misread), got in zip(GO_YAML_V2, read, strict=True):
        assert (got != text) is misread, (text, got)
        assert is_misread_by_go_yaml_v2(text) is misread, text
