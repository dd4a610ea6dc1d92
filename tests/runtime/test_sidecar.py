"""The sidecar in this process against the sandbox's API in memory (tests/fakeapi.py): files and generation follow
membership, a large job's leader publishes and its followers follow, a standby takes over, and the publication is
refused when its writer is not the job's. Each sidecar is the real ``run_sidecar`` on the test's loop, its
settings from the same flags; the trainer it signals is a real process. Every wait is for an event: a sidecar's
evaluation, a log line, a request, a signal on the trainer's stdout. tests/integration/test_sidecar.py keeps the
scenarios that need a real sidecar process (its signals, its health port, SIGTERM)."""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import re
import sys
from pathlib import Path

import pytest

from agent import examples
from agent.runtime.publication.handoff import NAME as READS
from agent.runtime.publication.publishing import said
from agent.runtime.restarts import RECORD as RUN_RECORD
from tests.fakeapi import agent_name, init_pod, state_of
from tests.jobs import (
    add_worker,
    configmap,
    create_volcano_job,
    forge_publication,
    generation,
    on_nodes_of_their_own,
    policy_admits,
    rogue,
    ssh_secret,
    world,
)

TRAINER = Path(__file__).resolve().parents[1] / "fake_trainer.py"
PODS = "/api/v1/namespaces/default/pods"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


async def init(api, logs, pod: str, out: Path, *args: str):
    """init for ``pod`` in a thread (it runs its own event loop, as its process does), to the end."""
    ran = await asyncio.to_thread(init_pod, api, logs, pod, out, *args)
    assert ran.code == 0, ran.err
    return ran


def has_ip(out: Path, ip_index: int) -> bool:
    try:
        return examples.loopback_ip(ip_index) in (out / "hostfile").read_text()
    except OSError:
        return False


class Trainer:
    """tests/fake_trainer.py, a real process: each signal it gets is read from its stdout, as it comes."""

    def __init__(self, proc: asyncio.subprocess.Process, record: Path) -> None:
        self.proc, self.record = proc, record

    @classmethod
    async def start(cls, tmp_path: Path, out: Path) -> Trainer:
        record = tmp_path / "signals.txt"
        record.touch()
        proc = await asyncio.create_subprocess_exec(sys.executable, str(TRAINER), str(record), str(out),
                                                    stdout=asyncio.subprocess.PIPE)
        trainer = cls(proc, record)
        assert await trainer.next() == "ready"
        return trainer

    @property
    def match(self) -> str:
        """--trainer-match for this trainer alone (tests run side by side)."""
        return re.escape(str(self.record))

    async def next(self, timeout: float = 30.0) -> str:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        return line.decode().strip()

    def signals(self) -> list[str]:
        return self.record.read_text().splitlines()

    async def stop(self) -> None:
        self.proc.kill()
        await self.proc.wait()


class Job:
    def __init__(self, running, trainer: Trainer) -> None:
        self.running, self.trainer = running, trainer
        self.out, self.sidecar = running.out, running.sidecar

    async def until(self, test, what: str = "condition"):
        return await self.running.until(test, what=what)

    def env(self) -> dict[str, str]:
        return self.running.env()

    def settled(self) -> bool:
        """Nothing seen that is not written yet: the files are the membership's as the sidecar holds it."""
        changes = self.sidecar.changes
        return not changes.dirty.is_set() and changes.since is None


async def start_job(api, logs, sidecars, tmp_path, *, pod="demo-worker-0", debounce="0") -> Job:
    out = tmp_path / "shared"
    await init(api, logs, pod, out, "--address", "ip")
    trainer = await Trainer.start(tmp_path, out)
    running = await sidecars.start(pod, out, "--address", "ip", "--debounce", debounce, "--trainer-match",
                                   trainer.match)
    job = Job(running, trainer)
    await job.until(lambda: job.sidecar.ready, "sidecar ready")
    return job


@pytest.fixture
async def job(memory, api, logs, sidecars, tmp_path):
    create_volcano_job(memory, (("master", 1), ("worker", 2)))
    started = await start_job(api, logs, sidecars, tmp_path)
    yield started
    await started.trainer.stop()


async def test_start_from_init_files_rewrites_nothing_and_signals_nobody(job):
    await job.until(job.settled, "nothing pending")
    assert job.sidecar.evaluator.evaluated  # the first evaluation ran
    assert generation(job.out) == 1 and job.trainer.signals() == []
    assert job.sidecar.metrics.rewrites._value.get() == 0


async def test_scale_down_delete_terminate_and_replace_are_followed(job, memory):
    # Each change waits for the signal of the one before: two SIGUSR1 pending at once are one (POSIX).
    memory.delete_pod("default", "demo-worker-1")
    await job.until(lambda: generation(job.out) == 2 and job.env()["WORLD_SIZE"] == "2", "scale down")
    assert await job.trainer.next() == "SIGUSR1 2"
    add_worker(memory, 1, 20)  # replacement with a new IP
    await job.until(lambda: generation(job.out) == 3, "replacement")
    assert json.loads((job.out / "topology.json").read_text())["members"][2]["address"] == examples.loopback_ip(20)
    assert await job.trainer.next() == "SIGUSR1 3"
    memory.update_pod("default", "demo-worker-1",
                      lambda p: p["metadata"].__setitem__("deletionTimestamp", "2026-11-22T01:00:00Z"))
    await job.until(lambda: generation(job.out) == 4 and job.env()["WORLD_SIZE"] == "2", "terminating excluded")
    assert await job.trainer.next() == "SIGUSR1 4"
    assert [line.split()[1] for line in job.trainer.signals()] == ["2", "3", "4"]


def set_condition(kind: str, status: str, reason: str | None = None):
    """A pod's condition ``kind`` written as the control plane writes it (replacing one of that type)."""
    def update(pod: dict) -> None:
        conditions = [c for c in pod["status"].get("conditions", []) if c.get("type") != kind]
        condition = {"type": kind, "status": status, "lastTransitionTime": "2026-11-22T01:00:00Z"}
        if reason is not None:
            condition["reason"] = reason
        pod["status"]["conditions"] = [*conditions, condition]
    return update


def notes(memory) -> list[str]:
    return [e.get("note") or e.get("message") or "" for e in memory.sandbox.store.list("/v1/events", "default")
            if e.get("reason") == "NewGeneration"]


async def told(job, memory, text: str) -> None:
    """Until a NewGeneration Event of the sidecar says ``text``."""
    recorder = job.sidecar.recorder
    async with asyncio.timeout(30), recorder.sent:
        await recorder.sent.wait_for(lambda: any(text in note for note in notes(memory)))


def member_names(out: Path) -> list[str]:
    return [m["name"] for m in json.loads((out / "topology.json").read_text())["members"]]


@pytest.mark.parametrize(("kind", "status", "reason", "why"), [
    pytest.param("DisruptionTarget", "True", "EvictionByEvictionAPI", "DisruptionTarget (EvictionByEvictionAPI",
                 id="evicted"),
    pytest.param("DisruptionTarget", "True", "DeletionByTaintManager", "DisruptionTarget (DeletionByTaintManager",
                 id="taint-manager"),
    pytest.param("Ready", "False", None, "the node lifecycle controller marked it", id="node-lost"),
])
async def test_a_member_the_api_shows_lost_leaves_at_once_with_an_event_and_rejoins_when_cleared(
        job, memory, kind, status, reason, why):
    worker_1 = examples.loopback_ip(2)
    assert worker_1 in (job.out / "hostfile").read_text()
    memory.update_pod("default", "demo-worker-1", set_condition(kind, status, reason))
    await job.until(lambda: generation(job.out) == 2, "the lost member left")
    assert job.env()["WORLD_SIZE"] == "2" and "demo-worker-1" not in member_names(job.out)
    assert worker_1 not in (job.out / "hostfile").read_text()
    assert await job.trainer.next() == "SIGUSR1 2"
    await told(job, memory, "left out: demo-worker-1: lost: ")
    assert any(why in note for note in notes(memory))
    cleared = "False" if kind == "DisruptionTarget" else "True"
    memory.update_pod("default", "demo-worker-1", set_condition(kind, cleared))
    await job.until(lambda: generation(job.out) == 3, "the member back")
    assert job.env()["WORLD_SIZE"] == "3" and "demo-worker-1" in member_names(job.out)
    assert worker_1 in (job.out / "hostfile").read_text()
    assert await job.trainer.next() == "SIGUSR1 3"
    await told(job, memory, "back: demo-worker-1")


NODES = "/v1/nodes"


def node_ready(status: str):
    """The Node's Ready condition as its kubelet (True, False) or the node lifecycle controller (Unknown) writes it."""
    def update(node: dict) -> None:
        conditions = [c for c in node["status"].get("conditions", []) if c.get("type") != "Ready"]
        node["status"]["conditions"] = [*conditions, {"type": "Ready", "status": status,
                                                      "lastHeartbeatTime": "2026-11-22T01:00:00Z"}]
    return update


def node_tainted(key: str, effect: str):
    def update(node: dict) -> None:
        node.setdefault("spec", {}).setdefault("taints", []).append({"key": key, "effect": effect})
    return update


def node_back(node: dict) -> None:
    node_ready("True")(node)
    node.setdefault("spec", {})["taints"] = []


@pytest.fixture
async def job_on_nodes(memory, api, logs, sidecars, tmp_path):
    """The job of ``job``, each pod on its own Node (demo-worker-1 on node-2)."""
    pods = create_volcano_job(memory, (("master", 1), ("worker", 2)))
    on_nodes_of_their_own(memory, pods)
    started = await start_job(api, logs, sidecars, tmp_path)
    yield started
    await started.trainer.stop()


@pytest.mark.parametrize(("change", "why"), [
    pytest.param(node_ready("False"), "node node-2 NotReady", id="not-ready"),
    pytest.param(node_ready("Unknown"), "node node-2 Unknown (its kubelet stopped reporting)", id="unknown"),
    pytest.param(node_tainted("node.kubernetes.io/unreachable", "NoExecute"),
                 "node node-2 tainted node.kubernetes.io/unreachable:NoExecute", id="unreachable-taint"),
    pytest.param(node_tainted("node.kubernetes.io/not-ready", "NoSchedule"),
                 "node node-2 tainted node.kubernetes.io/not-ready:NoSchedule", id="not-ready-taint"),
])
async def test_a_member_on_a_lost_node_leaves_at_once_with_an_event_and_rejoins_when_the_node_is_back(
        job_on_nodes, memory, change, why):
    """The Node says it first: the pod itself is marked only after the node controller's grace period, or
    evicted after the taints' toleration (300 s)."""
    job = job_on_nodes
    await job.until(lambda: job.sidecar.node_view is not None and job.sidecar.node_view.listed, "Nodes listed")
    memory.update(NODES, "", "node-2", change)
    await job.until(lambda: generation(job.out) == 2, "the member on the lost node left")
    assert job.env()["WORLD_SIZE"] == "2" and "demo-worker-1" not in member_names(job.out)
    assert await job.trainer.next() == "SIGUSR1 2"
    await told(job, memory, f"left out: demo-worker-1: lost: {why}")
    memory.update(NODES, "", "node-2", node_back)
    await job.until(lambda: generation(job.out) == 3, "the member back")
    assert job.env()["WORLD_SIZE"] == "3" and "demo-worker-1" in member_names(job.out)
    assert await job.trainer.next() == "SIGUSR1 3"
    await told(job, memory, "back: demo-worker-1")


@pytest.mark.parametrize(("status", "why"), [
    pytest.param("False", "node node-2 NotReady", id="not-ready"),
    pytest.param("Unknown", "node node-2 Unknown (its kubelet stopped reporting)", id="unknown"),
])
async def test_nodes_are_listed_as_status_cells_and_only_a_node_not_ready_is_read_whole(memory, api, logs, sidecars,
                                                                                        tmp_path, status, why):
    """A Node is ~12 KB as the kubelet keeps it, most of it its images: the first LIST is the API server's Table of
    Nodes without the objects (a Status cell each), and only the Node that is not Ready is read whole, for why.
    A Node lost before the sidecar starts takes its member out at the first evaluation, as a whole LIST did."""
    pods = create_volcano_job(memory, (("master", 1), ("worker", 2)))
    on_nodes_of_their_own(memory, pods)
    memory.update(NODES, "", "node-2", node_ready(status))  # demo-worker-1's
    job = await start_job(api, logs, sidecars, tmp_path)
    try:
        await job.until(lambda: generation(job.out) == 2, "the member on the lost node left")
        assert "demo-worker-1" not in member_names(job.out)
        await logs.until("demo-worker-0", f"pod demo-worker-1: {why}")
        asked = [request for who, request in api.requests if who == agent_name("sidecar", "demo-worker-0")
                 and request.path.startswith("/api/v1/nodes")]
        assert [(r.verb, r.path) for r in asked if r.verb != "watch"] == [("list", "/api/v1/nodes"),
                                                                         ("get", "/api/v1/nodes/node-2")]
        assert "as=Table" in asked[0].accept and ("includeObject", "None") in asked[0].query
    finally:
        await job.trainer.stop()


async def test_many_nodes_not_ready_are_read_in_one_list_not_one_get_each(memory, api, logs, sidecars, tmp_path,
                                                                         monkeypatch):
    """More Nodes not Ready than a handful of GETs (here: more than none) are read in one LIST of the Nodes
    whole, after the Table said which."""
    from agent.runtime import nodes
    monkeypatch.setattr(nodes, "NODE_GETS", 0)
    pods = create_volcano_job(memory, (("master", 1), ("worker", 2)))
    on_nodes_of_their_own(memory, pods)
    memory.update(NODES, "", "node-2", node_ready("Unknown"))
    job = await start_job(api, logs, sidecars, tmp_path)
    try:
        await job.until(lambda: generation(job.out) == 2, "the member on the lost node left")
        await logs.until("demo-worker-0", "pod demo-worker-1: node node-2 Unknown (its kubelet stopped reporting)")
        asked = [request for who, request in api.requests if who == agent_name("sidecar", "demo-worker-0")
                 and request.path.startswith("/api/v1/nodes") and request.verb != "watch"]
        assert [(r.verb, r.path, "as=Table" in r.accept) for r in asked] == [("list", "/api/v1/nodes", True),
                                                                             ("list", "/api/v1/nodes", False)]
    finally:
        await job.trainer.stop()


async def test_the_member_on_the_lost_node_writes_a_generation_when_its_node_is_back(memory, api, logs, sidecars,
                                                                                     tmp_path):
    """The lost member's own sidecar keeps it in its world (its own files never leave it out), but the others
    formed a world without it meanwhile: when its Node is back it writes a new generation and signals its
    trainer, which would otherwise wait in the old world's collective until torch's timeout."""
    pods = create_volcano_job(memory, (("master", 1), ("worker", 2)))
    on_nodes_of_their_own(memory, pods)
    job = await start_job(api, logs, sidecars, tmp_path, pod="demo-worker-1")  # on node-2
    try:
        await job.until(lambda: job.sidecar.node_view is not None and job.sidecar.node_view.listed, "Nodes listed")
        memory.update(NODES, "", "node-2", node_ready("False"))
        await job.until(lambda: job.sidecar.node_watch.own_lost, "its own node seen lost")
        assert generation(job.out) == 1  # its own files keep it: nothing to tell its trainer yet
        memory.update(NODES, "", "node-2", node_back)
        await job.until(lambda: generation(job.out) == 2, "a new generation once its node is back")
        assert job.env()["WORLD_SIZE"] == "3" and await job.trainer.next() == "SIGUSR1 2"
        await logs.until("demo-worker-1", "this pod's node node-2 is back")
    finally:
        await job.trainer.stop()


async def test_a_node_change_that_says_nothing_of_its_health_is_no_generation(job_on_nodes, memory):
    """A Node's status is written every few minutes, its labels and PreferNoSchedule taints change: none of it
    reshapes the world. The lost master's change after them shows they were seen and kept."""
    job = job_on_nodes
    await job.until(lambda: job.sidecar.node_view is not None and job.sidecar.node_view.listed, "Nodes listed")
    memory.update(NODES, "", "node-2", node_ready("True"))
    memory.update(NODES, "", "node-2", node_tainted("node.kubernetes.io/unreachable", "PreferNoSchedule"))
    memory.update(NODES, "", "node-2", node_tainted("example.com/maintenance", "NoSchedule"))
    memory.update(NODES, "", "node-0", node_ready("False"))
    await job.until(lambda: generation(job.out) == 2, "the master on the lost node left")
    assert member_names(job.out) == ["demo-worker-0", "demo-worker-1"]


async def test_a_pod_that_may_not_read_nodes_says_so_once_and_follows_the_pods(memory, api, logs, sidecars,
                                                                               tmp_path):
    create_volcano_job(memory, (("master", 1), ("worker", 2)))
    memory.faults(status=403, count=-1, path="/nodes")
    job = await start_job(api, logs, sidecars, tmp_path)
    try:
        await logs.until("demo-worker-0", "cannot watch Nodes")
        assert "manifests/rbac/nodes" in logs.text("demo-worker-0")
        memory.delete_pod("default", "demo-worker-1")
        await job.until(lambda: generation(job.out) == 2, "the pods still followed")
        agent = agent_name("sidecar", "demo-worker-0")
        assert sum(1 for who, r in list(api.requests) if who == agent and "/nodes" in r.path) == 1
        assert logs.text("demo-worker-0").count("cannot watch Nodes") == 1
    finally:
        await job.trainer.stop()


async def test_a_failing_readiness_probe_keeps_the_member_while_a_lost_one_leaves(job, memory):
    """The kubelet writes Ready False with a reason (ContainersNotReady) when a probe fails: the trainer runs and
    its node reports, so the world is not reshaped (and every trainer restarted) for a probe that flaps. The lost
    master's change after it shows the probe's was evaluated and kept."""
    memory.update_pod("default", "demo-worker-1", set_condition("Ready", "False", "ContainersNotReady"))
    memory.update_pod("default", "demo-master-0", set_condition("DisruptionTarget", "True", "PreemptionByScheduler"))
    await job.until(lambda: generation(job.out) == 2, "the preempted master left")
    assert job.env()["WORLD_SIZE"] == "2"
    assert member_names(job.out) == ["demo-worker-0", "demo-worker-1"]
    await told(job, memory, "left out: demo-master-0: lost: DisruptionTarget (PreemptionByScheduler")
    assert not any("demo-worker-1" in note for note in notes(memory))


async def test_a_terminating_member_leaves_with_an_event_that_names_it(job, memory):
    memory.update_pod("default", "demo-worker-1",
                      lambda p: p["metadata"].__setitem__("deletionTimestamp", "2026-11-22T01:00:00Z"))
    await job.until(lambda: generation(job.out) == 2 and job.env()["WORLD_SIZE"] == "2", "terminating excluded")
    await told(job, memory, "left out: demo-worker-1: terminating (deletionTimestamp is set)")


async def test_a_change_is_evaluated_with_the_cyclic_collector_off_and_it_is_on_again_after(job, memory,
                                                                                             monkeypatch):
    """The collector's passes over a change's new members were up to a third of a large job's change
    (runtime/memory.collector_paused)."""
    evaluator, seen = job.sidecar.evaluator, []
    evaluate = evaluator.evaluate

    def spied(*args, **kwargs):
        seen.append(gc.isenabled())
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(evaluator, "evaluate", spied)
    assert gc.isenabled()
    memory.delete_pod("default", "demo-worker-1")
    await job.until(lambda: generation(job.out) == 2, "scale down")
    assert seen and not any(seen) and gc.isenabled()


async def test_an_unchanged_relist_after_410_triggers_nothing(job, memory, api):
    await job.until(job.settled, "nothing pending")
    plan = job.sidecar.evaluator.plan
    # While the sidecar is away (an outage shorter than its first retry's pause, 0.8 s or more, so that it comes
    # back once, to a compacted history): a change that moves no one, then compaction.
    memory.faults(down_for=0.5)
    memory.update_pod("default", "demo-worker-1", lambda p: p["metadata"]["annotations"].__setitem__("note", "x"))
    memory.faults(compact=True)
    agent = agent_name("sidecar", "demo-worker-0")

    def of_pods() -> list:  # the sidecar's requests for pods (its Nodes' are relisted after a 410 too)
        return [r for who, r in list(api.requests) if who == agent and r.path.startswith(PODS)]

    lists = sum(1 for r in of_pods() if r.verb == "list")
    # The relist, then the watch from it: the LIST was applied, and nothing came of it.
    await api.notice.until(lambda: [r.verb for r in of_pods()][-1:] == ["watch"]
                           and sum(1 for r in of_pods() if r.verb == "list") > lists,
                           what="a relist and the watch after it")
    assert job.sidecar.metrics.relists._value.get() >= 1  # a LIST after the first (one more if it met the outage)
    await job.until(job.settled, "nothing pending")
    assert generation(job.out) == 1 and job.trainer.signals() == []
    assert job.sidecar.evaluator.plan is plan  # the pods held were kept: the plan is the one before, not made again


async def test_the_last_plan_is_let_go_before_the_next_is_made(job, memory, monkeypatch):
    """A plan from scratch (a burst of a quarter of the job) was made beside the one held: 3.7 MB more at the
    publisher's peak of a 16384-pod job."""
    await job.until(job.settled, "nothing pending")
    evaluator = job.sidecar.evaluator
    planner = evaluator.renderer.planner
    assert evaluator.plan is not None
    held_while_planning: list[bool] = []
    real = planner.plan
    monkeypatch.setattr(planner, "plan", lambda *a, **k: held_while_planning.append(evaluator.plan is not None)
                        or real(*a, **k))
    memory.update_pod("default", "demo-worker-1", lambda p: p["status"].update(
        podIP=examples.loopback_ip(79), podIPs=[{"ip": examples.loopback_ip(79)}]))
    await job.until(lambda: generation(job.out) == 2, "the new IP written")
    assert held_while_planning and not any(held_while_planning)
    assert evaluator.plan is not None and "demo-worker-1" in {m.name for m in evaluator.plan.topology.members}


async def test_a_relist_that_brings_changes_plans_only_them_and_keeps_the_layout(job, memory, api):
    """A relist (the journal emptied by a burst, a 410) hands the planner the pods it found changed, as a burst of
    events would: the job is not laid out again beside the plan held (at 16384 pods a full-view sidecar's peak,
    106 -> 141 MB)."""
    await job.until(job.settled, "nothing pending")
    planner = job.sidecar.evaluator.renderer.planner
    layout, plans = planner._layout, planner.incremental
    assert layout is not None
    agent = agent_name("sidecar", "demo-worker-0")
    lists = sum(1 for who, r in list(api.requests) if who == agent and r.verb == "list")
    # While the sidecar is away (an outage shorter than its first retry's pause, 0.8 s or more): a new IP and a
    # write of nothing held, then compaction.
    memory.faults(down_for=0.5)
    memory.update_pod("default", "demo-worker-1", lambda p: p["status"].update(
        podIP=examples.loopback_ip(78), podIPs=[{"ip": examples.loopback_ip(78)}]))
    memory.update_pod("default", "demo-master-0", kubelet_ready)
    memory.faults(compact=True)
    await job.until(lambda: generation(job.out) == 2, "the new IP written after the relist")
    assert sum(1 for who, r in list(api.requests) if who == agent and r.verb == "list") > lists  # it relisted
    assert job.env()["VC_WORKER_HOSTS"].split(",")[1] == examples.loopback_ip(78)
    assert planner._layout is layout  # carried over, never laid out from scratch
    assert planner.incremental == plans + 1
    assert await job.trainer.next() == "SIGUSR1 2"


def kubelet_ready(pod: dict) -> None:
    """What the kubelet writes once the containers are ready: conditions and container statuses only."""
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-22T00:01:00Z"}]
    pod["status"]["containerStatuses"] = [{"name": "trainer", "ready": True, "restartCount": 0, "started": True,
                                           "state": {"running": {"startedAt": "2026-11-22T00:00:30Z"}}}]


async def test_the_kubelets_ready_writes_are_no_change_and_the_layout_is_kept(job, memory):
    """A write that changes nothing the agent holds (the kubelet's Ready, to every pod of a job at start) is not
    evaluated, and the own pod's no longer makes the planner lay the whole job out again."""
    await job.until(job.settled, "nothing pending")
    planner = job.sidecar.evaluator.renderer.planner
    layout, plans = planner._layout, planner.incremental
    assert layout is not None
    for name in ("demo-worker-0", "demo-worker-1", "demo-master-0"):  # its own pod first
        memory.update_pod("default", name, kubelet_ready)
    memory.update_pod("default", "demo-worker-1", lambda p: p["status"].update(
        podIP=examples.loopback_ip(77), podIPs=[{"ip": examples.loopback_ip(77)}]))
    await job.until(lambda: generation(job.out) == 2, "the new IP written")
    assert job.env()["VC_WORKER_HOSTS"].split(",")[1] == examples.loopback_ip(77)
    assert planner._layout is layout  # never laid out from scratch
    assert planner.incremental == plans + 1  # one plan: the IP's
    assert await job.trainer.next() == "SIGUSR1 2"


@pytest.mark.slow
async def test_changes_during_a_dropped_watch_a_410_and_5xx_are_not_lost(job, memory):
    memory.faults(status=500, count=2, path="/pods")
    memory.faults(drop_watches=True)
    add_worker(memory, 2, 30)  # while the sidecar is disconnected and failing
    await job.until(lambda: generation(job.out) == 2, "catch-up after 5xx")
    memory.faults(down_for=1.0)
    memory.delete_pod("default", "demo-worker-2")
    memory.faults(compact=True)  # and the version it resumes from is gone: 410, relist
    await job.until(lambda: generation(job.out) == 3 and job.env()["WORLD_SIZE"] == "3",
                    "catch-up after outage and 410")
    assert (job.out / "torch.env").read_text().count("export WORLD_SIZE='3'") == 1


async def test_debounce_coalesces_a_burst_into_one_generation(memory, api, logs, sidecars, tmp_path):
    create_volcano_job(memory, (("master", 1), ("worker", 1)))
    job = await start_job(api, logs, sidecars, tmp_path, debounce="0.8")
    try:
        for i in range(1, 4):
            add_worker(memory, i, 60 + i)
        await job.until(lambda: generation(job.out) == 2 and job.env()["WORLD_SIZE"] == "5", "one rewrite")
        assert await job.trainer.next() == "SIGUSR1 2"
        await job.until(job.settled, "nothing pending")  # the burst was written whole: no second generation
        assert generation(job.out) == 2 and job.sidecar.metrics.rewrites._value.get() == 1
        assert job.trainer.signals() == ["SIGUSR1 2"]
    finally:
        await job.trainer.stop()


async def test_a_pod_with_the_jobs_labels_only_neither_joins_nor_freezes_the_sidecar(job, memory, logs):
    """A rogue pod with a duplicate index froze a running sidecar (readyz 503) until deleted."""
    pod = examples.volcano_job("demo", (("master", 1), ("worker", 1)))[1]
    pod["metadata"]["name"] = "rogue-dup"
    pod["metadata"].pop("ownerReferences")
    pod["spec"]["hostname"] = "rogue-dup"
    pod["status"].update(podIP=examples.loopback_ip(80), podIPs=[{"ip": examples.loopback_ip(80)}])
    memory.create_pod(pod)
    await logs.until("demo-worker-0", "leaving out a pod that is not the job's: pod 'rogue-dup'")
    await job.until(job.settled, "the change evaluated")
    assert job.sidecar.ready and generation(job.out) == 1
    add_worker(memory, 2, 81)  # the job's own pod still joins
    await job.until(lambda: generation(job.out) == 2, "generation 2")
    assert job.env()["WORLD_SIZE"] == "4" and examples.loopback_ip(80) not in (job.out / "hostfile").read_text()


async def test_a_sidecar_that_cannot_write_keeps_the_last_files_says_why_and_writes_once_it_can(job, memory):
    """The sidecar exited 1 on a full disk or a replaced ssh/: a trainer could stop its own sidecar."""
    out = job.out
    before = (out / "topology.json").read_bytes()
    (out / "hostfile").unlink()
    (out / "hostfile").mkdir()  # the rename onto it fails, as on a full disk: the markers stay at generation 1
    memory.set_pod_ip("default", "demo-worker-1", examples.loopback_ip(41))
    await job.until(lambda: "cannot write the files" in (job.sidecar.unready() or ""), "not ready")
    assert not job.running.task.done(), "the sidecar keeps running"
    assert (out / "topology.json").read_bytes() == before and (out / "generation").read_text() == "1\n"
    (out / "hostfile").rmdir()
    await job.until(lambda: has_ip(out, 41), "the files written once they can be")
    assert (out / "generation").read_text() == "2\n"
    await job.until(lambda: job.sidecar.ready, "ready again")


# --- a large job's publication --------------------------------------------------------------------------------

async def published_job(memory, api, logs, tmp_path, workers, *extra):
    pods = create_volcano_job(memory, (("master", 1), ("worker", workers)))
    for pod in pods:
        await init(api, logs, pod["metadata"]["name"], tmp_path / pod["metadata"]["name"], "--address", "ip",
                   "--source", "published", *extra)
    return pods


async def start_sidecar(sidecars, tmp_path, pod: str, *extra: str, who: str | None = None, out: Path | None = None,
                        topology: bool = False):
    return await sidecars.start(pod, out or tmp_path / pod, "--address", "ip", "--debounce", "0", "--signal", "none",
                                *extra, who=who, topology=topology)


async def follower_watching(api, pod: str) -> None:
    await api.notice.until(lambda: api.watching(agent_name("sidecar", pod), CONFIGMAPS), what=f"{pod} watching")


@pytest.mark.parametrize("view", ["full", "auto"])
async def test_with_a_published_topology_only_the_leader_watches_pods_and_followers_follow(memory, api, logs,
                                                                                           sidecars, tmp_path, view):
    await published_job(memory, api, logs, tmp_path, 3, "--view", view)
    await start_sidecar(sidecars, tmp_path, "demo-master-0", "--view", view)
    follower = await start_sidecar(sidecars, tmp_path, "demo-worker-2", "--view", view)
    await logs.until("demo-worker-2", "(follower)")
    await logs.until("demo-master-0", "started publishing")
    await follower_watching(api, "demo-worker-2")
    memory.reset_stats()
    add_worker(memory, 3, 80)
    follower_out = tmp_path / "demo-worker-2"
    await follower.until(lambda: generation(follower_out) == 2, what="the follower follows the leader's publication")
    env = json.loads((follower_out / "topology.json").read_text())["env"]
    assert env["WORLD_SIZE"] == "5" and env["NODE_RANK"] == "3"
    if view == "full":
        assert (follower_out / "hostfile").read_text() == (tmp_path / "demo-master-0" / "hostfile").read_text()
    else:  # its own view: rank 0, the sizes and its own place, from the journal's summary; no host list
        assert not (follower_out / "hostfile").exists() and not (tmp_path / "demo-master-0" / "hostfile").exists()
        assert env["MASTER_ADDR"] == world(tmp_path / "demo-master-0")[1]
    stats = memory.stats()["byAgent"]
    agent = agent_name("sidecar", "demo-worker-2")
    assert agent not in stats or stats[agent]["requests"] == 0  # the watch was open


@pytest.mark.parametrize("view", ["full", "auto"])
async def test_in_a_large_job_the_publisher_watches_the_nodes_and_its_rows_take_the_lost_member_out_everywhere(
        memory, api, logs, sidecars, tmp_path, view):
    """Only the publisher watches Nodes: the follower reads the lost member (and its return) in the published rows,
    in either view, and makes no request of its own for it."""
    pods = create_volcano_job(memory, (("master", 1), ("worker", 3)))
    on_nodes_of_their_own(memory, pods)
    for pod in pods:
        await init(api, logs, pod["metadata"]["name"], tmp_path / pod["metadata"]["name"], "--address", "ip",
                   "--source", "published", "--view", view)
    leader = await start_sidecar(sidecars, tmp_path, "demo-master-0", "--view", view)
    follower = await start_sidecar(sidecars, tmp_path, "demo-worker-2", "--view", view)
    await logs.until("demo-worker-2", "(follower)")
    await logs.until("demo-master-0", "started publishing")
    await follower_watching(api, "demo-worker-2")
    await leader.until(lambda: leader.sidecar.node_view is not None and leader.sidecar.node_view.listed,
                       what="the publisher listed the Nodes")
    out = tmp_path / "demo-worker-2"
    memory.update(NODES, "", "node-2", node_ready("False"))  # demo-worker-1's
    await follower.until(lambda: generation(out) == 2, what="the follower left the lost member out")
    assert world(out)[0] == "3"
    if view == "full":
        assert "demo-worker-1" not in member_names(out)
    memory.update(NODES, "", "node-2", node_back)
    await follower.until(lambda: generation(out) == 3, what="the member back at the follower")
    assert world(out)[0] == "4"
    follower_calls = [r.path for who, r in list(api.requests) if who == agent_name("sidecar", "demo-worker-2")]
    assert not any("/nodes" in path for path in follower_calls)
    assert any("/nodes" in r.path for who, r in list(api.requests) if who == agent_name("sidecar", "demo-master-0"))


async def test_a_follower_receives_only_the_journal_and_the_leader_names_its_standbys(memory, api, logs, sidecars,
                                                                                      tmp_path):
    """Each change reached every follower as the whole snapshot (88 KiB at 4096 pods). (A follower in its own view
    never reads the snapshot: test_view_own_... below.)"""
    await published_job(memory, api, logs, tmp_path, 7, "--view", "full")
    running = {n: await start_sidecar(sidecars, tmp_path, n, "--view", "full") for n in ("demo-master-0",
                                                                                          "demo-worker-0",
                                                                                          "demo-worker-5")}
    await logs.until("demo-worker-0", "(standby)")
    await follower_watching(api, "demo-worker-5")
    assert "(follower)" in logs.text("demo-worker-5")
    # A standby follows the publication too (each standby's LIST and watch of 16384 pods was ~450 MiB at start);
    # it lists the pods only once the Lease looks abandoned (the next test).
    await follower_watching(api, "demo-worker-0")
    assert not api.watching(agent_name("sidecar", "demo-worker-0"), PODS)
    snapshot = configmap(memory, "demo-topology")
    memory.reset_stats()
    add_worker(memory, 7, 90)
    await running["demo-worker-5"].until(lambda: world(tmp_path / "demo-worker-5")[0] == "9",
                                         what="the follower sees the new worker")
    follower = memory.stats()["byAgent"][agent_name("sidecar", "demo-worker-5")]
    assert follower["requests"] == 0  # its watch was open already
    assert follower["bytes"] < len(json.dumps(snapshot))  # the journal, not the snapshot
    journal = configmap(memory, "demo-topology-journal")
    assert journal["data"]["leader"] == "demo-master-0"
    assert journal["data"]["standby"] == "demo-worker-0,demo-worker-1"
    # The leader's real objects pass the admission policy as a CREATE by its own pod's token
    for name in ("demo-topology", "demo-topology-journal"):
        assert policy_admits(memory, "CREATE", "demo-master-0", configmap(memory, name), None)


async def test_a_sidecar_starts_from_what_its_init_read_and_reads_it_again_only_without_it(memory, api, logs,
                                                                                             sidecars, tmp_path):
    """Each follower's sidecar read its own pod, the job and the leader's pod again, which init had read a moment
    before (~20 KiB of its ~34 KiB at start in a 16384-pod job): it starts from init's reads
    (runtime/publication/handoff.py). Without them (a sidecar run alone, a file the trainer broke) it reads the API."""
    await published_job(memory, api, logs, tmp_path, 20)
    (state_of(tmp_path / "demo-worker-8") / READS).write_text("{not json")  # broken: read again, in one line
    await start_sidecar(sidecars, tmp_path, "demo-master-0")
    for pod in ("demo-worker-7", "demo-worker-8"):
        await start_sidecar(sidecars, tmp_path, pod)
        await logs.until(pod, "(follower)")

    def gets(pod: str) -> set[str]:
        return {r.path for agent, r in api.requests if agent == agent_name("sidecar", pod) and r.verb == "get"}

    read_again = {"/api/v1/namespaces/default/pods/demo-worker-8", "/apis/batch.volcano.sh/v1alpha1/namespaces/"
                  "default/jobs/demo", "/api/v1/namespaces/default/pods/demo-master-0"}
    assert gets("demo-worker-8") >= read_again
    assert not gets("demo-worker-7") & {p.replace("worker-8", "worker-7") for p in read_again}
    assert "not using init's reads" in logs.text("demo-worker-8")
    for pod in ("demo-worker-7", "demo-worker-8"):  # the same files either way
        assert json.loads((tmp_path / pod / "topology.json").read_text())["generation"] == 1

    def lists(pod: str) -> int:
        return sum(1 for agent, r in api.requests if agent == agent_name("sidecar", pod) and r.verb == "list")

    assert lists("demo-worker-7") == 0 and lists("demo-worker-8") == 1  # the summary init read, not listed again


async def test_a_sidecar_follows_the_summary_from_where_its_init_read_it(memory, api, logs, sidecars, tmp_path):
    """A pod in its own view watches the summary from the resourceVersion its init read it at: a change made in
    between reaches its files. A summary in init's reads that names the pod a standby is not used (the file is
    the trainer's to write too): that pod lists the publication itself."""
    await published_job(memory, api, logs, tmp_path, 20)
    handed = json.loads((state_of(tmp_path / "demo-worker-9") / READS).read_text())
    assert handed["summary"]["metadata"]["name"] == "demo-topology-summary"
    forged = json.loads((state_of(tmp_path / "demo-worker-10") / READS).read_text())
    forged["summary"]["data"]["standby"] = "demo-worker-10"
    (state_of(tmp_path / "demo-worker-10") / READS).write_text(json.dumps(forged))
    await start_sidecar(sidecars, tmp_path, "demo-master-0")
    await logs.until("demo-master-0", "started publishing")
    add_worker(memory, 20, 90)  # the sizes change: the summary is written again before the followers start
    await memory.until("/v1/configmaps", lambda store: '"nnodes":22' in store.get(
        "/v1/configmaps", "default", "demo-topology-summary")["data"].get("summary.json", ""))
    for pod in ("demo-worker-9", "demo-worker-10"):
        follower = await start_sidecar(sidecars, tmp_path, pod)
        await follower.until(lambda p=pod: world(tmp_path / p)[0] == "22", what=f"{pod} sees the new worker")
        uid = memory.sandbox.store.get("/v1/pods", "default", pod)["metadata"]["uid"]
        assert follower.sidecar.publication.elector.uid == uid  # a standby later: it holds the Lease as itself
    verbs = {pod: [r.verb for agent, r in api.requests if agent == agent_name("sidecar", pod)]
             for pod in ("demo-worker-9", "demo-worker-10")}
    assert "list" not in verbs["demo-worker-9"] and "watch" in verbs["demo-worker-9"]
    assert "list" in verbs["demo-worker-10"]


JOB = "/apis/batch.volcano.sh/v1alpha1/namespaces/default/jobs/demo"


def settled(running) -> bool:
    """Nothing seen that is not written yet, since the first evaluation."""
    changes = running.sidecar.changes
    return running.sidecar.evaluator.evaluated and not changes.dirty.is_set() and changes.since is None


def forged_reads(memory, pod: str, rogue_pod: dict) -> bytes:
    """Init's reads as a trainer can write them: the own pod as the API has it, the job's object with its uid
    removed and the worker task's replicas one more, and the rogue pod among the publishers init accepted."""
    from agent.core.publication.provenance import Writer
    from agent.runtime.publication.handoff import Handoff

    job = copy.deepcopy(next(o for o in list(memory.sandbox.store.objects.values())
                             if o.get("kind") == "Job" and o["metadata"]["name"] == "demo"))
    del job["metadata"]["uid"]
    next(t for t in job["spec"]["tasks"] if t["name"] == "worker")["replicas"] += 1
    me = memory.sandbox.store.get("/v1/pods", "default", pod)
    return Handoff(me, {JOB: job}, {Writer(rogue_pod["metadata"]["name"], rogue_pod["metadata"]["uid"])}).to_bytes()


@pytest.mark.parametrize("state", ["mounted", "absent"])
async def test_init_reads_forged_in_the_shared_directory_let_no_rogue_pod_in(memory, api, logs, sidecars, tmp_path,
                                                                              state):
    """The sidecar took the job's objects and the publishers it accepts from init's reads in the shared
    directory, which the trainer writes too: the job's object without its uid and with a task's replicas one
    more, and a rogue pod among the publishers, let a rogue pod in as rank 3 (WORLD_SIZE 3 -> 4, its IP in the
    hostfile). The reads are kept in the state directory, which the trainer does not mount; without one (a
    manifest written by hand before it), the sidecar reads the job from the API server."""
    create_volcano_job(memory, (("master", 1), ("worker", 2)))
    out = tmp_path / "demo-worker-0"
    where = () if state == "mounted" else ("--state-dir", str(tmp_path / "not-mounted"))
    await init(api, logs, "demo-worker-0", out, "--address", "ip", *where)
    assert world(out)[0] == "3"
    rogue_pod = memory.create_pod(rogue("demo-worker-2", "worker", 2, 77))
    (out / READS).write_bytes(forged_reads(memory, "demo-worker-0", rogue_pod))
    running = await start_sidecar(sidecars, tmp_path, "demo-worker-0", *where)
    await running.until(lambda: settled(running), what="the pods evaluated")  # the rogue was in the first list
    assert (world(out)[0], generation(out)) == ("3", 1)
    assert examples.loopback_ip(77) not in (out / "hostfile").read_text()
    assert "leaving out a pod that is not the job's: pod 'demo-worker-2'" in logs.text("demo-worker-0")
    gets = {r.path for agent, r in api.requests if agent == agent_name("sidecar", "demo-worker-0") and r.verb == "get"}
    if state == "absent":
        assert JOB in gets
        assert "no state directory" in logs.text("demo-worker-0")
    else:
        assert JOB not in gets  # init's own reads, from the state directory
    assert "not using init's reads" not in logs.text("demo-worker-0")  # the shared directory's copy is not read


async def test_a_publisher_forged_in_the_shared_directory_is_vetted_like_any_writer(memory, api, logs, sidecars,
                                                                                     tmp_path):
    """The publishers init accepted were taken from the shared directory too: a rogue pod named there was
    trusted without a read, and its forged publication (every address 127.9.9.9) reached a follower's hostfile.
    The follower reads the writer pod, refuses a copy no member of the job wrote, and follows the pods."""
    pods = await published_job(memory, api, logs, tmp_path, 3, "--view", "full")
    rogue_pod = memory.create_pod(rogue("rogue-1", "worker", 7, 78))
    gone(memory, "demo-topology", "demo-topology-journal", "demo-topology-summary")
    forge_publication(memory, pods, writer="rogue-1", writer_uid=rogue_pod["metadata"]["uid"])
    out = tmp_path / "demo-worker-2"
    (out / READS).write_bytes(forged_reads(memory, "demo-worker-2", rogue_pod))
    follower = await start_sidecar(sidecars, tmp_path, "demo-worker-2", "--view", "full")
    await follower.until(lambda: settled(follower), what="the first evaluation")
    assert "127.9.9.9" not in (out / "hostfile").read_text() and "127.9.9.9" not in (out / "torch.env").read_text()
    assert world(out)[0] == "4" and generation(out) == 1
    assert "the published topology is not used (configmap demo-topology" in logs.text("demo-worker-2")


async def served_topology(running) -> dict:
    import aiohttp

    async with aiohttp.ClientSession() as session, \
            session.get(f"http://127.0.0.1:{running.port}/topology") as answer:
        assert answer.status == 200, await answer.text()
        return await answer.json()


@pytest.mark.parametrize("view", ["full", "own"])
async def test_after_a_restart_topology_serves_what_the_sidecar_planned_not_what_the_trainer_wrote(memory, api,
                                                                                                  logs, sidecars,
                                                                                                  tmp_path, view):
    """A restarted sidecar served the topology.json it found in the shared directory, which the trainer can
    write: the same members with another world size and rank 0 went out on /topology. It serves what it
    planned itself (from the pods, or in its own view from the published summary), at the generation in place,
    and rewrites nothing while the members are the same."""
    pod = "demo-worker-2"
    out = tmp_path / pod
    if view == "full":
        create_volcano_job(memory, (("master", 1), ("worker", 3)))
        await init(api, logs, pod, out, "--address", "ip")
    else:  # a large job's follower: its files come from the leader's summary
        await published_job(memory, api, logs, tmp_path, 3, "--view", "own")
        await start_sidecar(sidecars, tmp_path, "demo-master-0", "--view", "own")
        await logs.until("demo-master-0", "started publishing")
    written = json.loads((out / "topology.json").read_text())
    assert written.get("view", "full") == view
    first = await start_sidecar(sidecars, tmp_path, pod, "--view", view, topology=True)
    await first.until(lambda: settled(first), what="the first evaluation")
    assert await served_topology(first) == written
    await sidecars.stop(pod)
    forged = copy.deepcopy(written)  # the same members (no rewrite is due), another world and rank 0
    forged.update(worldSize=9, masterAddr=examples.loopback_ip(77),
                  excluded=[{"name": "demo-master-0", "reason": "forged"}])
    (out / "topology.json").write_text(json.dumps(forged))
    again = await start_sidecar(sidecars, tmp_path, pod, "--view", view, topology=True)
    await again.until(lambda: settled(again), what="the first evaluation after the restart")
    assert await served_topology(again) == written
    assert generation(out) == 1 and again.sidecar.metrics.rewrites._value.get() == 0


@pytest.mark.parametrize("served", [False, True])
async def test_topology_json_is_held_only_where_topology_is_served(memory, api, logs, sidecars, tmp_path, served):
    """The sidecar holds its planned topology.json (4.5 MB at 16384 pods) only to serve it on /topology. A Volcano
    job's pytorch plugin names its training roles: the sidecar made its evaluator again with those options, and
    the new one held the document though nothing served it."""
    pod = "demo-worker-2"
    out = tmp_path / pod
    create_volcano_job(memory, (("master", 1), ("worker", 3)))
    await init(api, logs, pod, out, "--address", "ip")
    running = await start_sidecar(sidecars, tmp_path, pod, topology=served)
    await running.until(lambda: settled(running), what="the first evaluation")
    assert "Volcano pytorch plugin" in logs.text(pod)  # the options changed after the sidecar was made
    assert (running.sidecar.document is not None) == served
    if served:
        assert await served_topology(running) == json.loads((out / "topology.json").read_text())


@pytest.mark.parametrize("compacted", [False, True])
async def test_the_leaders_sidecar_starts_from_its_published_rows_and_watches_what_changed_since(
        memory, api, logs, sidecars, tmp_path, compacted):
    """The leader's sidecar listed every pod a moment after its init had (155 MiB at 16384 pods of ~9.6 KB). It
    starts from the rows its init published and watches the pods from the resourceVersion they are current to:
    what changed in between (a worker's new IP, a worker gone) reaches its files and the journal. When the API
    server no longer has that history (410), it lists the pods as before."""
    await published_job(memory, api, logs, tmp_path, 20)
    journal = configmap(memory, "demo-topology-journal")["data"]
    assert journal["podsResourceVersion"] and "podsResourceVersion" not in configmap(
        memory, "demo-topology-summary")["data"]
    memory.set_pod_ip("default", "demo-worker-12", examples.loopback_ip(93))  # after init, before the sidecar
    memory.delete_pod("default", "demo-worker-19")
    if compacted:
        memory.sandbox.store.compact()  # every watch from before now gets 410 Gone
    leader = await start_sidecar(sidecars, tmp_path, "demo-master-0", "--view", "full")
    await logs.until("demo-master-0", "started publishing")
    await leader.until(lambda: world(tmp_path / "demo-master-0")[0] == "20", what="the leader sees the worker gone")
    hosts = json.loads((tmp_path / "demo-master-0" / "topology.json").read_text())["members"]
    assert next(m for m in hosts if m["name"] == "demo-worker-12")["address"] == examples.loopback_ip(93)
    await memory.until("/v1/configmaps", lambda store: "demo-worker-19" in json.dumps(
        store.get("/v1/configmaps", "default", "demo-topology-journal")["data"]))  # published: gone
    lists = [r for agent, r in api.requests if agent == agent_name("sidecar", "demo-master-0")
             and r.path == PODS and r.verb == "list"]
    assert len(lists) == (1 if compacted else 0)
    assert "starting from the 21 pods published" in logs.text("demo-master-0")
    # the publication is read once: the rows it starts from are also its publisher's read-back
    reads = [r for agent, r in api.requests if agent == agent_name("sidecar", "demo-master-0")
             and r.path == CONFIGMAPS and r.verb == "list"
             and "demo-topology" in dict(r.query).get("labelSelector", "")]
    assert len(reads) == 1


def watch_events(running) -> float:
    """The objects a sidecar's watches have brought (its topology_agent_watch_events_total, BOOKMARKs apart: the
    sandbox sends one at each quiet half second)."""
    return sum(sample.value for metric in running.sidecar.metrics.events.collect() for sample in metric.samples
               if sample.name.endswith("_total") and sample.labels.get("type") != "BOOKMARK")


async def test_a_follower_in_its_own_view_receives_nothing_while_only_other_pods_rows_change(memory, api, logs,
                                                                                                 sidecars, tmp_path):
    """Followers in their own view read only the summary, but received every journal write: at start-up (the
    kubelet's status writes) ~1 MiB each at 4096 pods, growing with the job. They watch the summary ConfigMap,
    written only when what it says changes: a worker's new IP (its role too large to list) changes nothing they
    read, a worker that joins changes the sizes."""
    await published_job(memory, api, logs, tmp_path, 20)
    summary = configmap(memory, "demo-topology-summary")["metadata"]["resourceVersion"]
    await start_sidecar(sidecars, tmp_path, "demo-master-0")
    follower = await start_sidecar(sidecars, tmp_path, "demo-worker-7")
    await logs.until("demo-worker-7", "(follower)")
    await logs.until("demo-master-0", "started publishing")
    await follower_watching(api, "demo-worker-7")
    assert "following Volcano Job configmap demo-topology-summary" in logs.text("demo-worker-7")
    # the leader's sidecar read back what its init published: the same summary is not sent again
    assert configmap(memory, "demo-topology-summary")["metadata"]["resourceVersion"] == summary
    seq = int(configmap(memory, "demo-topology-journal")["data"]["seq"])
    events = watch_events(follower)
    memory.set_pod_ip("default", "demo-worker-12", examples.loopback_ip(90))
    await api.notice.until(lambda: int(configmap(memory, "demo-topology-journal")["data"]["seq"]) > seq,
                           what="the journal carries the new IP")
    assert configmap(memory, "demo-topology-summary")["metadata"]["resourceVersion"] == summary
    await asyncio.sleep(0.2)  # an event on its way to the follower would arrive meanwhile (in memory: at once)
    assert watch_events(follower) == events
    assert "following Volcano Job configmap demo-topology-summary" in logs.text("demo-worker-7")
    add_worker(memory, 20, 91)  # the sizes change: the summary is written, and the follower rewrites its files
    await follower.until(lambda: world(tmp_path / "demo-worker-7")[0] == "22", what="the follower sees the new size")
    assert configmap(memory, "demo-topology-summary")["metadata"]["resourceVersion"] != summary


async def test_without_rbac_for_leases_the_leader_still_publishes_without_failover(memory, api, logs, sidecars,
                                                                                   tmp_path):
    """RBAC from before the Lease (no leases rule): init says the topology is published without failover; the
    leader named in the journal must then keep publishing, not wait for a Lease it cannot read."""
    memory.faults(status=403, path="/leases", count=-1)
    await published_job(memory, api, logs, tmp_path, 5)
    await start_sidecar(sidecars, tmp_path, "demo-master-0")
    follower = await start_sidecar(sidecars, tmp_path, "demo-worker-3")
    await logs.until("demo-worker-3", "(follower)")
    await logs.until("demo-master-0", "without failover")
    add_worker(memory, 5, 91)
    await follower.until(lambda: world(tmp_path / "demo-worker-3")[0] == "7", what="the follower sees the new worker")


async def test_a_standby_readied_by_a_slow_leader_lets_go_of_the_pods_once_it_renews_again(memory, api, logs,
                                                                                          sidecars, tmp_path):
    """A leader that missed its renewals for a few seconds made the first standby list every pod, and the standby
    held them for the rest of its life (~90 MB at 16384 pods, against 44 for a standby that follows the summary).
    Once the leader has renewed for a whole lease, the standby follows the publication again, holding no pod."""
    await published_job(memory, api, logs, tmp_path, 5)
    # A 3 s lease: a standby that has seen the leader renew is ready after 1 s without a renewal and may take the
    # Lease after 3; the 2 s between (less the leader's 0.6 s between renewals) are slack for the test's next
    # steps (the standby's LIST of 6 pods, the renewals back) on a loaded machine.
    running = {n: await start_sidecar(sidecars, tmp_path, n, "--lease-seconds", "3")
               for n in ("demo-master-0", "demo-worker-0")}
    await logs.until("demo-worker-0", "(standby)")
    await logs.until("demo-master-0", "started publishing")
    watching = running["demo-worker-0"].sidecar.publication.elector.observed
    await api.notice.until(lambda: watching.renewals >= 1, what="the standby sees the leader renew")
    elector = running["demo-master-0"].sidecar.publication.elector
    renew = elector.attempt

    async def slow() -> bool:  # holds on, but writes nothing: the standby sees no renewal
        return True

    elector.attempt = slow
    standby = running["demo-worker-0"].sidecar
    await running["demo-worker-0"].until(lambda: standby.view.listed, what="the standby lists the pods")
    assert len(standby.view.pods) == 6 and "was not renewed for a third of its duration" in logs.text("demo-worker-0")
    elector.attempt = renew  # renewing again, before the standby may take the Lease
    await logs.until("demo-worker-0", "the publisher renews lease demo-topology again")
    for _ in range(200):  # let go of once the pods' follower has ended
        if not standby.view.listed:
            break
        await asyncio.sleep(0.05)
    assert standby.view.pods == {} and not standby.view.listed and standby.evaluator.plan is None
    assert "started publishing" not in logs.text("demo-worker-0")
    add_worker(memory, 5, 91)  # it follows the publication again
    await running["demo-worker-0"].until(lambda: world(tmp_path / "demo-worker-0")[0] == "7",
                                         what="the standby sees the new worker")
    assert standby.view.pods == {}


async def test_when_the_leader_stops_a_standby_takes_over_and_followers_see_the_new_membership(memory, api, logs,
                                                                                               sidecars, tmp_path):
    """Followers kept the last membership forever when the leader pod went away. The leader here stops as on
    SIGTERM (its Lease released); tests/integration kills a leader process."""
    await published_job(memory, api, logs, tmp_path, 5)
    running = {n: await start_sidecar(sidecars, tmp_path, n, "--lease-seconds", "3")
               for n in ("demo-master-0", "demo-worker-0", "demo-worker-1", "demo-worker-4")}
    for standby in ("demo-worker-0", "demo-worker-1"):  # both stand by before the leader goes
        await logs.until(standby, "(standby)")
    await logs.until("demo-master-0", "started publishing")
    # The follower must follow the journal before the leader goes (a follower that starts after the leader's pod
    # is deleted refuses the copy its writer no longer vouches for, and reads the pods).
    await logs.until("demo-worker-4", "(follower)")
    before = world(tmp_path / "demo-worker-4")
    published_before = {n: configmap(memory, n) for n in ("demo-topology", "demo-topology-journal")}
    await sidecars.stop("demo-master-0")
    memory.delete_pod("default", "demo-master-0")
    await running["demo-worker-4"].until(lambda: world(tmp_path / "demo-worker-4")[0] == "5", timeout=30,
                                         what="the follower sees the leader gone")
    after = world(tmp_path / "demo-worker-4")
    assert before[0] == "6" and after[1] != before[1]  # a new rank 0, a new MASTER_ADDR
    took = [n for n in ("demo-worker-0", "demo-worker-1") if "started publishing" in logs.text(n)]
    assert len(took) == 1
    # the released Lease read as abandoned: the standby listed the pods before it took the Lease
    assert "lease demo-topology is free or was not renewed for a third of its duration" in logs.text(took[0])
    lease = memory.sandbox.store.get("coordination.k8s.io/v1/leases", "default", "demo-topology")
    assert lease["spec"]["holderIdentity"] == took[0] and lease["spec"]["leaseTransitions"] >= 1
    # The new publisher's real writes pass the admission policy as an UPDATE by its own pod (a standby the
    # previous leader named), journal and snapshot alike.
    await memory.until("/v1/configmaps", lambda store: configmap(memory, "demo-topology")["data"]["leader"] == took[0])
    from tests.vap import Deny

    for name, old in published_before.items():
        assert policy_admits(memory, "UPDATE", took[0], configmap(memory, name), old)
        with pytest.raises(Deny, match=r"only the pod named in data\.leader"):  # the same write by a follower
            policy_admits(memory, "UPDATE", "demo-worker-4", configmap(memory, name), old)
    assert "released lease demo-topology" in logs.text("demo-master-0")


async def test_a_standby_that_takes_over_while_a_node_is_lost_never_publishes_its_member_as_back(memory, api, logs,
                                                                                                 sidecars, tmp_path):
    """The standby lists the pods (no mark on them: the marks are the publisher's) and waits for its Nodes' first
    LIST before it evaluates and publishes: otherwise the member on the lost Node came back for a moment, every
    trainer restarted twice."""
    pods = create_volcano_job(memory, (("master", 1), ("worker", 5)))
    on_nodes_of_their_own(memory, pods)
    for pod in pods:
        await init(api, logs, pod["metadata"]["name"], tmp_path / pod["metadata"]["name"], "--address", "ip",
                   "--source", "published")
    running = {n: await start_sidecar(sidecars, tmp_path, n, "--lease-seconds", "3")
               for n in ("demo-master-0", "demo-worker-0", "demo-worker-1", "demo-worker-4")}
    for standby in ("demo-worker-0", "demo-worker-1"):
        await logs.until(standby, "(standby)")
    await logs.until("demo-master-0", "started publishing")
    await logs.until("demo-worker-4", "(follower)")
    follower = running["demo-worker-4"]
    memory.update(NODES, "", "node-4", node_ready("Unknown"))  # demo-worker-3's
    await follower.until(lambda: world(tmp_path / "demo-worker-4")[0] == "5", what="the lost member left")
    # The new publisher's Nodes come slowly, and the lost member's pod changes meanwhile (a kubelet's status write,
    # here an annotation): the pod as the API gives it carries no mark.
    memory.faults(delay=2.0, delay_count=-1, path="/nodes")
    await sidecars.stop("demo-master-0")
    memory.update_pod("default", "demo-worker-3", lambda p: p["metadata"]["annotations"].__setitem__("note", "x"))
    memory.delete_pod("default", "demo-master-0")
    await follower.until(lambda: world(tmp_path / "demo-worker-4")[0] == "4", timeout=30,
                         what="the follower sees the leader gone")
    took = next(n for n in ("demo-worker-0", "demo-worker-1") if "started publishing" in logs.text(n))
    await memory.until("/v1/configmaps", lambda store: configmap(memory, "demo-topology")["data"]["leader"] == took)
    await follower.until(lambda: follower.sidecar.ready, what="the follower settled")
    # one generation for the lost member, one for the leader gone: none with the member back in between
    assert generation(tmp_path / "demo-worker-4") == 3, notes(memory)
    assert not any("world size 5 -> 5" in note for note in notes(memory)), notes(memory)
    assert any(note.startswith("generation 2: world size 6 -> 5, training pods 6 -> 5; left out: demo-worker-3: "
                               "lost: node node-4 Unknown") for note in notes(memory))  # the publisher's Event


@pytest.mark.parametrize("view", ["full", "auto"])
async def test_after_the_whole_job_is_re_created_followers_wait_for_the_leader_to_publish_again(memory, api, logs,
                                                                                                inits, sidecars,
                                                                                                tmp_path, view):
    """What a real cluster does: a controller that restarts a job re-creates every pod under its name with a new
    uid, and the publication survives (the job owns it). The copy's writer is then a member under another uid: not
    a forgery. Reading the pods instead would make every follower list every pod (the load the publication exists
    to avoid), so followers wait for the leader, whose sidecar publishes again, and use its copy."""
    pods = create_volcano_job(memory, (("master", 1), ("worker", 3)))
    names = [p["metadata"]["name"] for p in pods]
    for name in names:
        await init(api, logs, name, tmp_path / "before" / name, "--source", "published", "--address", "ip",
                   "--view", view)
    for pod in pods:  # the controller restarts the job: same names, new uids, new addresses
        memory.delete_pod("default", pod["metadata"]["name"])
        pod["metadata"]["uid"] = pod["metadata"]["uid"][:-4] + "beef"
        ip = examples.loopback_ip(200 + names.index(pod["metadata"]["name"]))
        pod["status"].update(podIP=ip, podIPs=[{"ip": ip}])
        memory.create_pod(pod)
    followers = {n: inits.start(n, tmp_path / n, "--source", "published", "--address", "ip", "--timeout", "60",
                                "--view", view) for n in names[1:]}
    await init(api, logs, "demo-master-0", tmp_path / "demo-master-0", "--source", "published", "--address", "ip",
               "--view", view)
    await start_sidecar(sidecars, tmp_path, "demo-master-0", "--view", view)
    for name, who in followers.items():
        ran = await inits.finish_async(who)
        assert ran.code == 0, ran.err
        assert "waiting for the published topology to be written again" in ran.err and "its writer's uid" in ran.err
        assert "reading the pods instead" not in ran.err
        if view == "full":
            hostfile = (tmp_path / name / "hostfile").read_text()
            assert all(p["status"]["podIP"] in hostfile for p in pods), hostfile
        else:  # its own view, from the summary the re-created leader published
            assert "(--view auto)" in ran.err and "reading the whole topology" not in ran.err
            assert world(tmp_path / name) == ("4", pods[0]["status"]["podIP"])


@pytest.mark.parametrize(("view", "read"), [("full", "demo-topology-journal"), ("auto", "demo-topology-summary")])
async def test_a_follower_leaves_a_journal_that_a_pod_of_another_job_rewrote_and_follows_the_pods(
        memory, api, logs, sidecars, tmp_path, view, read):
    """A journal (or, for a pod in its own view, the summary) rewritten by a writer that is not a member of the job
    (here another job's pod, in a namespace without the admission policy) was applied by every follower. A new
    writer is now read once before its copy is used: this one is refused in one line, and the follower follows
    the pods, so the job's changes still reach it."""
    await published_job(memory, api, logs, tmp_path, 3, "--view", view)
    other = memory.create_pod(examples.volcano_job("other", (("master", 1),))[0])
    follower = await start_sidecar(sidecars, tmp_path, "demo-worker-2", "--view", view)
    await logs.until("demo-worker-2", "(follower)")
    forged = copy.deepcopy(configmap(memory, read))
    forged["data"].update(leader="other-master-0", leaderUid=other["metadata"]["uid"])
    forged["metadata"].pop("resourceVersion")
    memory._run(memory.sandbox.store.replace, "/v1/configmaps", "default", read, forged)
    await logs.until("demo-worker-2", f"the published topology is not used (configmap {read}: its "
                                      "writer, pod 'other-master-0', belongs to job 'other', not 'demo'")
    await logs.until("demo-worker-2", "following the pods from now on")
    add_worker(memory, 3, 81)
    await follower.until(lambda: world(tmp_path / "demo-worker-2")[0] == "5", what="the follower sees the new worker")
    await sidecars.stop("demo-worker-2")
    # a follower that starts now (the same pod's sidecar, restarted) refuses the copy at once: at its LIST, or (in
    # its own view, from the summary its init read) at the first event of its watch, which brings the copy
    refused = f"the published topology is not used (configmap {read}: its writer"
    restarted = await start_sidecar(sidecars, tmp_path, "demo-worker-2", "--view", view)
    await logs.until("demo-worker-2", refused)  # the restarted sidecar's own log
    await logs.until("demo-worker-2", "(pods)" if view == "full" else "following the pods from now on")
    add_worker(memory, 4, 82)
    await restarted.until(lambda: world(tmp_path / "demo-worker-2")[0] == "6", what="the new worker followed")


async def test_a_leader_re_created_under_a_new_uid_rewrites_the_publication_and_followers_use_it(memory, api, logs,
                                                                                                 sidecars, tmp_path):
    """Readers accept a copy only from the pod that holds the writer's name *and* uid. Volcano re-creates a failed
    pod under its name with a new uid: the new leader's sidecar must not be locked out by its earlier
    incarnation's copy. It stays the candidate, rewrites the snapshot first and then the journal under its new uid
    (the policy admits it: the name is the leader's), and a follower that starts then uses them."""
    pods = await published_job(memory, api, logs, tmp_path, 3)
    old_uid = configmap(memory, "demo-topology")["data"]["leaderUid"]
    earlier = {n: configmap(memory, n) for n in ("demo-topology", "demo-topology-journal")}
    memory.delete_pod("default", "demo-master-0")
    reborn = copy.deepcopy(pods[0])
    reborn["metadata"]["uid"] = "6f1e2d3c-0000-4000-8000-00000000abcd"
    memory.create_pod(reborn)
    # A re-created pod's state volume is a new emptyDir: its init's reads of the earlier incarnation are gone
    # (and its own init, which runs first, would leave its own).
    (state_of(tmp_path / "demo-master-0") / READS).unlink()
    await start_sidecar(sidecars, tmp_path, "demo-master-0")

    def rewritten(store) -> bool:
        return all(store.get("/v1/configmaps", "default", name)["data"]["leaderUid"] == reborn["metadata"]["uid"]
                   for name in ("demo-topology", "demo-topology-journal"))
    await memory.until("/v1/configmaps", rewritten)
    assert old_uid == pods[0]["metadata"]["uid"] != reborn["metadata"]["uid"]
    for name, old in earlier.items():  # the policy admits the new incarnation's rewrite (the leader's name)
        assert policy_admits(memory, "UPDATE", "demo-master-0", configmap(memory, name), old)
    follower = await start_sidecar(sidecars, tmp_path, "demo-worker-2")
    await logs.until("demo-worker-2", "(follower)")
    add_worker(memory, 3, 82)
    await follower.until(lambda: world(tmp_path / "demo-worker-2")[0] == "5", what="the follower sees the new worker")
    assert "not used" not in logs.text("demo-worker-2")


@pytest.mark.slow  # seconds of real waiting (backoffs, a timeout): the whole suite runs it
async def test_with_view_own_a_follower_reads_the_summary_alone_and_follows_changes_and_a_takeover(memory, api,
                                                                                                   logs, sidecars,
                                                                                                   tmp_path):
    """A follower read the whole snapshot twice and rewrote every file; with --view own it reads the journal's
    summary (never the snapshot), writes torch.env equal to the full view's, and follows a new worker and a new
    rank 0. The pods that hold every pod (the leader, its standbys) write the same three files, made from their
    own plan's summary: one shape of files across the job."""
    # every pod with the job's options: the leader summarizes
    await published_job(memory, api, logs, tmp_path, 7, "--view", "own")
    light_files = ["generation", "topology.json", "torch.env"]  # init's reads for its sidecar: in its state dir
    for pod in ("demo-master-0", "demo-worker-0", "demo-worker-6"):  # the leader, a standby, a follower
        assert sorted(p.name for p in (tmp_path / pod).iterdir()) == light_files, pod
        assert sorted(p.name for p in state_of(tmp_path / pod).iterdir()) == sorted([READS, RUN_RECORD]), pod
        assert json.loads((tmp_path / pod / "topology.json").read_text())["view"] == "own"
    light = tmp_path / "light"
    ran = await init(api, logs, "demo-worker-5", light, "--address", "ip", "--source", "published", "--view", "own")
    assert "waiting for the job's publisher, pod demo-master-0 (the holder of lease demo-topology) to publish its " \
           "summary" in ran.err and "not used" not in ran.err
    assert sorted(p.name for p in light.iterdir()) == light_files
    full = tmp_path / "full"
    await init(api, logs, "demo-worker-5", full, "--address", "ip", "--source", "published")
    full_env = json.loads((full / "topology.json").read_text())["env"]
    assert json.loads((light / "topology.json").read_text())["env"] == full_env  # 7 workers: lists are kept

    running = {n: await start_sidecar(sidecars, tmp_path, n, "--lease-seconds", "3", "--view", "own")
               for n in ("demo-master-0", "demo-worker-0", "demo-worker-1")}
    follower = await start_sidecar(sidecars, tmp_path, "demo-worker-5", "--lease-seconds", "3", "--view", "own",
                                   who="light", out=light)
    await logs.until("demo-master-0", "started publishing")
    await logs.until("light", "(follower)")
    await follower_watching(api, "demo-worker-5")
    assert generation(light) == 1  # the summary places it where init did: nothing rewritten
    add_worker(memory, 7, 90)
    await follower.until(lambda: world(light)[0] == "9", what="the light follower sees the new worker")
    for pod in ("demo-master-0", "demo-worker-0"):  # the leader's and a standby's sidecars, from the pods
        await running[pod].until(lambda pod=pod: world(tmp_path / pod) == world(light), what=f"{pod} sees it")
        assert sorted(p.name for p in (tmp_path / pod).iterdir()) == light_files, pod
        env = json.loads((tmp_path / pod / "topology.json").read_text())["env"]
        assert env["NODE_RANK"] == ("0" if pod == "demo-master-0" else "1") and "VC_WORKER_HOSTS" in env
    await sidecars.kill("demo-master-0")
    before = world(light)
    memory.delete_pod("default", "demo-master-0")
    await follower.until(lambda: world(light)[0] == "8", timeout=30, what="the light follower sees the leader gone")
    assert world(light)[1] != before[1]  # a new rank 0, a new MASTER_ADDR
    assert sorted(p.name for p in light.iterdir()) == light_files
    text = logs.text("light")
    assert "not used" not in text and "reading the whole topology" not in text


async def test_with_view_own_but_no_summary_published_a_pod_says_so_and_reads_the_whole_topology(memory, api, logs,
                                                                                                 tmp_path):
    await published_job(memory, api, logs, tmp_path, 4, "--view", "full")  # the leader publishes no summary
    out = tmp_path / "light"
    ran = await init(api, logs, "demo-worker-3", out, "--address", "ip", "--source", "published", "--view", "own")
    assert "--view own not used: the leader published no summary" in ran.err
    assert (out / "hostfile").read_text() == (tmp_path / "demo-worker-3" / "hostfile").read_text()
    assert (out / "torch.env").read_text() == (tmp_path / "demo-worker-3" / "torch.env").read_text()


def gone(memory, *names: str) -> None:
    """What `kubectl delete configmap` (a user's, a cleanup script's) does to the published objects."""
    for name in names:
        memory.delete("/v1/configmaps", "default", name)


def present(*names: str):
    return lambda store: all(("/v1/configmaps", "default", name) in store.objects for name in names)


def looks(api, pod: str) -> int:
    """The leader's looks at what is published: LISTs of the configmaps' metadata alone."""
    return sum(1 for who, request in api.requests if who == agent_name("sidecar", pod) and request.verb == "list"
               and request.path == CONFIGMAPS and "PartialObjectMetadataList" in request.accept)


async def test_a_deleted_summary_neither_stops_a_pod_in_its_own_view_nor_stays_gone(memory, api, logs, sidecars,
                                                                                    tmp_path):
    """`kubectl delete configmap demo-topology-summary`: the leader wrote the summary again only when what it says
    changed, so meanwhile an init in its own view (a restarted pod, a replacement) waited out its --timeout, and a
    sidecar that started followed the whole job's pods. Now both read the whole topology (the journal in the same
    LIST says that it is published), and the leader's sidecar writes the summary again within a lease duration,
    saying what it said: later pods read it alone again."""
    await published_job(memory, api, logs, tmp_path, 20)
    before = configmap(memory, "demo-topology-summary")["data"]
    gone(memory, "demo-topology-summary")
    again = tmp_path / "again"
    ran = await init(api, logs, "demo-worker-7", again, "--address", "ip", "--source", "published", "--timeout", "10")
    assert ("configmap demo-topology-summary is gone while configmap demo-topology-journal is published (was it "
            "deleted?): reading the whole topology instead") in ran.err
    assert "read the published topology demo-topology: sequence 1, 21 pods" in ran.err
    assert world(again) == world(tmp_path / "demo-worker-7")
    follower = await start_sidecar(sidecars, tmp_path, "demo-worker-7", who="restarted", out=again)
    await logs.until("restarted", "(follower)")
    assert "following Volcano Job configmap demo-topology-journal from generation 1" in logs.text("restarted")
    assert "configmap demo-topology-summary is gone" in logs.text("restarted")

    await start_sidecar(sidecars, tmp_path, "demo-master-0", "--lease-seconds", "2")
    await logs.until("demo-master-0", "started publishing")  # a new leadership writes a summary that is not there
    await memory.until("/v1/configmaps", present("demo-topology-summary"))
    await api.notice.until(lambda: looks(api, "demo-master-0") >= 1, what="the leader looking")
    gone(memory, "demo-topology-summary")  # again, while the leader publishes and nothing changes
    await logs.until("demo-master-0", "configmap demo-topology-summary was gone (deleted?); wrote it again")
    assert said(configmap(memory, "demo-topology-summary")["data"]) == said(before)
    later = tmp_path / "later"
    ran = await init(api, logs, "demo-worker-8", later, "--address", "ip", "--source", "published", "--timeout", "10")
    assert "is gone" not in ran.err and "reading the whole topology" not in ran.err
    assert world(later) == world(tmp_path / "demo-worker-8")
    # The leader looks once per lease duration and writes nothing while everything is there.
    rv, seen = configmap(memory, "demo-topology-summary")["metadata"]["resourceVersion"], looks(api, "demo-master-0")
    await api.notice.until(lambda: looks(api, "demo-master-0") >= seen + 2, what="two more looks")
    assert configmap(memory, "demo-topology-summary")["metadata"]["resourceVersion"] == rv
    add_worker(memory, 20, 91)  # the follower that read the whole topology follows the journal
    await follower.until(lambda: world(again)[0] == "22", what="the follower sees the new worker")


async def test_a_leader_writes_again_the_snapshot_and_journal_deleted_while_nothing_changes(memory, api, logs,
                                                                                          sidecars, tmp_path):
    """The journal was written again at the next change only, the snapshot when it was due: a pod that reads the
    whole topology (its files name every member) waited out its --timeout in a job where nothing changed."""
    await published_job(memory, api, logs, tmp_path, 4, "--view", "full")
    await start_sidecar(sidecars, tmp_path, "demo-master-0", "--lease-seconds", "2", "--view", "full")
    await logs.until("demo-master-0", "started publishing")
    # it read back what init published and published once (a look comes only after that)
    await api.notice.until(lambda: looks(api, "demo-master-0") >= 1, what="the leader looking")
    seq = configmap(memory, "demo-topology-journal")["data"]["seq"]
    gone(memory, "demo-topology", "demo-topology-journal")
    await memory.until("/v1/configmaps", present("demo-topology", "demo-topology-journal"))
    await logs.until("demo-master-0", "configmap demo-topology-journal was gone")  # logged once its write returned
    assert configmap(memory, "demo-topology-journal")["data"]["seq"] == seq
    out = tmp_path / "full"
    ran = await init(api, logs, "demo-worker-3", out, "--address", "ip", "--source", "published", "--view", "full",
                     "--timeout", "10")
    assert f"read the published topology demo-topology: sequence {seq}, 5 pods" in ran.err
    assert (out / "hostfile").read_text() == (tmp_path / "demo-worker-3" / "hostfile").read_text()
    text = logs.text("demo-master-0")
    assert "configmap demo-topology was gone" in text and "configmap demo-topology-journal was gone" in text


async def test_rank_0_launching_over_ssh_writes_its_hostfile_from_the_summary_and_follows_it(memory, api, logs,
                                                                                             sidecars, tmp_path):
    """A large DeepSpeed job's rank 0 (no launcher role: pdsh runs there) whose hosts have DNS names that follow
    their indices reads the summary, not the whole topology (a few KiB where a 16384-pod job's snapshot is 4 MB),
    and writes the hostfile and <role>.host files the full view writes, byte for byte; its sidecar continues
    from init's generation (no rewrite at start) and rewrites them when a worker in the middle leaves."""
    from agent.core import Options, render_pod
    from agent.core.model import Processes

    secret = ssh_secret(tmp_path / "secret", "demo")
    ssh = ("--address", "dns", "--ssh-secret-dir", str(secret), "--nproc-per-node", "1")
    pods = create_volcano_job(memory, (("master", 1), ("worker", 20)))
    names = [p["metadata"]["name"] for p in pods]
    order = ["demo-worker-3", *(n for n in names if n != "demo-worker-3")]  # a worker's init leads
    for name in order:
        await init(api, logs, name, tmp_path / name, "--source", "published", *ssh)
    master = tmp_path / "demo-master-0"
    document = json.loads((master / "topology.json").read_text())
    assert document["view"] == "own" and document["hosts"] and len(document["members"]) == 1  # rank 0: itself
    assert "reading the whole topology" not in logs.text("demo-master-0")
    options = Options(address="dns", processes=Processes(per_node=1))
    full = render_pod(memory.sandbox.store.list("/v1/pods", "default"), "demo-master-0", options)
    for name in ("hostfile", "master.host", "worker.host"):
        assert (master / name).read_bytes() == full.files[name], name
    assert not (master / "discover_hosts.sh").exists()
    assert "demo-worker-19.demo" in (master / "hostfile").read_text()
    await start_sidecar(sidecars, tmp_path, "demo-worker-3", *ssh)
    await logs.until("demo-worker-3", "started publishing")
    rank0 = await start_sidecar(sidecars, tmp_path, "demo-master-0", *ssh)
    await rank0.until(lambda: rank0.sidecar.evaluator.evaluated, what="rank 0's sidecar evaluated")
    assert generation(master) == 1  # init's files continued from: the same hosts, no rewrite
    memory.delete_pod("default", "demo-worker-7")
    await rank0.until(lambda: generation(master) == 2, what="rank 0 rewrites its host lists")
    left = render_pod(memory.sandbox.store.list("/v1/pods", "default"), "demo-master-0", options)
    for name in ("hostfile", "worker.host"):
        assert (master / name).read_bytes() == left.files[name], name
    assert "demo-worker-7.demo" not in (master / "hostfile").read_text()
    assert json.loads((master / "topology.json").read_text())["hosts"] != document["hosts"]


CLAIMS = "resource.k8s.io/v1/resourceclaims"


def _dra_pod(pod, claim_name):
    """A trainer with cpu 96 taking one DRA claim (made from a template, as the resourceclaim controller does)."""
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "96"}, "claims": [{"name": "gpus"}]}
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "four-gpus"}]
    pod.setdefault("status", {})["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": claim_name}]


def _allocated(memory, pod, claim_name, gpus=4):
    from tests.core.test_claims import claim, results
    memory.create(CLAIMS, "default", claim(claim_name, allocated=results(("gpu", "gpu.nvidia.com", gpus)), owner=pod,
                                           pod_claim="gpus"))


async def test_the_sidecar_counts_dra_gpus_and_reads_the_claim_of_a_replacement_pod(memory, api, logs, sidecars,
                                                                                   tmp_path):
    pods = create_volcano_job(memory, (("master", 1), ("worker", 2)))
    for pod in pods:
        name = pod["metadata"]["name"]
        memory.update_pod("default", name, lambda p, n=name: _dra_pod(p, f"{n}-gpus-a"))
        _allocated(memory, name, f"{name}-gpus-a")
    job = await start_job(api, logs, sidecars, tmp_path)
    try:
        slots = lambda: [m["slots"] for m in json.loads((job.out / "topology.json").read_text())["members"]]  # noqa: E731
        await job.until(job.settled, "nothing pending")
        assert generation(job.out) == 1 and slots() == [4, 4, 4] and job.env()["NPROC_PER_NODE"] == "4"
        memory.delete_pod("default", "demo-worker-1")
        memory.delete(CLAIMS, "default", "demo-worker-1-gpus-a")  # the garbage collector deletes what it owned
        await job.until(lambda: generation(job.out) == 2, "scale down")
        replacement = examples.volcano_job("demo", (("master", 1), ("worker", 2)))[-1]
        _dra_pod(replacement, "demo-worker-1-gpus-b")
        replacement["status"].update(podIP=examples.loopback_ip(20), podIPs=[{"ip": examples.loopback_ip(20)}])
        # Its new claim, allocated before the pod is bound; a claim of two devices tells it from the deleted one.
        _allocated(memory, "demo-worker-1", "demo-worker-1-gpus-b", gpus=2)
        memory.create_pod(replacement)
        await job.until(lambda: generation(job.out) == 3, "replacement")
        assert slots() == [4, 4, 2]
    finally:
        await job.trainer.stop()
