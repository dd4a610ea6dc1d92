"""The client core: every request the agent makes is built here, and every answer read here. No I/O.

The two transports (client.py on urllib3 for init, async_client.py on aiohttp for the sidecar) and the mock
transport (mock.py, for tests) only move the bytes of a ``Request`` and return a ``Response``; what a status
means, how a watch stream splits into events, which page comes next, all of it is decided once, here, so a fix
reaches every caller. No HTTP library is imported: init does not load aiohttp, the sidecar does not load urllib3.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from agent.core.validation import not_json
from agent.errors import ApiConflict, ApiError, ApiForbidden, ApiGone, ApiNotFound, ApiUnavailable

Keep = Callable[[list[dict[str, Any]]], list[Any]]  # what a LIST caller keeps of each page (slimmed pods)
RBAC_HINT = "grant it with manifests/rbac (Role: get/list/watch pods, get the job's owner kind)"
# Pods per LIST page: a 4096-pod job's 18 MB LIST parsed at once peaked at 200 MB in the leader; a page of 500
# pods as a cluster holds them (~9.6 KB each) is ~5 MB of text and ~21 MB parsed, a fifth of the leader's peak
# at 16384 pods; 100 holds ~5 MB for one more request per 100 pods (headers: ~1 KB).
PAGE = 100
# Metadata only (what client-go's metadata client asks for), JSON as the fallback a server without it sends.
METADATA_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: dict[str, Any]

    @property
    def resource_version(self) -> str | None:
        return self.object.get("metadata", {}).get("resourceVersion")


@dataclass(frozen=True)
class Request:
    """One HTTP request, as the transports send it (they add the credentials and the User-Agent)."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...] = ()
    accept: str = "application/json"
    body: bytes | None = None
    verb: str = "get"  # for messages and the traffic counters: get, list, watch, create, update, patch
    what: str = ""  # what the messages call the object: "pod 'x'", "pods"
    content_type: str = "application/json"  # the body's (a merge patch names its own)

    @property
    def namespace(self) -> str:
        return namespace_of(self.path)

    def url(self, server: str) -> str:
        return server.rstrip("/") + self.path + (f"?{urlencode(self.query)}" if self.query else "")


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    retry_after: str | None = None


@dataclass
class Traffic:
    """What a client cost the API server: for benchmarks and the sidecar's metrics."""

    requests: int = 0
    watches: int = 0
    bytes: int = 0
    by_verb: dict[str, int] = field(default_factory=dict)

    def count(self, request: Request) -> None:
        self.requests += 1
        self.by_verb[request.verb] = self.by_verb.get(request.verb, 0) + 1
        if request.verb == "watch":
            self.watches += 1


# --- building ------------------------------------------------------------------------------------------------

def namespace_of(path: str) -> str:
    """The namespace segment of an API path ('' for cluster-scoped paths)."""
    parts = path.strip("/").split("/")
    return parts[parts.index("namespaces") + 1] if "namespaces" in parts else ""


def pods_path(namespace: str, name: str = "") -> str:
    collection = f"/api/v1/namespaces/{quote(namespace)}/pods"
    return f"{collection}/{quote(name)}" if name else collection


def get(path: str, *, metadata_only: bool = False) -> Request:
    parts = path.strip("/").split("/")
    return Request("GET", path, accept=METADATA_ACCEPT if metadata_only else "application/json", verb="get",
                   what=f"{parts[-2]} '{parts[-1]}'" if len(parts) > 1 else path)


def get_pod(namespace: str, name: str) -> Request:
    return Request("GET", pods_path(namespace, name), verb="get", what=f"pod '{name}'")


def list_query(label_selector: str = "", field_selector: str = "") -> dict[str, str]:
    """resourceVersion=0: the API server answers from its watch cache instead of a quorum read of etcd."""
    query = {"resourceVersion": "0"}
    if label_selector:
        query["labelSelector"] = label_selector
    if field_selector:
        query["fieldSelector"] = field_selector
    return query


def page_query(query: dict[str, str], limit: int, token: str) -> dict[str, str]:
    """The query of the next page: the API server refuses a resourceVersion together with a continue token."""
    if not limit:
        return query
    paged = {**query, "limit": str(limit)}
    if token:
        paged.pop("resourceVersion", None)
        paged["continue"] = token
    return paged


def list_page(path: str, query: dict[str, str], *, metadata_only: bool = False) -> Request:
    return Request("GET", path, tuple(query.items()),
                   accept=METADATA_LIST_ACCEPT if metadata_only else "application/json", verb="list",
                   what=path.strip("/").split("/")[-1])


def watch_query(resource_version: str, timeout: float, label_selector: str = "",
                field_selector: str = "") -> dict[str, str]:
    """Bookmarks on, and a server-side end (``timeoutSeconds``): a healthy watch always shows progress, so one
    that shows none for longer is dead (reflector.py)."""
    query = {"watch": "1", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
             "timeoutSeconds": str(max(1, int(timeout)))}
    if label_selector:
        query["labelSelector"] = label_selector
    if field_selector:
        query["fieldSelector"] = field_selector
    return query


def watch(path: str, resource_version: str, *, timeout: float, label_selector: str = "",
          field_selector: str = "") -> Request:
    return Request("GET", path, tuple(watch_query(resource_version, timeout, label_selector, field_selector).items()),
                   verb="watch", what=path.strip("/").split("/")[-1])


def write(method: str, path: str, body: dict[str, Any]) -> Request:
    """POST (create) to a collection, PUT (replace) to an object: ``metadata.resourceVersion`` in the body makes
    a replace a compare-and-swap."""
    parts = path.strip("/").split("/")
    name = body.get("metadata", {}).get("name", "?") if isinstance(body.get("metadata"), dict) else "?"
    return Request(method, path, body=json.dumps(body).encode(), verb="create" if method == "POST" else "update",
                   what=f"{parts[-1] if method == 'POST' else parts[-2]} '{name}'")


MERGE_PATCH = "application/merge-patch+json"


def patch(path: str, body: dict[str, Any]) -> Request:
    """A JSON merge patch (RFC 7386) to an object: the fields sent replace the object's, the rest stay."""
    parts = path.strip("/").split("/")
    return Request("PATCH", path, body=json.dumps(body).encode(), verb="patch", what=f"{parts[-2]} '{parts[-1]}'",
                   content_type=MERGE_PATCH)


# --- reading -------------------------------------------------------------------------------------------------

def _message(body: bytes) -> str:
    try:
        data = json.loads(body)
        return str(data.get("message", ""))[:300]
    except (ValueError, AttributeError, RecursionError):
        return body[:120].decode(errors="replace")


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def error_for_status(request: Request, response: Response) -> ApiError:
    """The agent's exception for an HTTP error status. Messages carry the API server's own ``message`` only, so
    no token or object dump reaches a log."""
    code, verb, what = response.status, request.verb, request.what
    message = _message(response.body)
    where = f"in namespace '{request.namespace}'" if request.namespace else "cluster-wide"
    if code in (401, 403):
        return ApiForbidden(
            f"API refused {verb} {what} {where} ({code}: {message or 'forbidden'}); the pod's service "
            f"account needs that permission: {RBAC_HINT}", status=code)
    if code == 404:
        return ApiNotFound(f"{what} not found {where} ({message})", status=code)
    if code == 409:
        return ApiConflict(f"{what} already exists or changed {where}", status=code)
    if code == 410:
        return ApiGone(f"{verb} {what}: resourceVersion too old ({message})", status=code)
    if code == 429 or code >= 500:
        return ApiUnavailable(f"API answered {code} to {verb} {what}: {message}", status=code,
                              retry_after=_retry_after(response.retry_after))
    return ApiError(f"API answered {code} to {verb} {what} {where}: {message}", status=code)



def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:20]} overflows")
    return value


def parse_json(body: bytes, *, what: str) -> dict[str, Any]:
    """A JSON object from the API, or ``ApiUnavailable``: invalid UTF-8, NaN, 1e9999, a 5000-digit number,
    nesting deeper than Python's stack, or a body that is not an object all mean a broken or hostile answer,
    treated like a cut connection (retried with backoff), never a traceback."""
    try:
        data = json.loads(body, parse_constant=not_json, parse_float=_finite)
    except (ValueError, RecursionError) as err:
        raise ApiUnavailable(f"{what}: the answer is not valid JSON ({type(err).__name__})") from None
    if not isinstance(data, dict):
        raise ApiUnavailable(f"{what}: the answer is JSON but not an object")
    return data


def read(request: Request, response: Response) -> dict[str, Any]:
    """The object an answer holds, or the ``ApiError`` its status means."""
    if response.status >= 400:
        raise error_for_status(request, response)
    return parse_json(response.body, what=f"{request.verb} {request.what}")


def parse_event(line: bytes) -> WatchEvent:
    """One line of a watch stream; ERROR events become the matching ``ApiError``."""
    data = parse_json(line, what="watch stream line (cut mid-event?)")
    kind, obj = data.get("type"), data.get("object")
    if not isinstance(kind, str) or not isinstance(obj, dict):
        raise ApiUnavailable("watch stream sent an event without a type or an object")
    event = WatchEvent(type=kind, object=obj)
    if event.type == "ERROR":
        raw_code = obj.get("code", 0)
        code = raw_code if isinstance(raw_code, int) and not isinstance(raw_code, bool) and 0 <= raw_code < 1000 \
            else 0
        message = str(obj.get("message", ""))[:200].replace("\n", " ")
        if code == 410:
            raise ApiGone(f"watch expired: {message}", status=410)
        raise ApiUnavailable(f"watch ended with an error event ({code}: {message})", status=code)
    if event.type not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
        raise ApiUnavailable(f"watch stream sent an event of type {event.type[:20]!r}")
    meta = obj.get("metadata")
    if meta is not None and (not isinstance(meta, dict) or not isinstance(meta.get("resourceVersion", ""), str)):
        raise ApiUnavailable("watch stream sent an object whose metadata is not an object")
    return event


class WatchLines:
    """A watch stream's bytes, as they come, into events: one JSON object per line."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines the chunk completes, each to be parsed (``parse_event``) once the one before it is handled:
        a 256 KiB read of the kubelet's writes (26 pods) parsed at once peaked at 1.6 MB, one at a time 0.4 MB,
        and the watcher keeps a few hundred bytes of each."""
        self._buffer += chunk
        if b"\n" not in self._buffer:
            return []
        *lines, self._buffer = self._buffer.split(b"\n")
        return [line for line in lines if line.strip()]

    def finish(self) -> None:
        """The stream ended: a partial line left over means it was cut mid-event."""
        if self._buffer.strip():
            raise ApiUnavailable("watch stream ended mid-event (connection cut)")


def list_items(data: dict[str, Any], *, what: str) -> tuple[list[dict[str, Any]], str]:
    """The items and resourceVersion of a LIST answer (items of the wrong shape are the caller's to refuse)."""
    items, meta = data.get("items"), data.get("metadata")
    items, meta = ([] if items is None else items), ({} if meta is None else meta)
    if not isinstance(items, list) or not isinstance(meta, dict):
        raise ApiUnavailable(f"list {what}: the answer has no list of items")
    return items, str(meta.get("resourceVersion", ""))[:100]


_CONTINUE = re.compile(rb'"continue"\s*:\s*"([A-Za-z0-9+/=_:.~-]*)"')


def peek_continue(raw: bytes) -> str:
    """The continue token of a LIST page read from its first bytes, before the page is parsed, so the next page
    can be asked for at once. The API server writes the list's metadata before its items; anything else (no
    token there, items first) gives '' and the caller waits for the parsed page. The caller checks the peeked
    token against the parsed one."""
    head = raw[:4096]
    items = head.find(b'"items"')
    found = _CONTINUE.search(head, 0, items) if items >= 0 else None
    return found.group(1).decode() if found else ""


class Pager:
    """A paged LIST: the request of each page (the API server refuses a resourceVersion together with a continue
    token), what the caller keeps of each page (cut down before the next page is read), and the first page's
    resourceVersion (the snapshot every page belongs to)."""

    def __init__(self, path: str, *, label_selector: str = "", field_selector: str = "", limit: int = 0,
                 keep: Keep | None = None, metadata_only: bool = False) -> None:
        self.path, self.limit, self.keep, self.metadata_only = path, limit, keep, metadata_only
        self.base = list_query(label_selector, field_selector)
        self.what = path.strip("/").split("/")[-1]
        self.token = ""
        self.kept: list[Any] = []
        self.version = ""

    def request(self, token: str | None = None) -> Request:
        """The next page's request (or the page of ``token``, to ask for it before this one is read)."""
        query = page_query(self.base, self.limit, self.token if token is None else token)
        return list_page(self.path, query, metadata_only=self.metadata_only)

    def take(self, request: Request, response: Response) -> bool:
        """Absorb one page; whether another follows."""
        data = read(request, response)
        items, rv = list_items(data, what=self.what)
        self.version = self.version or rv
        self.kept.extend(self.keep(items) if self.keep is not None else items)
        meta = data.get("metadata")
        token = meta.get("continue", "") if isinstance(meta, dict) and self.limit else ""
        self.token = token if isinstance(token, str) else ""
        return bool(self.token)
