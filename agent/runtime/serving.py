"""HTTPS for a server every pod can reach (the admission webhook): what a connection may cost is bounded before
any byte of a request is read.

asyncio's own TLS server gives each accepted connection a 256 KiB read buffer and waits 60 s for a ClientHello,
and aiohttp waits for a request head as long as a connection stays open: 300 idle connections took a webhook
from 72 to 161 MB, and 20 half-sent heads were still open after 41 s. Here the listener accepts at most
``Limits.connections`` at once (the rest wait in the kernel's backlog, costing this process nothing), reads TLS
into 16 KiB, and closes a connection whose handshake or request head does not complete in time, as
k8s.io/apiserver and controller-runtime do with Go's ``ReadHeaderTimeout``. An idle keep-alive connection
stays longer than Go's 90 s ``IdleConnTimeout``, so the API server, not this server, closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from asyncio import sslproto
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

log = logging.getLogger("topology-agent.webhook")


@dataclass(frozen=True)
class Limits:
    connections: int = 128  # open at once; each costs ~70 KB (TLS state and the HTTP parser)
    handshake: float = 10.0  # seconds for the TLS handshake
    head: float = 10.0  # seconds from a connection's start, or a request's first byte, to its complete head
    idle: float = 120.0  # seconds a keep-alive connection may wait for its next request
    head_bytes: int = 4096  # the request line and each header; the API server's are under 200 bytes
    headers: int = 32  # header fields per request; the API server sends about 8


class _TLS(sslproto.SSLProtocol):
    """asyncio's TLS with a 16 KiB read buffer (a TLS record is at most 16 KiB), and a hook when it closes."""

    max_size = 16 * 1024

    def __init__(self, *args: Any, closed: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._closed = closed

    def connection_lost(self, exc: BaseException | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            self._closed()


class _Guard(asyncio.Protocol):
    """Stands between TLS and aiohttp's handler to time each request head: from the connection's start, and from
    the first byte after a response, aiohttp must reach the route (``busy``) within ``Limits.head`` seconds."""

    def __init__(self, inner: asyncio.Protocol, server: BoundedServer) -> None:
        self.inner, self.server = inner, server
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None  # set while a head is on its way

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.guards[transport] = self
        self.inner.connection_made(transport)
        self._expect_head()

    def _expect_head(self) -> None:
        self.timer = asyncio.get_running_loop().call_later(self.server.limits.head, self._too_slow)

    def _too_slow(self) -> None:
        self.server.slow_heads += 1
        if self.transport is not None:
            self.transport.abort()

    def busy(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def data_received(self, data: bytes) -> None:
        if self.timer is None and not self.server.in_request(self):
            self._expect_head()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.busy()
        if self.transport is not None:
            self.server.guards.pop(self.transport, None)
        self.inner.connection_lost(exc)


class BoundedServer:
    """An aiohttp application served over TLS within ``Limits``. ``context`` is asked at each connection (a
    renewed certificate serves the next one); ``port`` is known after ``start``."""

    def __init__(self, app: web.Application, context: Callable[[], ssl.SSLContext],
                 limits: Limits = Limits()) -> None:
        self.app, self.context, self.limits = app, context, limits
        self.guards: dict[asyncio.BaseTransport, _Guard] = {}
        self.open = 0  # connections accepted and not yet closed
        self.slow_heads = 0
        self._busy: set[_Guard] = set()
        self._slots = asyncio.Semaphore(limits.connections)
        self._raw: set[asyncio.Transport] = set()
        self._runner: web.AppRunner | None = None
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self.port = 0
        app.middlewares.append(self._track)

    @web.middleware
    async def _track(self, request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        guard = self.guards.get(request.transport) if request.transport is not None else None
        if guard is None:
            return await handler(request)  # served by another runner (aiohttp's TestServer)
        guard.busy()
        self._busy.add(guard)
        try:
            return await handler(request)
        finally:
            self._busy.discard(guard)

    def in_request(self, guard: _Guard) -> bool:
        return guard in self._busy

    async def start(self, host: str, port: int, *, backlog: int = 512) -> int:
        """Listen (OSError when the address is taken) and accept in the background."""
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False,
                                     keepalive_timeout=self.limits.idle, max_line_size=self.limits.head_bytes,
                                     max_field_size=self.limits.head_bytes, max_headers=self.limits.headers)
        await self._runner.setup()
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                 flags=socket.AI_PASSIVE)
            family, kind, proto, _, address = infos[0]
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.bind(address)
                sock.listen(backlog)
                sock.setblocking(False)
            except OSError:
                sock.close()
                raise
        except (OSError, socket.gaierror):
            await self._runner.cleanup()
            raise
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        self._accepting = asyncio.create_task(self._accept(), name="webhook-accept")
        return self.port

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None and self._runner is not None
        factory = self._runner.server
        assert factory is not None
        while True:
            await self._slots.acquire()
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except asyncio.CancelledError:
                self._slots.release()
                raise
            except OSError as err:  # EMFILE and friends: try again shortly rather than spin
                self._slots.release()
                log.warning("webhook: cannot accept a connection (%s); retrying", err)
                await asyncio.sleep(0.1)
                continue
            await self._serve(conn, factory)

    async def _serve(self, conn: socket.socket, factory: Callable[[], asyncio.Protocol]) -> None:
        """TLS, then aiohttp behind a guard, on one accepted socket; its slot is given back when it closes."""
        loop = asyncio.get_running_loop()
        self.open += 1
        raw: list[asyncio.Transport] = []
        done = False

        def closed() -> None:
            nonlocal done
            if not done:
                done = True
                self.open -= 1
                self._slots.release()
                self._raw.difference_update(raw)

        waiter = loop.create_future()
        waiter.add_done_callback(lambda f: f.cancelled() or f.exception())  # a failed handshake is routine
        tls = _TLS(loop, _Guard(factory(), self), self.context(), waiter, server_side=True,
                   ssl_handshake_timeout=self.limits.handshake, closed=closed)
        try:
            transport, _ = await loop.connect_accepted_socket(lambda: tls, conn)
        except OSError:
            conn.close()
            closed()
            return
        if not done:
            raw.append(transport)
            self._raw.add(transport)

    async def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        if self._sock is not None:
            self._sock.close()
        if self._runner is not None:
            await self._runner.cleanup()
        for transport in list(self._raw):
            transport.abort()
        await asyncio.sleep(0)
