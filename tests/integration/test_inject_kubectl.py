"""kubectl reads what `topology-agent inject` writes as the strings the agent meant: its decoder (go-yaml v2, in
sigs.k8s.io/yaml) takes a plain `on`, `y` or `n` for a bool and `0o17` or `1e3` for a number. Every setting the
agent writes into a pod (tests/runtime/test_inject_yaml11.py reads the same output with PyYAML) goes through
`kubectl create --dry-run=client -o json`, which needs a server only to map the kinds: the sandbox's."""

from __future__ import annotations

import json

from agent import __version__
from agent.core.injection import Settings
from agent.runtime.adoption import inject_text
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
