"""LIST answers: paged as the API server pages them, as a Table for ``kubectl get``, or metadata only.

Each paged LIST continues the snapshot its first page saw (as the API server lists etcd at the first page's
revision), sorted once, not once per page; a continue token older than the snapshots kept gets 410 Expired.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable
from typing import Any

from agent.sandbox import tables
from agent.sandbox.calls import Answer, failure
from agent.sandbox.responses import metadata_only, partial
from agent.sandbox.store import Obj, Store

SNAPSHOTS = 64  # paged LISTs in progress kept; an older continue token gets 410 Expired, as from the API server


class Pager:
    """The paged LISTs in progress, each the snapshot its first page saw."""

    def __init__(self) -> None:
        self._snapshots: collections.OrderedDict[str, tuple[str, list[Obj]]] = collections.OrderedDict()
        self._ids = itertools.count(1)

    def page(self, store: Store, resource: str, namespace: str | None, matches: Callable[[Obj], bool], *,
             limit: int, token: str) -> tuple[list[Obj], dict[str, Any]] | Answer:
        """One page of the matching objects and the list's metadata (resourceVersion, continue)."""
        if token:
            snapshot_id, _, offset = token.partition(":")
            if snapshot_id not in self._snapshots or not offset.isdigit():
                return failure(410, "Expired", "The provided continue parameter is too old to display a "
                              "consistent list result. You can start a new list without the continue parameter.")
            version, items = self._snapshots[snapshot_id]
            start = int(offset)
        else:
            version, start = str(store.rv), 0
            items = sorted((o for o in store.list(resource, namespace) if matches(o)),
                           key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        meta: dict[str, Any] = {"resourceVersion": version}
        if limit and len(items) > start + limit:
            snapshot_id = token.partition(":")[0] if token else str(next(self._ids))
            self._snapshots[snapshot_id] = (version, items)
            self._snapshots.move_to_end(snapshot_id)
            while len(self._snapshots) > SNAPSHOTS:
                self._snapshots.popitem(last=False)
            meta["continue"] = f"{snapshot_id}:{start + limit}"
            meta["remainingItemCount"] = len(items) - start - limit
        elif token:
            self._snapshots.pop(token.partition(":")[0], None)
        return (items[start:start + limit] if limit else items), meta


def list_answer(accept: str, kind: str, api_version: str, page: list[Obj], meta: dict[str, Any], *,
                include: str = "") -> Answer:
    """The page in the form asked for: a Table (each row with what ``include``, the request's ``includeObject``,
    asks), PartialObjectMetadataList, or the kind's List."""
    if tables.wants_table(accept):
        return Answer(200, tables.table(kind, page, meta, partial=partial, include=include or "Metadata"))
    if metadata_only(accept):
        return Answer(200, {"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
                            "items": [partial(o) for o in page]})
    return Answer(200, {"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta, "items": page})
