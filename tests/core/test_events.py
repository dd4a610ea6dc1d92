"""The correlator (core/report/events.py): isomorphic occurrences become a series, new Events come from a token bucket,
the latest held-back occurrence is the one written, what waits is bounded (the newest of each reason, the rest
counted in a note) and let go once its pod is gone, a process's outcome is always written; the bodies are what
the API server takes; the notes come from the gang tracker's own answers."""

from __future__ import annotations

import tracemalloc

import pytest

from agent import examples
from agent.core.model import Options
from agent.core.plan.gang import Expectation, GangTracker
from agent.core.report.events import (
    CONTROLLER,
    GENERATION_LABEL,
    JOB_LABEL,
    NOTE_LIMIT,
    REASONS,
    Budget,
    Correlator,
    Occurrence,
    Ref,
    generation_note,
    micro_time,
    waiting_note,
)
from agent.sandbox.events import invalid_create, invalid_update, to_core

T0 = 1_800_000_000.0
POD = Ref("demo-worker-0", "default", "uid-0")


def correlator(**budget: float) -> Correlator:
    return Correlator(POD, POD.name, T0, job="demo", budget=Budget(**budget))  # type: ignore[arg-type]


def waiting(note: str = "waiting for the gang: 1 of 2") -> Occurrence:
    return Occurrence("WaitingForGang", note)


def test_an_occurrence_seen_again_is_a_series_patched_not_a_new_event():
    events = correlator(series_every=300)
    first = events.observe(waiting(), T0)
    assert first is not None and first.verb == "create" and "series" not in first.body
    second = events.observe(waiting(), T0 + 30)
    assert second is not None and second.verb == "patch" and second.name == first.name  # count 2 at once
    assert second.body == {"series": {"count": 2, "lastObservedTime": micro_time(T0 + 30)}}
    assert events.observe(waiting(), T0 + 60) is None  # counted, written later
    assert events.observe(waiting(), T0 + 90) is None
    assert events.due(T0 + 329) == []
    assert events.next_due(T0 + 100) == pytest.approx(T0 + 330)
    [later] = events.due(T0 + 330)
    assert later.verb == "patch" and later.body["series"] == {"count": 4, "lastObservedTime": micro_time(T0 + 90)}
    assert events.due(T0 + 1000) == []  # nothing new counted since
    assert later.fallback is not None and later.fallback["series"]["count"] == 4  # recreated whole if it expired


def test_a_different_note_is_a_new_event_while_the_bucket_lasts_then_the_latest_waits_for_a_token():
    events = correlator(burst=3, refill=300)
    made = [events.observe(waiting(f"waiting: {n} of 9"), T0 + n) for n in range(3)]
    assert [w.verb for w in made if w] == ["create"] * 3
    assert events.observe(waiting("waiting: 3 of 9"), T0 + 3) is None  # no token: held back
    assert events.observe(waiting("waiting: 4 of 9"), T0 + 4) is None  # the newer one replaces it
    assert events.due(T0 + 100) == []
    [created] = events.due(T0 + 300)  # one token, 300 s after the bucket began to refill
    assert created.verb == "create" and created.body["note"] == "waiting: 4 of 9"
    assert events.next_due(T0 + 300) is None


def test_a_process_outcome_is_written_even_with_the_bucket_empty():
    events = correlator(burst=1)
    assert events.observe(waiting("a"), T0) is not None
    assert events.observe(waiting("b"), T0 + 1) is None
    done = events.observe(Occurrence("GangComplete", "gang complete", generation=1), T0 + 2)
    assert done is not None and done.verb == "create"
    assert done.body["metadata"]["labels"] == {JOB_LABEL: "demo", GENERATION_LABEL: "1"}


def test_events_of_different_reasons_or_related_pods_are_held_back_apart():
    events = correlator(burst=3, refill=10)
    for n in range(3):  # the bucket emptied
        assert events.observe(waiting(f"waiting: {n}"), T0) is not None
    other = Ref("rogue", "default", "uid-r")
    assert events.observe(Occurrence("PodRefused", "rogue: not the job's", related=other), T0) is None
    assert events.observe(Occurrence("PodRefused", "stale: not the job's", related=Ref("stale", "default")), T0) \
        is None
    assert events.observe(Occurrence("NewGeneration", "generation 2", generation=2), T0) is None
    assert events.observe(Occurrence("NewGeneration", "generation 3", generation=3), T0) is None
    written = events.due(T0 + 30)
    assert [(w.body["reason"], w.body["note"]) for w in written] == [
        ("PodRefused", "rogue: not the job's"), ("PodRefused", "stale: not the job's"),
        ("NewGeneration", "generation 3")]  # the latest generation only
    assert written[0].body["related"] == other.body()


def refused(n: int) -> Occurrence:
    """A rogue pod's refusal, as the sidecar records it (a note of the roster's length)."""
    name = f"rogue-{n}"
    return Occurrence("PodRefused", f"pod '{name}' has the labels of Job 'demo' but is not owned by it (no "
                      "ownerReference with controller=true to Job 'demo'); it is left out of the topology",
                      related=Ref(name, "default", f"uid-rogue-{n}"))


@pytest.mark.slow
def test_fifty_thousand_refused_pods_leave_the_newest_few_waiting_and_count_the_rest():
    events = correlator(burst=1, refill=300)  # the default bound: 10 per reason
    assert events.observe(waiting(), T0) is not None  # the bucket emptied
    for n in range(45_000):
        assert events.observe(refused(n), T0 + n / 1000) is None
    tracemalloc.start()  # the last 5000 alone: tracing makes each ~5 times slower
    try:
        before, _ = tracemalloc.get_traced_memory()
        for n in range(45_000, 50_000):
            assert events.observe(refused(n), T0 + n / 1000) is None
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(events.waiting) == 10
    assert held - before < 16 * 1024  # nothing more is held for 5000 more pods (each waiting one is ~1 KB)
    assert [slot[1].name for slot in events.waiting] == [f"rogue-{n}" for n in range(49_990, 50_000)]  # newest
    assert events.held == {"PodRefused": 10}
    assert events.given_up == 49_990 and events.untold == {"PodRefused": 49_990}
    [first] = events.due(T0 + 50 + 300)  # one token: the oldest of the ten, which says how many were not
    assert first.body["related"]["name"] == "rogue-49990"
    assert first.body["note"].startswith("(49990 more PodRefused not recorded: too many at once) pod 'rogue-49990'")
    assert len(first.body["note"]) <= NOTE_LIMIT and not events.untold
    [second] = events.due(T0 + 50 + 600)
    assert second.body["note"] == refused(49_991).note  # nothing more was let go meanwhile


def test_a_repeat_of_a_noted_occurrence_counts_in_its_series():
    events = correlator(burst=1, refill=300, hold=1)
    assert events.observe(waiting(), T0) is not None
    for n in range(3):
        events.observe(refused(n), T0)
    [created] = events.due(T0 + 300)
    assert created.body["note"].startswith("(2 more PodRefused not recorded")
    repeat = events.observe(refused(2), T0 + 301)
    assert repeat is not None and (repeat.verb, repeat.name) == ("patch", created.name)


def test_the_bound_is_per_reason_and_a_replaced_occurrence_is_the_newest():
    events = correlator(burst=1, refill=300, hold=2)
    assert events.observe(waiting(), T0) is not None
    events.observe(refused(1), T0)
    events.observe(Occurrence("NewGeneration", "generation 2", generation=2), T0)
    events.observe(refused(2), T0)
    events.observe(refused(1), T0 + 1)  # rogue-1 again, with the same note: newer than rogue-2 now
    events.observe(refused(3), T0 + 2)  # over the bound: rogue-2 is the oldest refusal
    assert [(reason, related.name if related else None) for reason, related in events.waiting] == [
        ("NewGeneration", None), ("PodRefused", "rogue-1"), ("PodRefused", "rogue-3")]
    assert events.untold == {"PodRefused": 1}


def test_an_occurrence_about_a_pod_gone_is_never_written():
    events = correlator(burst=1, refill=300)
    assert events.observe(waiting(), T0) is not None
    for n in range(3):
        assert events.observe(refused(n), T0) is None
    assert events.gone("rogue-1") == 1 and events.gone("rogue-1") == 0 and events.gone("demo-worker-1") == 0
    assert events.given_up == 1 and "rogue-1" not in events.about and not events.untold
    written = events.due(T0 + 300) + events.due(T0 + 600) + events.due(T0 + 900)
    assert [w.body["related"]["name"] for w in written] == ["rogue-0", "rogue-2"]
    assert events.next_due(T0 + 900) is None


def test_a_failed_write_is_forgotten_so_the_next_occurrence_creates_again():
    events = correlator()
    first = events.observe(waiting(), T0)
    assert first is not None
    events.forget(first)
    again = events.observe(waiting(), T0 + 1)
    assert again is not None and again.verb == "create" and again.name != first.name


def test_every_body_is_one_the_api_server_takes_and_names_are_unique():
    events = correlator(burst=10)
    names = set()
    for reason, kind in REASONS.items():
        write = events.observe(Occurrence(reason, f"{reason} happened"), T0)  # the same nanosecond for all
        assert write is not None
        body = write.body
        assert invalid_create(body) is None, body
        assert (body["reason"], body["action"], body["type"]) == (reason, kind.action, kind.type)
        assert body["reportingController"] == CONTROLLER and body["reportingInstance"] == POD.name
        assert body["regarding"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "default",
                                     "name": "demo-worker-0", "uid": "uid-0"}
        assert body["metadata"]["namespace"] == "default"
        names.add(body["metadata"]["name"])
    assert len(names) == len(REASONS)
    repeat = events.observe(Occurrence("WaitingForGang", "WaitingForGang happened"), T0 + 1)
    assert repeat is not None and repeat.verb == "patch"
    stored = to_core(repeat.fallback)  # type: ignore[arg-type]
    patched = {**stored, "series": repeat.body["series"]}
    assert invalid_update(patched, stored | {"series": None}) is None


def test_notes_are_cut_to_the_apis_limit_and_reasons_are_known():
    assert len(Occurrence("WaitingForGang", "x" * 5000).note) == NOTE_LIMIT
    with pytest.raises(ValueError, match="unknown event reason"):
        Occurrence("Waiting", "x")
    assert generation_note(4, (2, 8), (3, 12)) == "generation 4: world size 8 -> 12, training pods 2 -> 3"
    assert generation_note(2, None, (3, 12)) == "generation 2: world size 12, 3 training pods"


def test_a_generation_note_names_the_pods_left_out_with_why_and_those_back():
    left = [(f"w-{i}", "lost: DisruptionTarget (PreemptionByScheduler: preempted by the scheduler)") for i in range(7)]
    note = generation_note(5, (8, 8), (1, 1), left=left, back=["w-9"])
    assert note == ("generation 5: world size 8 -> 1, training pods 8 -> 1; left out: "
                    + "; ".join(f"w-{i}: {left[0][1]}" for i in range(5)) + " (and 2 more); back: w-9")
    assert len(Occurrence("NewGeneration", note, generation=5).note) <= NOTE_LIMIT


def test_the_waiting_note_says_how_many_and_why_each_missing_pod_is_missing():
    pods = examples.volcano_job("demo", (("master", 1), ("worker", 7)))
    for pod in pods[2:5]:  # workers 1-3: on no node yet
        pod["status"] = {"phase": "Pending"}
    pods[5]["spec"]["nodeName"] = "node-a"  # worker 4: on a node, no IP yet
    pods[5]["status"] = {"phase": "Pending"}
    del pods[7]  # worker 6: not created
    options = Options(address="ip")
    tracker = GangTracker(pods[0], "demo-master-0", options,
                          Expectation(total=8, per_role={"master": 1, "worker": 7}, source="Job 'demo' replicas"))
    for pod in pods:
        tracker.put(pod)
    unscheduled, no_ip = tracker.unplaced()
    note = waiting_note(tracker.status(), source="Job 'demo' replicas", unscheduled=unscheduled, no_ip=no_ip,
                        refused={"rogue-1": "pod 'rogue-1' has the labels of Job 'demo' but is not owned by it"})
    assert note == ("waiting for the gang: 7 of 8 training pods present (Job 'demo' replicas); not created: worker 6; "
                    "not scheduled: demo-worker-1, demo-worker-2, demo-worker-3; no IP yet: demo-worker-4; "
                    "refused: pod 'rogue-1' has the labels of Job 'demo' but is not owned by it")


def test_the_waiting_note_names_the_first_pods_and_counts_the_rest():
    status_pods = examples.volcano_job("demo", (("master", 1), ("worker", 20)))
    for pod in status_pods[1:]:
        pod["spec"]["nodeName"] = "node-a"
        pod["status"] = {"phase": "Pending"}
    tracker = GangTracker(status_pods[0], "demo-master-0", Options(address="ip"),
                          Expectation(total=21, per_role=None, source="--expect"))
    for pod in status_pods:
        tracker.put(pod)
    unscheduled, no_ip = tracker.unplaced()
    note = waiting_note(tracker.status(), source="--expect", unscheduled=unscheduled, no_ip=no_ip, refused={})
    assert note.endswith("no IP yet: demo-worker-0, demo-worker-1, demo-worker-10, demo-worker-11, demo-worker-12 "
                         "and 15 more")
