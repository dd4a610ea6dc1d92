"""What a rerun of init knows of the runs before it (runtime/restarts.py): the record in the state directory,
read only when it is this pod's and what init writes, and the sidecar's generations counted, so the numbering
goes on across an in-place restart. The barrier's store keeps the members behind pod by pod."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from agent import examples
from agent.core.plan.restarts import restarts_barrier
from agent.k8s.core import WatchEvent
from agent.runtime.restarts import (
    GENERATION,
    RECORD,
    PodAttempts,
    Run,
    cut_pod,
    read_run,
    record_generation,
    write_run,
)
from tests.fakeapi import state_of
from tests.jobs import create_volcano_job, generation


def test_a_completed_run_is_read_back_for_its_pod_only(tmp_path):
    write_run(tmp_path, Run("uid-1", 2, 5, attempt=3))
    assert read_run(tmp_path, "uid-1") == Run("uid-1", 2, 5, attempt=3)
    assert read_run(tmp_path, "uid-2") is None  # a volume that outlived its pod: the new pod's first run
    assert read_run(None, "uid-1") is None
    assert read_run(tmp_path / "absent", "uid-1") is None


def test_the_sidecars_later_generation_is_counted_and_a_new_run_supersedes_it(tmp_path):
    write_run(tmp_path, Run("uid-1", 1, 1))
    record_generation(tmp_path, "uid-1", 6)
    assert read_run(tmp_path, "uid-1") == Run("uid-1", 1, 6)
    record_generation(tmp_path, "uid-0", 60)  # another pod's: not counted
    assert read_run(tmp_path, "uid-1") == Run("uid-1", 1, 1)
    record_generation(tmp_path, "uid-1", 6)
    write_run(tmp_path, Run("uid-1", 2, 7))
    assert not (tmp_path / GENERATION).exists()
    assert read_run(tmp_path, "uid-1") == Run("uid-1", 2, 7)


@pytest.mark.parametrize("content", [
    pytest.param("not json", id="not-json"),
    pytest.param("[]", id="not-an-object"),
    pytest.param('{"uid": "uid-1", "runs": 0, "generation": 1}', id="no-run-completed"),
    pytest.param('{"uid": "uid-1", "runs": 1, "generation": "9"}', id="a-string-generation"),
    pytest.param('{"uid": "uid-1", "runs": true, "generation": 1}', id="a-bool"),
    pytest.param('{"uid": 1, "runs": 1, "generation": 1}', id="no-uid"),
    pytest.param('{"uid": "uid-1", "runs": 1, "generation": 1, "attempt": -1}', id="a-negative-attempt"),
    pytest.param("x" * 5000, id="too-long"),
])
def test_anything_else_is_no_record_said_in_one_line(tmp_path, caplog, content):
    (tmp_path / RECORD).write_text(content)
    with caplog.at_level(logging.INFO, "topology_agent.restarts"):
        assert read_run(tmp_path, "uid-1") is None
    assert len(caplog.records) == 1 and "counts as the pod's first" in caplog.text


def test_a_link_planted_in_the_state_directory_is_not_followed(tmp_path, caplog):
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"uid": "uid-1", "runs": 3, "generation": 9}))
    state = tmp_path / "state"
    state.mkdir()
    (state / RECORD).symlink_to(target)
    assert read_run(state, "uid-1") is None


def status(name: str, restarts: int, state: str = "terminated") -> dict:
    return {"metadata": {"name": name, "uid": f"u-{name}", "resourceVersion": "1"},
            "spec": {"containers": [{"name": "trainer"}], "initContainers": [{"name": "topology-agent"}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1",
                       "initContainerStatuses": [{"name": "topology-agent", "restartCount": restarts,
                                                  "state": {state: {"exitCode": 0}}}]}}


def test_the_barriers_store_agrees_with_the_rule_event_by_event():
    pods = {name: status(name, 0) for name in ("a", "b", "c")}
    store = PodAttempts(frozenset(pods), 1)
    assert not store.down() and "not read yet" in store.barrier().describe()
    store.replace([cut_pod(p) for p in pods.values()])
    for event in [WatchEvent("MODIFIED", status("a", 1, "running")), WatchEvent("MODIFIED", status("b", 1)),
                  WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "9"}}),
                  WatchEvent("MODIFIED", status("x", 0)),  # not a member
                  WatchEvent("DELETED", status("c", 0))]:
        store.apply(event)
        if event.type in ("ADDED", "MODIFIED"):
            pods[event.object["metadata"]["name"]] = event.object
        elif event.type == "DELETED":
            pods.pop(event.object["metadata"]["name"])
        assert store.barrier().behind == restarts_barrier(pods, frozenset("abc"), 1).behind
    assert store.down()


def test_a_cut_pod_is_small_and_cutting_it_again_changes_nothing():
    full = status("a", 2, "running")
    full["spec"]["containers"][0]["env"] = [{"name": "X", "value": "y" * 4000}]
    cut = cut_pod(full)
    assert cut_pod(cut) == cut
    assert len(json.dumps(cut)) < 400


def restarted(count: int):
    def change(pod: dict) -> None:
        pod.setdefault("status", {})["initContainerStatuses"] = [
            {"name": "topology-agent", "restartCount": count, "state": {"terminated": {"exitCode": 0}}}]
    return change


async def test_the_numbering_goes_on_from_the_sidecars_last_generation_after_an_in_place_restart(
        memory, api, logs, sidecars, tmp_path):
    from tests.fakeapi import init_pod

    pods = create_volcano_job(memory, (("master", 1), ("worker", 2)))
    for pod in pods:
        memory.update_pod("default", pod["metadata"]["name"], restarted(0))
    out = tmp_path / "shared"
    ran = await asyncio.to_thread(init_pod, api, logs, "demo-worker-0", out, "--address", "ip")
    assert ran.code == 0, ran.err
    running = await sidecars.start("demo-worker-0", out, "--address", "ip", "--debounce", "0", "--signal", "none")
    memory.set_pod_ip("default", "demo-worker-1", examples.loopback_ip(20))
    await running.until(lambda: generation(out) == 2, what="generation 2")
    await sidecars.stop("demo-worker-0")  # RestartAllContainers: every container stops, the volumes stay
    assert (state_of(out) / GENERATION).exists()
    for pod in pods:
        memory.update_pod("default", pod["metadata"]["name"], restarted(1))
    ran = await asyncio.to_thread(init_pod, api, logs, "demo-worker-0", out, "--address", "ip", "--timeout", "20")
    assert ran.code == 0, ran.err
    assert generation(out) == 3
    assert "init runs again in this pod" in ran.err


async def test_a_rerun_placed_before_jobsets_agent_leaves_the_wait_to_it_and_writes_the_next_generation(
        memory, api, logs, tmp_path):
    from tests.fakeapi import init_pod

    pods = examples.jobset("trainer", (("workers", 1, 2),))
    memory.create("jobset.x-k8s.io/v1alpha2/jobsets", "default", {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "trainer", "namespace": "default", "uid": "jobset-uid"},
        "spec": {"failurePolicy": {"restartStrategy": "InPlaceRestart"},
                 "replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": {
                     "parallelism": 2, "completions": 2, "template": {}}}}]},
        "status": {"currentInPlaceRestartAttempt": 0}})
    for pod in pods:
        pod["metadata"].setdefault("annotations", {})["jobset.sigs.k8s.io/in-place-restart-attempt"] = "0"
        pod["spec"]["initContainers"].append({"name": "in-place-restart-agent", "image": "jobset-agent",
                                              "restartPolicy": "Always", "startupProbe": {"httpGet": {"port": 8081}}})
        memory.create_pod(pod)
    me, out = pods[0]["metadata"]["name"], tmp_path / "shared"
    ran = await asyncio.to_thread(init_pod, api, logs, me, out, "--timeout", "20")
    assert ran.code == 0, ran.err
    ran = await asyncio.to_thread(init_pod, api, logs, me, out, "--timeout", "20")
    assert ran.code == 0, ran.err  # JobSet's current attempt is 0, this run's 1: it would wait in vain
    assert "init container 'in-place-restart-agent' (JobSet's in-place restart agent) comes after this one and " \
           "starts the trainer once JobSet's attempt 1 is current" in ran.err
    assert generation(out) == 2
