"""The sandbox's watch streams (agent/sandbox/watching.py): a client that resumes from the last resourceVersion it
read (an event's or a BOOKMARK's) misses nothing, whatever instant a write lands at."""

from __future__ import annotations

import asyncio
import json

from agent.sandbox.faults import Knobs
from agent.sandbox.store import Store, Watcher
from agent.sandbox.watching import _Stream

CONFIGMAPS = "/v1/configmaps"


class _WriteAsTheWaitEnds(asyncio.Queue):
    """The watcher's queue, where the first wait for an event ends as a write lands: in one turn of the loop the
    wait's timer fires and the write puts its event in the queue (a busy API server's loop runs both together)."""

    def __init__(self, write) -> None:
        super().__init__()
        self.write, self.waits = write, 0

    async def get(self):
        self.waits += 1
        if self.waits == 1:
            try:
                await asyncio.sleep(3600)  # until the watch's timeout ends the wait
            finally:
                self.write()  # in the same turn of the loop
        return await super().get()


def test_a_bookmark_never_passes_an_event_not_sent_yet():
    """The stream's BOOKMARK said the store's resourceVersion while the event that made it waited in the queue;
    the watch then ended at its timeout, and the client, resuming from the bookmark, never saw that event (a
    guard waiting for the summary ConfigMap stalled so until its --timeout: tests/runtime/test_leading.py)."""
    store = Store()
    lines: list[dict] = []

    async def write(line: bytes) -> None:
        lines.append(json.loads(line))

    async def run() -> None:
        def create() -> None:
            store.create(CONFIGMAPS, "default", {"metadata": {"name": "demo-topology-summary"}, "data": {}})

        watcher = Watcher(resource=CONFIGMAPS, namespace="default", queue=_WriteAsTheWaitEnds(create))
        store.watchers.add(watcher)
        stream = _Stream(write, "test", Knobs(), store, watcher, lambda obj: True)
        start = str(store.rv)
        assert await stream.begin(start)
        await stream.follow(0.2, 0.5, "ConfigMap", "v1")

    asyncio.run(run())
    sent = [line["object"]["metadata"]["name"] for line in lines if line["type"] == "ADDED"]
    resumed_from = int(lines[-1]["object"]["metadata"]["resourceVersion"]) if lines else 1
    replayed = [event.new["metadata"]["name"] for event in store.events_since(resumed_from, CONFIGMAPS)]
    assert sent + replayed == ["demo-topology-summary"], (lines, replayed)
