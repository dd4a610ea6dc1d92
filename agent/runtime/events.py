"""A pod's Events, sent without ever holding the job up: what to write is core/report/events.py's (the correlator and
its budget); this module sends it, off the path that configures the pod.

An occurrence is handed over on a bounded queue and the caller moves on (a full queue drops it, said once).
One sender takes them: a thread with its own client in init (init's calls block, and its timing must not depend
on the Events), a task on the sidecar's loop. A write that fails is never retried in place: 401/403 (no RBAC for
Events) and a 404 to a create (the API serves no events.k8s.io) are said once in the log and recording stops; a
5xx, a 429 or a lost connection pauses recording with a growing backoff (said once, and once when it resumes);
a series whose Event has expired (404 to its PATCH) is created again. Nothing here raises to the caller.

init also has a standing occurrence (``stand``): why it waits, asked of init (``source``) first after
``WAIT_FIRST`` seconds of waiting and then every ``OBSERVE`` seconds, so a wait that does not change is one
Event whose series counts the observations, and a wait over in less than ``WAIT_FIRST`` records none.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.core.report.events import BUDGET, Budget, Correlator, Occurrence, Ref, Write
from agent.errors import ApiConflict, ApiError, ApiForbidden, ApiNotFound, ApiUnavailable
from agent.k8s.retrying import Backoff

log = logging.getLogger("topology_agent.events")
QUEUE = 64  # occurrences waiting to be taken: far more than a pod makes between two sends
WAIT_FIRST = 5.0  # seconds of waiting before init says why (a gang complete by then records no wait)
OBSERVE = 30.0  # seconds between two observations of a wait (a series' count)
EXIT_GRACE = 1.0  # seconds init gives its last Events to be sent before the process ends


def events_path(namespace: str) -> str:
    return f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"


class Sink(Protocol):
    """The two calls an Event needs (init's blocking client has them)."""

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...


class AsyncSink(Protocol):
    """The same calls, async (the sidecar's client)."""

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...

    async def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...


@dataclass
class Counts:
    """What the Events cost, for the log and the benchmark: requests and the request bytes sent."""

    created: int = 0
    patched: int = 0
    dropped: int = 0  # occurrences or writes given up (queue full, recording paused or stopped, refused)
    sent: int = 0  # bytes of the request bodies


@dataclass
class Recording:
    """What the two senders share: the correlator, and what a failed write means."""

    correlator: Correlator
    clock: Callable[[], float] = time.time
    counts: Counts = field(default_factory=Counts)
    stopped: str | None = None  # why recording stopped for good
    paused_until: float = 0.0
    backoff: Backoff = field(default_factory=lambda: Backoff(base=1.0, cap=60.0))
    refusals: set[int] = field(default_factory=set)  # the statuses of refused Events said so far (once each)

    @property
    def path(self) -> str:
        return events_path(self.correlator.regarding.namespace)

    def writes(self, occurrence: Occurrence | None) -> list[Write]:
        """The writes to make now: ``occurrence``'s, then whatever has come due."""
        now = self.clock()
        given_up = self.correlator.given_up
        first = self.correlator.observe(occurrence, now) if occurrence is not None else None
        self.counts.dropped += self.correlator.given_up - given_up  # let go for the correlator's bound
        return ([first] if first is not None else []) + self.correlator.due(now)

    def gone(self, name: str) -> None:
        """The pod ``name`` is gone: what waits about it is never written."""
        self.counts.dropped += self.correlator.gone(name)

    def wait(self, default: float) -> float:
        """Seconds until something comes due, at most ``default``."""
        now = self.clock()
        due = self.correlator.next_due(now)
        return max(0.0, min(default, due - now)) if due is not None else default

    def sendable(self, write: Write) -> bool:
        if self.stopped is None and self.clock() >= self.paused_until:
            return True
        self.counts.dropped += 1
        self.correlator.forget(write)
        return False

    def request(self, write: Write) -> tuple[str, str, dict[str, Any]]:
        """The call a write makes: the verb, the path and the body."""
        path = self.path if write.verb == "create" else f"{self.path}/{write.name}"
        self.counts.sent += len(json.dumps(write.body))
        return write.verb, path, write.body

    def done(self, write: Write) -> None:
        if write.verb == "create":
            self.counts.created += 1
        else:
            self.counts.patched += 1
        if self.backoff.attempt:
            log.info("events resumed: the API server took %s %s", write.verb, write.name)
            self.backoff.reset()

    def failed(self, write: Write, err: ApiError) -> Write | None:
        """What a failed write means (module docstring); the write to make instead, if any."""
        if isinstance(err, ApiNotFound) and write.verb == "patch" and write.fallback is not None:
            return Write("create", write.name, write.fallback, reason=write.reason)  # the Event expired
        self.counts.dropped += 1
        self.correlator.forget(write)
        if isinstance(err, ApiForbidden):
            self.stopped = str(err)
            log.warning("events are not recorded from now on: the API server refused to create an Event in namespace "
                        "'%s' (%d); the pod's Role needs create and patch on events.k8s.io events (kubectl apply -k "
                        "manifests/rbac)", self.correlator.regarding.namespace, err.status)
        elif isinstance(err, ApiNotFound):
            self.stopped = str(err)
            log.warning("events are not recorded from now on: the API server serves no events.k8s.io/v1 Events (404 "
                        "to a create); the pod is configured all the same")
        elif isinstance(err, ApiUnavailable):
            delay = self.backoff.next_delay(err.retry_after)
            self.paused_until = self.clock() + delay
            if self.backoff.attempt == 1:
                log.warning("events paused: %s; the pod's Events resume once the API server takes them (next "
                            "try in %.0f s, backing off)", err, delay)
        elif not isinstance(err, ApiConflict) and err.status not in self.refusals:  # 409: a name taken, dropped
            self.refusals.add(err.status)
            log.warning("an Event was refused (%s); it is dropped, and others refused so are not said again", err)
        return None

    def bug(self, err: Exception) -> None:
        """Recording must never end the process: a bug stops it, in one line."""
        self.stopped = f"{type(err).__name__}: {err}"
        log.warning("events are not recorded from now on (internal error: %s; a bug in the agent)", self.stopped)


_STOP = object()


class ThreadRecorder:
    """init's Events: a daemon thread with its own client, fed through a bounded queue."""

    def __init__(self, sink: Sink, regarding: Ref, *, job: str = "", budget: Budget = BUDGET,
                 clock: Callable[[], float] = time.time, observe: float | None = None,
                 wait_first: float | None = None) -> None:
        self.sink = sink
        self.recording = Recording(Correlator(regarding, regarding.name, clock(), job=job, budget=budget), clock)
        self.queue: queue.Queue[object] = queue.Queue(maxsize=QUEUE)
        self.observe_every = OBSERVE if observe is None else observe
        self.wait_first = WAIT_FIRST if wait_first is None else wait_first
        self.lock = threading.Lock()  # held by init around what ``source`` reads
        self._source: Callable[[], Occurrence | None] | None = None
        self._next_look = 0.0
        context = contextvars.copy_context()  # its log lines are the pod's, as init's are
        self._thread = threading.Thread(target=lambda: context.run(self._run), name="events", daemon=True)
        self._thread.start()

    @property
    def counts(self) -> Counts:
        return self.recording.counts

    def record(self, occurrence: Occurrence) -> None:
        """Hand ``occurrence`` over; never blocks (a full queue drops it)."""
        try:
            self.queue.put_nowait(occurrence)
        except queue.Full:
            self.recording.counts.dropped += 1

    def stand(self, source: Callable[[], Occurrence | None] | None) -> None:
        """From now on, the wait that ``source`` describes (called under ``lock``, in the sender's thread) is
        observed after ``wait_first`` seconds, then every ``observe`` seconds; None ends it."""
        self._source = source
        self._next_look = self.recording.clock() + self.wait_first
        self.record_nothing()

    def record_nothing(self) -> None:
        """Wake the sender to look at the time again."""
        with contextlib.suppress(queue.Full):
            self.queue.put_nowait(None)

    def close(self, grace: float = EXIT_GRACE) -> None:
        """No more occurrences: what is queued is sent within ``grace`` seconds, the rest dropped."""
        self._source = None
        deadline = time.monotonic() + grace
        try:
            self.queue.put(_STOP, timeout=grace)
        except queue.Full:
            return
        self._thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        recording = self.recording
        while True:
            look = self._next_look - recording.clock() if self._source is not None else self.observe_every
            try:
                item = self.queue.get(timeout=recording.wait(max(0.0, look)))
            except queue.Empty:
                item = None
            if item is _STOP:
                return
            try:
                for write in recording.writes(item if isinstance(item, Occurrence) else self._looked()):
                    self._send(write)
            except Exception as err:
                recording.bug(err)
                return

    def _looked(self) -> Occurrence | None:
        """The standing wait, when it is time to look at it again."""
        source = self._source
        if source is None or self.recording.clock() < self._next_look:
            return None
        self._next_look = self.recording.clock() + self.observe_every
        with self.lock:
            return source()

    def _send(self, write: Write | None) -> None:
        recording = self.recording
        while write is not None and recording.sendable(write):
            verb, path, body = recording.request(write)
            try:
                (self.sink.create if verb == "create" else self.sink.patch)(path, body)
            except ApiError as err:
                write = recording.failed(write, err)
                continue
            recording.done(write)
            return


class TaskRecorder:
    """The sidecar's Events: a task on its loop (``run``, one of its root tasks), fed through a bounded queue.

    The sidecar's occurrences about other pods (the pods it refuses) are kept to pods that still exist: ``gone``
    lets go of those waiting for the bucket and of those still queued (counted per pod as they are queued, so a
    pod of the same name refused again after is recorded). init records none about other pods."""

    def __init__(self, sink: AsyncSink, regarding: Ref, *, job: str = "", budget: Budget = BUDGET,
                 clock: Callable[[], float] = time.time) -> None:
        self.sink = sink
        self.recording = Recording(Correlator(regarding, regarding.name, clock(), job=job, budget=budget), clock)
        self.queue: asyncio.Queue[Occurrence] = asyncio.Queue(maxsize=QUEUE)
        self.sent = asyncio.Condition()  # notified after each write (tests await a count)
        self.queued: collections.Counter[str] = collections.Counter()  # in the queue, per related pod name
        self.departed: dict[str, int] = {}  # of those, how many were queued before their pod was gone

    @property
    def counts(self) -> Counts:
        return self.recording.counts

    def record(self, occurrence: Occurrence) -> None:
        try:
            self.queue.put_nowait(occurrence)
        except asyncio.QueueFull:
            self.recording.counts.dropped += 1
            return
        if occurrence.related is not None:
            self.queued[occurrence.related.name] += 1

    def gone(self, name: str) -> None:
        """The pod ``name`` is gone (deleted, or let in): nothing queued or waiting about it is written."""
        if name in self.queued:
            self.departed[name] = self.queued[name]
        self.recording.gone(name)

    def pending(self) -> set[str]:
        """The pods that occurrences queued or waiting are about."""
        return set(self.queued) | set(self.recording.correlator.about)

    def _taken(self, occurrence: Occurrence) -> Occurrence | None:
        """``occurrence``, taken from the queue; None if its pod was gone meanwhile."""
        if occurrence.related is None:
            return occurrence
        name = occurrence.related.name
        self.queued[name] -= 1
        if self.queued[name] <= 0:
            del self.queued[name]
        left = self.departed.pop(name, 0)
        if not left:
            return occurrence
        if left > 1:
            self.departed[name] = left - 1
        self.recording.counts.dropped += 1
        return None

    async def run(self) -> None:
        """Send until cancelled; a bug stops recording, never the sidecar."""
        recording = self.recording
        while True:
            try:
                async with asyncio.timeout(recording.wait(3600.0)):
                    item: Occurrence | None = self._taken(await self.queue.get())
            except TimeoutError:
                item = None
            try:
                for write in recording.writes(item):
                    await self._send(write)
            except Exception as err:
                recording.bug(err)
                await asyncio.Event().wait()
            async with self.sent:
                self.sent.notify_all()

    async def _send(self, write: Write | None) -> None:
        recording = self.recording
        while write is not None and recording.sendable(write):
            verb, path, body = recording.request(write)
            try:
                await (self.sink.create if verb == "create" else self.sink.patch)(path, body)
            except ApiError as err:
                write = recording.failed(write, err)
                continue
            recording.done(write)
            return


class Refusals:
    """The sidecar's view watcher (runtime/views.Watcher) for the pods it refuses: each refused pod is recorded
    (PodRefused), and what is pending about a pod is let go once the view says it is gone: deleted, let in, or
    absent from a LIST (a deletion the watch missed). A pod refused again is told as refused, then removed from
    the view: that removal is not its end."""

    def __init__(self, recorder: TaskRecorder, namespace: str) -> None:
        self.recorder, self.namespace = recorder, namespace
        self.seen: set[str] = set()  # refused by the LIST under way (pruned to the pods pending)
        self.just = ""  # refused by the watch event the view applies now

    def refused(self, pod: Any, why: str) -> None:
        meta = pod.get("metadata", {})
        name = str(meta.get("name", "?"))
        self.recorder.record(Occurrence("PodRefused", why, related=Ref(name, self.namespace,
                                                                        str(meta.get("uid") or ""))))
        self.just = name
        self.seen.add(name)
        if len(self.seen) > 4 * QUEUE:  # a LIST of many refused pods: only those pending matter
            self.seen &= self.recorder.pending()

    def reset(self, pods: Mapping[str, Any]) -> None:
        """A LIST (or a snapshot): a pod pending that it did not refuse is a member now, or no more."""
        for name in self.recorder.pending() - self.seen:
            self.recorder.gone(name)
        self.seen.clear()
        self.just = ""

    def changed(self, name: str, pod: Any | None) -> None:
        """A watch event: a pod refused by it is removed from the view (not gone); any other pod removed is gone
        and one put is let in."""
        if name == self.just:
            self.seen.discard(name)  # refused by a watch event, not by a LIST
        else:
            self.recorder.gone(name)
        self.just = ""
