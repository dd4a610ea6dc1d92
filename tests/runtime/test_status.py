"""``topology-agent status`` over the sandbox's API in memory (runtime/status.py): the job found by its name among
the controllers' kinds, its pods read as their init reads them (the options of their init container), the
generation each pod's agent recorded, a large job's publisher and standbys, and ``-w`` printing again at a change.
tests/integration/test_status.py runs the command itself against running agents."""

from __future__ import annotations

import asyncio
import copy
import io
import json

import pytest

from agent.errors import InputError
from agent.flags.status import StatusSettings, options_of
from agent.runtime.status import show
from tests.fakeapi import CONFIG, init_pod
from tests.jobs import add_worker, create_volcano_job, rogue


def settings(**given) -> StatusSettings:
    return StatusSettings(**{"job": "demo", "namespace": "default", "config": CONFIG, "controller": None,
                             "output": "table", "watch": False, **given})


async def status(api, **given) -> str:
    out = io.StringIO()
    async with api.async_client("status") as client:
        await show(client, settings(**given), out=out)
    return out.getvalue()


async def started(api, logs, tmp_path, names, *args: str) -> None:
    """Each pod's init, side by side as the pods' processes."""
    ran = await asyncio.gather(*(asyncio.to_thread(init_pod, api, logs, name, tmp_path / name, *args)
                                 for name in names))
    assert all(r.code == 0 for r in ran), [r.err for r in ran]


async def test_a_running_job_is_found_by_its_name_and_each_pod_shows_its_rank_and_generation(memory, api, logs,
                                                                                           tmp_path):
    pods = create_volcano_job(memory, (("master", 1), ("worker", 2)))
    memory.create_pod(rogue("rogue-1", "worker", 7, 9))
    await started(api, logs, tmp_path, [p["metadata"]["name"] for p in pods])
    text = await status(api)
    lines = text.splitlines()
    assert lines[0] == "Volcano Job 'demo' in namespace default: 3 of 3 training pods placed, world size 3"
    assert lines[1].split() == ["NAME", "ROLE", "RANK", "NODE-RANK", "NODE", "ADDRESS", "GENERATION", "READY"]
    assert [line.split()[:4] for line in lines[2:5]] == [["demo-master-0", "master", "0", "0"],
                                                        ["demo-worker-0", "worker", "1", "1"],
                                                        ["demo-worker-1", "worker", "2", "2"]]
    assert all(line.split()[6] == "1" for line in lines[2:5])  # each init recorded generation 1
    assert "rogue-1    pod 'rogue-1' has the labels of Job 'demo' but is not owned by it" in text
    doc = json.loads(await status(api, output="json"))
    assert [(m["name"], m["rank"], m["generation"]) for m in doc["members"]] == [
        ("demo-master-0", 0, 1), ("demo-worker-0", 1, 1), ("demo-worker-1", 2, 1)]
    assert doc["leftOut"][0]["name"] == "rogue-1" and doc["publication"] is None


async def test_a_job_that_is_not_there_or_is_two_jobs_is_one_line_naming_what_to_do(memory, api):
    with pytest.raises(InputError, match=r"no job 'demo' in namespace 'default' \(looked for Volcano Job, "):
        await status(api)
    create_volcano_job(memory, (("master", 1), ("worker", 1)))
    with pytest.raises(InputError, match=r"no job 'demo' .*\(looked for Kubeflow PyTorchJob\)"):
        await status(api, controller="pytorchjob")
    memory.create("batch/v1/jobs", "default", {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "demo"},
                                               "spec": {"completions": 2}})
    with pytest.raises(InputError, match=r"several jobs are named 'demo' .*\(Volcano Job, Indexed Job\); pass "
                                         r"--controller \(volcano, indexed-job\)"):
        await status(api)
    assert "Volcano Job 'demo'" in await status(api, controller="volcano")


async def test_a_large_job_shows_its_publisher_and_standbys(memory, api, logs, tmp_path):
    pods = create_volcano_job(memory, (("master", 1), ("worker", 4)))
    await started(api, logs, tmp_path, [p["metadata"]["name"] for p in pods], "--source", "published")
    text = await status(api)
    # every init at once: the first training pod's to run publishes, and names the first two others its standbys
    publisher = memory.sandbox.store.get("/v1/configmaps", "default", "demo-topology")["data"]["leader"]
    ranks = ["demo-master-0", *(f"demo-worker-{k}" for k in range(4))]
    assert "PUBLISHED   configmap demo-topology, sequence 1" in text
    assert f"PUBLISHER   {publisher} (Lease held by {publisher}, renewed" in text
    assert f"STANDBYS    {', '.join([n for n in ranks if n != publisher][:2])}" in text


def test_the_options_are_those_of_the_pods_init_container():
    pod = {"spec": {"initContainers": [{"name": "topology-agent", "args": ["init", "--out", "/shared",
                                                                             "--nproc-per-node", "4"],
                                        "env": [{"name": "TOPOLOGY_ADDRESS", "value": "ip"}]}]}}
    options = options_of(pod)
    assert options is not None and options.nproc_per_node == 4 and options.address == "ip"
    assert options_of({"spec": {"initContainers": [{"name": "topology-agent", "args": ["init", "--bogus"]}]}}) is None
    assert options_of({"spec": {}}) is None


class Printed(io.StringIO):
    """What ``show`` prints, with an event set at each write."""

    def __init__(self) -> None:
        super().__init__()
        self.wrote = asyncio.Event()

    def write(self, text: str) -> int:
        self.wrote.set()
        return super().write(text)


async def test_watch_prints_again_when_a_pod_joins(memory, api, logs, tmp_path):
    pods = create_volcano_job(memory, (("master", 1), ("worker", 1)))
    await started(api, logs, tmp_path, [p["metadata"]["name"] for p in pods])
    out = Printed()
    async with api.async_client("status") as client:
        task = asyncio.create_task(show(client, settings(watch=True), out=out))
        try:
            async with asyncio.timeout(20):
                await out.wrote.wait()
                out.wrote.clear()
                assert "demo-worker-1" not in out.getvalue()
                add_worker(memory, 1, 30)
                await out.wrote.wait()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    first, second = out.getvalue().split("\n\n", 1)
    assert "2 of 2 training pods placed" in first
    assert "demo-worker-1   worker   2      2" in second and "<unknown>" in second  # no agent ran in it yet


# --- what others wrote: names, pods and Events the job does not own -------------------------------------------

LEASES = "coordination.k8s.io/v1/leases"
OSC8 = "\x1b]8;;https://evil.example/\x07demo-worker-0\x1b]8;;\x07"
FAKE_ROW = "x\r\ndemo-rogue-0   master   0      0      node-0   127.9.9.9   1 (1s)   1/1"


def replaced(memory, resource: str, name: str, change) -> None:
    """An object of the job rewritten by someone who may write it (its resourceVersion dropped: no conflict)."""
    obj = copy.deepcopy(memory.sandbox.store.get(resource, "default", name))
    change(obj)
    obj["metadata"].pop("resourceVersion")
    memory._run(memory.sandbox.store.replace, resource, "default", name, obj)


async def test_a_forged_lease_holder_and_journal_publisher_print_escaped_and_invalid(memory, api, logs, tmp_path):
    pods = create_volcano_job(memory, (("master", 1), ("worker", 2)))
    await started(api, logs, tmp_path, [p["metadata"]["name"] for p in pods], "--source", "published")
    replaced(memory, LEASES, "demo-topology", lambda lease: lease["spec"].update(holderIdentity=OSC8))
    replaced(memory, "/v1/configmaps", "demo-topology-journal",
             lambda journal: journal["data"].update(leader="\x1b[2J\x1b[H", standby=f"{FAKE_ROW},demo-worker-1\x07"))
    text = await status(api)
    lines = text.splitlines()
    assert all(line.isprintable() for line in lines), lines
    assert len([line for line in lines if line.startswith("demo-")]) == 3  # the three pods' rows, and no other
    assert "PUBLISHER   <invalid: \\x1b[2J\\x1b[H> (Lease held by <invalid: \\x1b]8;;https://evil.example/\\x07" \
           "demo-worker-0\\x1b]8;;\\x07>, renewed" in text
    assert "STANDBYS    <invalid: x\\r\\ndemo-rogue-0   master   0" in text and "<invalid: demo-worker-1\\x07>" in text
    doc = json.loads(await status(api, output="json"))  # the document keeps the values, as JSON escapes them
    assert doc["publication"]["leaseHolder"] == OSC8
