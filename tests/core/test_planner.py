"""``Planner`` (the sidecar's plan kept between changes) against ``build_plan`` from scratch.

After every change of a random sequence (joins, leaves, new IPs, lost IPs, terminating and finished pods, new
process counts, index conflicts, moves between nodes, new Node labels, this pod itself changing) the planner's
plan must equal the one ``build_plan`` makes from the same pods, or both must refuse with the same line. Each
controller the agent reads, with the options that change how the plan is made.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import examples
from agent.core import Options, Renderer, render_pod
from agent.core.placement import DEFAULT_LEVELS
from agent.core.rendering import MemberTexts, render_topology_json, topology_document
from agent.core.topology import Planner, build_plan
from agent.core.variables import compute_variables
from agent.errors import InputError

BLOCK, SUBBLOCK = "cloud.google.com/gce-topology-block", "cloud.google.com/gce-topology-subblock"

JOBS = {
    "volcano": lambda: examples.volcano_job(tasks=(("master", 1), ("worker", 9), ("extras", 3))),
    "pytorchjob": lambda: examples.pytorchjob(workers=10),
    "trainjob": lambda: examples.trainjob(num_nodes=10),
    "jobset": lambda: examples.jobset(rjobs=(("driver", 1, 1), ("workers", 3, 3))),
    "lws": lambda: examples.leaderworkerset(size=4, groups=3),
    "indexed-job": lambda: examples.indexed_job(completions=10),
    "mpijob": lambda: examples.mpijob(workers=10),
}
OPTIONS = {
    "default": Options(),
    "ip": Options(address="ip"),
    "topology": Options(rank_order="topology", levels=DEFAULT_LEVELS),
    "levels": Options(levels=DEFAULT_LEVELS),
}
OPS = ("ip", "no-ip", "dup-ip", "leave", "join", "terminating", "failed", "pending", "running", "slots", "clone",
       "node", "labels", "self", "other-job", "burst")


def _outcome(make):
    try:
        return make()
    except InputError as err:
        return f"refused: {err}"


def _views(topology):
    """The derived views renderers read; the planner seeds them, a fresh copy of the topology computes them."""
    return (topology.training, topology.me, topology.roles, topology.world_size, topology.slot_sizes,
            {role: topology.role_members(role) for role in topology.roles}, topology.run_starts)


def _same_views(plan) -> None:
    if isinstance(plan, str):
        return
    assert _views(plan.topology) == _views(dataclasses.replace(plan.topology))


class World:
    """A job's pods as the sidecar holds them (name -> object; a change is a new object), and the Node labels."""

    def __init__(self, pods, rnd: random.Random) -> None:
        self.rnd = rnd
        self.rv = itertools.count(1000)
        self.all = {p["metadata"]["name"]: p for p in pods}
        for k, pod in enumerate(self.all.values()):
            pod["metadata"]["resourceVersion"] = str(next(self.rv))
            pod["spec"]["nodeName"] = f"node-{k}"
            pod.setdefault("status", {})["phase"] = "Running"
        self.nodes = {f"node-{k}": {BLOCK: "b", SUBBLOCK: f"sub-{k % 3}"} for k in range(len(self.all) + 4)}
        names = list(self.all)
        held = set(rnd.sample(names, len(names) // 4))
        self.pods = {n: p for n, p in self.all.items() if n not in held}
        self.me = rnd.choice(sorted(self.pods))
        self.last = ""

    def _new(self, name: str):
        pod = copy.deepcopy(self.pods[name])
        pod["metadata"]["resourceVersion"] = str(next(self.rv))
        return pod

    def others(self):
        return sorted(n for n in self.pods if n != self.me)

    def step(self, op: str, target: str | None = None) -> None:
        rnd, others = self.rnd, self.others()
        name = rnd.choice(others) if others else self.me
        if self.last in others and rnd.random() < 0.5:
            name = self.last  # the same pod again (loses its IP, then gets one): the transitions that matter
        name = target or name
        self.last = name
        if op == "self":
            name = self.me
        if op == "join":
            out = sorted(set(self.all) - set(self.pods))
            if target in out:
                out = [target]
            if out:
                joining = rnd.choice(out)
                self.pods[joining] = self.all[joining]
            return
        if op == "leave":
            if name in others:
                del self.pods[name]
            return
        if op == "burst":
            for _ in range(rnd.randint(2, 5)):
                self.step(rnd.choice(("ip", "leave", "join", "no-ip", "running")))
            return
        if name not in self.pods:
            return
        pod = self._new(name)
        status, meta, spec = pod.setdefault("status", {}), pod["metadata"], pod["spec"]
        if op == "ip":
            ip = f"127.{rnd.randint(100, 120)}.{rnd.randint(0, 255)}.{rnd.randint(1, 254)}"
            status["podIP"], status["podIPs"] = ip, [{"ip": ip}]
        elif op == "dup-ip":  # hostNetwork pods on one node share its IP: refused under --address ip
            other = self.pods[rnd.choice(sorted(self.pods))].get("status", {})
            status["podIP"], status["podIPs"] = other.get("podIP"), other.get("podIPs")
        elif op == "no-ip":
            status.pop("podIP", None)
            status.pop("podIPs", None)
        elif op == "terminating":
            meta["deletionTimestamp"] = "2026-11-23T00:00:00Z"
        elif op in ("failed", "pending", "running"):
            status["phase"] = op.capitalize()
        elif op == "slots":
            container = spec["containers"][0]
            container.setdefault("resources", {}).setdefault("limits", {})["nvidia.com/gpu"] = str(rnd.randint(1, 4))
        elif op == "clone":  # a second pod claiming the same index (a stale pod): both paths must refuse alike
            meta["name"] = f"{name}-stale"
            meta.pop("uid", None)
            name = meta["name"]
        elif op == "node":
            spec["nodeName"] = rnd.choice([*self.nodes, "unknown-node", ""])
        elif op == "labels":
            self.nodes = dict(self.nodes)
            self.nodes[rnd.choice(sorted(self.nodes))] = {BLOCK: "b", SUBBLOCK: f"sub-{rnd.randint(0, 5)}"}
            return
        elif op == "other-job":
            meta["namespace"] = "elsewhere"
        self.pods[name] = pod


def _check(world: World, options: Options, ops: list[str], target: str | None = None) -> Planner:
    planner = Planner(options, world.me)
    for op in ["start", *ops]:
        if op != "start":
            world.step(op, target)
        held, nodes = dict(world.pods), world.nodes
        got = _outcome(lambda: planner.plan(held, nodes=nodes))  # noqa: B023 - called at once
        want = _outcome(lambda: build_plan(list(held.values()), world.me, options, nodes=nodes))  # noqa: B023
        assert got == want, f"after {op}"
        _same_views(got)
        _same_views(want)
    return planner


@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("opts", sorted(OPTIONS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=25))
def test_planner_equals_planning_from_scratch(job, opts, seed, ops):
    _check(World(JOBS[job](), random.Random(seed)), OPTIONS[opts], ops)


PAIRS = [(a, b) for a in OPS if a not in ("burst", "labels", "self", "clone")
         for b in ("ip", "no-ip", "running", "leave", "join")]


@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("opts", sorted(OPTIONS))
def test_every_pod_through_every_two_changes(job, opts):
    """Exhaustive where the random walk is thin: each pod (training or not, present or held back), each change
    followed by each of the common ones."""
    for name in sorted(World(JOBS[job](), random.Random(0)).all):
        for first, then in PAIRS:
            world = World(JOBS[job](), random.Random(0))
            if name == world.me:
                continue
            _check(world, OPTIONS[opts], [first, then], target=name)


@pytest.mark.parametrize("opts", ["default", "ip", "topology"])
def test_single_pod_changes_are_incremental(opts):
    """The point of the planner: a new IP, a leave and a join are planned from the last layout (in topology
    order only a change that keeps the pod's place is)."""
    world = World(examples.volcano_job(tasks=(("master", 1), ("worker", 63))), random.Random(7))
    ops = ["ip"] * 10 if opts == "topology" else ["ip", "leave", "join", "ip", "leave", "join", "ip", "ip"]
    planner = _check(world, OPTIONS[opts], ops)
    assert planner.incremental == len(ops)


def test_a_join_moves_the_ranks_after_it():
    """A worker joining in the middle: the workers after it move one node rank up; those before keep theirs."""
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 6)))
    for k, pod in enumerate(pods):
        pod["metadata"]["resourceVersion"] = str(k + 1)
    late = pods.pop(3)  # demo-worker-2
    held = {p["metadata"]["name"]: p for p in pods}
    planner = Planner(Options(), "demo-worker-0")
    before = {m.name: m.node_rank for m in planner.plan(held).topology.members}
    held[late["metadata"]["name"]] = late
    after = {m.name: m.node_rank for m in planner.plan(held).topology.members}
    assert planner.incremental == 1
    assert before == {"demo-master-0": 0, "demo-worker-0": 1, "demo-worker-1": 2, "demo-worker-3": 3,
                      "demo-worker-4": 4, "demo-worker-5": 5}
    assert after == {"demo-master-0": 0, "demo-worker-0": 1, "demo-worker-1": 2, "demo-worker-2": 3,
                     "demo-worker-3": 4, "demo-worker-4": 5, "demo-worker-5": 6}


def _files(make):
    try:
        return make().files
    except InputError as err:
        return f"refused: {err}"


@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("opts", ["ip", "levels"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=15))
def test_the_sidecars_files_are_the_one_shot_files_byte_for_byte(job, opts, seed, ops):
    """The sidecar's ``Renderer`` (kept plans, each member's topology.json text cached as bytes) writes exactly
    the bytes ``render_pod`` writes from scratch, which encodes members 1024 at a time (issue 24); and topology.json
    is ``json.dumps`` of its document."""
    world, options = World(JOBS[job](), random.Random(seed)), OPTIONS[opts]
    renderer = Renderer(options, world.me, checked=False)
    for op in ["start", *ops]:
        if op != "start":
            world.step(op)
        held, nodes = dict(world.pods), world.nodes
        kept = _files(lambda: renderer.render(held, generation=3, files_dir="/shared", nodes=nodes))  # noqa: B023
        fresh = _files(lambda: render_pod(list(held.values()), world.me, options, generation=3,  # noqa: B023
                                          files_dir="/shared", nodes=nodes))  # noqa: B023
        assert kept == fresh, f"after {op}"


def test_topology_json_across_the_encoders_1024_member_chunks_is_the_documents_json():
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2100)))
    plan = build_plan(pods, "demo-worker-7", Options(address="ip"))
    variables = compute_variables(plan, Options(address="ip"), generation=1)
    expected = json.dumps(topology_document(plan, variables, generation=1)) + "\n"
    assert render_topology_json(plan, variables, generation=1) == expected.encode()
    assert render_topology_json(plan, variables, generation=1, texts=MemberTexts()) == expected.encode()
