"""The leader's blocks (runtime/publication/block_writing.py) against the sandbox's API in memory: written when
their text changes, and ``tend`` puts back a block that was deleted or that another writer changed, so that the
pods whose summary names its text by digest do not wait for it for good."""

from __future__ import annotations

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
