"""init's API client: the client core (core.py) over the standard library's http.client, synchronous.

The transport moves bytes and bounds time; everything else is the core's. Every http.client and socket exception
becomes the agent's ``ApiError`` here (transport.unreachable), so nothing above this module knows which HTTP
library is underneath. ``Client.deadline`` (init's ``--timeout``) bounds every request, connect included.
"""

from __future__ import annotations

import http.client
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import chain
from typing import Any, Protocol
from urllib.parse import urlsplit

from agent import __version__
from agent.core.model import RawPod
from agent.errors import ApiError
from agent.k8s import core
from agent.k8s.config import ApiConfig
from agent.k8s.core import PAGE, Drops, Keep, Oversized, Pager, Request, Response, Traffic, WatchEvent, WatchLines
from agent.k8s.transport import CONNECT, IDLE, READ, Budget, headers, silent, ssl_context, too_slow, unreachable

__all__ = ["Api", "Client", "Transport", "WatchEvent"]

log = logging.getLogger("topology_agent.api")


class Transport(Protocol):
    """Moves a request's bytes; bounds each read. ``send`` answers within ``timeout`` in all; ``stream`` gives the
    head at once and the body's chunks as they come (a LIST page, a watch), each read waiting at most ``wait``
    seconds; an error's body (and a body a test's transport has whole) is in the head. Closing the chunks ends
    the request, whether they were read or not."""

    def send(self, request: Request, *, timeout: float) -> Response: ...

    def stream(self, request: Request, *, wait: float) -> tuple[Response, Iterator[bytes]]: ...


class Api(Protocol):
    """What the runtime needs from the API server (init's side); tests substitute the mock transport."""

    def get_pod(self, namespace: str, name: str) -> RawPod: ...

    def get_object(self, path: str, *, metadata_only: bool = False) -> dict[str, Any]: ...

    def list_pods(self, namespace: str, selector: str, *, keep: Keep | None = None) -> tuple[list[RawPod], str]: ...

    def list_objects(self, path: str, *, label_selector: str = "", field_selector: str = "", limit: int = 0,
                     keep: Keep | None = None, metadata_only: bool = False,
                     table: bool = False) -> tuple[list[dict[str, Any]], str]: ...

    def watch_pods(self, namespace: str, selector: str, resource_version: str, *, timeout: float,
                   idle: float = IDLE) -> Iterator[WatchEvent]: ...

    def watch_objects(self, path: str, resource_version: str, *, timeout: float, label_selector: str = "",
                      field_selector: str = "", idle: float = IDLE) -> Iterator[WatchEvent]: ...

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...


class HttpTransport:
    """The standard library's http.client, one keep-alive connection per request in flight (at most ``KEEP``
    idle ones kept: a LIST page asked for ahead runs on the second). urllib3 would add 40 ms of imports to every
    pod's start for what this class does: a connection timeout, a read timeout, and reuse of a connection whose
    answer was read whole."""

    KEEP = 2

    def __init__(self, config: ApiConfig, user_agent: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self.user_agent, self.clock = config, user_agent, clock
        self.context = ssl_context(config)
        url = urlsplit(config.server)
        self.host = url.hostname or ""
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.idle: list[http.client.HTTPConnection] = []
        self.lock = threading.Lock()

    def _connection(self, request: Request, timeout: float) -> http.client.HTTPConnection:
        """An idle connection the server has not closed, or a new one, connected within ``timeout``."""
        with self.lock:
            while self.idle:
                conn = self.idle.pop()
                if conn.sock is not None and not _readable(conn.sock):  # readable at rest: closed (or garbage)
                    return conn
                conn.close()
        if self.context is not None:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self.context)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.connect()  # the TLS handshake included
        except (http.client.HTTPException, OSError) as err:
            conn.close()
            raise unreachable(err, self.config.server, request) from err
        return conn

    def _open(self, request: Request, read: float) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn = self._connection(request, min(CONNECT, read))
        url = urlsplit(request.url(self.config.server))
        try:
            conn.sock.settimeout(read)  # each read of the answer: its head, each chunk of its body
            conn.request(request.method, url.path + (f"?{url.query}" if url.query else ""), body=request.body,
                         headers=headers(self.config, self.user_agent, request))
            return conn, conn.getresponse()
        except TimeoutError as err:  # connected, but no answer: the aiohttp side's words
            conn.close()
            raise (silent(request, read) if request.verb == "watch" else too_slow(request, read)) from err
        except (http.client.HTTPException, OSError) as err:
            conn.close()
            raise unreachable(err, self.config.server, request) from err

    def _release(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        """Keep a connection whose answer was read whole for the next request; close any other."""
        if response.isclosed() and not response.will_close and conn.sock is not None:
            with self.lock:
                if len(self.idle) < self.KEEP:
                    self.idle.append(conn)
                    return
        response.close()
        conn.close()

    def send(self, request: Request, *, timeout: float) -> Response:
        started = self.clock()
        conn, response = self._open(request, timeout)
        body = bytearray()
        reading = self._chunks(request, conn, response, too_slow(request, timeout))
        try:
            for chunk in reading:
                body += chunk
                if self.clock() - started > timeout:
                    raise too_slow(request, timeout)
        finally:
            reading.close()  # a half-read answer closes the connection: it is not reused
        return Response(response.status, bytes(body), response.getheader("Retry-After"))

    def stream(self, request: Request, *, wait: float) -> tuple[Response, Iterator[bytes]]:
        conn, response = self._open(request, wait)
        if response.status >= 400:
            try:
                return Response(response.status, response.read(), response.getheader("Retry-After")), iter(())
            except (http.client.HTTPException, OSError) as err:
                raise unreachable(err, self.config.server, request) from err
            finally:
                self._release(conn, response)

        quiet = silent(request, wait) if request.verb == "watch" else too_slow(request, wait)
        return Response(response.status), _Body(self._chunks(request, conn, response, quiet), conn, response)

    def _chunks(self, request: Request, conn: http.client.HTTPConnection, response: http.client.HTTPResponse,
                quiet: Exception) -> Generator[bytes, None, None]:
        """The body as it comes; `quiet` is raised when the server stops sending (the caller's words for it)."""
        try:
            while chunk := response.read1(READ):
                yield chunk
            response.read()  # nothing left: this marks the answer read whole (read1 leaves a sized one open)
        except TimeoutError as err:
            raise quiet from err
        except (http.client.HTTPException, OSError) as err:
            raise unreachable(err, self.config.server, request) from err
        finally:
            self._release(conn, response)  # a half-read answer: the connection is closed, not reused

    def close(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()


def _readable(sock: socket.socket) -> bool:
    """Whether a connection at rest has something to read: the server closed it (or sent what nobody asked)."""
    return bool(select.select([sock], [], [], 0)[0])


class _Body:
    """A response's chunks; ``close`` ends the response even when none was read (a page asked for ahead and not
    wanted): a generator closed before it started runs no ``finally``."""

    def __init__(self, chunks: Generator[bytes, None, None], conn: http.client.HTTPConnection,
                 response: http.client.HTTPResponse) -> None:
        self._chunks, self._conn, self._response = chunks, conn, response

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        return next(self._chunks)

    def close(self) -> None:
        self._chunks.close()
        if not self._response.isclosed():
            self._response.close()
            self._conn.close()


Opened = tuple[Request, Response, Iterator[bytes], float, float]  # a page asked for: its head, body, start, limit
PEEK = 4096  # a page's first bytes, where its continue token is looked for


class Client:
    """The calls init makes, each one request of the core over the transport."""

    def __init__(self, config: ApiConfig, *, user_agent: str | None = None, timeout: float = 30.0,
                 transport: Transport | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.traffic = Traffic()
        self.timeout = timeout
        self.clock = clock
        self.budget = Budget(clock)  # .deadline: init's --timeout, which every request ends by
        self.drops = Drops()  # objects dropped for their size, each said once
        self.transport = transport or HttpTransport(config, user_agent or f"topology-agent/{__version__}",
                                                       clock=clock)

    def close(self) -> None:
        closer = getattr(self.transport, "close", None)
        if closer is not None:
            closer()

    def send(self, request: Request) -> Response:
        self.traffic.count(request)
        response = self.transport.send(request, timeout=self.budget.left(self.timeout))
        self.traffic.bytes += len(response.body)
        return response

    def call(self, request: Request) -> dict[str, Any]:
        return core.read(request, self.send(request))

    def get_pod(self, namespace: str, name: str) -> RawPod:
        return self.call(core.get_pod(namespace, name))  # type: ignore[return-value]

    def get_object(self, path: str, *, metadata_only: bool = False) -> dict[str, Any]:
        return self.call(core.get(path, metadata_only=metadata_only))

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.call(core.write("POST", path, body))

    def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.call(core.write("PUT", path, body))

    def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.call(core.patch(path, body))

    def list_pods(self, namespace: str, selector: str, *, keep: Keep | None = None) -> tuple[list[RawPod], str]:
        """The job's pods, in pages of ``PAGE``; ``keep`` shrinks each page before the next is read."""
        return self.list_objects(core.pods_path(namespace), label_selector=selector, limit=PAGE,  # type: ignore
                                 keep=keep)

    def list_objects(self, path: str, *, label_selector: str = "", field_selector: str = "", limit: int = 0,
                     keep: Keep | None = None, metadata_only: bool = False,
                     table: bool = False) -> tuple[list[dict[str, Any]], str]:
        """Every page read as its bytes come (core.ListReader): no page is held whole, an object over its budget
        is dropped unread and said once (``drops``). ``table``: the API server's printed columns, each row its
        cells by column name (core.table_rows)."""
        pager = Pager(path, label_selector=label_selector, field_selector=field_selector, limit=limit, keep=keep,
                      metadata_only=metadata_only, table=table)
        if not limit:
            self._read_page(pager, self._open(pager.request()))
            return pager.kept, pager.version
        # The next page is asked for as soon as this one's first bytes name it (its continue token, written
        # before its items), while this one is read and cut down: the API server prepares a page in about the
        # time the agent takes to read one (4096 pods: 0.3-0.6 s of 1.0 s waiting, sequentially). Only its head
        # is read ahead; its body waits in the connection until this page is done.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="list-ahead") as ahead:
            opened = self._open(pager.request())
            while True:
                more, asked = self._read_page(pager, opened, ahead)
                if not more:
                    _discard(asked)
                    break
                wanted = pager.request()
                if asked is not None and asked.result()[0] == wanted:
                    opened = asked.result()
                else:  # the peek was wrong, or there was none: ask for the page the parsed answer names
                    _discard(asked)
                    opened = self._open(wanted)
        return pager.kept, pager.version

    def _open(self, request: Request) -> Opened:
        """A page asked for: its head read, its body not yet."""
        self.traffic.count(request)
        limit = self.budget.left(self.timeout)
        started = self.clock()
        response, chunks = self.transport.stream(request, wait=limit)
        return request, response, chunks, started, limit

    def _read_page(self, pager: Pager, opened: Opened,
                   ahead: ThreadPoolExecutor | None = None) -> tuple[bool, Future[Opened] | None]:
        """Read one page into ``pager`` within its time: whether another follows, and (with ``ahead``) the next
        page asked for as soon as this one's first bytes gave its continue token (core.peek_continue)."""
        request, response, chunks, started, limit = opened
        head, peeking, asked = b"", ahead is not None, None
        try:
            page = pager.reading(request, response)
            for chunk in chain((response.body,), chunks):
                if peeking and ahead is not None:
                    head += chunk[:PEEK - len(head)]
                    if b'"items"' in head or len(head) >= PEEK:
                        peeking, token = False, core.peek_continue(head)
                        if token:
                            asked = ahead.submit(self._open, pager.request(token))
                self.traffic.bytes += len(chunk)
                page.feed(chunk)
                if self.clock() - started > limit:
                    raise too_slow(request, limit)
            return page.finish(), asked
        except BaseException:
            _discard(asked)
            raise
        finally:
            closing = getattr(chunks, "close", None)
            if closing is not None:
                closing()  # a half-read answer closes its connection now
            self._say(pager.take_dropped())

    def _say(self, dropped: list[Oversized]) -> None:
        for line in self.drops.lines(dropped):
            log.warning("%s", line)

    def watch_pods(self, namespace: str, selector: str, resource_version: str, *, timeout: float,
                   idle: float = IDLE) -> Iterator[WatchEvent]:
        return self.watch_objects(core.pods_path(namespace), resource_version, timeout=timeout,
                                  label_selector=selector, idle=idle)

    def watch_objects(self, path: str, resource_version: str, *, timeout: float, label_selector: str = "",
                      field_selector: str = "", idle: float = IDLE) -> Iterator[WatchEvent]:
        """Events after ``resource_version`` until the server ends the watch (``timeout``); ``ApiUnavailable``
        when ``idle`` seconds pass without an event or bookmark, or at the client's deadline."""
        request = core.watch(path, resource_version, timeout=timeout, label_selector=label_selector,
                             field_selector=field_selector)
        self.traffic.count(request)
        wait = self.budget.left(idle)
        response, chunks = self.transport.stream(request, wait=wait)
        if response.status >= 400:
            raise core.error_for_status(request, response)
        lines = WatchLines(core.budget_for(path), what=request.what)
        last = self.clock()
        try:
            for chunk in chunks:
                self.traffic.bytes += len(chunk)
                complete = lines.feed(chunk)
                now = self.clock()
                dropped = lines.take_dropped()
                if dropped:
                    self._say(dropped)
                    last = now  # a whole event, dropped: the stream goes on
                if complete:
                    last = now
                    for line in complete:
                        yield core.parse_event(line)
                elif now - last > wait:  # bytes, but no event: a trickle is no progress
                    raise silent(request, wait)
                self.budget.left(idle)  # past the client's deadline: ApiUnavailable
        finally:
            closing = getattr(chunks, "close", None)
            if closing is not None:
                closing()  # a watch left early closes its connection now (a half-read answer is not reused)
        lines.finish()


def _discard(future: Future[Opened] | None) -> None:
    """A page asked for ahead and not wanted: its connection closed."""
    if future is None:
        return
    try:
        chunks = future.result()[2]
    except ApiError:  # not this page's failure: the page asked for next meets its own
        return
    closing = getattr(chunks, "close", None)
    if closing is not None:
        closing()
