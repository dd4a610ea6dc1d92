"""A pod explains itself: a real init process records on its own Pod (events.k8s.io/v1) why it waits, and real
``kubectl describe pod`` (which lists v1 Events by involvedObject) shows it; then the gang completes and describe
shows that. The recorder's series, budget and faults are tested in process: tests/runtime/test_events.py."""

from __future__ import annotations

from agent import examples
from tests.integration.conftest import finish, start_init
from tests.jobs import add_worker, create_volcano_job, rogue

EVENTS = "/v1/events"


def events_of(sandbox, reason: str) -> list[dict]:
    return [e for e in sandbox.sandbox.store.list(EVENTS, "default") if e.get("reason") == reason]


def describe_events(kubectl, pod: str) -> str:
    """The Events section of ``kubectl describe pod``."""
    out = kubectl("describe", "pod", pod).stdout
    return out[out.index("\nEvents:"):]


def test_kubectl_describe_shows_why_a_pod_waits_and_then_that_its_gang_is_complete(sandbox, kubectl, tmp_path):
    create_volcano_job(sandbox, (("master", 1), ("worker", 3)))
    sandbox.update_pod("default", "demo-worker-1", lambda p: p.__setitem__("status", {"phase": "Pending"}))
    sandbox.delete_pod("default", "demo-worker-2")
    sandbox.create_pod(rogue("demo-worker-2", "worker", 2, 9))  # someone else's pod under the job's name
    proc = start_init(sandbox, "demo-master-0", tmp_path / "out", "--address", "ip", "--timeout", "90")
    try:
        sandbox.wait_for(EVENTS, lambda _: events_of(sandbox, "WaitingForGang"), timeout=30)  # after 5 s of waiting
        waiting = describe_events(kubectl, "demo-master-0")
        print(waiting)  # the report quotes it
        assert "Normal  WaitingForGang" in waiting and "topology-agent.io/agent" in waiting
        assert "waiting for the gang: 3 of 4 training pods present (Job 'demo' replicas)" in waiting
        assert "not created: worker 2" in waiting and "not scheduled: demo-worker-1" in waiting
        assert "refused: pod 'demo-worker-2' has the labels of Job 'demo' but is not owned by it" in waiting
        assert proc.poll() is None
        sandbox.delete_pod("default", "demo-worker-2")  # the job's own pods, scheduled
        add_worker(sandbox, 2, 12)
        sandbox.schedule("default", "demo-worker-1", examples.loopback_ip(11))
        code, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, err
    done = describe_events(kubectl, "demo-master-0")
    print(done)
    assert "Normal  GangComplete" in done
    assert "gang complete: 4 training pods; generation 1: role master, node rank 0 of 4, rank 0 of 4" in done
    assert "WaitingForGang" in done  # the wait it recorded stays, before the outcome
    assert "topology-agent.io/agent" not in describe_events(kubectl, "demo-worker-0")  # each pod its own Events
