"""The one HTTP client of the agent: GET, LIST and WATCH of pods and the owner kinds, over urllib3.

Every urllib3 and socket exception is mapped here to the agent's ``ApiError`` tree (one context manager,
``_mapped``), so nothing above this module knows which HTTP library is underneath. Bodies in error messages
are truncated to the API server's own ``message`` so a token or object dump never reaches a log.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote, urlencode

import urllib3

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
    PodSource,
    Traffic,
    WatchEvent,
    error_for_status,
    list_query,
    namespace_of,
    page_query,
    parse_event,
    parse_json,
    peek_continue,
    request_headers,
    ssl_context,
    tls_failure,
    watch_query,
)

__all__ = ["ApiClient", "PodSource", "WatchEvent"]

class ApiClient:
    def __init__(self, config: ApiConfig, *, user_agent: str | None = None, timeout: float = 30.0) -> None:
        self.config = config
        self.traffic = Traffic()
        self.timeout = timeout
        self.user_agent = user_agent or f"topology-agent/{__version__}"
        kwargs: dict[str, Any] = {"maxsize": 2, "retries": False}
        context = ssl_context(config)
        if context is not None:
            kwargs["ssl_context"] = context
            if not config.verify:
                kwargs["cert_reqs"] = "CERT_NONE"
        self.pool = urllib3.PoolManager(**kwargs)

    def close(self) -> None:
        self.pool.clear()

    # --- plumbing ----------------------------------------------------------------------------------------

    def _headers(self, accept: str = "application/json") -> dict[str, str]:
        return request_headers(self.config, self.user_agent, accept)

    @contextlib.contextmanager
    def _mapped(self, verb: str, what: str) -> Iterator[None]:
        try:
            yield
        except ApiError:
            raise
        except (urllib3.exceptions.HTTPError, OSError) as err:
            untrusted = tls_failure(err, self.config.server)
            if untrusted is not None:
                raise untrusted from err
            reason = type(err).__name__
            raise ApiUnavailable(f"API server {self.config.server} unreachable during {verb} {what}: {reason}") \
                from err

    def _check(self, response: urllib3.BaseHTTPResponse, verb: str, what: str, namespace: str) -> None:
        if response.status >= 400:
            body = response.data if response.data is not None else b""
            raise error_for_status(response.status, body, response.headers.get("Retry-After"), verb=verb,
                                   what=what, namespace=namespace)

    def _get_raw(self, path: str, *, verb: str, what: str, namespace: str,
                 query: dict[str, str] | None = None, accept: str = "application/json") -> bytes:
        url = self.config.server.rstrip("/") + path + (f"?{urlencode(query)}" if query else "")
        self.traffic.count(verb)
        with self._mapped(verb, what):
            response = self.pool.request("GET", url, headers=self._headers(accept),
                                         timeout=urllib3.Timeout(connect=5.0, read=self.timeout))
            data = response.data or b""
            self.traffic.bytes += len(data)
            self._check(response, verb, what, namespace)
            return data

    def _get_json(self, path: str, *, verb: str, what: str, namespace: str,
                  query: dict[str, str] | None = None, accept: str = "application/json") -> dict[str, Any]:
        raw = self._get_raw(path, verb=verb, what=what, namespace=namespace, query=query, accept=accept)
        return parse_json(raw, what=f"{verb} {what}")

    # --- the calls ---------------------------------------------------------------------------------------

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST an object to a collection path (``keygen --apply``, the leader's published topology)."""
        return self._write("POST", path, body, verb="create")

    def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT an object to its own path; ``metadata.resourceVersion`` in the body makes it a compare-and-swap."""
        return self._write("PUT", path, body, verb="update")

    def _write(self, method: str, path: str, body: dict[str, Any], *, verb: str) -> dict[str, Any]:
        parts = path.strip("/").split("/")
        namespace = namespace_of(path)
        what = f"{parts[-1] if method == 'POST' else parts[-2]} '{body.get('metadata', {}).get('name', '?')}'"
        self.traffic.count(verb)
        with self._mapped(verb, what):
            response = self.pool.request(method, self.config.server.rstrip("/") + path, body=json.dumps(body),
                                         headers={**self._headers(), "Content-Type": "application/json"},
                                         timeout=urllib3.Timeout(connect=5.0, read=self.timeout))
            self.traffic.bytes += len(response.data or b"")
            if response.status == 409:
                raise ApiConflict(f"{what} already exists or changed in namespace '{namespace}'", status=409)
            self._check(response, verb, what, namespace)
            return parse_json(response.data or b"", what=f"{verb} {what}")

    def get_pod(self, namespace: str, name: str) -> RawPod:
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
        return self._get_json(path, verb="get", what=f"pod '{name}'", namespace=namespace)  # type: ignore[return-value]

    def list_pods(self, namespace: str, selector: str, *, keep: Keep | None = None) -> tuple[list[RawPod], str]:
        """The job's pods, in pages of ``PAGE``; ``keep`` shrinks each page before the next is read."""
        return self.list_objects(f"/api/v1/namespaces/{quote(namespace)}/pods", label_selector=selector,  # type: ignore
                                 limit=PAGE, keep=keep)

    def list_objects(self, path: str, *, label_selector: str = "", field_selector: str = "", limit: int = 0,
                     keep: Keep | None = None, metadata_only: bool = False) -> tuple[list[dict[str, Any]], str]:
        parts = path.strip("/").split("/")
        namespace = namespace_of(path)
        pager = Pager(list_query(label_selector, field_selector), limit=limit, keep=keep, what=parts[-1])
        accept = METADATA_LIST_ACCEPT if metadata_only else "application/json"

        def fetch(query: dict[str, str]) -> bytes:
            return self._get_raw(path, verb="list", what=parts[-1], namespace=namespace, query=query, accept=accept)

        if not limit:
            pager.take(parse_json(fetch(pager.query()), what=f"list {parts[-1]}"))
            return pager.kept, pager.version
        # The next page is asked for while this one is parsed and cut down: the API server prepares a page in
        # about the time the agent takes to read one (4096 pods: 0.3-0.6 s of 1.0 s waiting, sequentially).
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="list-ahead") as ahead:
            pending = ahead.submit(fetch, pager.query())
            while True:
                raw = pending.result()
                token = peek_continue(raw)
                if token:
                    pending = ahead.submit(fetch, page_query(pager.base, limit, token))
                more = pager.take(parse_json(raw, what=f"list {parts[-1]}"))
                del raw
                if not more:
                    break
                if pager.token != token:  # the peek was wrong: ask for the page the parsed answer names
                    pending = ahead.submit(fetch, pager.query())
        return pager.kept, pager.version

    def get_object(self, path: str, *, metadata_only: bool = False) -> dict[str, Any]:
        parts = path.strip("/").split("/")
        namespace = namespace_of(path)
        return self._get_json(path, verb="get", what=f"{parts[-2]} '{parts[-1]}'", namespace=namespace,
                              accept=METADATA_ACCEPT if metadata_only else "application/json")

    def watch_pods(self, namespace: str, selector: str, resource_version: str, *,
                   timeout: float) -> Iterator[WatchEvent]:
        """Stream events after ``resource_version`` until the server ends the watch (after ``timeout``)."""
        return self.watch_objects(f"/api/v1/namespaces/{quote(namespace)}/pods", resource_version, timeout=timeout,
                                  label_selector=selector)

    def watch_objects(self, path: str, resource_version: str, *, timeout: float, label_selector: str = "",
                      field_selector: str = "") -> Iterator[WatchEvent]:
        query = watch_query(resource_version, timeout, label_selector, field_selector)
        parts = path.strip("/").split("/")
        namespace = namespace_of(path)
        url = f"{self.config.server.rstrip('/')}{path}?{urlencode(query)}"
        self.traffic.count("watch")
        self.traffic.watches += 1
        with self._mapped("watch", parts[-1]):
            response = self.pool.request("GET", url, headers=self._headers(), preload_content=False,
                                         timeout=urllib3.Timeout(connect=5.0, read=timeout + 30.0))
            try:
                if response.status >= 400:
                    self._check(response, "watch", parts[-1], namespace)  # .data reads the error body
                buffer = b""
                for chunk in response.stream(64 * 1024, decode_content=True):
                    self.traffic.bytes += len(chunk)
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        if line.strip():
                            yield parse_event(line)
            finally:
                response.release_conn()
