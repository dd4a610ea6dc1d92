"""What init's steps share to reach the API server and the pod's Events: its calls, each within init's deadline
(retried while the server is away, the watches reflected with an idle limit derived from ``--timeout``), and the
recorder of the pod's Events (their own client: a slow Event never holds init's calls up)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from agent.core.model import RawPod
from agent.core.report.events import Occurrence, Ref
from agent.errors import GangTimeout
from agent.k8s.core import WatchEvent
from agent.k8s.reflector import AsyncOps, Reflector, Store, reflect
from agent.k8s.reflector import Settings as ReflectorSettings
from agent.k8s.retrying import DeadlineExceeded, retried
from agent.k8s.transport import IDLE
from agent.runtime.events import Sink, ThreadRecorder

T = TypeVar("T")


class Calls:
    """init's clock and deadline, and its calls within them."""

    def __init__(self, *, timeout: float, watch_idle: float | None, clock: Callable[[], float],
                 sleep: Callable[[float], None]) -> None:
        self.clock, self.sleep = clock, sleep
        self.started = clock()
        self.deadline = self.started + timeout
        # A watch that shows no progress for a third of --timeout is dead (60 s at most): init sees a hung watch
        # in time to list again before its deadline.
        self.reflecting = ReflectorSettings.with_idle(watch_idle or min(IDLE, max(3.0, timeout / 3)))

    async def pause(self, seconds: float) -> None:
        self.sleep(seconds)

    def elapsed(self) -> float:
        return self.clock() - self.started

    async def retried(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        try:
            return await retried(call, what=what, deadline=self.deadline, sleep=self.pause, clock=self.clock)
        except DeadlineExceeded as err:
            raise GangTimeout(f"timed out after {self.elapsed():.1f} s: the API server kept failing "
                              f"({err.last}); check the API server and the pod's network") from err

    def ops(self, list_call: Callable[[], Awaitable[tuple[list[Any], str]]],
            watch_call: Callable[[str, float, float], AsyncIterator[WatchEvent]]) -> AsyncOps:
        return AsyncOps(list_call, watch_call, clock=self.clock, sleep=self.pause)

    async def reflect(self, what: str, ops: AsyncOps, store: Store, done: Callable[[], bool]) -> Reflector:
        reflector = Reflector(what, self.reflecting, now=self.clock())
        await reflect(reflector, ops, store, deadline=self.deadline, done=done)
        return reflector


class PodEvents:
    """The pod's Events, once its uid is known (``start``), if init was given where to send them."""

    def __init__(self, sink: Sink | None) -> None:
        self.sink = sink
        self.recorder: ThreadRecorder | None = None

    def start(self, me: RawPod, namespace: str, pod_name: str) -> None:
        if self.sink is not None:
            uid = me.get("metadata", {}).get("uid") or ""
            self.recorder = ThreadRecorder(self.sink, Ref(pod_name, namespace, uid))

    def name_job(self, job: str) -> None:
        if self.recorder is not None:
            self.recorder.recording.correlator.job = job

    def lock(self) -> threading.Lock:
        """What the events thread holds while it reads a standing source (a fresh one when nothing records)."""
        return self.recorder.lock if self.recorder is not None else threading.Lock()

    def stand(self, source: Callable[[], Occurrence | None] | None) -> None:
        if self.recorder is not None:
            self.recorder.stand(source)

    def tell(self, occurrence: Occurrence) -> None:
        if self.recorder is not None:
            self.recorder.record(occurrence)

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()
