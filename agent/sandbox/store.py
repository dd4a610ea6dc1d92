"""The sandbox API server's object store: objects, one resourceVersion counter, an event log, watchers.

Semantics follow the real API server where the agent and kubectl can tell: every write bumps one global
resourceVersion; a watch from resourceVersion N replays the logged events after N, then streams new ones; a
watch from a version older than the log keeps gets 410 Gone; a label-selected watch sees an object that
stops matching as DELETED and one that starts matching as ADDED.
"""

from __future__ import annotations

import asyncio
import builtins
import pickle
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str]  # (resource key "group/version/plural", namespace, name)
NAMESPACES = "/v1/namespaces"
NAME_LABEL = "kubernetes.io/metadata.name"  # the API server sets it on every Namespace to its name, on every write


class Conflict(Exception):
    pass


class NotFound(Exception):
    pass


class Gone(Exception):
    pass


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(eq=False)
class Watcher:
    resource: str
    namespace: str | None
    queue: asyncio.Queue[tuple[str, Obj] | None] = field(default_factory=asyncio.Queue)


@dataclass
class Event:
    rv: int
    resource: str
    kind: str
    old: Obj | None
    new: Obj


def clone(obj: Obj) -> Obj:
    """A deep copy of an object: through pickle, four times as fast as ``copy.deepcopy`` for a pod."""
    return pickle.loads(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))


class Store:
    """Each write publishes one copy of the object as written (the event's ``new``), never changed afterwards: the
    next event of that object names it as its ``old``, so an event costs one copy, not two."""

    def __init__(self, *, history: int = 100_000) -> None:
        self.objects: dict[Key, Obj] = {}
        self.rv = 1
        self.log: deque[Event] = deque(maxlen=history)
        self.oldest = 1  # a watch from an rv below this gets 410
        self.watchers: set[Watcher] = set()
        self.published: dict[Key, Obj] = {}  # each object as its last event carried it

    # --- reads -------------------------------------------------------------------------------------------

    def list(self, resource: str, namespace: str | None) -> list[Obj]:
        return [obj for (res, ns, _), obj in self.objects.items()
                if res == resource and (namespace is None or ns == namespace)]

    def get(self, resource: str, namespace: str, name: str) -> Obj:
        try:
            return self.objects[(resource, namespace, name)]
        except KeyError:
            raise NotFound(name) from None

    def events_since(self, rv: int, resource: str) -> builtins.list[Event]:
        if rv < self.oldest - 1:
            raise Gone(rv)
        return [e for e in self.log if e.rv > rv and e.resource == resource]

    # --- writes ------------------------------------------------------------------------------------------

    def _publish(self, resource: str, kind: str, old: Obj | None, new: Obj) -> None:
        event = Event(self.rv, resource, kind, old, new)
        if len(self.log) == self.log.maxlen:
            self.oldest = self.log[0].rv + 1
        self.log.append(event)
        for watcher in list(self.watchers):
            if watcher.resource == resource:
                watcher.queue.put_nowait((kind, event))  # type: ignore[arg-type]

    def _bump(self, obj: Obj) -> None:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)

    def create(self, resource: str, namespace: str, obj: Obj, *, keep_uid: bool = False) -> Obj:
        """``keep_uid``: a test seeding the cluster as a controller left it (pods that name their owner's uid)
        keeps the uid it gives; the API's create always makes a new one."""
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        key = (resource, namespace, meta["name"])
        if key in self.objects:
            raise Conflict(meta["name"])
        given = meta.get("uid") if keep_uid and isinstance(meta.get("uid"), str) and meta.get("uid") else None
        meta.update(namespace=namespace, uid=given or str(uuid.uuid4()), creationTimestamp=now())
        meta.setdefault("labels", {})
        meta.setdefault("annotations", {})
        meta.pop("deletionTimestamp", None)
        _name_label(resource, meta)
        if resource == "/v1/pods":
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        self._bump(obj)
        self.objects[key] = obj
        self.published[key] = clone(obj)
        self._publish(resource, "ADDED", None, self.published[key])
        return obj

    def replace(self, resource: str, namespace: str, name: str, obj: Obj) -> Obj:
        old = self.get(resource, namespace, name)
        expected = obj.get("metadata", {}).get("resourceVersion")
        if expected and expected != old["metadata"]["resourceVersion"]:
            raise Conflict(name)
        meta = obj.setdefault("metadata", {})
        for keep in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp"):
            if keep in old["metadata"]:
                meta[keep] = old["metadata"][keep]
        _name_label(resource, meta)
        self._bump(obj)
        key = (resource, namespace, name)
        before = self.published.get(key) or clone(old)
        self.objects[key] = obj
        self.published[key] = clone(obj)
        self._publish(resource, "MODIFIED", before, self.published[key])
        return obj

    def delete(self, resource: str, namespace: str, name: str, *, graceful: bool = False) -> Obj:
        obj = self.get(resource, namespace, name)
        if graceful and not obj["metadata"].get("deletionTimestamp"):
            new = clone(obj)
            new["metadata"]["deletionTimestamp"] = now()
            return self.replace(resource, namespace, name, new)
        key = (resource, namespace, name)
        del self.objects[key]
        before = self.published.pop(key, None)
        self._bump(obj)
        gone = clone(obj)
        self._publish(resource, "DELETED", before or gone, gone)
        return obj

    def compact(self) -> None:
        """Forget the event log: every watch from an older resourceVersion now gets 410 Gone."""
        self.log.clear()
        self.oldest = self.rv + 1


def _name_label(resource: str, meta: Obj) -> None:
    """A Namespace carries ``kubernetes.io/metadata.name: <its name>`` whatever its writer sent (the namespace
    registry's PrepareForCreate and PrepareForUpdate): webhooks' namespaceSelectors exclude namespaces by it."""
    if resource == NAMESPACES:
        if not isinstance(meta.get("labels"), dict):
            meta["labels"] = {}
        meta["labels"][NAME_LABEL] = meta["name"]
