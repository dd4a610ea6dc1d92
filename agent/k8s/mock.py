"""Transports that answer from a function instead of a socket, for tests: the clients, the core and the reflector
run for real above them. ``handler(request)`` returns a ``Response`` (a GET, a LIST page, a write, or a watch's
error answer) or, for a watch, the stream's chunks (an iterable of bytes; a ``Response`` among them ends the
stream with that error, an exception raised by the iterator is the transport's failure).

An answer may also be a function of the seconds it may take (a request's whole answer; each read of a watch), as
the real transports bound them, returning the ``Response`` or the chunks: a handler that waits (an in-memory API
server with its delays and silent watches) gives up when a socket would. ``AsyncMockTransport`` also awaits an
answer that is awaitable and reads async chunks, so a handler that waits never blocks the caller's loop.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from typing import Any

from agent.k8s.core import Request, Response

Chunks = Iterable[bytes] | AsyncIterable[bytes]
Handler = Callable[[Request], Any]  # Response | Chunks | (wait -> Response | Chunks), or an awaitable of one


def _bounded(answer: Any, seconds: float) -> Any:
    """The answer given the time it may take, when the handler asked for it."""
    return answer(seconds) if callable(answer) else answer


class MockTransport:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Request] = []

    def send(self, request: Request, *, timeout: float) -> Response:
        self.requests.append(request)
        answer = _bounded(self.handler(request), timeout)
        if not isinstance(answer, Response):
            raise TypeError(f"the handler answered {request.verb} with a stream")
        return answer

    def stream(self, request: Request, *, wait: float) -> tuple[Response, Iterator[bytes]]:
        self.requests.append(request)
        answer = _bounded(self.handler(request), wait)
        if isinstance(answer, Response):
            return answer, iter(())
        return Response(200), iter(answer)


class AsyncMockTransport:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Request] = []

    async def _answer(self, request: Request, seconds: float) -> Any:
        self.requests.append(request)
        answer = self.handler(request)
        if inspect.isawaitable(answer):
            answer = await answer
        answer = _bounded(answer, seconds)
        if inspect.isawaitable(answer):
            answer = await answer
        return answer

    async def send(self, request: Request, *, timeout: float) -> Response:
        answer = await self._answer(request, timeout)
        if not isinstance(answer, Response):
            raise TypeError(f"the handler answered {request.verb} with a stream")
        return answer

    async def stream(self, request: Request, *, wait: float) -> AsyncIterator[Response | bytes]:
        answer = await self._answer(request, wait)
        if isinstance(answer, Response):
            yield answer
            return
        yield Response(200)
        if not isinstance(answer, AsyncIterable):
            for chunk in answer:
                yield chunk
            return
        chunks = aiter(answer)
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            closing = getattr(chunks, "aclose", None)
            if closing is not None:
                await closing()  # a watch left early ends its stream now
