"""One API request and its answer as the sandbox reads and writes them, however they travel: over HTTPS
(server.py turns an aiohttp request into a ``Call`` and an ``Answer`` into its response) or in memory (memory.py,
a function call). Everything the API's semantics decide (objects.py, listing.py, watching.py, faults.py) works on
these, so both ways in share one implementation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import unquote

# The object paths, as the API server routes them: a collection, or one object (and its subresource), under
# each API prefix. The HTTPS server registers them in this order; ``route`` matches them in the same order.
PREFIXES = ("/api/{version}", "/apis/{group}/{version}")
COLLECTIONS = ("/{plural}", "/namespaces/{namespace}/{plural}")
ITEMS = ("/{plural}/{name}", "/namespaces/{namespace}/{plural}/{name}", "/namespaces/{namespace}/{plural}/{name}/{sub}",
         "/{plural}/{name}/{sub}")  # last: a namespace's collection is matched before as one


def patterns() -> list[str]:
    return [prefix + suffix for prefix in PREFIXES for suffix in (*COLLECTIONS, *ITEMS)]


def _regex(pattern: str) -> re.Pattern[str]:
    """aiohttp's reading of a pattern: ``{name}`` is one path segment."""
    return re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^{}/]+)", pattern) + "$")


_ROUTES = [_regex(p) for p in patterns()]


def route(path: str) -> dict[str, str] | None:
    """The parts of an object path (group, version, plural, namespace, name, sub), each unquoted; None for a
    path no object lives at."""
    for regex in _ROUTES:
        found = regex.match(path)
        if found:
            return {key: unquote(value) for key, value in found.groupdict().items()}
    return None


@dataclass(frozen=True)
class Call:
    """One request to an object path: what the API's semantics read of it."""

    method: str
    path: str
    route: Mapping[str, str]  # the path's parts (``route``)
    query: Mapping[str, str] = field(default_factory=dict)
    accept: str = "application/json"
    content_type: str = "application/json"
    body: bytes = b""
    agent: str = "?"  # the client's User-Agent: what the stats count by

    @property
    def is_item(self) -> bool:
        return "name" in self.route


@dataclass(frozen=True)
class Answer:
    """An answer before it is sent: its status, its document (JSON, or text for a string) and extra headers."""

    status: int
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)

    @cached_property
    def encoded(self) -> bytes:
        """The body's bytes, made once (counted by the stats, then sent)."""
        return self.body.encode() if isinstance(self.body, str) else json.dumps(self.body).encode()


def failure(code: int, reason: str, message: str, *, details: dict[str, Any] | None = None) -> Answer:
    """A Status, as the API server fails a request."""
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if details:
        body["details"] = details
    return Answer(code, body)
