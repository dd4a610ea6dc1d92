"""Transports that answer from a function instead of a socket, for tests: the clients, the core and the reflector
run for real above them. ``handler(request)`` returns a ``Response`` (a GET, a LIST page, a write, or a watch's
error answer) or, for a watch, the stream's chunks (an iterable of bytes; a ``Response`` among them ends the
stream with that error, an exception raised by the iterator is the transport's failure).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator

from agent.k8s.core import Request, Response

Handler = Callable[[Request], "Response | Iterable[bytes]"]


class MockTransport:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Request] = []

    def send(self, request: Request, *, timeout: float) -> Response:
        self.requests.append(request)
        answer = self.handler(request)
        if not isinstance(answer, Response):
            raise TypeError(f"the handler answered {request.verb} with a stream")
        return answer

    def stream(self, request: Request, *, wait: float) -> tuple[Response, Iterator[bytes]]:
        self.requests.append(request)
        answer = self.handler(request)
        if isinstance(answer, Response):
            return answer, iter(())
        return Response(200), iter(answer)


class AsyncMockTransport:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Request] = []

    async def send(self, request: Request, *, timeout: float) -> Response:
        return MockTransport.send(self, request, timeout=timeout)  # type: ignore[arg-type]

    async def stream(self, request: Request, *, wait: float) -> AsyncIterator[Response | bytes]:
        head, chunks = MockTransport.stream(self, request, wait=wait)  # type: ignore[arg-type]
        yield head
        for chunk in chunks:
            yield chunk
