"""What both API clients share: the watch event type, traffic counters, the TLS context, and how HTTP statuses
and watch lines map to the agent's ``ApiError`` tree. No HTTP library is imported here, so the sidecar (aiohttp)
does not load urllib3 and init (urllib3) does not load aiohttp.
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.core.model import RawPod
from agent.errors import ApiError, ApiForbidden, ApiGone, ApiNotFound, ApiUnavailable, ApiUntrusted
from agent.k8s.config import ApiConfig

Keep = Callable[[list[dict[str, Any]]], list[Any]]  # what a LIST caller keeps of each page (slimmed pods)
RBAC_HINT = "grant it with manifests/rbac (Role: get/list/watch pods, get the job's owner kind)"


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: dict[str, Any]

    @property
    def resource_version(self) -> str | None:
        return self.object.get("metadata", {}).get("resourceVersion")


class PodSource(Protocol):
    """What the init and sidecar loops need from the API; tests substitute an in-memory fake."""

    def get_pod(self, namespace: str, name: str) -> RawPod: ...

    def list_pods(self, namespace: str, selector: str, *,
                  keep: Keep | None = None) -> tuple[list[RawPod], str]: ...

    def watch_pods(self, namespace: str, selector: str, resource_version: str, *,
                   timeout: float) -> Iterator[WatchEvent]: ...

    def get_object(self, path: str, *, metadata_only: bool = False) -> dict[str, Any]: ...

    def list_objects(self, path: str, *, label_selector: str = "", field_selector: str = "", limit: int = 0,
                     metadata_only: bool = False) -> tuple[list[dict[str, Any]], str]: ...

    def watch_objects(self, path: str, resource_version: str, *, timeout: float, label_selector: str = "",
                      field_selector: str = "") -> Iterator[WatchEvent]: ...

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...


@dataclass
class Traffic:
    """What this client cost the API server: for benchmarks and the sidecar's metrics."""

    requests: int = 0
    watches: int = 0
    bytes: int = 0
    by_verb: dict[str, int] = field(default_factory=dict)

    def count(self, verb: str) -> None:
        self.requests += 1
        self.by_verb[verb] = self.by_verb.get(verb, 0) + 1


def _message(body: bytes) -> str:
    try:
        data = json.loads(body)
        return str(data.get("message", ""))[:300]
    except (ValueError, AttributeError):
        return body[:120].decode(errors="replace")


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def error_for_status(code: int, body: bytes, retry_after: str | None, *, verb: str, what: str,
                     namespace: str) -> ApiError:
    """The agent's exception for an HTTP error status (shared by the sync and the async client)."""
    message = _message(body)
    where = f"in namespace '{namespace}'" if namespace else "cluster-wide"
    if code in (401, 403):
        return ApiForbidden(
            f"API refused {verb} {what} {where} ({code}: {message or 'forbidden'}); the pod's service "
            f"account needs that permission: {RBAC_HINT}", status=code)
    if code == 404:
        return ApiNotFound(f"{what} not found {where} ({message})", status=code)
    if code == 410:
        return ApiGone(f"{verb} {what}: resourceVersion too old ({message})", status=code)
    if code == 429 or code >= 500:
        return ApiUnavailable(f"API answered {code} to {verb} {what}: {message}", status=code,
                              retry_after=_retry_after(retry_after))
    return ApiError(f"API answered {code} to {verb} {what} {where}: {message}", status=code)


def tls_failure(err: BaseException, server: str) -> ApiUntrusted | None:
    """The ``ApiUntrusted`` for a failed certificate verification anywhere in ``err``'s chain (urllib3 wraps it in
    its SSLError, aiohttp in ClientConnectorCertificateError), or None: every other connection error is retried."""
    seen: set[int] = set()
    todo: list[object] = [err]
    while todo:
        item = todo.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        why = getattr(item, "verify_message", None)  # aiohttp's wrapper is an SSLCertVerificationError too, without it
        if isinstance(item, ssl.SSLCertVerificationError) and why:
            return ApiUntrusted(f"API server {server}: its TLS certificate failed verification ({why}); check the "
                                "CA (the kubeconfig's certificate-authority, or the service account's ca.crt) and "
                                "the server address")
        todo += [item.__cause__, item.__context__, getattr(item, "reason", None),
                 getattr(item, "certificate_error", None), *item.args]
    return None


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


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
        data = json.loads(body, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError) as err:
        raise ApiUnavailable(f"{what}: the answer is not valid JSON ({type(err).__name__})") from None
    if not isinstance(data, dict):
        raise ApiUnavailable(f"{what}: the answer is JSON but not an object")
    return data


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


def list_items(data: dict[str, Any], *, what: str) -> tuple[list[dict[str, Any]], str]:
    """The items and resourceVersion of a LIST answer (items of the wrong shape are the caller's to refuse)."""
    items, meta = data.get("items"), data.get("metadata")
    items, meta = ([] if items is None else items), ({} if meta is None else meta)
    if not isinstance(items, list) or not isinstance(meta, dict):
        raise ApiUnavailable(f"list {what}: the answer has no list of items")
    return items, str(meta.get("resourceVersion", ""))[:100]


PAGE = 500  # pods per LIST page: a 4096-pod job's 18 MB LIST parsed at once peaked at 200 MB in the leader


def page_query(query: dict[str, str], limit: int, token: str) -> dict[str, str]:
    """The query of the next page: the API server refuses a resourceVersion together with a continue token."""
    if not limit:
        return query
    paged = {**query, "limit": str(limit)}
    if token:
        paged.pop("resourceVersion", None)
        paged["continue"] = token
    return paged


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
    """The bookkeeping of a paged LIST, shared by the sync and the async client: the query of each page (the API
    server refuses a resourceVersion together with a continue token), what the caller keeps of each page (cut down
    before the next page is read), and the first page's resourceVersion (the snapshot every page belongs to)."""

    def __init__(self, query: dict[str, str], *, limit: int, keep: Keep | None, what: str) -> None:
        self.base, self.limit, self.keep, self.what = query, limit, keep, what
        self.token = ""
        self.kept: list[Any] = []
        self.version = ""

    def query(self) -> dict[str, str]:
        return page_query(self.base, self.limit, self.token)

    def take(self, data: dict[str, Any]) -> bool:
        """Absorb one page; whether another follows."""
        items, rv = list_items(data, what=self.what)
        self.version = self.version or rv
        self.kept.extend(self.keep(items) if self.keep is not None else items)
        meta = data.get("metadata")
        token = meta.get("continue", "") if isinstance(meta, dict) and self.limit else ""
        self.token = token if isinstance(token, str) else ""
        return bool(self.token)


def namespace_of(path: str) -> str:
    """The namespace segment of an API path ('' for cluster-scoped paths)."""
    parts = path.strip("/").split("/")
    return parts[parts.index("namespaces") + 1] if "namespaces" in parts else ""


def list_query(label_selector: str = "", field_selector: str = "") -> dict[str, str]:
    """resourceVersion=0: the API server answers from its watch cache instead of a quorum read of etcd."""
    query = {"resourceVersion": "0"}
    if label_selector:
        query["labelSelector"] = label_selector
    if field_selector:
        query["fieldSelector"] = field_selector
    return query


def watch_query(resource_version: str, timeout: float, label_selector: str = "",
                field_selector: str = "") -> dict[str, str]:
    query = {"watch": "1", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
             "timeoutSeconds": str(max(1, int(timeout)))}
    if label_selector:
        query["labelSelector"] = label_selector
    if field_selector:
        query["fieldSelector"] = field_selector
    return query


# Metadata only (what client-go's metadata client asks for), JSON as the fallback a server without it sends.
METADATA_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"


def request_headers(config: ApiConfig, user_agent: str, accept: str = "application/json") -> dict[str, str]:
    headers = {"Accept": accept, "User-Agent": user_agent}
    token = config.bearer()  # re-read each time: in-cluster tokens rotate
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def ssl_context(config: ApiConfig) -> ssl.SSLContext | None:
    if not config.server.startswith("https"):
        return None
    if config.verify:
        context = ssl.create_default_context(cafile=config.ca_file)
    else:  # the kubeconfig said insecure-skip-tls-verify
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    return context
