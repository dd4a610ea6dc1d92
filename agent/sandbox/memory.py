"""The sandbox's API in memory: the same store, objects, paged LISTs, watches, bookmarks, 410s and fault knobs as
the HTTPS server (one implementation: ``Sandbox.answer`` and ``Watches.stream``), reached by a function call
instead of a socket. The agent's own clients run over it through the mock transports (k8s/mock.py), so init, the
sidecar and their faults are tested in one process, in milliseconds, against real API semantics.

The sandbox runs on its own event loop in a thread (threaded.py), as over HTTPS, so a blocking caller (init's
client, in any thread) and an async one (the sidecar's, on the test's loop) reach it alike and the tests change it
with the same helpers. A request is a ``Call``; its answer comes back as an ``Answer``, a watch as its lines as
they are written. What a transport would see goes wrong as Python's own errors: ``ConnectionResetError`` for a
connection closed without an answer (the server down, a reset fault, a dropped watch), ``TimeoutError`` for no
whole answer in time or a watch silent for longer than its read wait; the caller's transport maps them as it
maps a socket's. Trickling bytes is a property of a socket and is left to the HTTPS server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from agent.sandbox.calls import Answer, Call, failure, route
from agent.sandbox.server import Cut
from agent.sandbox.threaded import SandboxThread
from agent.sandbox.watching import Watch

_END, _CUT = object(), object()  # a watch's last item: ended by the server, or cut


class Asked(Protocol):
    """What the sandbox reads of a client's request (the agent's ``k8s.core.Request`` has it)."""

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def query(self) -> tuple[tuple[str, str], ...]: ...

    @property
    def accept(self) -> str: ...

    @property
    def body(self) -> bytes | None: ...  # JSON; a request with a ``content_type`` (a JSON patch) names its own


class Memory(SandboxThread):
    """A sandbox that opens no socket: ``send``/``stream`` for blocking callers, ``send_async``/``stream_async``
    for callers on an event loop (other than the sandbox's own)."""

    def __init__(self, state_dir: Path, **kwargs: Any) -> None:
        super().__init__(state_dir, listen=False, **kwargs)
        self.opened: list[tuple[str, str]] = []  # (client, path) of each watch as it is opened, in order
        self.on_open: Callable[[], None] = lambda: None  # called as each is: a test awaits a watch open

    def watching(self, agent: str, path: str) -> bool:
        """Whether the sandbox has opened a watch of ``path`` for ``agent`` (from then on a drop cuts it)."""
        return (agent, path) in list(self.opened)

    def _call(self, asked: Asked, agent: str) -> Call | Answer:
        parts = route(asked.path)
        if parts is None:
            return failure(404, "NotFound", "the server could not find the requested resource")
        return Call(asked.method, asked.path, parts, dict(asked.query), accept=asked.accept, body=asked.body or b"",
                    content_type=getattr(asked, "content_type", "application/json"), agent=agent)

    async def _answer(self, call: Call | Answer) -> Answer | Watch:
        if isinstance(call, Answer):
            return call
        try:
            return await self.sandbox.answer(call)
        except Cut as err:
            raise ConnectionResetError(str(err)) from None

    async def _one(self, call: Call | Answer) -> Answer:
        answered = await self._answer(call)
        if isinstance(answered, Watch):
            return failure(400, "BadRequest", "a watch is read as a stream")
        return answered

    async def _follow(self, watch: Watch, put: Callable[[object], None]) -> None:
        """The watch's lines to ``put``, then how it ended."""
        async def write(line: bytes) -> None:
            put(line)

        ended = _CUT
        self.opened.append((watch.agent, watch.path))
        self.on_open()  # nothing else runs on this loop until the stream has its watcher and can be dropped
        try:
            await self.sandbox.watches.stream(watch, write)
            ended = _END
        finally:
            put(ended)

    # --- blocking callers --------------------------------------------------------------------------------

    def send(self, asked: Asked, *, agent: str, timeout: float) -> Answer:
        future = asyncio.run_coroutine_threadsafe(self._one(self._call(asked, agent)), self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout:.1f} s") from None

    def stream(self, asked: Asked, *, agent: str, wait: float) -> Answer | Iterator[bytes]:
        """An error answer, or the watch's lines: each waited for at most ``wait`` seconds."""
        future = asyncio.run_coroutine_threadsafe(self._answer(self._call(asked, agent)), self.loop)
        try:
            answered = future.result(wait)  # the head of the answer, as a socket's read waits for it
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer within {wait:.1f} s") from None
        if isinstance(answered, Answer):
            return answered
        lines: queue.SimpleQueue[object] = queue.SimpleQueue()
        return self._lines(lines, asyncio.run_coroutine_threadsafe(self._follow(answered, lines.put), self.loop),
                           wait)

    @staticmethod
    def _lines(lines: queue.SimpleQueue[object], following: concurrent.futures.Future[None],
               wait: float) -> Iterator[bytes]:
        try:
            while True:
                try:
                    item = lines.get(timeout=wait)
                except queue.Empty:
                    raise TimeoutError(f"no line for {wait:.1f} s") from None
                if item is _END:
                    return
                if item is _CUT:
                    raise ConnectionResetError("the watch was cut")
                yield item  # type: ignore[misc]
        finally:
            following.cancel()  # a watch left early is closed on the sandbox's side too

    # --- callers on an event loop ------------------------------------------------------------------------

    async def send_async(self, asked: Asked, *, agent: str, timeout: float) -> Answer:
        future = asyncio.run_coroutine_threadsafe(self._one(self._call(asked, agent)), self.loop)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.wrap_future(future)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout:.1f} s") from None

    async def stream_async(self, asked: Asked, *, agent: str, wait: float) -> Answer | AsyncIterator[bytes]:
        """An error answer, or the watch's lines: each waited for at most ``wait`` seconds."""
        future = asyncio.run_coroutine_threadsafe(self._answer(self._call(asked, agent)), self.loop)
        try:
            async with asyncio.timeout(wait):
                answered = await asyncio.wrap_future(future)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer within {wait:.1f} s") from None
        if isinstance(answered, Answer):
            return answered
        mine = asyncio.get_running_loop()
        lines: asyncio.Queue[object] = asyncio.Queue()

        def put(item: object) -> None:
            with contextlib.suppress(RuntimeError):  # the caller's loop has closed: nobody reads any more
                mine.call_soon_threadsafe(lines.put_nowait, item)

        return self._lines_async(lines, asyncio.run_coroutine_threadsafe(self._follow(answered, put), self.loop),
                                 wait)

    @staticmethod
    async def _lines_async(lines: asyncio.Queue[object], following: concurrent.futures.Future[None],
                           wait: float) -> AsyncIterator[bytes]:
        try:
            while True:
                try:
                    # not wait_for: on 3.11 a cancel that meets a line is swallowed (gh-86296), and the watch of
                    # a follower told to stop went on forever (a standby's switch back to the publication)
                    async with asyncio.timeout(wait):
                        item = await lines.get()
                except TimeoutError:
                    raise TimeoutError(f"no line for {wait:.1f} s") from None
                if item is _END:
                    return
                if item is _CUT:
                    raise ConnectionResetError("the watch was cut")
                yield item  # type: ignore[misc]
        finally:
            following.cancel()
