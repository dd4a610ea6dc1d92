"""HTTPS for a server every pod can reach (the admission webhook): what connections may cost is bounded before
any byte of a request is read, and a flood of them does not keep the API server out.

asyncio's own TLS server gives each accepted connection a 256 KiB read buffer and waits 60 s for a ClientHello,
and aiohttp waits for a request head as long as a connection stays open: 300 idle connections would more than
double a webhook's memory, and half-sent heads would stay open for as long as their senders like. Here:

- at most ``Limits.connections`` are open at once (about 70 KB each: TLS state and the HTTP parser);
- TLS is read into 16 KiB (a TLS record is at most 16 KiB);
- a handshake must complete within ``Limits.handshake`` seconds, and a request head within ``Limits.head`` of the
  connection's start or of its first byte, as k8s.io/apiserver and controller-runtime bound theirs with Go's
  ``ReadHeaderTimeout``;
- when every slot is taken and another connection arrives, the one that has waited longest without a request
  in progress is closed to make room (a connection still in its handshake or head, or idle between requests).
  A flood of connections that send nothing therefore holds no slot for long, while a request the API server
  has sent is never dropped for a newcomer. Only when every slot is serving a request does accepting wait.

An idle keep-alive connection stays ``Limits.idle`` seconds, longer than Go's 90 s ``IdleConnTimeout``, so the API
server, not this server, closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from asyncio import sslproto
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

log = logging.getLogger("topology_agent.webhook")


@dataclass(frozen=True)
class Limits:
    connections: int = 128  # open at once
    handshake: float = 10.0  # seconds for the TLS handshake
    head: float = 10.0  # seconds from a connection's start, or a request's first byte, to its complete head
    idle: float = 120.0  # seconds a keep-alive connection may wait for its next request
    head_bytes: int = 4096  # the request line and each header; the API server's are under 200 bytes
    headers: int = 32  # header fields per request; the API server sends about 8


class _TLS(sslproto.SSLProtocol):
    """asyncio's TLS with a 16 KiB read buffer, which tells its connection when the socket closes."""

    max_size = 16 * 1024

    def __init__(self, *args: Any, connection: _Connection, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._connection = connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._connection.raw = transport  # type: ignore[assignment]
        super().connection_made(transport)
        if self._connection.aborted:  # closed to make room before its socket was set up
            transport.abort()  # type: ignore[attr-defined]

    def connection_lost(self, exc: BaseException | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            self._connection.closed()


class _Connection(asyncio.Protocol):
    """One accepted connection, between TLS and aiohttp's handler: it times each request head and knows whether a
    request is in progress (``busy``, set by the server's middleware when aiohttp reaches the route)."""

    def __init__(self, inner: asyncio.Protocol, server: BoundedServer) -> None:
        self.inner, self.server = inner, server
        self.raw: asyncio.Transport | None = None  # the socket's transport (TLS runs over it)
        self.transport: asyncio.Transport | None = None  # the decrypted one aiohttp writes to
        self.busy = False
        self.timer: asyncio.TimerHandle | None = None  # set while a head is on its way
        self.aborted = self.gone = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.by_transport[transport] = self
        self.inner.connection_made(transport)
        self._expect_head()

    def _expect_head(self) -> None:
        self.timer = asyncio.get_running_loop().call_later(self.server.limits.head, self._too_slow)

    def _too_slow(self) -> None:
        self.timer = None
        self.server.slow_heads += 1
        self.abort()

    def started(self) -> None:
        """aiohttp has the whole head and runs the route."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.busy = True

    def finished(self) -> None:
        self.busy = False
        self.server.waited(self)

    def data_received(self, data: bytes) -> None:
        if self.timer is None and not self.busy:
            self._expect_head()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.server.by_transport.pop(self.transport, None)
        self.inner.connection_lost(exc)

    def abort(self) -> None:
        self.aborted = True
        if self.raw is not None:
            self.raw.abort()

    def closed(self) -> None:
        if not self.gone:
            self.gone = True
            self.server.forget(self)


class BoundedServer:
    """An aiohttp application served over TLS within ``Limits``. ``context`` is asked at each connection (a
    renewed certificate serves the next one); ``port`` is known after ``start``."""

    def __init__(self, app: web.Application, context: Callable[[], ssl.SSLContext],
                 limits: Limits = Limits()) -> None:
        self.app, self.context, self.limits = app, context, limits
        self.by_transport: dict[asyncio.BaseTransport, _Connection] = {}
        # Every open connection, the one without a request for longest first.
        self._open: OrderedDict[_Connection, None] = OrderedDict()
        self._room = asyncio.Event()
        self.slow_heads = 0  # closed for a late head or handshake
        self.evicted = 0  # closed to make room for a newer connection
        self._runner: web.AppRunner | None = None
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self.port = 0
        app.middlewares.append(self._track)

    @property
    def open(self) -> int:
        return len(self._open)

    @web.middleware
    async def _track(self, request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        connection = self.by_transport.get(request.transport) if request.transport is not None else None
        if connection is None:
            return await handler(request)  # served by another runner (aiohttp's TestServer)
        connection.started()
        try:
            return await handler(request)
        finally:
            connection.finished()

    def waited(self, connection: _Connection) -> None:
        """``connection`` has no request in progress from now: it goes to the back of the line to be closed."""
        if connection in self._open:
            self._open.move_to_end(connection)
            self._room.set()

    def forget(self, connection: _Connection) -> None:
        self._open.pop(connection, None)
        self._room.set()

    def _evictable(self) -> _Connection | None:
        return next((c for c in self._open if not c.busy), None)

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
        except OSError:
            await self._runner.cleanup()
            raise
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        self._accepting = asyncio.create_task(self._accept(), name="webhook-accept")
        return self.port

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None and self._runner is not None and self._runner.server is not None
        factory = self._runner.server
        while True:
            while len(self._open) >= self.limits.connections and self._evictable() is None:
                self._room.clear()  # every connection is serving a request: let the backlog wait
                await self._room.wait()
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as err:  # EMFILE and friends: try again shortly rather than spin
                log.warning("webhook: cannot accept a connection (%s); retrying", err)
                await asyncio.sleep(0.1)
                continue
            if len(self._open) >= self.limits.connections:
                victim = self._evictable()
                if victim is not None:
                    self.evicted += 1
                    self._open.pop(victim, None)
                    victim.abort()
            await self._serve(conn, factory)

    async def _serve(self, conn: socket.socket, factory: Callable[[], asyncio.Protocol]) -> None:
        """TLS, then aiohttp behind the connection's guard, on one accepted socket."""
        loop = asyncio.get_running_loop()
        connection = _Connection(factory(), self)
        self._open[connection] = None
        waiter = loop.create_future()
        waiter.add_done_callback(lambda f: f.cancelled() or f.exception())  # a failed handshake is routine
        tls = _TLS(loop, connection, self.context(), waiter, server_side=True,
                   ssl_handshake_timeout=self.limits.handshake, connection=connection)
        try:
            await loop.connect_accepted_socket(lambda: tls, conn)
        except OSError:
            conn.close()
            connection.closed()

    async def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        if self._sock is not None:
            self._sock.close()
        if self._runner is not None:
            await self._runner.cleanup()
        for connection in list(self._open):
            connection.abort()
        await asyncio.sleep(0)
