"""The client core: every request the agent makes is built here, and every answer read here. No I/O.

The two transports (client.py on http.client for init, async_client.py on aiohttp for the sidecar) and the mock
transport (mock.py, for tests) only move the bytes of a ``Request`` and return a ``Response``; what a status
means, how a watch stream splits into events, which page comes next, all of it is decided once, here, so a fix
reaches every caller. No HTTP library is imported: init does not load aiohttp, the sidecar does not load
init's client.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from agent.core.pods.validation import not_json
from agent.errors import ApiConflict, ApiError, ApiForbidden, ApiGone, ApiNotFound, ApiUnavailable

Keep = Callable[[list[dict[str, Any]]], list[Any]]  # what a LIST caller keeps of each page (slimmed pods)
RBAC_HINT = "grant it with manifests/rbac (Role: get/list/watch pods, get the job's owner kind)"
# Pods per LIST page: a 4096-pod job's 18 MB LIST parsed at once would take the leader to 200 MB; a page of 500
# pods as a cluster holds them (~9.6 KB each) is ~5 MB of text and ~21 MB parsed, a fifth of the leader's peak
# at 16384 pods; 100 holds ~5 MB for one more request per 100 pods (headers: ~1 KB).
PAGE = 100
# What one object may take of a LIST answer or a watch stream, in characters of its JSON text (bytes, for the
# ASCII that pods are made of): an object over it is dropped before it is parsed, and the reading goes on with
# the next one, so no object costs more than its budget whatever its size (etcd stores objects of up to
# 1.5 MiB by default). A pod gets 512 KiB. The pods of the jobs the agent serves are ~10 KB as a cluster holds
# them (docs/benchmarks.md); pods with sidecars injected, many env vars and volumes, and Argo's or Tekton's
# pods are tens of KB; the largest part a controller can put in a pod is its annotations, which the API server
# caps at 256 KiB in all (apimachinery pkg/api/validation/objectmeta.go, TotalAnnotationSizeLimitB), and a
# container's environment must pass exec, which takes at most 128 KiB per variable (Linux MAX_ARG_STRLEN). So
# 512 KiB holds a pod with its annotations at the cap and as much again of spec, status and managedFields: 50
# times a member, and no pod a controller makes is dropped; a pod that large is someone's forgery, ignored.
# Every other kind gets 9 MiB: the JSON of any object etcd can hold at its default 1.5 MiB, even where Go's
# encoder writes every byte as a 6-character escape (the agent's own ConfigMaps hold up to 1 MiB of JSON text
# each, which their JSON escapes to up to 2 MiB).
POD_BUDGET = 512 * 1024
OBJECT_BUDGET = 9 * 1024 * 1024
BUDGETS = {"pods": POD_BUDGET}  # a collection's last path segment -> its objects' budget
# Metadata only (what client-go's metadata client asks for), JSON as the fallback a server without it sends.
METADATA_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
# The API server's printed columns (what ``kubectl get`` shows), each row without its object (includeObject=None).
TABLE_ACCEPT = "application/json;as=Table;g=meta.k8s.io;v=v1,application/json"


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


def list_page(path: str, query: dict[str, str], *, metadata_only: bool = False, table: bool = False) -> Request:
    if table:
        return Request("GET", path, (*query.items(), ("includeObject", "None")), accept=TABLE_ACCEPT, verb="list",
                       what=path.strip("/").split("/")[-1])
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


def budget_for(path: str) -> int:
    """The characters one object of the collection at ``path`` may take (``POD_BUDGET``, ``OBJECT_BUDGET``)."""
    return BUDGETS.get(path.strip("/").split("/")[-1], OBJECT_BUDGET)


HEAD = 4096  # characters of a dropped object kept to name it
_NAMED = re.compile(r'"metadata"\s*:\s*\{.*?"name"\s*:\s*"([a-z0-9][a-z0-9.-]{0,252})"', re.S)
_NAMESPACED = re.compile(r'"metadata"\s*:\s*\{.*?"namespace"\s*:\s*"([a-z0-9][a-z0-9-]{0,62})"', re.S)


@dataclass(frozen=True)
class Oversized:
    """An object dropped unread for its size: its name as its first characters give it ('' when they do not, or
    when it is not a DNS-1123 name: nothing else of the object reaches a log), and its size."""

    what: str  # the collection: "pods"
    namespace: str
    name: str
    size: int

    @classmethod
    def from_head(cls, what: str, head: str, size: int) -> Oversized:
        name, namespace = _NAMED.search(head), _NAMESPACED.search(head)
        return cls(what, namespace.group(1) if namespace else "", name.group(1) if name else "", size)


class Drops:
    """The objects dropped for their size, each said once (a rogue pod changed every second is one line), and at
    most ``NAMED`` of them by name: what is remembered of them is bounded too."""

    NAMED = 1024

    def __init__(self) -> None:
        self.named: set[tuple[str, str, str]] = set()
        self.count = 0

    def lines(self, dropped: Iterable[Oversized]) -> list[str]:
        """The lines to log for ``dropped``: those not said already."""
        return [line for item in dropped if (line := self.say(item)) is not None]

    def say(self, dropped: Oversized) -> str | None:
        """The line to log for ``dropped``, or None when it was said already."""
        self.count += 1
        key = (dropped.what, dropped.namespace, dropped.name)
        if key in self.named or len(self.named) > self.NAMED:
            return None
        self.named.add(key)
        if len(self.named) > self.NAMED:
            return f"more than {self.NAMED} objects over their size budget were dropped; the others are not named"
        kind = dropped.what.removesuffix("s") or "object"
        where = f"'{dropped.namespace}/{dropped.name}'" if dropped.name else "(its name not among its first bytes)"
        budget = budget_for(dropped.what)
        return (f"ignoring {kind} {where} from the API: its JSON is {dropped.size} bytes, over the {budget} bytes a "
                f"{kind} may take (no controller makes one that large), so it was dropped unread and everything "
                "goes on without it; delete it if it is not meant to be there")


class WatchLines:
    """A watch stream's bytes, as they come, into events: one JSON object per line. A line over ``budget``
    (``budget_for`` the watched collection) is dropped as its bytes arrive, only its first ``HEAD`` kept to name
    it (``dropped``), so a watch holds at most one line of the budget."""

    def __init__(self, budget: int = OBJECT_BUDGET, *, what: str = "") -> None:
        self.budget, self.what = budget, what
        self._parts: list[bytes] = []
        self._size = 0  # bytes of the line so far
        self._head = b""  # a line being dropped: its first bytes
        self.dropped: list[Oversized] = []  # since the caller last took them

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines the chunk completes, each to be parsed (``parse_event``) once the one before it is handled:
        a 256 KiB read of the kubelet's writes (26 pods) peaks at 0.4 MB this way (1.6 MB parsed at
        once), and the watcher keeps a few hundred bytes of each."""
        lines: list[bytes] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            self._add(chunk, start, len(chunk) if end < 0 else end)
            if end < 0:
                return lines
            line = self._line()
            if line is not None and line.strip():
                lines.append(line)
            start = end + 1

    def _add(self, chunk: bytes, start: int, end: int) -> None:
        """``chunk[start:end]`` to the line; copied only while the line is within the budget."""
        self._size += end - start
        if self._parts and self._size > self.budget:  # over: keep the head, drop the rest as it comes
            for held in self._parts:
                self._head += held[:HEAD - len(self._head)]
            self._parts = []
        if self._size > self.budget:
            self._head = self._head or chunk[start:min(end, start + HEAD)]
        elif end > start:
            self._parts.append(chunk if start == 0 and end == len(chunk) else chunk[start:end])

    def _line(self) -> bytes | None:
        size, self._size = self._size, 0
        if size > self.budget:
            head, self._head = self._head, b""
            self.dropped.append(Oversized.from_head(self.what, head.decode(errors="replace"), size))
            return None
        parts, self._parts = self._parts, []
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def finish(self) -> None:
        """The stream ended: a partial line left over means it was cut mid-event."""
        if self._size > self.budget or b"".join(self._parts).strip():
            raise ApiUnavailable("watch stream ended mid-event (connection cut)")

    def take_dropped(self) -> list[Oversized]:
        dropped, self.dropped = self.dropped, []
        return dropped


_WHITE = re.compile(r"[ \t\n\r]*")
_TOKEN = re.compile(r'["{}\[\],]')  # what the reader looks for outside strings
_ITEMS_KEY = re.compile(r'(?<!\\)"items"[ \t\n\r]*:[ \t\n\r]*\Z')
_UNOPENED = "a '}' never opened"  # what a dropped item's scan calls a brace that closes nothing
STEP = 64 * 1024  # characters a reader takes in at once; a failed attempt at an item waits for this many more


class _Lexer:
    """Where a JSON text's structural characters are, outside its strings, across reads: a string or an escape
    left open at a read's end is carried to the next."""

    def __init__(self) -> None:
        self.in_string = self.escaped = False

    def next_token(self, text: str, at: int) -> int:
        """Where the next of ``{}[],`` outside strings is, from ``at``; -1 at the text's end (a string or an escape
        left open is remembered)."""
        while True:
            if self.escaped:
                if at >= len(text):
                    return -1
                at, self.escaped = at + 1, False
            if self.in_string:  # str.find: a regex's class crawls through a string of a megabyte
                quote = text.find('"', at)
                escape = text.find("\\", at, len(text) if quote < 0 else quote)
                if escape >= 0:
                    at, self.escaped = escape + 1, True
                elif quote < 0:
                    return -1
                else:
                    at, self.in_string = quote + 1, False
                continue
            found = _TOKEN.search(text, at)
            if found is None:
                return -1
            if found.group() == '"':
                self.in_string, at = True, found.end()
                continue
            return found.start()


class _Envelope:
    """A LIST answer's fields besides its items, kept as text within ``budget`` characters; its last characters
    (``tail``) are where the items' key is looked for."""

    def __init__(self, budget: int, what: str) -> None:
        self.budget, self.what = budget, what
        self.parts: list[str] = []
        self.size = 0
        self.tail = ""

    def keep(self, text: str) -> None:
        self.size += len(text)
        if self.size > self.budget:
            raise ApiUnavailable(f"list {self.what}: the answer's fields besides its items exceed {self.budget} "
                                 "characters")
        self.parts.append(text)
        self.tail = (self.tail + text)[-64:]

    def take(self) -> str:
        text, self.parts = "".join(self.parts), []
        return text


class ListReader:
    """A LIST answer's bytes, as they come, into its items, each parsed alone as soon as it is whole, so a page
    is never held whole, as text or parsed: what the reader holds is at most one object's budget and a read.

    An item's text over ``budget`` is dropped unread as its characters arrive (``dropped`` names it from its
    first ``HEAD``), and the items after it are read as usual. The answer's other fields (its metadata: the
    resourceVersion and the continue token) are kept as text and parsed at the end (``finish``); they may take
    ``budget`` too. The items are found by their key (``"items": [``) at the answer's top level, wherever the
    server writes it; an answer whose items are not found so is parsed whole at the end, within the budget."""

    def __init__(self, budget: int = OBJECT_BUDGET, *, what: str = "") -> None:
        self.budget, self.what = budget, what
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._decoder = json.JSONDecoder(parse_constant=not_json, parse_float=_finite)
        self._text = ""  # what is not consumed yet
        self._mode = "envelope"  # "envelope", "items" (between items), "skip" (in an item being dropped), "after"
        self._envelope = _Envelope(budget, what)
        self._depth = 0  # of the envelope, or of the item being dropped
        self._lexer = _Lexer()
        self._comma = False  # between items: a ',' (True) or the first item or ']' (False) comes next
        self._after_comma = False
        self._wait = 0  # the text's length when an item last failed to parse: it waits for STEP more
        self._skipped = 0  # characters of the item being dropped
        self._head = ""
        self.dropped: list[Oversized] = []

    def feed(self, chunk: bytes) -> list[Any]:
        """The items the chunk completes (within the budget), in order."""
        items: list[Any] = []
        for start in range(0, len(chunk), STEP):  # a chunk read whole (a test's transport) a read at a time
            try:
                self._text += self._utf8.decode(chunk[start:start + STEP])
            except UnicodeDecodeError as err:
                raise ApiUnavailable(f"list {self.what}: the answer is not valid JSON ({type(err).__name__})") \
                    from None
            self._run(items, final=False)
        return items

    def finish(self) -> tuple[list[Any], dict[str, Any]]:
        """The items the end completes, and the answer without the items found as they came (``list_items`` reads
        it); ``ApiUnavailable`` for an answer cut or not valid."""
        items: list[Any] = []
        try:
            self._text += self._utf8.decode(b"", final=True)
        except UnicodeDecodeError as err:
            raise ApiUnavailable(f"list {self.what}: the answer is not valid JSON ({type(err).__name__})") from None
        self._run(items, final=True)
        if self._mode in ("items", "skip"):
            raise ApiUnavailable(f"list {self.what}: the answer ended within its items (connection cut)")
        self._envelope.keep(self._text)
        self._text = ""
        return items, parse_json(self._envelope.take().encode(), what=f"list {self.what}")

    def take_dropped(self) -> list[Oversized]:
        dropped, self.dropped = self.dropped, []
        return dropped

    def _run(self, items: list[Any], *, final: bool) -> None:
        while self._text:
            if self._mode in ("envelope", "after"):
                if not self._scan_envelope():
                    return
            elif self._mode == "items":
                if not self._read_items(items, final=final):
                    return
            elif not self._skip():
                return

    # --- the envelope -------------------------------------------------------------------------------------------

    def _scan_envelope(self) -> bool:
        """Through the envelope's text to the items' '[' (then "items" mode: True) or to its end (False)."""
        text, at = self._text, 0
        while True:
            token = self._lexer.next_token(text, at)
            if token < 0:
                self._envelope.keep(text)
                self._text = ""
                return False
            char = text[token]
            at = token + 1
            if char in "{[":
                if (char == "[" and self._depth == 1 and self._mode == "envelope"
                            and _ITEMS_KEY.search(self._envelope.tail + text[max(0, token - 64):token])):
                    self._envelope.keep(text[:at] + "]")
                    self._text = text[at:]
                    self._mode, self._comma, self._after_comma = "items", False, False
                    return True
                self._depth += 1
            elif char in "}]":
                self._depth -= 1

    # --- the items ----------------------------------------------------------------------------------------------

    def _read_items(self, items: list[Any], *, final: bool) -> bool:
        """Items parsed while they are whole in the text; True when the mode changed (the items ended, or one is
        dropped)."""
        text = self._text
        at = _WHITE.match(text).end()  # type: ignore[union-attr]
        try:
            while at < len(text):
                char = text[at]
                if char == "]" and not self._after_comma:
                    self._text, self._mode, self._depth = text[at + 1:], "after", 1
                    return True
                if self._comma:
                    if char != ",":
                        raise ValueError("expected ',' or ']'")
                    self._comma, self._after_comma = False, True
                    at = _WHITE.match(text, at + 1).end()  # type: ignore[union-attr]
                    continue
                if len(text) - at > self.budget:  # whole within the budget, or dropped
                    try:
                        item, end = self._decoder.raw_decode(text[at:at + self.budget])
                        if end == self.budget and text[at + end - 1] not in '}]"':
                            raise json.JSONDecodeError("a number cut at the budget", text, at + end)
                        end += at
                    except json.JSONDecodeError:
                        self._text, self._mode, self._depth = text[at:], "skip", 0
                        self._skipped, self._head = 0, text[at:at + HEAD]
                        return True
                else:
                    if not final and len(text) - at < self._wait + STEP:
                        break  # parsed a read at a time: an item cut at the text's end is parsed again
                    try:
                        item, end = self._decoder.raw_decode(text, at)
                    except json.JSONDecodeError:
                        if final:
                            raise
                        self._wait = len(text) - at
                        break
                    if end == len(text) and not final and text[end - 1] not in '}]"':
                        self._wait = len(text) - at
                        break  # a number may go on in the next read
                items.append(item)
                self._comma, self._after_comma, self._wait = True, False, 0
                at = _WHITE.match(text, end).end()  # type: ignore[union-attr]
        except (ValueError, RecursionError) as err:
            raise ApiUnavailable(f"list {self.what}: the answer is not valid JSON ({type(err).__name__})") from None
        self._text = text[at:]
        return False

    def _skip(self) -> bool:
        """Through an item being dropped, to the ',' or ']' after it (then "items" mode: True)."""
        text, at = self._text, 0
        while True:
            token = self._lexer.next_token(text, at)
            if token < 0:
                self._skipped += len(text)
                self._text = ""
                return False
            char = text[token]
            at = token + 1
            if char in "{[":
                self._depth += 1
            elif self._depth and char in "}]":
                self._depth -= 1
            elif not self._depth and char in ",]":
                self._skipped += token
                self.dropped.append(Oversized.from_head(self.what, self._head, self._skipped))
                self._text, self._head = text[token:], ""
                self._mode, self._comma, self._after_comma = "items", True, False
                return True
            elif char == "}":
                raise ApiUnavailable(f"list {self.what}: the answer is not valid JSON ({_UNOPENED})")


def list_items(data: dict[str, Any], *, what: str) -> tuple[list[dict[str, Any]], str]:
    """The items and resourceVersion of a LIST answer (items of the wrong shape are the caller's to refuse); a
    Table's rows as items, each its cells by column name (``table_rows``)."""
    items, meta = table_rows(data, what=what) if data.get("kind") == "Table" else data.get("items"), \
        data.get("metadata")
    items, meta = ([] if items is None else items), ({} if meta is None else meta)
    if not isinstance(items, list) or not isinstance(meta, dict):
        raise ApiUnavailable(f"list {what}: the answer has no list of items")
    return items, str(meta.get("resourceVersion", ""))[:100]


def table_rows(data: dict[str, Any], *, what: str) -> list[dict[str, Any]]:
    """A Table's rows, each its cells by the name of their column (``{"Name": ..., "Status": ...}``)."""
    columns, rows = data.get("columnDefinitions"), data.get("rows")
    if not isinstance(columns, list) or not isinstance(rows, list) \
            or not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in columns) \
            or not all(isinstance(r, dict) and isinstance(r.get("cells"), list) for r in rows):
        raise ApiUnavailable(f"list {what}: the answer is not a Table of rows")
    names = [column["name"] for column in columns]
    return [dict(zip(names, row["cells"], strict=False)) for row in rows]


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
    token), what the caller keeps of each page's items (cut down as they are read, before the next are), and the
    first page's resourceVersion (the snapshot every page belongs to). A page is read as its bytes come
    (``reading``): no page is held whole, and an item over ``budget`` (``budget_for`` the collection) is dropped
    unread (``dropped``)."""

    def __init__(self, path: str, *, label_selector: str = "", field_selector: str = "", limit: int = 0,
                 keep: Keep | None = None, metadata_only: bool = False, table: bool = False,
                 budget: int | None = None) -> None:
        self.path, self.limit, self.keep, self.metadata_only, self.table = path, limit, keep, metadata_only, table
        self.base = list_query(label_selector, field_selector)
        self.what = path.strip("/").split("/")[-1]
        self.budget = budget_for(path) if budget is None else budget
        self.token = ""
        self.kept: list[Any] = []
        self.version = ""
        self.dropped: list[Oversized] = []  # since the caller last took them

    def request(self, token: str | None = None) -> Request:
        """The next page's request (or the page of ``token``, to ask for it before this one is read)."""
        query = page_query(self.base, self.limit, self.token if token is None else token)
        return list_page(self.path, query, metadata_only=self.metadata_only, table=self.table)

    def reading(self, request: Request, response: Response) -> Page:
        """A page whose answer has this head (``ApiError`` for an error status); its body is fed to it."""
        if response.status >= 400:
            raise error_for_status(request, response)
        return Page(self)

    def take(self, request: Request, response: Response) -> bool:
        """Absorb one page read whole; whether another follows."""
        page = self.reading(request, response)
        page.feed(response.body)
        return page.finish()

    def _keep(self, items: list[Any]) -> None:
        if items:
            self.kept.extend(self.keep(items) if self.keep is not None else items)

    def take_dropped(self) -> list[Oversized]:
        dropped, self.dropped = self.dropped, []
        return dropped


class Page:
    """One LIST page as its bytes come: each item kept (the pager's ``keep``) as soon as it is whole."""

    def __init__(self, pager: Pager) -> None:
        self.pager = pager
        self.reader = ListReader(pager.budget, what=pager.what)

    def feed(self, chunk: bytes) -> None:
        if chunk:
            self.pager._keep(self.reader.feed(chunk))
            self.pager.dropped += self.reader.take_dropped()

    def finish(self) -> bool:
        """The page's end: whether another follows."""
        pager = self.pager
        last, data = self.reader.finish()
        pager._keep(last)
        pager.dropped += self.reader.take_dropped()
        items, rv = list_items(data, what=pager.what)
        pager._keep(items)  # an answer whose items were not found as they came
        pager.version = pager.version or rv
        meta = data.get("metadata")
        token = meta.get("continue", "") if isinstance(meta, dict) and pager.limit else ""
        pager.token = token if isinstance(token, str) else ""
        return bool(pager.token)
