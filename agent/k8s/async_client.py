"""The sidecar's API client: the client core (core.py) over aiohttp, so its long watch never blocks a thread.

The same requests, the same reading of answers and the same time bounds as client.py; only the transport
differs. aiohttp and socket exceptions become the agent's ``ApiError`` here, in one place.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from agent import __version__
from agent.core.model import RawPod
from agent.k8s import core
from agent.k8s.aio import aiohttp
from agent.k8s.config import ApiConfig
from agent.k8s.core import PAGE, Drops, Keep, Oversized, Pager, Request, Response, Traffic, WatchEvent, WatchLines
from agent.k8s.transport import CONNECT, IDLE, headers, silent, ssl_context, too_slow, unreachable

log = logging.getLogger("topology_agent.api")


class AsyncTransport(Protocol):
    """``send``: a whole answer within ``timeout``. ``stream``: the head, then the body's chunks as they come (a
    LIST page, a watch), each read waiting at most ``wait`` seconds; an error's body is in the head."""

    async def send(self, request: Request, *, timeout: float) -> Response: ...

    def stream(self, request: Request, *, wait: float) -> AsyncIterator[Response | bytes]: ...


class AsyncApi(Protocol):
    """What the sidecar needs from the API server; tests substitute the mock transport."""

    async def get_pod(self, namespace: str, name: str) -> RawPod: ...

    async def get_object(self, path: str, *, metadata_only: bool = False) -> dict[str, Any]: ...

    async def list_objects(self, path: str, *, label_selector: str = "", field_selector: str = "", limit: int = 0,
                           keep: Keep | None = None, metadata_only: bool = False,
                           table: bool = False) -> tuple[list[dict[str, Any]], str]: ...

    def watch_objects(self, path: str, resource_version: str, *, timeout: float, label_selector: str = "",
                      field_selector: str = "", idle: float = IDLE) -> AsyncIterator[WatchEvent]: ...

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...


class AiohttpTransport:
    def __init__(self, config: ApiConfig, user_agent: str, connections: int = 4) -> None:
        self.config, self.user_agent, self.connections = config, user_agent, connections
        self._ssl = ssl_context(config)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False,
                                             limit=self.connections)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _request(self, request: Request, timeout: aiohttp.ClientTimeout) -> Any:
        return self.session.request(request.method, request.url(self.config.server), data=request.body,
                                    headers=headers(self.config, self.user_agent, request), timeout=timeout)

    async def send(self, request: Request, *, timeout: float) -> Response:
        try:
            async with asyncio.timeout(timeout):  # the whole answer, however its bytes arrive
                async with self._request(request, aiohttp.ClientTimeout(total=None, connect=CONNECT)) as resp:
                    return Response(resp.status, await resp.read(), resp.headers.get("Retry-After"))
        except TimeoutError as err:
            raise too_slow(request, timeout) from err
        except (aiohttp.ClientError, OSError) as err:
            raise unreachable(err, self.config.server, request) from err

    async def stream(self, request: Request, *, wait: float) -> AsyncIterator[Response | bytes]:
        """The response head first, then the body's chunks; each read waits at most ``wait`` seconds (a watch's
        silence is ``silent``, a LIST page's ``too_slow``)."""
        try:
            async with self._request(request, aiohttp.ClientTimeout(total=None, connect=CONNECT,
                                                                    sock_read=wait)) as resp:
                if resp.status >= 400:
                    yield Response(resp.status, await resp.read(), resp.headers.get("Retry-After"))
                    return
                yield Response(resp.status)
                while chunk := await resp.content.readany():
                    yield chunk
        except TimeoutError as err:
            raise (silent(request, wait) if request.verb == "watch" else too_slow(request, wait)) from err
        except (aiohttp.ClientError, OSError) as err:
            raise unreachable(err, self.config.server, request) from err


class AsyncClient:
    """The calls the sidecar makes, each one request of the core over the transport."""

    def __init__(self, config: ApiConfig, *, user_agent: str | None = None, timeout: float = 30.0,
                 transport: AsyncTransport | None = None, clock: Callable[[], float] = time.monotonic,
                 connections: int = 4) -> None:
        self.config = config
        self.traffic = Traffic()
        self.timeout = timeout
        self.clock = clock
        self.transport = transport or AiohttpTransport(config, user_agent or f"topology-agent/{__version__}",
                                                       connections)
        self.drops = Drops()  # objects dropped for their size, each said once

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        closer = getattr(self.transport, "close", None)
        if closer is not None:
            await closer()

    async def send(self, request: Request) -> Response:
        self.traffic.count(request)
        response = await self.transport.send(request, timeout=self.timeout)
        self.traffic.bytes += len(response.body)
        return response

    async def call(self, request: Request) -> dict[str, Any]:
        return core.read(request, await self.send(request))

    async def get_pod(self, namespace: str, name: str) -> RawPod:
        return await self.call(core.get_pod(namespace, name))  # type: ignore[return-value]

    async def get_object(self, path: str, *, metadata_only: bool = False) -> dict[str, Any]:
        return await self.call(core.get(path, metadata_only=metadata_only))

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.call(core.write("POST", path, body))

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.call(core.write("PUT", path, body))

    async def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.call(core.patch(path, body))

    async def list_pods(self, namespace: str, selector: str, *,
                        keep: Keep | None = None) -> tuple[list[RawPod], str]:
        """The job's pods, in pages of ``PAGE``; ``keep`` shrinks each page before the next is read."""
        items, rv = await self.list_objects(core.pods_path(namespace), label_selector=selector, limit=PAGE,
                                            keep=keep)
        return items, rv  # type: ignore[return-value]

    async def list_objects(self, path: str, *, label_selector: str = "", field_selector: str = "", limit: int = 0,
                           keep: Keep | None = None, metadata_only: bool = False,
                           table: bool = False) -> tuple[list[dict[str, Any]], str]:
        """Every page read as its bytes come (core.ListReader): no page is held whole, an object over its budget
        is dropped unread and said once (``drops``). ``table``: the API server's printed columns, each row its
        cells by column name (core.table_rows)."""
        pager = Pager(path, label_selector=label_selector, field_selector=field_selector, limit=limit, keep=keep,
                      metadata_only=metadata_only, table=table)
        while await self._read_page(pager, pager.request()):
            pass
        return pager.kept, pager.version

    async def _read_page(self, pager: Pager, request: Request) -> bool:
        """One page into ``pager``, whole within the client's timeout; whether another follows."""
        self.traffic.count(request)
        parts = self.transport.stream(request, wait=self.timeout)
        try:
            async with asyncio.timeout(self.timeout):  # the whole page, however its bytes arrive
                page = None
                async for part in parts:
                    if isinstance(part, Response):
                        page = pager.reading(request, part)
                        part = part.body
                    self.traffic.bytes += len(part)
                    if page is not None:
                        page.feed(part)
                if page is None:  # no head at all: an empty answer, not valid JSON
                    page = pager.reading(request, Response(200))
                return page.finish()
        except TimeoutError:
            raise too_slow(request, self.timeout) from None
        finally:
            closing = getattr(parts, "aclose", None)
            if closing is not None:
                await closing()  # a half-read answer closes its connection now
            self._say(pager.take_dropped())

    def _say(self, dropped: list[Oversized]) -> None:
        for line in self.drops.lines(dropped):
            log.warning("%s", line)

    def watch_pods(self, namespace: str, selector: str, resource_version: str, *, timeout: float,
                   idle: float = IDLE) -> AsyncIterator[WatchEvent]:
        return self.watch_objects(core.pods_path(namespace), resource_version, timeout=timeout,
                                  label_selector=selector, idle=idle)

    async def watch_objects(self, path: str, resource_version: str, *, timeout: float, label_selector: str = "",
                            field_selector: str = "", idle: float = IDLE) -> AsyncIterator[WatchEvent]:
        """Events after ``resource_version`` until the server ends the watch (``timeout``); ``ApiUnavailable``
        when ``idle`` seconds pass without an event or bookmark."""
        request = core.watch(path, resource_version, timeout=timeout, label_selector=label_selector,
                             field_selector=field_selector)
        self.traffic.count(request)
        lines = WatchLines(core.budget_for(path), what=request.what)
        last = self.clock()
        async for part in self.transport.stream(request, wait=idle):
            if isinstance(part, Response):
                if part.status >= 400:
                    raise core.error_for_status(request, part)
                continue
            self.traffic.bytes += len(part)
            complete = lines.feed(part)
            now = self.clock()
            dropped = lines.take_dropped()
            if dropped:
                self._say(dropped)
                last = now  # a whole event, dropped: the stream goes on
            if complete:
                last = now
                for line in complete:
                    yield core.parse_event(line)
            elif now - last > idle:  # bytes, but no event: a trickle is no progress
                raise silent(request, idle)
        lines.finish()


__all__ = ["AsyncApi", "AsyncClient", "AsyncTransport"]
