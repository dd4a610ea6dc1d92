"""A pod's Events over the sandbox's API in memory (runtime/events.py): sent off the path that configures the pod,
aggregated into series, stopped by a 403 in one line, paused by a 5xx and resumed, an expired series created
again; init says why it waits and how it ended, the sidecar each new generation and each pod it leaves out (the
newest few of any number pending, none about a pod gone).
tests/integration/test_events.py shows them through real kubectl describe."""

from __future__ import annotations

import asyncio
import time

import pytest

from agent import examples
from agent.core.report.events import GENERATION_LABEL, JOB_LABEL, Bucket, Budget, Occurrence, Ref
from agent.runtime import events as recording
from agent.runtime.events import TaskRecorder, ThreadRecorder
from tests.fakeapi import agent_name, init_pod
from tests.jobs import add_worker, create_volcano_job, rogue

EVENTS = "/v1/events"  # the sandbox's store key for both versions
POD = Ref("demo-worker-0", "default", "uid-0")
T0 = 1_800_000_000.0


def stored(memory) -> list[dict]:
    return sorted(memory.sandbox.store.list(EVENTS, "default"), key=lambda e: e["metadata"]["name"])


def sent_by(memory, pod: str) -> dict[str, int]:
    return memory.stats()["byAgent"].get(agent_name("events", pod), {"requests": 0, "bytes": 0})


async def settled(recorder: TaskRecorder, test, what: str) -> None:
    async with asyncio.timeout(10), recorder.sent:
        await recorder.sent.wait_for(test)


@pytest.fixture
async def recorder(api):
    async with api.async_client(agent_name("events", POD.name)) as client:
        made = TaskRecorder(client, POD, job="demo", budget=Budget(burst=2, refill=3600, series_every=3600))
        task = asyncio.create_task(made.run())
        yield made
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_repeated_occurrence_is_one_event_whose_series_is_patched(recorder, memory):
    waiting = Occurrence("WaitingForGang", "waiting for the gang: 1 of 2 training pods present")
    for _ in range(3):
        recorder.record(waiting)
    await settled(recorder, lambda: recorder.counts.created + recorder.counts.patched == 2, "a create and a patch")
    [event] = stored(memory)
    assert event["message"] == waiting.note and event["series"]["count"] == 2  # the 3rd counted, written later
    assert event["involvedObject"]["uid"] == "uid-0" and event["metadata"]["labels"] == {JOB_LABEL: "demo"}
    assert sent_by(memory, POD.name)["requests"] == 2


async def test_new_events_beyond_the_bucket_wait_and_the_latest_is_kept(recorder, memory):
    for n in range(5):
        recorder.record(Occurrence("NewGeneration", f"generation {n + 2}", generation=n + 2))
    await settled(recorder, lambda: recorder.queue.empty() and recorder.counts.created == 2, "the burst")
    assert [e["message"] for e in stored(memory)] == ["generation 2", "generation 3"]
    assert recorder.recording.correlator.waiting[("NewGeneration", None)].note == "generation 6"
    assert [e["metadata"]["labels"][GENERATION_LABEL] for e in stored(memory)] == ["2", "3"]


async def test_a_403_is_said_once_and_recording_stops(recorder, memory, logs):
    memory.faults(status=403, path="/events")
    recorder.record(Occurrence("NewGeneration", "generation 2", generation=2))
    await settled(recorder, lambda: recorder.recording.stopped is not None, "recording stopped")
    memory.faults(clear=True)
    recorder.record(Occurrence("NewGeneration", "generation 3", generation=3))
    await settled(recorder, lambda: recorder.queue.empty() and recorder.counts.dropped == 2, "the next one dropped")
    said = [line for line in logs.text("").splitlines() if "events" in line]
    assert said == ["WARNING events are not recorded from now on: the API server refused to create an Event in "
                    "namespace 'default' (403); the pod's Role needs create and patch on events.k8s.io events "
                    "(kubectl apply -k manifests/rbac)"]
    assert sent_by(memory, POD.name)["requests"] == 1 and stored(memory) == []


async def test_an_event_refused_otherwise_is_dropped_and_said_once(recorder, memory, logs):
    memory.faults(status=422, path="/events")
    for n in range(2):
        recorder.record(Occurrence("PodRefused", f"pod '{n}' is not the job's", related=Ref(str(n), "default")))
    await settled(recorder, lambda: recorder.counts.dropped == 2, "both refused")
    said = [line for line in logs.text("").splitlines() if "Event was refused" in line]
    assert len(said) == 1 and "API answered 422 to create events" in said[0]
    assert recorder.recording.stopped is None  # the next Events are still tried


async def test_a_5xx_pauses_recording_which_resumes_after_its_backoff(api, memory, logs):
    now = [1_800_000_000.0]
    async with api.async_client(agent_name("events", POD.name)) as client:
        recorder = TaskRecorder(client, POD, clock=lambda: now[0])
        task = asyncio.create_task(recorder.run())
        try:
            memory.faults(status=503, path="/events")
            recorder.record(Occurrence("PodRefused", "pod 'a' is not the job's", related=Ref("a", "default")))
            await settled(recorder, lambda: recorder.recording.paused_until > now[0], "paused")
            memory.faults(clear=True)
            recorder.record(Occurrence("PodRefused", "pod 'b' is not the job's", related=Ref("b", "default")))
            await settled(recorder, lambda: recorder.counts.dropped == 2, "dropped while paused")
            now[0] = recorder.recording.paused_until
            recorder.record(Occurrence("PodRefused", "pod 'c' is not the job's", related=Ref("c", "default")))
            await settled(recorder, lambda: recorder.counts.created == 1, "resumed")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert [e["related"]["name"] for e in stored(memory)] == ["c"]
    said = [line for line in logs.text("").splitlines() if "events" in line]
    assert len(said) == 2 and said[0].startswith("WARNING events paused: API answered 503 to create events")
    assert said[1].startswith("INFO events resumed")


async def test_a_series_whose_event_expired_is_created_again_whole(recorder, memory):
    waiting = Occurrence("WaitingForGang", "waiting for the gang: 1 of 2")
    recorder.record(waiting)
    await settled(recorder, lambda: recorder.counts.created == 1, "created")
    [event] = stored(memory)
    memory.call(_delete(memory, event["metadata"]["name"]))  # the API server's TTL ran out
    recorder.record(waiting)
    await settled(recorder, lambda: recorder.counts.created == 2, "created again")
    [again] = stored(memory)
    assert again["metadata"]["name"] == event["metadata"]["name"] and again["series"]["count"] == 2


async def _delete(memory, name: str) -> None:
    memory.sandbox.store.delete(EVENTS, "default", name)


class Writes:
    """An AsyncSink that keeps what it is asked to write."""

    def __init__(self) -> None:
        self.made: list[tuple[str, dict]] = []

    async def create(self, path: str, body: dict) -> dict:
        self.made.append(("create", body))
        return body

    async def patch(self, path: str, body: dict) -> dict:
        self.made.append(("patch", body))
        return body


def rogue_pod(n: int) -> dict:
    return {"metadata": {"name": f"rogue-{n}", "namespace": "default", "uid": f"uid-rogue-{n}"}}


@pytest.mark.slow
async def test_fifty_thousand_refused_pods_leave_at_most_the_bound_pending():
    sink = Writes()
    recorder = TaskRecorder(sink, POD, budget=Budget(burst=1, refill=3600))  # the default bound: 10 per reason
    refusals = recording.Refusals(recorder, "default")
    task = asyncio.create_task(recorder.run())
    try:
        most = 0
        for n in range(50_000):
            refusals.refused(rogue_pod(n), f"pod 'rogue-{n}' has the labels of Job 'demo' but is not owned by it")
            refusals.changed(f"rogue-{n}", None)  # an ADDED refused: removed from the view, not gone
            if n % 32 == 31:
                await asyncio.sleep(0)  # the recorder takes what is queued, as between two watch events
                most = max(most, len(recorder.recording.correlator.waiting))
        await settled(recorder, lambda: recorder.queue.empty(), "the queue taken")
        waiting = recorder.recording.correlator.waiting
        assert most <= 10 and len(waiting) == 10
        assert [related.name for _, related in waiting] == [f"rogue-{n}" for n in range(49_990, 50_000)]
        assert len(recorder.pending()) == 10 and len(refusals.seen) <= 4 * recording.QUEUE
        assert [body["related"]["name"] for _, body in sink.made] == ["rogue-0"]  # the one token
        assert recorder.counts.dropped == 50_000 - 1 - 10  # let go for the bound, or by the full queue
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_an_occurrence_about_a_pod_gone_is_let_go_queued_or_waiting():
    sink = Writes()
    now = [T0]
    recorder = TaskRecorder(sink, POD, budget=Budget(burst=1, refill=300), clock=lambda: now[0])
    refusals = recording.Refusals(recorder, "default")
    for n in range(3):
        refusals.refused(rogue_pod(n), f"rogue-{n}: not the job's")
        refusals.changed(f"rogue-{n}", None)
    refusals.changed("rogue-2", None)  # deleted while queued
    task = asyncio.create_task(recorder.run())
    try:
        await settled(recorder, lambda: recorder.queue.empty(), "the queue taken")
        assert recorder.pending() == {"rogue-1"} and recorder.counts.dropped == 1
        refusals.refused(rogue_pod(2), "rogue-2: not the job's")  # a new pod of that name: recorded
        refusals.changed("rogue-2", None)
        await settled(recorder, lambda: recorder.queue.empty(), "the queue taken")
        assert recorder.pending() == {"rogue-1", "rogue-2"}
        refusals.changed("rogue-1", None)  # deleted while waiting for a token
        refusals.reset({POD.name: {}})  # a LIST that does not refuse rogue-2: deleted meanwhile, or let in
        assert recorder.pending() == set() and recorder.counts.dropped == 3
        now[0] += 3600
        recorder.record(Occurrence("NewGeneration", "generation 2"))
        await settled(recorder, lambda: len(sink.made) == 2, "the token taken")
        assert [body.get("related", {}).get("name") for _, body in sink.made] == ["rogue-0", None]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_full_queue_drops_and_a_bug_stops_recording_not_the_caller(api, logs):
    async with api.async_client("test") as client:
        recorder = TaskRecorder(client, POD)  # not running: nothing takes from the queue
        for n in range(recording.QUEUE + 5):
            recorder.record(Occurrence("NewGeneration", f"generation {n}"))
        assert recorder.counts.dropped == 5
        broken = TaskRecorder(client, POD)
        broken.recording.correlator.observe = lambda *_: 1 / 0  # type: ignore[method-assign]  # a bug
        task = asyncio.create_task(broken.run())
        broken.record(Occurrence("NewGeneration", "generation 2"))
        await logs.until("", "events are not recorded from now on (internal error: ZeroDivisionError")
        assert not task.done()  # it waits: the sidecar's root tasks go on
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_init_sends_its_events_on_a_thread_of_its_own_and_a_slow_api_for_them_does_not_hold_it(api, memory):
    memory.faults(delay=3.0, path="/events")
    recorder = ThreadRecorder(api.client("test"), POD)
    started = time.monotonic()
    for n in range(3):
        recorder.record(Occurrence("NewGeneration", f"generation {n}"))
    recorder.close(grace=0.2)
    assert time.monotonic() - started < 1.0  # three writes of 3 s each: given 0.2 s, then left


# --- init and the sidecar --------------------------------------------------------------------------------------

@pytest.fixture
def quick(monkeypatch):
    """Init says why it waits after 0.2 s and looks again every 0.3 s (5 s and 30 s in a pod)."""
    monkeypatch.setattr(recording, "WAIT_FIRST", 0.2)
    monkeypatch.setattr(recording, "OBSERVE", 0.3)


def waiting_job(memory) -> None:
    """A master and 3 workers: worker 1 not scheduled, worker 2 someone else's pod under the job's name."""
    create_volcano_job(memory, (("master", 1), ("worker", 3)))
    memory.update_pod("default", "demo-worker-1", lambda p: p.__setitem__("status", {"phase": "Pending"}))
    memory.delete_pod("default", "demo-worker-2")
    memory.create_pod(rogue("demo-worker-2", "worker", 2, 9))


def test_init_says_why_it_waits_then_that_the_gang_is_complete(quick, memory, api, inits, tmp_path):
    waiting_job(memory)
    who = inits.start("demo-master-0", tmp_path / "out", "--timeout", "30", "--address", "ip")
    memory.wait_for(EVENTS, lambda store: any(
        (e.get("series") or {}).get("count", 0) >= 2 for e in store.list(EVENTS, "default")))  # looked at again
    [waiting] = stored(memory)
    assert (waiting["reason"], waiting["type"], waiting["action"]) == ("WaitingForGang", "Normal", "WaitForGang")
    assert waiting["message"].startswith("waiting for the gang: 3 of 4 training pods present (Job 'demo' replicas); "
                                         "not created: worker 2; not scheduled: demo-worker-1; refused: pod "
                                         "'demo-worker-2' has the labels of Job 'demo' but is not owned by it")
    memory.delete_pod("default", "demo-worker-2")
    add_worker(memory, 2, 12)
    memory.set_pod_ip("default", "demo-worker-1", examples.loopback_ip(11))
    ran = inits.finish(who)
    assert ran.code == 0, ran.err
    done = [e for e in stored(memory) if e["reason"] == "GangComplete"]
    assert [e["message"] for e in done] == ["gang complete: 4 training pods; generation 1: role master, node "
                                            "rank 0 of 4, rank 0 of 4"]
    assert done[0]["metadata"]["labels"] == {JOB_LABEL: "demo", GENERATION_LABEL: "1"}


def test_a_gang_complete_before_init_would_say_it_waits_records_its_outcome_alone(memory, api, logs, tmp_path):
    create_volcano_job(memory, (("master", 1), ("worker", 1)))
    ran = init_pod(api, logs, "demo-worker-0", tmp_path / "out", "--address", "ip")
    assert ran.code == 0, ran.err
    assert [e["reason"] for e in stored(memory)] == ["GangComplete"]
    assert sent_by(memory, "demo-worker-0")["requests"] == 1


def test_init_that_times_out_says_why_on_its_pod(quick, memory, api, logs, tmp_path):
    waiting_job(memory)
    ran = init_pod(api, logs, "demo-master-0", tmp_path / "out", "--timeout", "1", "--address", "ip")
    assert ran.code == 4
    [timeout] = [e for e in stored(memory) if e["reason"] == "GangTimeout"]
    assert timeout["type"] == "Warning" and timeout["message"].startswith("gave up: timed out after 1.")
    assert "missing: worker 2" in timeout["message"]


def test_init_without_rbac_for_events_is_configured_all_the_same_and_says_so_once(quick, memory, api, inits,
                                                                                  logs, tmp_path):
    memory.faults(status=403, path="/events")
    waiting_job(memory)
    memory.delete_pod("default", "demo-worker-2")
    add_worker(memory, 2, 12)
    who = inits.start("demo-master-0", tmp_path / "out", "--timeout", "30", "--address", "ip")
    logs.wait_for(who, "events are not recorded from now on")  # the wait's Event, refused
    memory.set_pod_ip("default", "demo-worker-1", examples.loopback_ip(11))
    ran = inits.finish(who)
    assert ran.code == 0, ran.err
    assert ran.err.count("events are not recorded from now on: the API server refused to create an Event") == 1
    assert sent_by(memory, "demo-master-0")["requests"] == 1  # nothing more tried: not the outcome either
    assert (tmp_path / "out" / "torch.env").is_file()


async def worker_sidecars_recorder(memory, api, logs, sidecars, tmp_path) -> TaskRecorder:
    """A master and a worker, the worker's init run and its sidecar started (no debounce): the sidecar's recorder."""
    create_volcano_job(memory, (("master", 1), ("worker", 1)))
    out = tmp_path / "out"
    ran = await asyncio.to_thread(init_pod, api, logs, "demo-worker-0", out, "--address", "ip")
    assert ran.code == 0, ran.err
    running = await sidecars.start("demo-worker-0", out, "--address", "ip", "--debounce", "0")
    return running.sidecar.recorder


async def test_the_sidecar_records_each_new_generation_and_each_pod_it_leaves_out(memory, api, logs, sidecars,
                                                                                  tmp_path):
    recorder = await worker_sidecars_recorder(memory, api, logs, sidecars, tmp_path)
    add_worker(memory, 1, 30)
    memory.create_pod(rogue("rogue-1", "worker", 5, 31))
    await settled(recorder, lambda: recorder.counts.created == 2, "two Events")
    by_reason = {e["reason"]: e for e in stored(memory)}
    generation = by_reason["NewGeneration"]
    assert generation["message"] == "generation 2: world size 2 -> 3, training pods 2 -> 3"
    assert generation["metadata"]["labels"][GENERATION_LABEL] == "2" and generation["action"] == "Rewrite"
    refused = by_reason["PodRefused"]
    assert refused["type"] == "Warning" and refused["related"]["name"] == "rogue-1"
    assert refused["message"].startswith("pod 'rogue-1' has the labels of Job 'demo' but is not owned by it")


def waits_about(recorder: TaskRecorder, name: str) -> bool:
    return any(related is not None and related.name == name for _, related in recorder.recording.correlator.waiting)


async def test_the_sidecar_never_writes_a_refusal_of_a_pod_deleted_before_a_token_came(memory, api, logs, sidecars,
                                                                                      tmp_path):
    recorder = await worker_sidecars_recorder(memory, api, logs, sidecars, tmp_path)
    now = [T0]
    recorder.recording.clock = lambda: now[0]
    recorder.recording.correlator.bucket = Bucket(1, 300.0, T0)  # one Event, then one per 5 minutes
    memory.create_pod(rogue("rogue-1", "worker", 5, 31))
    await settled(recorder, lambda: recorder.counts.created == 1, "rogue-1's Event")
    memory.create_pod(rogue("rogue-2", "worker", 6, 32))
    await settled(recorder, lambda: waits_about(recorder, "rogue-2"), "rogue-2 waiting")
    memory.delete_pod("default", "rogue-2")
    memory.create_pod(rogue("rogue-3", "worker", 7, 33))  # after the deletion, in the watch's order
    await settled(recorder, lambda: waits_about(recorder, "rogue-3"), "rogue-3 waiting")
    now[0] += 300  # a token
    memory.update_pod("default", "rogue-1", lambda p: p["metadata"]["labels"].update(seen="again"))  # wakes it
    await settled(recorder, lambda: recorder.counts.created == 2, "the token taken")
    assert [e["related"]["name"] for e in stored(memory) if e["reason"] == "PodRefused"] == ["rogue-1", "rogue-3"]
