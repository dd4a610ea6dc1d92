"""The one reflector: list, then watch from the list's resourceVersion, for every loop of the agent (init's gang
wait, init's wait for the published topology, and the sidecar's pods and journal watches).

Decisions are made by ``Reflector`` (pure: no I/O, no clock of its own), as client-go's tools/cache Reflector
makes them, with the faults seen against real and broken API servers in mind:

* a watch asks for bookmarks and for a server-side end (``timeoutSeconds`` of 40-55 s): a healthy watch shows
  progress at least that often (the API server's watch cache also bookmarks every minute), so one that shows
  none for ``idle`` seconds (60) is dead, whether it hangs silently or trickles bytes; the list is read again
  (a watch that hung may hang again, a LIST shows what it hid);
* a watch that ends at once is not restarted at once: watch starts are at least ``min_watch_interval`` apart;
* 410 Gone lists again after a random pause (the relists of N pods spread over ``relist_jitter`` seconds), and
  failures back off (0.8 s doubling to 30 s, with jitter, never below 0.8 s whatever Retry-After says);
* a list, an event, a bookmark, or a watch the server ended after running its course is progress; nothing else
  is. ``stale_for`` tells the runtime how long it has been without progress (the sidecar's /readyz).
* what it is handed is bounded by the clients: a LIST is read a page at a time and each page an object at a
  time, a watch an event at a time, and an object over its size budget (core.budget_for: 512 KiB for a pod) is
  dropped unread, said once, and is neither listed nor an event here: it is as absent as a pod that does not
  exist, so it never stalls a wait nor costs more than its budget.

``reflect`` is the one driver: a coroutine over ``Ops`` (list, watch, sleep, clock) that feeds a ``Store``
(runtime/views.py), as client-go's reflector feeds its store: a LIST replaces what the store holds, each event
applies one change. init and the sidecar give it the same async client face (init's is k8s/blocking.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agent.errors import ApiGone, ApiStalled, ApiUnavailable
from agent.k8s.core import WatchEvent
from agent.k8s.retrying import Backoff
from agent.k8s.transport import IDLE

log = logging.getLogger("topology_agent.reflector")


@dataclass(frozen=True)
class Settings:
    idle: float = IDLE  # seconds without progress before a watch counts as dead
    watch_seconds: tuple[float, float] = (40.0, 55.0)  # timeoutSeconds asked, jittered; under ``idle``
    min_watch_interval: float = 1.0  # seconds between two watch starts
    relist_jitter: float = 2.0  # a 410's relist waits a random part of this

    @classmethod
    def with_idle(cls, idle: float) -> Settings:
        """Settings for an inactivity deadline of ``idle`` seconds: the watches then ask the server to end them
        in 2/3 to 0.9 of it, so a healthy watch always shows progress in time; a relist's random pause stays
        within half of it, so a hung watch is replaced, and its hidden changes listed, within 2x ``idle``."""
        return cls(idle=idle, watch_seconds=(idle * 2 / 3, idle * 0.9), relist_jitter=min(2.0, idle / 2))


class Reflector:
    """Where a list+watch stands: the resourceVersion, what to do next and when, how long since progress."""

    def __init__(self, what: str, settings: Settings | None = None, *, rand: Callable[[], float] = random.random,
                 now: float = 0.0) -> None:
        self.what = what
        self.settings = settings or Settings()
        self.rand = rand
        self.rv = ""
        self.need_list = True
        self.backoff = Backoff()
        self.not_before = now
        self.last_watch = float("-inf")
        self.watch_started = 0.0
        self.watch_asked = 0.0
        self.last_progress = now
        self.last_error: str | None = None
        self.gone = 0  # 410s since the last watch that worked

    def next(self, now: float) -> tuple[str, float]:
        """("list" or "watch", seconds to wait before it)."""
        kind = "list" if self.need_list or not self.rv else "watch"
        earliest = self.not_before
        if kind == "watch":
            earliest = max(earliest, self.last_watch + self.settings.min_watch_interval)
        return kind, max(0.0, earliest - now)

    def watch_timeout(self, now: float) -> float:
        low, high = self.settings.watch_seconds
        self.last_watch = self.watch_started = now
        self.watch_asked = low + (high - low) * self.rand()
        return self.watch_asked

    def _progress(self, now: float, *, watching: bool) -> None:
        """A list is progress for staleness; only a watch that works ends the failures (a list that succeeds
        between two 410s or two 503s would otherwise reset the backoff every time: 2 requests/s for ever)."""
        self.last_progress = now
        self.last_error = None
        if watching:
            self.backoff.reset()
            self.gone = 0

    def listed(self, rv: str, now: float) -> None:
        self.rv, self.need_list = rv, False
        self._progress(now, watching=False)

    def event(self, event: WatchEvent, now: float) -> None:
        if event.resource_version:
            self.rv = event.resource_version
        self._progress(now, watching=True)

    def ended(self, now: float) -> None:
        """The server ended the watch: progress when it ran its course (an empty watch that ends at once is not)."""
        if now - self.watch_started >= self.watch_asked / 2:
            self._progress(now, watching=True)

    def failed(self, err: ApiGone | ApiUnavailable, now: float) -> float:
        """Note a failure; the seconds until the next request."""
        if isinstance(err, ApiGone | ApiStalled):
            # A 410, or a watch that hung (it may hang again: a LIST shows what it hid). Every pod's watch expires
            # together when the API server compacts: spread the relists, then back off.
            self.need_list = True
            self.gone += 1
            delay = self.settings.relist_jitter * self.rand() if self.gone == 1 else self.backoff.next_delay()
        else:
            delay = self.backoff.next_delay(err.retry_after)
            if not self.rv:
                self.need_list = True
        self.last_error = str(err)
        self.not_before = now + delay
        return delay

    def stale_for(self, now: float) -> float:
        return now - self.last_progress


class Ops(Protocol):
    """The I/O the driver needs: one list, one watch, a sleep, a clock; ``seen`` hears each event first."""

    async def list(self) -> tuple[list[Any], str]: ...

    def watch(self, rv: str, timeout: float, idle: float) -> AsyncIterator[WatchEvent]: ...

    def seen(self, event: WatchEvent) -> None: ...

    async def sleep(self, seconds: float) -> None: ...

    def clock(self) -> float: ...


class Store(Protocol):
    """What a list+watch keeps (client-go's Store): a LIST replaces it, each watch event applies one change.
    Either may raise ``ApiGone`` to have the list read again."""

    def replace(self, items: list[Any]) -> None: ...

    def apply(self, event: WatchEvent) -> None: ...


async def reflect(reflector: Reflector, ops: Ops, store: Store, *, deadline: float | None = None,
                  done: Callable[[], bool] = lambda: False) -> bool:
    """List and watch into ``store`` until ``done`` says enough (True), or until ``deadline`` (False). 410 and
    transient errors are handled here; anything else (403, an untrusted certificate) goes to the caller."""
    while not done():
        now = ops.clock()
        kind, wait = reflector.next(now)
        if deadline is not None:
            if now >= deadline:
                return False
            wait = min(wait, deadline - now)
        if wait > 0:
            await ops.sleep(wait)
            continue
        try:
            if kind == "list":
                items, rv = await ops.list()
                store.replace(items)
                del items
                reflector.listed(rv, ops.clock())
                continue
            timeout = reflector.watch_timeout(ops.clock())
            stream = ops.watch(reflector.rv, timeout, reflector.settings.idle)
            try:
                async for event in stream:
                    reflector.event(event, ops.clock())
                    ops.seen(event)
                    store.apply(event)
                    if done():
                        return True
                    if deadline is not None and ops.clock() >= deadline:
                        return False
            finally:
                await aclose(stream)
            reflector.ended(ops.clock())
        except (ApiGone, ApiUnavailable) as err:
            delay = reflector.failed(err, ops.clock())
            log.info("%s: %s; %s in %.1f s (resourceVersion %s)", reflector.what, err,
                     "listing again" if reflector.need_list else "watching again", delay, reflector.rv or "-")
    return True


async def aclose(stream: AsyncIterator[Any]) -> None:
    """A watch's connection is closed as the watch is left, not when its stream is collected: its socket, held by
    a generator in a cycle, outlived the client's close (init) otherwise. Streams that wrap a watch call this on
    the watch they wrap."""
    closing = getattr(stream, "aclose", None)
    if closing is not None:
        await closing()


class AsyncOps:
    """``Ops`` over the client's calls. ``on_request("list" or "watch")`` is called as each request starts (the
    sidecar's liveness: its loop is alive even while the API server is away), ``on_event`` with each event (its
    metrics)."""

    def __init__(self, list_call: Callable[[], Awaitable[tuple[list[Any], str]]],
                 watch_call: Callable[[str, float, float], AsyncIterator[WatchEvent]], *,
                 clock: Callable[[], float], on_request: Callable[[str], None] = lambda kind: None,
                 on_event: Callable[[WatchEvent], None] = lambda event: None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._list, self._watch, self.clock, self._on_request = list_call, watch_call, clock, on_request
        self._sleep, self.seen = sleep, on_event

    async def list(self) -> tuple[list[Any], str]:
        self._on_request("list")
        return await self._list()

    def watch(self, rv: str, timeout: float, idle: float) -> AsyncIterator[WatchEvent]:
        self._on_request("watch")
        return self._watch(rv, timeout, idle)

    async def sleep(self, seconds: float) -> None:
        await self._sleep(seconds)
