"""The leader's blocks (runtime/publication/block_writing.py) against the sandbox's API in memory: written when
their text changes, and ``tend`` puts back a block that was deleted or that another writer changed, so that the
pods whose summary names its text by digest do not wait for it for good."""

from __future__ import annotations

import pytest

from agent.core.publication.blocks import BLOCK_KEY, Made, block_digest, block_name
from agent.runtime.publication.block_writing import BlockWriter
from tests.jobs import configmap

CONFIGMAPS = "/v1/configmaps"
BLOCKS = [Made(("zone-a", "rack-1"), 2, 2, '{"runs":[[0,0,1]]}'), Made(("zone-a", "rack-2"), 1, 1, '{"runs":[[0,2]]}')]


def texts(memory):
    return [configmap(memory, block_name("demo-topology", made.values))["data"][BLOCK_KEY] for made in BLOCKS]


async def test_tend_puts_back_a_block_deleted_or_changed_by_another_writer(memory, api):
    writer = BlockWriter(api.async_client("leader"), "default", "demo-topology", owner=None)
    writer.made = BLOCKS
    await writer.write(BLOCKS)
    assert texts(memory) == [made.text for made in BLOCKS]
    await writer.tend()  # nothing changed: nothing written
    first = configmap(memory, block_name("demo-topology", BLOCKS[0].values))
    second = configmap(memory, block_name("demo-topology", BLOCKS[1].values))

    def forged(cm):
        cm["data"][BLOCK_KEY] = '{"runs":[[0,0,5]]}'
    memory.update(CONFIGMAPS, "default", first["metadata"]["name"], forged)
    memory.delete(CONFIGMAPS, "default", second["metadata"]["name"])
    await writer.tend()
    assert texts(memory) == [made.text for made in BLOCKS]
    assert [block_digest(t) for t in texts(memory)] == [made.digest for made in BLOCKS]


async def test_tend_leaves_the_blocks_this_leader_wrote_alone(memory, api):
    writer = BlockWriter(api.async_client("leader"), "default", "demo-topology", owner=None)
    writer.made = BLOCKS
    await writer.write(BLOCKS)
    versions = [configmap(memory, block_name("demo-topology", m.values))["metadata"]["resourceVersion"]
                for m in BLOCKS]
    await writer.tend()
    await writer.tend()
    assert [configmap(memory, block_name("demo-topology", m.values))["metadata"]["resourceVersion"]
            for m in BLOCKS] == versions


async def test_the_journal_and_the_summary_with_its_block_are_written_at_once():
    """A change the summary says goes out as the journal and, at the same time, the block then the summary:
    a pod in its own view (the summary's reader) does not wait for the journal's round trip first."""
    import asyncio

    from agent.core.model import Options
    from agent.core.publication.journal import summary_name
    from agent.runtime.publication.publishing import JournalWriter, first_publisher

    order: list[str] = []
    summary_sent = asyncio.Event()

    class Api:
        async def create(self, collection, body):  # type: ignore[no-untyped-def]
            name = body["metadata"]["name"]
            order.append(name)
            if name == summary_name("demo-topology"):
                summary_sent.set()
            elif name == "demo-topology-journal":  # its answer comes after the summary went out
                await asyncio.wait_for(summary_sent.wait(), 2)
            return {"metadata": {"name": name, "resourceVersion": str(len(order))}}

    writer = JournalWriter(Api(), "default", "demo-topology", job="demo",  # type: ignore[arg-type]
                           options=Options(), leader="demo-worker-0", leader_uid="u", owner=None)
    publisher = first_publisher("default", Options(), job="demo", leader="demo-worker-0", leader_uid="u")
    publisher.snapshot_written(publisher.state.seq)
    writer.blocks.held, writer.blocks.made = {}, BLOCKS
    assert await writer._written(publisher, {"summary": "{}"}, "new")
    assert writer.summary.said == "new"
    block = order.index(block_name("demo-topology", BLOCKS[0].values))
    assert order.index("demo-topology-journal") < block < order.index(summary_name("demo-topology"))


@pytest.mark.slow
async def test_a_large_change_is_written_a_part_at_a_time_after_the_snapshot_before_the_last_journal():
    """A change over one entry's size goes out as one journal version per part, in sequence, each written before
    the next: a follower's watch sees every part (a version that is overwritten before it is read would send it
    back to the snapshot). The snapshot, which a follower that falls behind reads, comes first."""
    from agent import examples
    from agent.core.model import Options
    from agent.core.publication import journal as journal_module
    from agent.core.publication.journal import read_journal
    from agent.runtime.publication.publishing import JournalWriter, first_publisher

    written: list[tuple[str, dict]] = []

    class Api:
        async def create(self, collection, body):  # type: ignore[no-untyped-def]
            written.append((body["metadata"]["name"], body))
            return {"metadata": {"name": body["metadata"]["name"], "resourceVersion": str(len(written))}}

        replace = create

    pods = {p["metadata"]["name"]: p for p in examples.volcano_job("demo", (("master", 1), ("worker", 4095)))}
    writer = JournalWriter(Api(), "default", "demo-topology", job="demo",  # type: ignore[arg-type]
                           options=Options(), leader="demo-master-0", leader_uid="u", owner=None)
    publisher = first_publisher("default", Options(), job="demo", leader="demo-master-0", leader_uid="u")
    publisher.change(pods, set(pods), journal=False)
    publisher.snapshot_written(publisher.state.seq)
    first = publisher.state.seq
    for k, pod in enumerate(pods.values()):
        pod["status"]["podIP"] = f"127.8.{k // 250}.{k % 250 + 1}"
    assert publisher.change(pods, set(pods)) is not None
    writer.blocks.held, writer.blocks.made = {}, []
    assert await writer._written(publisher, {}, writer.summary.said)
    names = [name for name, _ in written]
    assert names == ["demo-topology", "demo-topology-journal", "demo-topology-journal"]
    journals = [read_journal(body) for name, body in written if name == "demo-topology-journal"]
    assert [(j.base, j.seq) for j in journals if j is not None] == [(first, first + 1), (first + 1, first + 2)]
    assert all(len(body["data"][journal_module.JOURNAL_KEY]) <= journal_module.MAX_ENTRY for _, body in written[1:])
