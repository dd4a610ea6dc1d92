"""The sidecar's API client: the same calls and the same error mapping as ``client.py``, on aiohttp.

The sidecar is asyncio (its watch, debounce and health server run side by side), so its long watch must not
block a thread. Status codes and watch lines are interpreted by the helpers in ``client.py``; this module only
moves bytes, and maps aiohttp and socket exceptions to ``ApiUnavailable`` in one place.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

from agent import __version__
from agent.core.model import RawPod
from agent.errors import ApiConflict, ApiError, ApiUnavailable
from agent.k8s.config import ApiConfig
from agent.k8s.wire import (
    METADATA_ACCEPT,
    METADATA_LIST_ACCEPT,
    PAGE,
    Keep,
    Pager,
    Traffic,
    WatchEvent,
    error_for_status,
    list_query,
    namespace_of,
    parse_event,
    parse_json,
    request_headers,
    ssl_context,
    tls_failure,
    watch_query,
)


class AsyncApiClient:
    def __init__(self, config: ApiConfig, *, user_agent: str | None = None, timeout: float = 30.0) -> None:
        self.config = config
        self.traffic = Traffic()
        self.timeout = timeout
        self.user_agent = user_agent or f"topology-agent/{__version__}"
        self._ssl = ssl_context(config)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AsyncApiClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False, limit=4)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _headers(self, accept: str = "application/json") -> dict[str, str]:
        return request_headers(self.config, self.user_agent, accept)

    @contextlib.contextmanager
    def _mapped(self, verb: str, what: str) -> Iterator[None]:
        try:
            yield
        except ApiError:
            raise
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            untrusted = tls_failure(err, self.config.server)
            if untrusted is not None:
                raise untrusted from err
            raise ApiUnavailable(
                f"API server {self.config.server} unreachable during {verb} {what}: {type(err).__name__}") from err

    async def _get_json(self, path: str, *, verb: str, what: str, namespace: str,
                        query: dict[str, str] | None = None, accept: str = "application/json") -> dict[str, Any]:
        url = self.config.server.rstrip("/") + path + (f"?{urlencode(query)}" if query else "")
        self.traffic.count(verb)
        with self._mapped(verb, what):
            async with self.session.get(url, headers=self._headers(accept),
                                        timeout=aiohttp.ClientTimeout(total=self.timeout, connect=5.0)) as resp:
                body = await resp.read()
                self.traffic.bytes += len(body)
                if resp.status >= 400:
                    raise error_for_status(resp.status, body, resp.headers.get("Retry-After"), verb=verb,
                                           what=what, namespace=namespace)
                return parse_json(body, what=f"{verb} {what}")

    async def get_pod(self, namespace: str, name: str) -> RawPod:
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
        return await self._get_json(path, verb="get", what=f"pod '{name}'", namespace=namespace)  # type: ignore

    async def get_object(self, path: str, *, metadata_only: bool = False) -> dict[str, Any]:
        parts = path.strip("/").split("/")
        return await self._get_json(path, verb="get", what=f"{parts[-2]} '{parts[-1]}'", namespace=namespace_of(path),
                                    accept=METADATA_ACCEPT if metadata_only else "application/json")

    async def list_pods(self, namespace: str, selector: str, *,
                        keep: Keep | None = None) -> tuple[list[RawPod], str]:
        """The job's pods, in pages of ``PAGE``; ``keep`` shrinks each page before the next is read."""
        items, rv = await self.list_objects(f"/api/v1/namespaces/{quote(namespace)}/pods", label_selector=selector,
                                            limit=PAGE, keep=keep)
        return items, rv  # type: ignore[return-value]

    async def list_objects(self, path: str, *, label_selector: str = "", field_selector: str = "", limit: int = 0,
                           keep: Keep | None = None, metadata_only: bool = False) -> tuple[list[dict[str, Any]], str]:
        parts = path.strip("/").split("/")
        namespace = namespace_of(path)
        pager = Pager(list_query(label_selector, field_selector), limit=limit, keep=keep, what=parts[-1])
        accept = METADATA_LIST_ACCEPT if metadata_only else "application/json"
        while pager.take(await self._get_json(path, verb="list", what=parts[-1], namespace=namespace,
                                             query=pager.query(), accept=accept)):
            pass
        return pager.kept, pager.version

    async def write(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST (create) to a collection or PUT (replace) to an object; 409 becomes ``ApiConflict``."""
        parts = path.strip("/").split("/")
        namespace = namespace_of(path)
        verb = "create" if method == "POST" else "update"
        what = f"{parts[-1] if method == 'POST' else parts[-2]} '{body.get('metadata', {}).get('name', '?')}'"
        self.traffic.count(verb)
        with self._mapped(verb, what):
            async with self.session.request(method, self.config.server.rstrip("/") + path, data=json.dumps(body),
                                            headers={**self._headers(), "Content-Type": "application/json"},
                                            timeout=aiohttp.ClientTimeout(total=self.timeout, connect=5.0)) as resp:
                data = await resp.read()
                self.traffic.bytes += len(data)
                if resp.status == 409:
                    raise ApiConflict(f"{what} already exists or changed in namespace '{namespace}'", status=409)
                if resp.status >= 400:
                    raise error_for_status(resp.status, data, resp.headers.get("Retry-After"), verb=verb, what=what,
                                           namespace=namespace)
                return parse_json(data, what=f"{verb} {what}")

    def watch_pods(self, namespace: str, selector: str, resource_version: str, *,
                   timeout: float) -> AsyncIterator[WatchEvent]:
        return self.watch_objects(f"/api/v1/namespaces/{quote(namespace)}/pods", resource_version, timeout=timeout,
                                  label_selector=selector)

    async def watch_objects(self, path: str, resource_version: str, *, timeout: float, label_selector: str = "",
                            field_selector: str = "") -> AsyncIterator[WatchEvent]:
        query = watch_query(resource_version, timeout, label_selector, field_selector)
        parts = path.strip("/").split("/")
        namespace = namespace_of(path)
        url = f"{self.config.server.rstrip('/')}{path}?{urlencode(query)}"
        self.traffic.count("watch")
        self.traffic.watches += 1
        with self._mapped("watch", parts[-1]):
            client_timeout = aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=timeout + 30.0)
            async with self.session.get(url, headers=self._headers(), timeout=client_timeout) as resp:
                if resp.status >= 400:
                    body = await resp.read()
                    raise error_for_status(resp.status, body, resp.headers.get("Retry-After"), verb="watch",
                                           what=parts[-1], namespace=namespace)
                buffer = b""
                async for chunk in resp.content.iter_any():
                    self.traffic.bytes += len(chunk)
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        if line.strip():
                            yield parse_event(line)
                if buffer.strip():
                    raise ApiUnavailable("watch stream ended mid-event (connection cut)")
