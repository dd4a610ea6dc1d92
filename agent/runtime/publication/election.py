"""The sidecar's side of the publisher election: one coordination.k8s.io/v1 Lease per job (rules in
core/publication/lease.py).

Only the leader and the standbys it names run this (2 GETs/s for the whole job while the leader is healthy);
followers never touch the Lease. The leader renews every ``Timing.renew_every`` and counts as leader until it
has failed to renew for ``Timing.renew_deadline``; a standby writes the Lease only when ``may_take`` says so,
always with the resourceVersion it read, so at most one pod publishes. A standby follows the publication, not
the pods, until the Lease looks ``abandoned`` (a third of its duration without a renewal): ``get_ready`` is told then,
so that the standby lists the pods before the Lease may be taken; ``stand_down`` when the holder has renewed it
for a whole duration since (a slow leader, not a gone one), so that the standby lets go of them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agent.core.publication.lease import (
    Observation,
    Timing,
    abandoned,
    lease_body,
    may_take,
    read_record,
    release_body,
    stands_down,
)
from agent.errors import ApiConflict, ApiError, ApiForbidden, ApiNotFound, ApiUnavailable
from agent.k8s.async_client import AsyncApi
from agent.runtime.publication.publishing import lease_path, now_wall

log = logging.getLogger("topology_agent.election")
STAND_DOWN_MOST = 64  # durations (16 min at the default 15 s): the longest a standby readied again and again keeps
# the pods it listed before it lets go of them


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Standby:
    """What a standby's elector asks of its sidecar (a leader's and a lone publisher's need none of it)."""

    get_ready: Callable[[], None] = _nothing  # the holder looks gone: list the pods now
    rank: Callable[[], int] = lambda: 0  # this standby's place among the named ones (``abandoned``)
    ready: Callable[[], bool] = lambda: True  # it could publish now: only then does it take the Lease
    stand_down: Callable[[], None] = _nothing  # the holder renews again: let go of the pods listed


class Elector:
    def __init__(self, api: AsyncApi, namespace: str, name: str, me: str, *, owner: dict[str, Any] | None,
                 timing: Timing | None = None, named_leader: bool = False,
                 clock: Callable[[], float] = time.monotonic, uid: str = "", standby: Standby = Standby()) -> None:
        self.api, self.namespace, self.name, self.me, self.owner, self.clock = api, namespace, name, me, owner, clock
        self.uid = uid  # this pod's: the Lease says which incarnation of its name holds it (leading.py)
        self.timing = timing or Timing()
        # Without RBAC for Leases the pod the journal names as leader publishes anyway (no failover); the
        # standbys then never take over.
        self.named_leader = named_leader
        self.observed = Observation()
        self.leading = False
        self.renewed_at = 0.0
        self.standby = standby  # set once, when the sidecar starts to stand by
        self.readied: int | None = None  # the renewals seen when it was told to get ready (None: not since)
        self.stand_down_after = 1  # whole durations of renewals before it stands down (doubles each time)

    async def attempt(self) -> bool:
        """One client-go tryAcquireOrRenew: whether this pod holds the Lease now."""
        path = lease_path(self.namespace, self.name)
        try:
            lease = await self.api.get_object(path)
        except ApiNotFound:
            if not self.named_leader and not self.standby.ready():
                return False
            body = lease_body(self.name, self.me, now_wall=now_wall(), previous=None, owner=self.owner,
                              duration=self.timing.duration, holder_uid=self.uid)
            try:
                written = await self.api.create(lease_path(self.namespace), body)
            except ApiConflict:
                return False
            return self._took(written)
        now = self.clock()
        record = read_record(lease)
        self.observed.see(record, now)
        if abandoned(self.observed, self.me, now, self.timing, self.standby.rank()):
            if self.readied is None:
                self.readied = self.observed.renewals
            self.standby.get_ready()
        elif self.readied is not None and stands_down(self.observed, self.me, self.readied, self.timing,
                                                      self.stand_down_after):
            self.readied = None
            self.stand_down_after = min(2 * self.stand_down_after, STAND_DOWN_MOST)
            self.standby.stand_down()
        if record.holder != self.me and not self.standby.ready():  # it would hold the Lease without publishing
            return False
        if not may_take(self.observed, self.me, now):
            return False
        body = lease_body(self.name, self.me, now_wall=now_wall(), previous=record, owner=self.owner,
                          duration=self.timing.duration, holder_uid=self.uid)
        try:
            written = await self.api.replace(path, body)
        except ApiConflict:  # another standby wrote first
            return False
        return self._took(written)

    def _took(self, written: dict[str, Any]) -> bool:
        self.observed.see(read_record(written), self.clock())
        self.readied = None
        self.renewed_at = self.clock()
        return True

    async def run(self, on_change: Callable[[bool], Awaitable[None]]) -> None:
        """Contend or renew forever; ``on_change(True/False)`` when this pod starts or stops leading."""
        forbidden_logged = False
        while True:
            try:
                leading = await self.attempt()
            except ApiForbidden as err:
                if not forbidden_logged:
                    log.warning("cannot read or write lease %s (%s); %s", self.name, err,
                                "publishing without failover (grant leases: manifests/rbac)" if self.named_leader
                                else "this pod will not take over publishing")
                    forbidden_logged = True
                leading = self.named_leader
            except (ApiUnavailable, ApiError) as err:
                # A leader that cannot reach the API keeps leading until its renew deadline has passed.
                leading = self.leading and self.clock() - self.renewed_at < self.timing.renew_deadline
                log.info("lease %s: %s (%s)", self.name, err, "still leading" if leading else "not leading")
            if leading != self.leading:
                self.leading = leading
                log.info("%s publishing the topology (lease %s)", "started" if leading else "stopped", self.name)
                await on_change(leading)
            await asyncio.sleep(self.timing.renew_every if self.leading else self.timing.retry_every)

    async def release(self) -> None:
        """On SIGTERM: let a standby take over at its next look instead of after the whole lease."""
        if not self.leading or self.observed.record is None:
            return
        body = release_body(self.name, self.observed.record, now_wall=now_wall(), owner=self.owner)
        try:
            await self.api.replace(lease_path(self.namespace, self.name), body)
            log.info("released lease %s", self.name)
        except ApiError as err:
            log.info("could not release lease %s (%s); a standby takes over when it expires", self.name, err)
        self.leading = False
