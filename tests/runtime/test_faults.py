"""The API server misbehaving, as a fault proxy showed it can, against init and the sidecar in this process
(tests/fakeapi.py): each fault is the sandbox's own knob (``memory.faults``). init runs on a clock of its own
(``run_init``'s seams), so its timeout, its backoffs and its request rate are the agent's own arithmetic, exact and
instant; the sidecar's publication faults run on real time, each wait awaiting an event. docs/reliability.md lists
each fault with what the agent does; tests/integration/test_faults.py keeps those a socket makes (a silent or a
trickling connection, no answer) and the sidecar's request rate over time."""

from __future__ import annotations

import json

import pytest

from agent import examples
from tests.fakeapi import init_pod
from tests.jobs import add_worker, create_volcano_job, world
from tests.runtime.test_sidecar import published_job, start_sidecar


class Clock:
    """init's clock: it moves only when init sleeps (its backoffs, its pauses between watches)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def waiting_job(memory):
    """A master and a worker without an IP: init waits for the worker."""
    create_volcano_job(memory, (("master", 1), ("worker", 1)), with_ips=False)
    memory.set_pod_ip("default", "demo-master-0", examples.loopback_ip(0))


def requests_by(memory, agent):
    return sum(v["requests"] for k, v in memory.stats()["byAgent"].items() if agent in k)


INIT_FAULTS = [  # (name, the fault, what init's last line says)
    ("a watch that ends at once", {"watch": "empty", "path": "/pods"}, "without IP: demo-worker-0"),
    ("a 410 on every watch", {"watch": "gone", "path": "/pods"}, "without IP: demo-worker-0"),
    ("429 with Retry-After 0", {"status": 429, "retry_after": 0}, "API answered 429"),
]


@pytest.mark.parametrize("fault, says", [f[1:] for f in INIT_FAULTS], ids=[f[0] for f in INIT_FAULTS])
def test_init_ends_by_its_timeout_under_any_fault_and_asks_at_most_5_times_a_second(memory, api, logs, tmp_path,
                                                                                     fault, says):
    waiting_job(memory)
    memory.faults(**fault)
    time = Clock()
    started = time.now
    ran = init_pod(api, logs, "demo-master-0", tmp_path / "out", "--address", "ip", "--timeout", "6",
                   clock=time.clock, sleep=time.sleep)
    took = time.now - started
    assert ran.code == 4, ran.err
    assert took <= 6 + 1, took  # --timeout + 1 s
    assert requests_by(memory, "init") <= 5 * took
    last = ran.err.strip().splitlines()[-1]
    assert "timed out after" in last and says in last, last
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.slow
async def test_a_503_at_start_does_not_make_a_follower_watch_every_pod_for_its_life(memory, api, logs, sidecars,
                                                                                    tmp_path):
    await published_job(memory, api, logs, tmp_path, 4)
    memory.faults(status=503, count=3, path="/configmaps")
    await start_sidecar(sidecars, tmp_path, "demo-worker-3")
    await logs.until("demo-worker-3", "(follower)")


def _renew(memory, change):
    def apply():
        store = memory.sandbox.store
        lease = json.loads(json.dumps(store.get("coordination.k8s.io/v1/leases", "default", "demo-topology")))
        change(lease)
        lease["metadata"].pop("resourceVersion", None)
        return store.replace("coordination.k8s.io/v1/leases", "default", "demo-topology", lease)
    return memory._run(apply)


@pytest.mark.slow
async def test_followers_fall_back_to_the_pods_when_the_publisher_stops_and_return_when_it_is_back(memory, api, logs,
                                                                                                   sidecars, tmp_path):
    """A stolen and renewed Lease left every follower stale with no warning."""
    await published_job(memory, api, logs, tmp_path, 4)
    await start_sidecar(sidecars, tmp_path, "demo-master-0", "--lease-seconds", "2")
    follower = await start_sidecar(sidecars, tmp_path, "demo-worker-3", "--lease-seconds", "2", "--probe-every", "1")
    await logs.until("demo-worker-3", "(follower)")
    await logs.until("demo-master-0", "started publishing")
    await sidecars.stop("demo-master-0")  # the publisher goes ...

    def steal(lease):  # ... and a pod that is no member holds and renews its Lease
        lease["spec"]["holderIdentity"] = "not-a-member"
    for _ in range(2):
        _renew(memory, steal)
    await logs.until("demo-worker-3", "the publisher stopped: lease demo-topology is held by 'not-a-member'",
                     timeout=20)
    add_worker(memory, 4, 92)  # nobody publishes: the follower sees it from the pods
    await follower.until(lambda: world(tmp_path / "demo-worker-3")[0] == "6", timeout=15, what="the new worker seen")
    await start_sidecar(sidecars, tmp_path, "demo-master-0", "--lease-seconds", "2")
    _renew(memory, lambda lease: lease["spec"].update(holderIdentity="", leaseDurationSeconds=1))
    await logs.until("demo-worker-3", "the published topology is sound again", timeout=30)


async def test_a_journal_sequence_out_of_range_makes_followers_follow_the_pods(memory, api, logs, sidecars, tmp_path):
    """A forged journal at sequence 2^53-1 made followers refuse every later journal, silently, for good. (A
    follower that holds every member applies the journal's entries; one in its own view reads only the summary.)"""
    await published_job(memory, api, logs, tmp_path, 4, "--view", "full")
    await start_sidecar(sidecars, tmp_path, "demo-master-0", "--view", "full")
    follower = await start_sidecar(sidecars, tmp_path, "demo-worker-3", "--view", "full")
    await logs.until("demo-worker-3", "(follower)")
    await logs.until("demo-master-0", "started publishing")
    await sidecars.stop("demo-master-0")  # nobody will write the journal back

    def forge():
        store = memory.sandbox.store
        journal = json.loads(json.dumps(store.get("/v1/configmaps", "default", "demo-topology-journal")))
        top = 2**53 - 1
        journal["data"].update(base=str(top - 1), seq=str(top), **{"changes.json": json.dumps(
            [{"seq": top, "put": [], "gone": [], "shapes": {}}])})
        journal["metadata"].pop("resourceVersion", None)
        return store.replace("/v1/configmaps", "default", "demo-topology-journal", journal)
    memory._run(forge)
    await logs.until("demo-worker-3", "the published journal starts after its snapshot", timeout=15)
    add_worker(memory, 4, 93)
    await follower.until(lambda: world(tmp_path / "demo-worker-3")[0] == "6", timeout=15, what="the new worker seen")
