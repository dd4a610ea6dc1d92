"""init's client with the async face the runtime is written against (``AsyncApi``): each call a coroutine that
makes the blocking call of client.py and returns its answer.

The runtime's helpers (reading the job, the Nodes, the published topology, vouching for its writer) are written
once, async, for the sidecar; init runs the same helpers in ``asyncio.run`` over this adapter, so it keeps its
small synchronous client (http.client: no aiohttp loaded, the start-up cost of every pod) and does one thing at a
time, as it always did. Nothing here waits concurrently: a call holds the loop until its answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from agent.core.model import RawPod
from agent.k8s.client import Client
from agent.k8s.core import Keep, Traffic, WatchEvent
from agent.k8s.transport import IDLE


class Blocking:
    """``AsyncApi`` over a blocking ``Client``."""

    def __init__(self, client: Client) -> None:
        self.client = client

    @property
    def traffic(self) -> Traffic:
        return self.client.traffic

    async def get_pod(self, namespace: str, name: str) -> RawPod:
        return self.client.get_pod(namespace, name)

    async def get_object(self, path: str, *, metadata_only: bool = False) -> dict[str, Any]:
        return self.client.get_object(path, metadata_only=metadata_only)

    async def list_objects(self, path: str, *, label_selector: str = "", field_selector: str = "", limit: int = 0,
                           keep: Keep | None = None, metadata_only: bool = False,
                           table: bool = False) -> tuple[list[dict[str, Any]], str]:
        return self.client.list_objects(path, label_selector=label_selector, field_selector=field_selector,
                                        limit=limit, keep=keep, metadata_only=metadata_only, table=table)

    async def watch_objects(self, path: str, resource_version: str, *, timeout: float, label_selector: str = "",
                            field_selector: str = "", idle: float = IDLE) -> AsyncIterator[WatchEvent]:
        events: Iterator[WatchEvent] = self.client.watch_objects(
            path, resource_version, timeout=timeout, label_selector=label_selector, field_selector=field_selector,
            idle=idle)
        try:
            for event in events:
                yield event
        finally:
            closing = getattr(events, "close", None)
            if closing is not None:
                closing()  # a watch left early closes its connection now

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.client.create(path, body)

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.client.replace(path, body)
