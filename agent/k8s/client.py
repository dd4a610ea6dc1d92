"""init's API client: the client core (core.py) over urllib3, synchronous.

The transport moves bytes and bounds time; everything else is the core's. Every urllib3 and socket exception
becomes the agent's ``ApiError`` here (transport.unreachable), so nothing above this module knows which HTTP
library is underneath. ``Client.deadline`` (init's ``--timeout``) bounds every request, connect included.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import urllib3

from agent import __version__
from agent.core.model import RawPod
from agent.k8s import core
from agent.k8s.config import ApiConfig
from agent.k8s.core import PAGE, Keep, Pager, Request, Response, Traffic, WatchEvent, WatchLines
from agent.k8s.transport import CONNECT, IDLE, READ, Budget, headers, silent, ssl_context, too_slow, unreachable

__all__ = ["Api", "Client", "Transport", "WatchEvent"]


class Transport(Protocol):
    """Moves a request's bytes; bounds each read. ``send`` answers within ``timeout`` in all; ``stream`` yields
    a watch's chunks, each read waiting at most ``wait`` seconds."""

    def send(self, request: Request, *, timeout: float) -> Response: ...

    def stream(self, request: Request, *, wait: float) -> tuple[Response, Iterator[bytes]]: ...


class Api(Protocol):
    """What the runtime needs from the API server (init's side); tests substitute the mock transport."""

    def get_pod(self, namespace: str, name: str) -> RawPod: ...

    def get_object(self, path: str, *, metadata_only: bool = False) -> dict[str, Any]: ...

    def list_pods(self, namespace: str, selector: str, *, keep: Keep | None = None) -> tuple[list[RawPod], str]: ...

    def list_objects(self, path: str, *, label_selector: str = "", field_selector: str = "", limit: int = 0,
                     keep: Keep | None = None, metadata_only: bool = False) -> tuple[list[dict[str, Any]], str]: ...

    def watch_pods(self, namespace: str, selector: str, resource_version: str, *, timeout: float,
                   idle: float = IDLE) -> Iterator[WatchEvent]: ...

    def watch_objects(self, path: str, resource_version: str, *, timeout: float, label_selector: str = "",
                      field_selector: str = "", idle: float = IDLE) -> Iterator[WatchEvent]: ...

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...


class Urllib3Transport:
    def __init__(self, config: ApiConfig, user_agent: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self.user_agent, self.clock = config, user_agent, clock
        kwargs: dict[str, Any] = {"maxsize": 2, "retries": False}
        context = ssl_context(config)
        if context is not None:
            kwargs["ssl_context"] = context
            if not config.verify:
                kwargs["cert_reqs"] = "CERT_NONE"
        self.pool = urllib3.PoolManager(**kwargs)

    def _open(self, request: Request, read: float) -> urllib3.BaseHTTPResponse:
        try:
            return self.pool.request(request.method, request.url(self.config.server), body=request.body,
                                     headers=headers(self.config, self.user_agent, request), preload_content=False,
                                     timeout=urllib3.Timeout(connect=min(CONNECT, read), read=read))
        except urllib3.exceptions.ReadTimeoutError as err:  # connected, but no answer: the aiohttp side's words
            raise (silent(request, read) if request.verb == "watch" else too_slow(request, read)) from err
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise unreachable(err, self.config.server, request) from err

    def send(self, request: Request, *, timeout: float) -> Response:
        started = self.clock()
        response = self._open(request, timeout)
        body = bytearray()
        reading = self._chunks(request, response, too_slow(request, timeout))
        try:
            for chunk in reading:
                body += chunk
                if self.clock() - started > timeout:
                    raise too_slow(request, timeout)
        finally:
            reading.close()  # a half-read answer closes the connection: it is not reused
        return Response(response.status, bytes(body), response.headers.get("Retry-After"))

    def stream(self, request: Request, *, wait: float) -> tuple[Response, Iterator[bytes]]:
        response = self._open(request, wait)
        if response.status >= 400:
            try:
                return Response(response.status, response.read(), response.headers.get("Retry-After")), iter(())
            except (urllib3.exceptions.HTTPError, OSError) as err:
                raise unreachable(err, self.config.server, request) from err
            finally:
                response.release_conn()

        return Response(response.status), self._chunks(request, response, silent(request, wait))

    def _chunks(self, request: Request, response: urllib3.BaseHTTPResponse,
                quiet: Exception) -> Generator[bytes, None, None]:
        """The body as it comes; `quiet` is raised when the server stops sending (the caller's words for it)."""
        whole = False
        try:
            while chunk := response.read1(READ):
                yield chunk
            whole = True
        except urllib3.exceptions.ReadTimeoutError as err:
            raise quiet from err
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise unreachable(err, self.config.server, request) from err
        finally:
            if not whole:
                response.close()  # a half-read answer: the connection is not reused
            response.release_conn()

    def close(self) -> None:
        self.pool.clear()


class Client:
    """The calls init makes, each one request of the core over the transport."""

    def __init__(self, config: ApiConfig, *, user_agent: str | None = None, timeout: float = 30.0,
                 transport: Transport | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.traffic = Traffic()
        self.timeout = timeout
        self.clock = clock
        self.budget = Budget(clock)  # .deadline: init's --timeout, which every request ends by
        self.transport = transport or Urllib3Transport(config, user_agent or f"topology-agent/{__version__}",
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
                     keep: Keep | None = None, metadata_only: bool = False) -> tuple[list[dict[str, Any]], str]:
        pager = Pager(path, label_selector=label_selector, field_selector=field_selector, limit=limit, keep=keep,
                      metadata_only=metadata_only)
        if not limit:
            request = pager.request()
            pager.take(request, self.send(request))
            return pager.kept, pager.version
        # The next page is asked for while this one is parsed and cut down: the API server prepares a page in
        # about the time the agent takes to read one (4096 pods: 0.3-0.6 s of 1.0 s waiting, sequentially).
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="list-ahead") as ahead:
            request = pager.request()
            pending = ahead.submit(self.send, request)
            while True:
                response = pending.result()
                token = core.peek_continue(response.body)
                if token:
                    next_request = pager.request(token)
                    pending = ahead.submit(self.send, next_request)
                more = pager.take(request, response)
                del response
                if not more:
                    break
                if pager.token != token:  # the peek was wrong: ask for the page the parsed answer names
                    next_request = pager.request()
                    pending = ahead.submit(self.send, next_request)
                request = next_request
        return pager.kept, pager.version

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
        lines = WatchLines()
        last = self.clock()
        try:
            for chunk in chunks:
                self.traffic.bytes += len(chunk)
                complete = lines.feed(chunk)
                now = self.clock()
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
