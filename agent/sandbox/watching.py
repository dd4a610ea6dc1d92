"""WATCH streams as the API server sends them, and the faulty ones the tests ask for.

A watch from resourceVersion "" or "0" starts with the current objects as ADDED; one from N replays the logged
events after N (410 Expired once the log has forgotten N), then streams new ones, with BOOKMARKs when asked. A
label- or field-selected watch sees an object that stops matching as DELETED and one that starts as ADDED.
Every open stream and its task are tracked, so that a dropped watch is cut (no final chunk, as a lost
connection) and stop() does not wait for a stream that never ends. A stream's lines go to a ``write`` function:
an HTTPS response's (``serve``), or an in-memory client's (memory.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agent.sandbox.faults import Knobs
from agent.sandbox.store import Gone, Obj, Store, Watcher

HEADERS = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
Write = Callable[[bytes], Awaitable[Any]]
GONE = json.dumps({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                               "status": "Failure", "message": "too old resource version",
                                               "reason": "Expired", "code": 410}}).encode() + b"\n"


@dataclass(frozen=True)
class Watch:
    """A WATCH asked for: what it watches (a resource in a namespace, through the request's selectors), from
    which resourceVersion, for how long, with bookmarks or not; and who asks (the stats count by it)."""

    resource: str
    namespace: str | None
    matches: Callable[[Obj], bool]
    kind: str
    api_version: str
    path: str
    resource_version: str = ""
    bookmarks: bool = False
    timeout: float | None = None
    agent: str = "?"
    shown: Callable[[Obj], Obj] | None = None  # how a stored object is shown in the watch's version


class Watches:
    """The open watch streams of one sandbox, and the tasks a drop or stop cancels."""

    def __init__(self, store: Store, knobs: Knobs, bookmark_interval: float) -> None:
        self.store = store
        self.knobs = knobs
        self.bookmark_interval = bookmark_interval
        self.tasks: set[asyncio.Task[Any]] = set()
        self.streams: set[web.StreamResponse] = set()

    @contextlib.contextmanager
    def cancellable(self) -> Iterator[None]:
        """The current task (a watch, an answer a fault delays) is cancelled by drop(), so stop() ends it."""
        task = asyncio.current_task()
        if task:
            self.tasks.add(task)
        try:
            yield
        finally:
            if task:
                self.tasks.discard(task)

    async def drop(self) -> None:
        for stream in list(self.streams):
            transport = stream._req.transport if stream._req else None  # cut, not close: no final chunk
            if transport:
                transport.abort()
        for task in list(self.tasks):
            task.cancel()

    async def serve(self, request: web.Request, watch: Watch) -> web.StreamResponse:
        """The watch as an HTTPS response; a dropped one is cut (its connection aborted, no final chunk)."""
        response = web.StreamResponse(headers=HEADERS)
        await response.prepare(request)
        count = self.knobs.stats.count
        version = request.version
        count(watch.agent, headers=len(f"HTTP/{version.major}.{version.minor} {response.status} {response.reason}\r\n")
              + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in response.headers.items()) + 2)

        async def write(line: bytes) -> None:  # each line one chunk: its size in hex, CRLF, the line, CRLF
            count(watch.agent, headers=len(f"{len(line):x}\r\n") + 2)
            await response.write(line)

        self.streams.add(response)
        try:
            await self.stream(watch, write)
            with contextlib.suppress(ConnectionResetError):
                await response.write_eof()
                count(watch.agent, headers=len(b"0\r\n\r\n"))
        except (asyncio.CancelledError, ConnectionResetError):
            pass
        finally:
            self.streams.discard(response)
        return response

    async def stream(self, watch: Watch, write: Write) -> None:
        """The watch's lines, as the API server sends them (or as the watch fault asks), until the timeout asked
        or the store ends it; ``CancelledError`` when dropped or stopped (a cut connection)."""
        self.knobs.stats.count(watch.agent, watch=True)
        faults = self.knobs.faults
        if faults.watch and faults.applies(watch.path):
            await self._faulty(faults.watch, write)
            return
        watcher = Watcher(resource=watch.resource, namespace=watch.namespace)
        self.store.watchers.add(watcher)  # before the first line: no event is missed meanwhile
        stream = _Stream(write, watch.agent, self.knobs, self.store, watcher, watch.matches, watch.shown)
        try:
            with self.cancellable():
                if await stream.begin(watch.resource_version):
                    await stream.follow(watch.timeout, self.bookmark_interval if watch.bookmarks else None,
                                        watch.kind, watch.api_version)
        finally:
            self.store.watchers.discard(watcher)

    async def _faulty(self, mode: str, write: Write) -> None:
        """A watch that goes wrong as the fault asks: the headers, then nothing until the client gives up
        ("hang"), nothing at all ("empty"), or 410 Gone at once ("gone")."""
        with self.cancellable():
            if mode == "hang":
                await asyncio.Event().wait()
            elif mode == "gone":
                await write(GONE)


class _Stream:
    """One watch's events, as its client is allowed to see them (its namespace, its selectors)."""

    def __init__(self, write: Write, agent: str, knobs: Knobs, store: Store, watcher: Watcher,
                 matches: Callable[[Obj], bool], shown: Callable[[Obj], Obj] | None = None) -> None:
        self.shown = shown
        self.write = write
        self.agent = agent
        self.knobs = knobs
        self.store = store
        self.watcher = watcher
        self.matches = matches

    async def send(self, event_type: str, obj: Obj) -> None:
        if self.shown is not None and event_type in ("ADDED", "MODIFIED", "DELETED"):
            obj = self.shown(obj)
        line = json.dumps({"type": event_type, "object": obj}).encode() + b"\n"
        self.knobs.stats.count(self.agent, nbytes=len(line))
        await self.write(line)
        self.knobs.stats.last_event[self.agent] = time.perf_counter()  # benchmarks: when the API sent it

    def in_scope(self, obj: Obj | None) -> bool:
        namespace = self.watcher.namespace
        return obj is not None and (not namespace or obj["metadata"].get("namespace") == namespace) \
            and self.matches(obj)

    async def deliver(self, event_type: str, old: Obj | None, new: Obj) -> None:
        """The event as this watch sees it: a change across its selectors is an ADDED or a DELETED."""
        was, now_ = self.in_scope(old), self.in_scope(new)
        if event_type == "DELETED":
            if was:
                await self.send("DELETED", new)
        elif event_type == "ADDED":
            if now_:
                await self.send("ADDED", new)
        elif was and not now_:
            await self.send("DELETED", new)
        elif now_ and not was:
            await self.send("ADDED", new)
        elif now_:
            await self.send("MODIFIED", new)

    async def begin(self, raw_rv: str) -> bool:
        """The events before the live ones: the current objects, or the log's since ``raw_rv``; False after a
        410 (the stream is over)."""
        resource, namespace = self.watcher.resource, self.watcher.namespace
        if raw_rv in ("", "0"):
            for obj in sorted(self.store.list(resource, namespace), key=lambda o: o["metadata"]["name"]):
                if self.in_scope(obj):
                    await self.send("ADDED", obj)
            return True
        try:
            backlog = self.store.events_since(int(raw_rv), resource)
        except (Gone, ValueError):
            await self.send("ERROR", {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                      "message": f"too old resource version: {raw_rv} ({self.store.oldest})",
                                      "reason": "Expired", "code": 410})
            return False
        for event in backlog:
            await self.deliver(event.kind, event.old, event.new)
        # Events already replayed from the log are also in the queue: skip what we sent.
        replayed = backlog[-1].rv if backlog else int(raw_rv)
        queue = self.watcher.queue
        while not queue.empty():
            item = queue.get_nowait()
            if item and item[1].rv > replayed:  # type: ignore[attr-defined]
                await self.deliver(item[0], item[1].old, item[1].new)  # type: ignore[attr-defined]
        return True

    async def follow(self, timeout: float | None, bookmark_interval: float | None, kind: str,
                     api_version: str) -> None:
        """The live events until ``timeout`` or the store ends the watch, a BOOKMARK at each quiet interval."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        while True:
            wait = bookmark_interval if bookmark_interval is not None else 3600.0
            if deadline is not None:
                wait = min(wait, deadline - loop.time())
                if wait <= 0:
                    break
            try:
                async with asyncio.timeout(wait):  # not wait_for: on 3.11 it can swallow a cancel (gh-86296)
                    item = await self.watcher.queue.get()
            except TimeoutError:
                # A BOOKMARK says every event up to its version was sent: never while one waits in the queue (a
                # write can land as the wait ends; the client resuming from the bookmark would skip it).
                if bookmark_interval is not None and self.watcher.queue.empty():
                    await self.send("BOOKMARK", {"kind": kind, "apiVersion": api_version,
                                                 "metadata": {"resourceVersion": str(self.store.rv)}})
                continue
            if item is None:
                break
            logged = item[1]
            await self.deliver(item[0], logged.old, logged.new)  # type: ignore[attr-defined]
