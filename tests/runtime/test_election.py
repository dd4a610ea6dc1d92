"""The publisher election from a standby's side (runtime/publication/election.py), against a Lease held in memory: when
it gets ready (lists the pods) and when it takes the Lease."""

from __future__ import annotations

import copy
from typing import Any

from agent.core.publication.lease import Timing
from agent.runtime.publication.election import Elector, Standby


class LeaseApi:
    """One Lease; each write bumps its resourceVersion, as the API server does."""

    def __init__(self, holder: str) -> None:
        self.lease: dict[str, Any] = {"metadata": {"name": "demo-topology", "resourceVersion": "1"},
                                      "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                                               "renewTime": "T0", "acquireTime": "T0", "leaseTransitions": 0}}
        self.writes = 0

    async def get_object(self, path: str) -> dict[str, Any]:
        return copy.deepcopy(self.lease)

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.writes += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.lease)

    def renew(self, when: str) -> None:
        self.lease["spec"]["renewTime"] = when
        self.lease["metadata"]["resourceVersion"] = str(int(self.lease["metadata"]["resourceVersion"]) + 1)


async def test_a_standby_gets_ready_before_the_lease_expires_and_takes_it_only_once_it_can_publish() -> None:
    """A standby that took the Lease before its LIST of 16384 pods was done held it without publishing for as
    long as the LIST took (takeover 18.9 s against a 15 s lease): it takes the Lease only once it is ready, and
    the second standby gets ready only if the first has not taken over within a whole lease."""
    now = [0.0]
    api = LeaseApi("demo-master-0")
    readied: list[str] = []
    listed = {"first": False, "second": False}
    first = Elector(api, "default", "demo-topology", "demo-worker-0", owner=None, timing=Timing(15),  # type: ignore
                    clock=lambda: now[0], standby=Standby(get_ready=lambda: readied.append("first"),
                                                          ready=lambda: listed["first"]))
    second = Elector(api, "default", "demo-topology", "demo-worker-1", owner=None, timing=Timing(15),  # type: ignore
                     clock=lambda: now[0], standby=Standby(get_ready=lambda: readied.append("second"),
                                                           ready=lambda: listed["second"], rank=lambda: 1))
    for elector in (first, second):
        assert not await elector.attempt()
    now[0], _ = 1.0, api.renew("T1")  # the leader seen renewing; then it crashes
    for elector in (first, second):
        assert not await elector.attempt()
    now[0] = 5.9
    assert not await first.attempt() and readied == []
    now[0] = 6.0  # a third of the lease without a renewal: the first standby lists the pods
    assert not await first.attempt() and not await second.attempt() and readied == ["first"]  # told at each look
    now[0] = 16.0  # the lease has expired, but its LIST is not done: it does not hold the Lease without publishing
    assert not await first.attempt() and api.writes == 0
    listed["first"] = True
    assert await first.attempt() and api.writes == 1 and api.lease["spec"]["holderIdentity"] == "demo-worker-0"
    assert not await second.attempt() and "second" not in readied  # it saw the new holder: it stays a standby


async def test_the_second_standby_takes_over_when_the_first_does_not() -> None:
    now = [0.0]
    api = LeaseApi("demo-master-0")
    readied: list[float] = []
    second = Elector(api, "default", "demo-topology", "demo-worker-1", owner=None, timing=Timing(15),  # type: ignore
                     clock=lambda: now[0], standby=Standby(get_ready=lambda: readied.append(now[0]),
                                                           ready=lambda: bool(readied), rank=lambda: 1))
    await second.attempt()
    now[0], _ = 1.0, api.renew("T1")
    await second.attempt()
    for t in (6.0, 16.0, 20.9):
        now[0] = t
        assert not await second.attempt() and not readied
    now[0] = 21.0  # a lease and a third without a renewal: the first standby is gone too
    assert await second.attempt() and readied == [21.0]


async def test_a_standby_readied_by_a_slow_leader_stands_down_once_it_renews_again() -> None:
    """A leader that missed two renewals readied the first standby, then renewed again: the standby is told to
    stand down (let go of the pods it listed) once the renewals cover a whole lease, once; a standby that took
    the Lease is never told."""
    now = [0.0]
    api = LeaseApi("demo-master-0")
    told: list[tuple[str, float]] = []
    first = Elector(api, "default", "demo-topology", "demo-worker-0", owner=None, timing=Timing(15),  # type: ignore
                    clock=lambda: now[0], standby=Standby(get_ready=lambda: told.append(("ready", now[0])),
                                                          stand_down=lambda: told.append(("down", now[0])),
                                                          ready=lambda: False))  # still listing: it would not take it
    await first.attempt()
    now[0], _ = 1.0, api.renew("T1")
    await first.attempt()
    now[0] = 6.0  # slow: a third of the lease without a renewal
    assert not await first.attempt() and told == [("ready", 6.0)]
    for k in range(1, 9):  # it renews again, every 2 s
        now[0] = 6.0 + 2 * k
        api.renew(f"T{k + 1}")
        assert not await first.attempt()
    assert told == [("ready", 6.0), ("down", 22.0)]
    now[0], _ = 24.0, api.renew("T10")
    await first.attempt()
    assert told[-1] == ("down", 22.0)  # told once
    now[0] = 29.0  # slow again: ready again, and it keeps the pods twice as long this time (one LIST each time)
    assert not await first.attempt() and told[-1] == ("ready", 29.0)
    for k in range(1, 17):
        now[0] = 29.0 + 2 * k
        api.renew(f"U{k}")
        assert not await first.attempt()
        assert (told[-1] == ("down", now[0])) == (k == 16)
