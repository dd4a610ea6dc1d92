"""The leader's writes of the topology order's blocks (core/publication/blocks.py): one ConfigMap per block,
``<job>-topology-block-<key>``, written when its text changes and before the summary that names it, so that a
LIST that shows a summary shows its blocks. A block no summary names any more is left as it is (a pod reads a
block only under the digest its summary gives); it goes with the job, whose object owns it.

Blocks need no writer check of their own: the summary, whose writer a reader vouches for, names each block's text
by its digest.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import TYPE_CHECKING, Any

from agent.core.pods.pod import object_name
from agent.core.publication.blocks import BLOCK_KEY, PART_LABEL, Made, block_digest, block_key, block_name
from agent.core.publication.published import select_value
from agent.errors import ApiConflict, ApiNotFound
from agent.k8s.retrying import retried

if TYPE_CHECKING:  # the protocol's module imports aiohttp, which init does not load (k8s/blocking.py)
    from agent.k8s.async_client import AsyncApi

log = logging.getLogger("topology_agent.publishing")
BLOCKS_LABEL = "topology-agent.io/blocks-of"  # a job's blocks, apart from the objects a full view lists


def block_body(snapshot_name: str, made: Made, *, owner: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": block_name(snapshot_name, made.values),
                     "labels": {"app.kubernetes.io/managed-by": "topology-agent",
                                BLOCKS_LABEL: select_value(snapshot_name),
                                PART_LABEL: block_key(snapshot_name, made.values)}},
        "data": {BLOCK_KEY: made.text},
    }
    if owner:
        body["metadata"]["ownerReferences"] = [{**owner, "controller": False}]
    return body


class BlockWriter:
    """The blocks one leader has written, by name, with their digests (read back once per leadership)."""

    def __init__(self, api: AsyncApi, namespace: str, name: str, *, owner: dict[str, Any] | None) -> None:
        self.api, self.name, self.owner = api, name, owner
        self.collection = f"/api/v1/namespaces/{namespace}/configmaps"
        self.held: dict[str, str] | None = None  # block name -> the digest of its text as published
        self.versions: dict[str, str] = {}  # block name -> the resourceVersion this leader wrote or read back
        self.made: list[Made] = []  # the blocks of the summary last made

    async def _read_back(self) -> dict[str, str]:
        items, _ = await retried(lambda: self.api.list_objects(
            self.collection, label_selector=f"{BLOCKS_LABEL}={select_value(self.name)}"), what="reading the blocks")
        held = {}
        for item in items:
            text = (item.get("data") or {}).get(BLOCK_KEY)
            held[object_name(item)] = block_digest(text) if isinstance(text, str) else ""
            self.versions[object_name(item)] = _version(item)
        return held

    async def write(self, blocks: list[Made]) -> None:
        """Each block whose text is not the one published, created or replaced."""
        if not blocks:
            return
        if self.held is None:
            self.held = await self._read_back()
        for made in blocks:
            name = block_name(self.name, made.values)
            if self.held.get(name) == made.digest:
                continue
            await retried(functools.partial(self._put, name, block_body(self.name, made, owner=self.owner)),
                          what=f"publishing block {name}")
            self.held[name] = made.digest

    async def _put(self, name: str, body: dict[str, Any]) -> None:
        written = None
        if self.held is not None and name in self.held:
            with contextlib.suppress(ApiNotFound):
                written = await self.api.replace(f"{self.collection}/{name}", body)
        if written is None:
            try:
                written = await self.api.create(self.collection, body)
            except ApiConflict:
                written = await self.api.replace(f"{self.collection}/{name}", body)
        self.versions[name] = _version(written)

    async def tend(self) -> None:
        """Write again the blocks that are gone (deleted) or that another writer changed (a resourceVersion this
        leader did not write): the summary names each by its text's digest, and its pods wait for that text."""
        blocks = self.made
        if not blocks or self.held is None:
            return
        items, _ = await self.api.list_objects(self.collection, metadata_only=True,
                                               label_selector=f"{BLOCKS_LABEL}={select_value(self.name)}")
        there = {object_name(item): _version(item) for item in items}
        for made in blocks:
            name = block_name(self.name, made.values)
            if name not in there:
                self.held.pop(name, None)
                log.warning("configmap %s was gone (deleted?); writing it again", name)
            elif there[name] != (self.versions.get(name) or there[name]):
                self.held.pop(name, None)
                log.warning("configmap %s was changed by another writer; writing it again", name)
        await self.write(blocks)


def _version(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")
