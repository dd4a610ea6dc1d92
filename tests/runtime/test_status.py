"""``topology-agent status`` over the sandbox's API in memory (runtime/commands/status.py): the job found by its
name among the controllers' kinds, its pods read as their init reads them (the options of their init container),
the generation each pod's agent recorded, a large job's publisher and standbys, and ``-w`` printing again at a
change.
tests/integration/test_status.py runs the command itself against running agents."""

from __future__ import annotations

import asyncio
import copy
import io
import json
import time

import pytest

from agent import examples
from agent.core.report.events import CONTROLLER, GENERATION_LABEL, JOB_LABEL, micro_time
from agent.errors import InputError
from agent.flags.status import StatusSettings, options_of
from agent.runtime.commands.status import show
from agent.runtime.demo import volcano_owner
from agent.runtime.events import events_path
from tests.fakeapi import CONFIG, init_pod
from tests.jobs import add_worker, create_trainjob, create_volcano_job, name_of, on_nodes_of_their_own, rogue


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


async def test_a_member_on_a_lost_node_is_shown_left_out_with_its_node_and_why(memory, api, logs, tmp_path):
    """status reads the pods' Nodes (a GET each for a handful) as the sidecars that watch them see them."""
    pods = create_volcano_job(memory, (("master", 1), ("worker", 2)))
    on_nodes_of_their_own(memory, pods)
    await started(api, logs, tmp_path, [p["metadata"]["name"] for p in pods])
    memory.update("/v1/nodes", "", "node-2", lambda node: node["status"].__setitem__(
        "conditions", [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]))
    text = await status(api)
    assert text.splitlines()[0].endswith("2 of 3 training pods placed, world size 2")
    assert "demo-worker-1   lost: node node-2 Unknown (its kubelet stopped reporting)" in text
    doc = json.loads(await status(api, output="json"))
    assert doc["leftOut"] == [{"name": "demo-worker-1",
                               "reason": "lost: node node-2 Unknown (its kubelet stopped reporting)"}]


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
    assert options is not None and options.processes.per_node == 4 and options.address == "ip"
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


def rogue_job_and_pod(memory) -> None:
    """``aaa-rogue``, sorting before every pod of the job: the job's labels, an owner of its own maker's (a job
    'evil' of the same kind), and ``--roles worker`` in its init container's args."""
    evil = volcano_owner()
    evil["metadata"].update(name="evil", uid="uid-of-evil")
    evil["spec"]["tasks"] = [{"name": "worker", "replicas": 3, "template": {}}]
    memory.create("batch.volcano.sh/v1alpha1/jobs", "default", evil)
    pod = rogue("aaa-rogue", "worker", 0, 9)
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "evil",
                                           "uid": "uid-of-evil", "controller": True}]
    pod["spec"]["initContainers"][0]["args"] += ["--roles", "worker"]
    memory.create_pod(pod)


async def test_a_rogue_pod_that_sorts_first_neither_sets_the_options_nor_shows_as_a_rank(memory, api, logs,
                                                                                        tmp_path):
    pods = create_volcano_job(memory, (("master", 1), ("worker", 2)))
    await started(api, logs, tmp_path, [p["metadata"]["name"] for p in pods])
    rogue_job_and_pod(memory)
    text = await status(api)
    lines = text.splitlines()
    assert lines[0] == "Volcano Job 'demo' in namespace default: 3 of 3 training pods placed, world size 3"
    assert [line.split()[:4] for line in lines[2:5]] == [["demo-master-0", "master", "0", "0"],
                                                        ["demo-worker-0", "worker", "1", "1"],
                                                        ["demo-worker-1", "worker", "2", "2"]]
    assert [line.split(None, 1)[1] for line in lines if line.startswith("aaa-rogue ")] == [
        f"pod 'aaa-rogue' has the labels of Job 'demo' but is not owned by it (no ownerReference leads to its uid "
        f"{pods[0]['metadata']['ownerReferences'][0]['uid']}); only the job's own pods are members"]


async def test_a_job_that_owns_none_of_the_pods_with_its_labels_says_so_in_one_line(memory, api):
    owner = volcano_owner()
    owner["metadata"]["uid"] = "uid-of-a-new-demo"  # the pods are an earlier job's of that name
    memory.create("batch.volcano.sh/v1alpha1/jobs", "default", owner)
    for pod in examples.volcano_job("demo", (("master", 1), ("worker", 1))):
        memory.create_pod(pod)
    memory.create_pod(rogue("aaa-rogue", "worker", 0, 9))
    text = await status(api)
    problems = [line for line in text.splitlines() if line.startswith("no plan: ")]
    assert problems == ["no plan: none of the 3 pods with the job's labels is owned by Job 'demo' (uid "
                        "uid-of-a-new-demo): they are no pods of this job (another object of that name made them, "
                        "or someone else did); wait for its controller to create its pods, or check -n and "
                        "--controller"]
    assert "0 training pods placed, world size 0" in text and "demo-master-0   pod 'demo-master-0' has the labels" \
        in text


async def forged_generation(memory, api, pod: str, **given) -> None:
    """An Event someone who may create Events wrote with the job's generation label, saying ``pod`` wrote
    generation 99 now."""
    uid = memory.sandbox.store.get("/v1/pods", "default", pod)["metadata"]["uid"]
    event = {"apiVersion": "events.k8s.io/v1", "kind": "Event",
             "metadata": {"name": f"{pod}.forged{len(given)}", "namespace": "default",
                          "labels": {JOB_LABEL: "demo", GENERATION_LABEL: "99"}},
             "eventTime": micro_time(time.time() + 60), "reportingController": CONTROLLER,
             "reportingInstance": pod, "action": "Rewrite", "reason": "NewGeneration", "type": "Normal",
             "note": "generation 99", "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": "default",
                                                    "name": pod, "uid": uid}}
    if "regarding_name" in given:
        event["regarding"]["name"] = given.pop("regarding_name")
    event.update(given)
    async with api.async_client("forger") as client:
        await client.create(events_path("default"), event)


@pytest.mark.parametrize("forged", [
    {"reportingController": "evil.example/forger"},
    {"reportingInstance": "aaa-rogue"},
    {"reason": "PodRefused"},
    {"regarding_name": "aaa-rogue"},
], ids=["another-controller", "another-instance", "another-reason", "about-another-pod-with-the-members-uid"])
async def test_a_generation_is_read_only_from_events_the_pods_own_agent_could_have_written(memory, api, logs,
                                                                                         tmp_path, forged):
    pods = create_volcano_job(memory, (("master", 1), ("worker", 1)))
    await started(api, logs, tmp_path, [p["metadata"]["name"] for p in pods])
    await forged_generation(memory, api, "demo-worker-0", **forged)
    doc = json.loads(await status(api, output="json"))
    assert [(m["name"], m["generation"]) for m in doc["members"]] == [("demo-master-0", 1), ("demo-worker-0", 1)]
    await forged_generation(memory, api, "demo-worker-0")  # all an agent writes: what status cannot tell from its own
    doc = json.loads(await status(api, output="json"))
    assert [(m["name"], m["generation"]) for m in doc["members"]] == [("demo-master-0", 1), ("demo-worker-0", 99)]


async def test_a_trainjobs_pods_are_its_own_through_its_jobset_and_jobs_and_a_rogue_jobs_are_not(memory, api):
    node_pods, launcher = create_trainjob(memory, num_nodes=3)
    jobset = memory.sandbox.store.get("jobset.x-k8s.io/v1alpha2/jobsets", "default", "ds")
    by_jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "ds",
                 "uid": jobset["metadata"]["uid"], "controller": True}
    for ref in {p["metadata"]["ownerReferences"][0]["name"]: p["metadata"]["ownerReferences"][0]
                for p in node_pods + launcher}.values():  # the Jobs JobSet makes, each owned by it
        memory.create("batch/v1/jobs", "default", {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
            "name": ref["name"], "uid": ref["uid"], "ownerReferences": [by_jobset]}, "spec": {}})
    for pod in launcher:
        memory.create_pod(pod)
    # someone's Job of their own, and a pod of it with the TrainJob's labels, sorting first
    memory.create("batch/v1/jobs", "default", {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": "ds-node-9", "uid": "uid-of-ds-node-9"}, "spec": {}})
    pod = copy.deepcopy(node_pods[0])
    pod["metadata"].update(name="aaa-rogue", uid="uid-of-aaa-rogue", ownerReferences=[
        {"apiVersion": "batch/v1", "kind": "Job", "name": "ds-node-9", "uid": "uid-of-ds-node-9", "controller": True}])
    pod["spec"]["hostname"] = "aaa-rogue"
    memory.create_pod(pod)
    text = await status(api, job="ds")
    real = [name_of(p) for p in node_pods + launcher]
    rows = [line.split()[0] for line in text.splitlines()[2:] if line.split() and line.split()[0] in real]
    assert sorted(rows) == sorted(real), text
    assert "3 of 3 training pods placed, world size 3" in text.splitlines()[0]
    assert any(line.startswith("aaa-rogue ") and "pod 'aaa-rogue' has the labels of TrainJob 'ds' but is not owned "
               "by it" in line for line in text.splitlines()), text


async def test_a_leaderworkersets_workers_are_its_own_through_their_leader_pod_and_statefulsets(memory, api):
    """LeaderWorkerSet -> leader StatefulSet -> leader pod -> the group's worker StatefulSet -> worker pods."""
    pods = examples.leaderworkerset("vllm", size=3, groups=1)

    def statefulset(pod: dict, owner: dict) -> None:
        ref = pod["metadata"]["ownerReferences"][0]
        memory.create("apps/v1/statefulsets", "default", {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {
            "name": ref["name"], "uid": ref["uid"], "ownerReferences": [{**owner, "controller": True}]}, "spec": {}})

    memory.create("leaderworkerset.x-k8s.io/v1/leaderworkersets", "default", {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": "vllm", "uid": "uid-of-vllm"}, "spec": {"replicas": 1}})
    statefulset(pods[0], {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": "vllm",
                          "uid": "uid-of-vllm"})
    leader = memory.create_pod(pods[0])
    statefulset(pods[1], {"apiVersion": "v1", "kind": "Pod", "name": "vllm-0", "uid": leader["metadata"]["uid"]})
    for pod in pods[1:]:
        memory.create_pod(pod)
    extra = copy.deepcopy(pods[2])  # a fourth worker in the group, of a StatefulSet that is no one's
    extra["metadata"].update(name="vllm-0-3", uid="uid-of-vllm-0-3", ownerReferences=[
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "evil", "uid": "uid-of-evil", "controller": True}])
    extra["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"] = "3"
    extra["spec"]["hostname"] = "vllm-0-3"
    memory.create_pod(extra)
    text = await status(api, job="vllm")
    lines = text.splitlines()
    assert [line.split()[0] for line in lines[2:5]] == ["vllm-0", "vllm-0-1", "vllm-0-2"], text
    assert "3 training pods placed, world size" in lines[0]
    assert [line.split(None, 1)[0] for line in lines if "not owned" in line] == ["vllm-0-3"], text
