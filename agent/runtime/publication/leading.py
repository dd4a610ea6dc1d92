"""init's side of the publisher Lease of a large job: who leads is core/publication/leading.py's to say; this module
reads and writes the Lease for it.

- ``claim``: a training pod's first look (a GET, and a GET of the holder pod's metadata once: ``judge``, whose
  answer spares the read of the publication's writer later), then a create where there is none, or a write over it
  with the resourceVersion read where ``leading.claim`` says so; a 409 is another init's win, and one more look
  says whose.
- ``guard``: a guard's look while it waits for the publication (a GET every few seconds), and the take-over.
- ``keep``: while this init leads, a thread renews the Lease every ``Timing.renew_every``: init's calls block (a
  LIST of 16384 pods takes seconds, a gang wait minutes), and a Lease left unrenewed for its duration is a guard's
  to take. It stops when init ends; the sidecar renews from then on (election.py).
- ``hand_to``: a leader whose snapshot was there already (written by a pod of this job) gives that pod the Lease:
  only that pod may write over its copy (the admission policy), and its sidecar publishes once it holds the Lease.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from agent.core.escaping import pod_name_shown, shown
from agent.core.publication import leading
from agent.core.publication.lease import Observation, Record, Timing, lease_body, read_record
from agent.errors import ApiConflict, ApiError, ApiNotFound
from agent.runtime.publication.publishing import lease_path, now_wall

if TYPE_CHECKING:  # the protocol's module imports aiohttp, which init does not load (k8s/blocking.py)
    from agent.k8s.async_client import AsyncApi

log = logging.getLogger("topology_agent.init")
Retried = Callable[[Callable[[], Awaitable[Any]], str], Awaitable[Any]]
Judge = Callable[[Record], Awaitable["str | None"]]  # why the Lease's holder is no live pod of this job, or None
STOP_WAIT = 5.0  # seconds init waits at its end for a renewal in flight (the thread otherwise ends at once)


class LeaseCalls(Protocol):
    """The blocking calls the renewing thread makes (init's client)."""

    def get_object(self, path: str, *, metadata_only: bool = False) -> dict[str, Any]: ...

    def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...


class InitLease:
    """The Lease as one init sees it: what it observed, and while it holds the Lease, its renewals (``Keeper``)."""

    def __init__(self, api: AsyncApi, namespace: str, name: str, me: str, *, owner: dict[str, Any] | None,
                 timing: Timing, clock: Callable[[], float], blocking: LeaseCalls | None = None, uid: str = "",
                 judge: Judge | None = None) -> None:
        self.api, self.namespace, self.name, self.me, self.uid, self.owner = api, namespace, name, me, uid, owner
        self.timing, self.clock, self.judge = timing, clock, judge
        self._judged: dict[tuple[str, str], str | None] = {}  # each holder (name, uid) is read once
        self.observed = Observation()
        self.keeper = Keeper(self, blocking)

    @property
    def path(self) -> str:
        return lease_path(self.namespace, self.name)

    @property
    def owner_uid(self) -> str:
        return str((self.owner or {}).get("uid") or "")

    @property
    def holder(self) -> str:
        """Who holds the Lease, as this init saw it last ("" before it looked, or when nobody does)."""
        return self.observed.record.holder if self.observed.record is not None else ""

    @property
    def holding(self) -> bool:
        return self.keeper.record is not None

    def body(self, holder: str, previous: Record | None) -> dict[str, Any]:
        """The Lease written over ``previous`` (created when None), held by ``holder``."""
        return lease_body(self.name, holder, now_wall=now_wall(), previous=previous, owner=self.owner,
                          duration=self.timing.duration, holder_uid=self.uid if holder == self.me else "")

    async def claim(self, retried: Retried) -> bool:
        """Whether this init leads: True once it created the Lease or wrote over it, False when another pod of
        this job holds it. ``ApiForbidden`` (no RBAC for Leases) goes to the caller."""
        for _ in range(2):  # a 409: another init wrote first, and the second look says who
            try:
                lease = await retried(lambda: self.api.get_object(self.path), f"read lease {self.name}")
            except ApiNotFound:
                lease = None
            record = read_record(lease) if lease is not None else None
            if record is not None:
                self.observed.see(record, self.clock())
            why = await self._holder(record)
            verdict = leading.claim(record, me=self.me, owner_uid=self.owner_uid, holder_live=why is None)
            if verdict is leading.Claim.FOLLOW:
                log.info("lease %s is held by pod %s: it publishes the topology", self.name,
                         pod_name_shown(record.holder) if record is not None else "?")
                return False
            try:
                await retried(functools.partial(self._write, record), f"write lease {self.name}")
            except ApiConflict:
                continue
            log.info("lease %s %s: this pod lists the pods and publishes the topology", self.name,
                     _taken(record, self, why))
            return True
        return False

    async def _holder(self, record: Record | None) -> str | None:
        """Why the holder of a Lease this init would follow is no live pod of this job (``judge``), or None."""
        if self.judge is None or not leading.judges_holder(record, me=self.me, owner_uid=self.owner_uid):
            return None
        assert record is not None
        key = (record.holder, record.holder_uid)
        if key not in self._judged:
            self._judged[key] = await self.judge(record)
        return self._judged[key]

    async def guard(self) -> bool:
        """A guard's look (core/publication/leading.py): True when it took the Lease over, and this init leads from now
        on. A failed look is no verdict: the next one comes within seconds."""
        try:
            lease: dict[str, Any] | None = await self.api.get_object(self.path)
        except ApiNotFound:
            lease = None
        except ApiError as err:
            log.info("lease %s: cannot look at it now (%s)", self.name, err)
            return False
        now = self.clock()
        record = read_record(lease) if lease is not None else None
        holder = None
        if record is not None:
            self.observed.see(record, now)
            try:
                holder = await self._holder(record)
            except ApiError as err:
                log.info("lease %s: cannot read its holder now (%s)", self.name, err)
            if not leading.takes_over(self.observed, me=self.me, owner_uid=self.owner_uid, now=now,
                                      holder_live=holder is None):
                return False
        why = _taken(record, self, holder) if record is None or leading.claim(
            record, me=self.me, owner_uid=self.owner_uid, holder_live=holder is None) is leading.Claim.TAKE else \
            f"taken over from pod {pod_name_shown(record.holder)}: not renewed for " \
            f"{now - self.observed.changed_at:.1f} s"
        try:
            await self._write(record)
        except ApiError as err:  # a 409: another guard was first
            log.info("lease %s: not taken over (%s)", self.name, err)
            return False
        log.warning("lease %s %s; this pod lists the pods and publishes the topology instead", self.name, why)
        return True

    async def _write(self, previous: Record | None) -> None:
        """Create the Lease (``previous`` None) or write over the record read, as its holder from now on."""
        body = self.body(self.me, previous)
        written = await (self.api.create(lease_path(self.namespace), body) if previous is None else
                         self.api.replace(self.path, body))
        record = read_record(written)
        self.observed.see(record, self.clock())
        self.keeper.record = record

    def keep(self) -> None:
        """Renew the Lease from a thread of its own until ``stop``."""
        self.keeper.start()

    def stop(self) -> None:
        self.keeper.stop()

    async def hand_to(self, holder: str) -> None:
        """Give the Lease to ``holder``, the pod that wrote the copy found: only it may write over its copy, and
        its init or sidecar renews the Lease as its own (election.py)."""
        self.keeper.stop()
        previous, self.keeper.record = self.keeper.record, None
        if previous is None:
            return
        try:
            await self.api.replace(self.path, self.body(holder, previous))
        except ApiError as err:
            log.info("lease %s: not handed to %s (%s); it is free once this init stops renewing it", self.name,
                     holder, err)
            return
        log.info("handed lease %s to pod %s, which wrote the published topology found: only it writes over it",
                 self.name, holder)


class Keeper:
    """While an init holds the Lease, a thread renews it every ``Timing.renew_every`` with init's blocking client;
    ``record`` is what it wrote last (None: not held), shared with init's thread under a lock."""

    def __init__(self, lease: InitLease, blocking: LeaseCalls | None) -> None:
        self.lease, self.blocking = lease, blocking
        self._lock = threading.Lock()
        self._record: Record | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def record(self) -> Record | None:
        with self._lock:
            return self._record

    @record.setter
    def record(self, record: Record | None) -> None:
        with self._lock:
            self._record = record

    def start(self) -> None:
        if self.blocking is None or self.record is None or self._thread is not None:
            return
        self._stop = threading.Event()  # a guard that handed the Lease on may hold it again later
        context = contextvars.copy_context()  # its log lines are the pod's, as init's are
        self._thread = threading.Thread(target=lambda: context.run(self._renew), name="lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT)
            self._thread = None

    def _renew(self) -> None:
        assert self.blocking is not None
        lease, failing = self.lease, False  # a failure is said once, until a renewal works again
        while not self._stop.wait(lease.timing.renew_every):
            previous = self.record
            if previous is None:
                return
            try:
                written = self.blocking.replace(lease.path, lease.body(lease.me, previous))
            except ApiConflict:
                if self._lost():
                    return
                continue
            except ApiError as err:
                if not failing:
                    log.info("lease %s: not renewed (%s); trying again every %.1f s", lease.name, err,
                             lease.timing.renew_every)
                failing = True
                continue
            failing = False
            with self._lock:
                if self._record is not None:
                    self._record = read_record(written)

    def _lost(self) -> bool:
        """After a 409 to a renewal: whether another pod holds the Lease now (a guard that found it unrenewed)."""
        assert self.blocking is not None
        lease = self.lease
        try:
            record: Record | None = read_record(self.blocking.get_object(lease.path))
        except ApiNotFound:
            record = None
        except ApiError:
            return False
        with self._lock:
            if record is not None and record.holder == lease.me:
                self._record = record
                return False
            self._record = None
        log.warning("lease %s is held by %s now, not by this pod (it was not renewed in time); this init still "
                    "publishes if the snapshot is not there yet (its create decides), and gives way otherwise",
                    lease.name, pod_name_shown(record.holder) if record is not None and record.holder else "nobody")
        return True


def _taken(record: Record | None, lease: InitLease, why: str | None = None) -> str:
    """How this init came to hold the Lease, for its log line (``why``: its holder is no live pod of this job)."""
    if record is None:
        return "created"
    if why is not None:
        return f"held by pod {pod_name_shown(record.holder)}, no live pod of this job ({why}), taken over"
    if record.holder == lease.me:
        return "held under this pod's name, taken again"
    if not record.holder:
        return "free, taken"
    return f"left by an earlier incarnation of the job (owner uid {shown(record.owner_uid)}), taken over"
