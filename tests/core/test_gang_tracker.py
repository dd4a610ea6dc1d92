"""The incremental gang tracker answers exactly what gang_status answers over the same pods, after every event
(init's wait costs O(1) per event, never the whole job)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import examples
from agent.core import Memo, Options
from agent.core.plan.gang import Expectation, GangTracker, gang_status
from agent.errors import InputError

JOBS = {
    "volcano": (lambda: examples.volcano_job(tasks=(("master", 1), ("worker", 4), ("extras", 2))),
                Expectation(total=5, per_role={"master": 1, "worker": 4}, source="t"), "demo-worker-1"),
    "jobset": (lambda: examples.jobset(), Expectation(total=5, per_role=None, source="t"), "trainer-driver-0-0-cht55"),
    "lws": (lambda: examples.leaderworkerset(size=4, groups=1),
            Expectation(total=4, per_role={"leader": 1, "worker": 3}, source="t"), "vllm-0-2"),
    # Trainer's MPI launcher running container 'launcher' is no node when no runtime was read
    "trainjob-mpi": (lambda: examples.trainjob_mpi(num_nodes=3, launcher_as_node=False),
                     Expectation(total=3, per_role={"node": 3}, source="t"),
                     examples.trainjob_mpi(num_nodes=3, launcher_as_node=False)[1]["metadata"]["name"]),
}


def _outcome(compute):
    try:
        return ("status", compute())
    except InputError:
        return ("refused", None)


@st.composite
def event_runs(draw):
    key = draw(st.sampled_from(sorted(JOBS)))
    build, expected, me = JOBS[key]
    pods = build()
    events = draw(st.lists(st.tuples(st.integers(0, len(pods) - 1),
                                     st.sampled_from(["add", "add", "no-ip", "delete", "terminate", "fail",
                                                      "bad-index", "duplicate"])), min_size=1, max_size=25))
    return key, pods, expected, me, events, draw(st.sampled_from(["dns", "ip"]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_runs())
def test_the_tracker_agrees_with_gang_status_after_every_event(run):
    _key, pods, expected, me_name, events, address = run
    options = Options(address=address)
    me = next(p for p in pods if p["metadata"]["name"] == me_name)
    tracker = GangTracker(me, me_name, options, expected, memo=Memo(options))
    current = {me_name: me}
    tracker.put(me)
    for version, (i, action) in enumerate(events, start=1):
        pod = copy.deepcopy(pods[i])
        name = pod["metadata"]["name"]
        pod["metadata"]["resourceVersion"] = str(version)
        if action == "delete":
            if name == me_name:
                continue
            current.pop(name, None)
            tracker.remove(name)
        else:
            if action == "no-ip":
                pod["status"] = {"phase": "Pending"}
            elif action == "terminate":
                pod["metadata"]["deletionTimestamp"] = "2026-11-22T00:00:00Z"
            elif action == "fail":
                pod["status"]["phase"] = "Failed"
            elif action == "bad-index":
                for section in ("labels", "annotations"):
                    for label in list(pod["metadata"][section]):
                        if label.endswith(("task-index", "worker-index", "completion-index")):
                            pod["metadata"][section][label] = "x"
            elif action == "duplicate":
                pod["metadata"]["name"] = name = f"{name}-dup"
            current[name] = pod
            tracker.put(pod)
        want = _outcome(lambda: gang_status(list(current.values()), me_name, options, expected))
        got = _outcome(tracker.status)
        assert got == want
        ready = _outcome(tracker.ready)
        assert ready == (("refused", None) if want[0] == "refused" else ("status", want[1].ready))


def test_a_late_pod_completes_the_gang_in_one_event():
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2)))
    options = Options(address="ip")
    expected = Expectation(total=3, per_role={"master": 1, "worker": 2}, source="t")
    late = copy.deepcopy(pods[2])
    late["status"] = {"phase": "Pending"}
    tracker = GangTracker(pods[1], "demo-worker-0", options, expected)
    for pod in (pods[0], pods[1], late):
        tracker.put(pod)
    status = tracker.status()
    assert not status.ready and status.without_ip == ("demo-worker-1",)
    tracker.put(pods[2])
    assert tracker.status().ready


@pytest.mark.parametrize("n", [64])
def test_two_pods_claiming_one_index_are_refused(n):
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2)))
    twin = copy.deepcopy(pods[2])
    twin["metadata"]["name"] = "demo-worker-1-twin"
    tracker = GangTracker(pods[1], "demo-worker-0", Options(), Expectation(total=3, per_role=None, source="t"))
    for pod in (*pods, twin):
        tracker.put(pod)
    with pytest.raises(InputError) as err:
        tracker.status()
    assert "both claim role 'worker' index 1" in str(err.value)


def test_the_status_line_stays_short_with_thousands_of_pods_without_ip():
    """A 4096-pod job waiting for IPs logged one 70 KB line per watch: a reader gets a count and a few names,
    and init_bench hung on the full pipe."""
    from agent.core.plan.gang import GangStatus

    names = tuple(f"demo-worker-{i}" for i in range(4095))
    line = GangStatus(ready=False, present=4096, expected=4096, missing=(), without_ip=names).describe()
    assert len(line) < 300
    assert "4095 pods without IP" in line and "demo-worker-0" in line and "demo-worker-4094" not in line
    few = GangStatus(ready=False, present=3, expected=3, missing=(), without_ip=("a", "b")).describe()
    assert few.endswith("without IP: a, b")
