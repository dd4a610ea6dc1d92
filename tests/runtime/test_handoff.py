"""Init's reads left for its sidecar (runtime/publication/handoff.py): in the state directory, which only the agent's
containers mount; never in the shared directory the trainer writes. A file there that is not what init wrote is
still refused in one line, and the sidecar reads the API instead."""

from __future__ import annotations

import json
import logging
import os

import pytest

from agent import examples
from agent.core.publication.provenance import Writer
from agent.runtime.publication.handoff import NAME, Handoff, read_handoff, write_handoff

POD = examples.volcano_job("demo", (("master", 1), ("worker", 2)))[1]
JOB = "/apis/batch.volcano.sh/v1alpha1/namespaces/default/jobs/demo"


def test_what_init_wrote_is_read_back_whole(tmp_path):
    summary = {"metadata": {"name": "demo-topology-summary", "resourceVersion": "7"}, "data": {}}
    write_handoff(tmp_path, Handoff(POD, {JOB: {"kind": "Job"}}, {Writer("demo-master-0", "u-1")}, summary))
    back = read_handoff(tmp_path, "demo-worker-0")
    assert back.pod == POD and back.own_pod() == POD and back.objects == {JOB: {"kind": "Job"}}
    assert back.summary == summary
    assert back.writers == {Writer("demo-master-0", "u-1")}
    assert [p.name for p in tmp_path.iterdir()] == [NAME]  # renamed into place: no temp file left


def test_an_own_pod_read_before_its_ip_is_read_again():
    pod = {**POD, "status": {"phase": "Pending"}}
    assert Handoff(pod).own_pod() is None


@pytest.mark.parametrize("content, why", [
    ("{not json", "Expecting property name"),
    ("[]", "not a JSON object"),
    (json.dumps({"pod": {**POD, "metadata": {**POD["metadata"], "name": "demo-worker-1"}}, "objects": {},
                 "writers": []}), "its pod is not 'demo-worker-0'"),
    (json.dumps({"pod": {"metadata": "x"}, "objects": {}, "writers": []}), "metadata"),
    (json.dumps({"pod": None, "objects": {"jobs/demo": {}}, "writers": []}), "objects is not a map of API paths"),
    (json.dumps({"pod": None, "objects": {}, "writers": [["demo-master-0"]]}), "writers is not a list"),
    (json.dumps({"pod": None, "objects": {}, "writers": [["demo-master-0", ""]]}), "writers is not a list"),
    (json.dumps({"pod": None, "objects": {}, "writers": [],
                 "summary": {"metadata": {"name": "demo-topology-summary"}}}),
     "summary is not a ConfigMap with a name and a resourceVersion"),
    (json.dumps({"pod": None, "objects": {}, "writers": [], "summary": ["x"]}), "summary is not a ConfigMap"),
])
def test_anything_else_is_refused_in_one_line(tmp_path, caplog, content, why):
    (tmp_path / NAME).write_text(content)
    with caplog.at_level(logging.INFO, "topology_agent.handoff"):
        assert read_handoff(tmp_path, "demo-worker-0") == Handoff()
    assert len(caplog.records) == 1 and why in caplog.text and "reading them from the API server" in caplog.text


def test_a_link_planted_by_the_trainer_is_not_followed(tmp_path, caplog):
    target = tmp_path / "elsewhere.json"
    write_handoff(tmp_path, Handoff(POD))
    os.replace(tmp_path / NAME, target)
    (tmp_path / NAME).symlink_to(target)
    with caplog.at_level(logging.INFO, "topology_agent.handoff"):
        assert read_handoff(tmp_path, "demo-worker-0") == Handoff()
    assert "symbolic link" in caplog.text


def test_no_file_is_no_reads_and_no_line(tmp_path, caplog):
    with caplog.at_level(logging.INFO, "topology_agent.handoff"):
        assert read_handoff(tmp_path, "demo-worker-0") == Handoff()
    assert not caplog.records


def test_without_a_state_directory_nothing_is_written_or_read_and_the_sidecar_says_so(tmp_path, caplog):
    """A pod whose manifest has no state volume: the copy in the shared directory (which the trainer can write,
    forged or not) is not read; the sidecar reads the API server instead, and says so in one line."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / NAME).write_bytes(Handoff(POD, {JOB: {"kind": "Job"}}, {Writer("rogue-0", "u-9")}).to_bytes())
    absent = tmp_path / "state"
    write_handoff(absent, Handoff(POD))
    assert not absent.exists()
    with caplog.at_level(logging.INFO, "topology_agent.handoff"):
        assert read_handoff(absent, "demo-worker-0") == Handoff()
        assert read_handoff(None, "demo-worker-0") == Handoff()  # no state directory configured: no line
    assert len(caplog.records) == 1 and f"no state directory {absent}" in caplog.text
    assert "not from the shared directory the trainer can write" in caplog.text
