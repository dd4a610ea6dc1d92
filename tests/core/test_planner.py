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
import pickle
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import examples
from agent.core import Options, Renderer, render_pod
from agent.core.files.rendering import MemberTexts, render_topology_json, topology_document
from agent.core.files.variables import compute_variables
from agent.core.plan.layout import build_plan
from agent.core.plan.planner import Planner
from agent.core.pods.placement import DEFAULT_LEVELS
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
    "c10d": Options(address="ip", elastic=(1, 64)),  # training pods in the order of their (random) IPs
}
# The fast lane (scripts/test --fast) plans every controller with the default options and in c10d's order (by
# IP); the whole suite also by IP in the index order and with the topology levels.
FAST = ("default", "c10d")
OPTION_PARAMS = [o if o in FAST else pytest.param(o, marks=pytest.mark.slow) for o in sorted(OPTIONS)]
OPS = ("ip", "no-ip", "dup-ip", "leave", "join", "terminating", "failed", "pending", "running", "slots", "clone",
       "node", "labels", "new-node", "self", "other-job", "burst")


def _outcome(make):
    try:
        return make()
    except InputError as err:
        return f"refused: {err}"


def _views(topology):
    """The derived views renderers read; the planner seeds them, a fresh copy of the topology computes them."""
    return (topology.training, topology.me, topology.roles, topology.processes, topology.slot_sizes,
            {role: topology.role_members(role) for role in topology.roles}, topology.run_starts,
            topology.address_templates)


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
        # two blocks of three sub-blocks, interleaved in index order: a domain's first member is often not rank 0's
        self.nodes = {f"node-{k}": {BLOCK: f"b-{k % 2}", SUBBLOCK: f"sub-{k % 3}"} for k in range(len(self.all) + 4)}
        names = list(self.all)
        held = set(rnd.sample(names, len(names) // 4))
        self.pods = {n: p for n, p in self.all.items() if n not in held}
        self.me = rnd.choice(sorted(self.pods))
        self.last = ""

    def _new(self, name: str):
        # A deep copy by pickle's round trip: a third of copy.deepcopy's time on a pod, and the property tests
        # here and in test_summary.py make one at nearly every step.
        pod = pickle.loads(pickle.dumps(self.pods[name], pickle.HIGHEST_PROTOCOL))
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
            self.nodes[rnd.choice(sorted(self.nodes))] = {BLOCK: f"b-{rnd.randint(0, 1)}",
                                                          SUBBLOCK: f"sub-{rnd.randint(0, 5)}"}
            return
        elif op == "new-node":  # a Node's labels read for the first time: a new one, or one a pod runs on already
            node = rnd.choice([f"node-new-{len(self.nodes)}", "unknown-node"])
            self.nodes = {**self.nodes, node: {BLOCK: f"b-{rnd.randint(0, 2)}", SUBBLOCK: f"sub-{rnd.randint(0, 5)}"}}
            if rnd.random() < 0.5:
                return
            spec["nodeName"] = node
        elif op == "other-job":
            meta["namespace"] = "elsewhere"
        self.pods[name] = pod


def _check(world: World, options: Options, ops: list[str], target: str | None = None, *,
           told: bool = False) -> Planner:
    """``told``: the planner is told which pods changed (else it compares them all)."""
    planner = Planner(options, world.me)
    held: dict = {}
    for op in ["start", *ops]:
        if op != "start":
            world.step(op, target)
        before, held, nodes = held, dict(world.pods), world.nodes
        touched = _touched(before, held) if told else None
        got = _outcome(lambda: planner.plan(held, nodes=nodes, touched=touched))  # noqa: B023 - called at once
        want = _outcome(lambda: build_plan(list(held.values()), world.me, options, nodes=nodes))  # noqa: B023
        assert got == want, f"after {op}"
        _same_views(got)
        _same_views(want)
    return planner


@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("opts", OPTION_PARAMS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=25),
       told=st.booleans())
def test_planner_equals_planning_from_scratch(job, opts, seed, ops, told):
    _check(World(JOBS[job](), random.Random(seed)), OPTIONS[opts], ops, told=told)


PAIRS = [(a, b) for a in OPS if a not in ("burst", "labels", "new-node", "self", "clone")
         for b in ("ip", "no-ip", "running", "leave", "join")]


@pytest.mark.slow
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


@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("opts", OPTION_PARAMS)
def test_this_pods_own_changes_plan_as_from_scratch(job, opts):
    """This pod's own changes (its IP, its phase, its slots, its node, leaving its job) are carried over when it
    keeps its scope and identity, else planned from scratch: the plan is always the one made from scratch."""
    for first, then in [(a, b) for a in ("ip", "no-ip", "running", "pending", "failed", "slots", "node",
                                         "terminating", "other-job") for b in ("ip", "running", "pending")]:
        world = World(JOBS[job](), random.Random(0))
        _check(world, OPTIONS[opts], [first, then], target=world.me)


def test_this_pods_phase_and_ip_keep_the_layout():
    world = World(examples.volcano_job(tasks=(("master", 1), ("worker", 63))), random.Random(3))
    planner = _check(world, OPTIONS["ip"], ["ip", "running", "pending", "ip"], target=world.me)
    assert planner.incremental == 4


@pytest.mark.parametrize("opts", ["default", "ip", "topology", "c10d"])
def test_single_pod_changes_are_incremental(opts):
    """The point of the planner: a new IP, a leave and a join are planned from the last layout (in topology
    order only a change that keeps the pod's place is; in c10d's a new IP moves the pod to its address's place)."""
    world = World(examples.volcano_job(tasks=(("master", 1), ("worker", 63))), random.Random(7))
    ops = ["ip"] * 10 if opts == "topology" else ["ip", "leave", "join", "ip", "leave", "join", "ip", "ip"]
    planner = _check(world, OPTIONS[opts], ops)
    assert planner.incremental == len(ops)


def test_a_leave_in_topology_order_is_carried_over_and_reorders_the_domains_it_led():
    """Topology order puts domains in the order of their first member (index order): a member that leaves
    without being the first of a domain that holds others leaves the rest in their order; the first of a
    sub-block with others hands the sub-block's place to its next member, which can move it among its siblings.
    Both are carried over from the kept layout, only the second reorders; both plans are build_plan's."""
    def world_and_targets() -> tuple[World, str, str]:
        world = World(examples.volcano_job(tasks=(("master", 1), ("worker", 63))), random.Random(7))
        sub = {name: (k % 2, k % 3) for k, name in enumerate(world.all)}  # node-k's block and sub-block (World)
        present = [name for name in world.all if name in world.pods and name != world.me]
        last = present[-1]
        firsts = [next(n for n in world.all if n in world.pods and sub[n] == s) for s in set(sub.values())]
        first = next(n for n in firsts if n != world.me and sum(sub[m] == sub[n] for m in world.pods) > 1)
        return world, last, first

    world, last, first = world_and_targets()
    planner = _check(world, OPTIONS["topology"], ["ip", "leave"], target=last)
    assert (planner.incremental, planner.reordered) == (2, 0)
    world, last, first = world_and_targets()
    planner = _check(world, OPTIONS["topology"], ["ip", "leave"], target=first)
    assert (planner.incremental, planner.reordered) == (2, 1)


@pytest.mark.parametrize("packed", [False, True], ids=["own-node", "shared-node"])
def test_a_join_in_topology_order_is_carried_over_and_reorders_the_domains_it_leads(packed):
    """A member that joins after the first member (index order) of the deepest domain it shares with others takes
    its place in that domain (among the members of its node, or as a new node among its siblings); one that
    would be the first of a domain that holds others moves that domain among its siblings. Both are carried over
    from the kept layout, only the second reorders; both plans are build_plan's. ``packed``: each pod that joins
    runs on the node of a pod already there."""
    names = list(World(examples.volcano_job(tasks=(("master", 1), ("worker", 63))), random.Random(7)).all)
    present = World(examples.volcano_job(tasks=(("master", 1), ("worker", 63))), random.Random(7)).pods
    hosts = sorted(present, key=names.index)[1::3]  # the pods whose nodes the joining ones share when packed

    def world(name: str) -> World:
        made = World(examples.volcano_job(tasks=(("master", 1), ("worker", 63))), random.Random(7))
        if packed:
            made.all[name]["spec"]["nodeName"] = made.all[host_of[name]]["spec"]["nodeName"]
        return made

    joining = [n for n in names if n not in present]
    host_of = {name: hosts[k % len(hosts)] for k, name in enumerate(joining)}
    node = {name: host_of[name] if packed and name in host_of else name for name in names}
    path = {name: (names.index(node[name]) % 2, names.index(node[name]) % 3, node[name]) for name in names}
    carried = {}
    for name in joining:
        for depth in (3, 2, 1):
            shared = [names.index(m) for m in present if path[m][:depth] == path[name][:depth]]
            if shared:
                carried[name] = min(shared) < names.index(name)
                break
    assert set(carried.values()) == {True, False}
    for name, kept in carried.items():
        planner = _check(world(name), OPTIONS["topology"], ["ip", "join"], target=name)
        assert (planner.incremental, planner.reordered) == (2, 0 if kept else 1), name


@pytest.mark.slow
@pytest.mark.parametrize("opts", ["default", "ip"])
def test_a_burst_under_a_quarter_of_a_large_job_is_carried_over(opts):
    """A journal entry gathers the kubelet's writes of ~80 pods at once while a 16384-pod job starts: each made a
    full-view pod lay the job out from scratch (over 64 changes). A burst of up to a quarter of the job is
    carried over, and the plan is still the one made from scratch."""
    world = World(examples.volcano_job(tasks=(("master", 1), ("worker", 2047))), random.Random(11))
    planner = Planner(OPTIONS[opts], world.me)
    planner.plan(dict(world.pods))
    layout = planner._layout
    for burst in (120, 120, 400):
        for _ in range(burst):
            world.step(world.rnd.choice(("ip", "leave", "join", "running", "pending")))
        held = dict(world.pods)
        got = _outcome(lambda: planner.plan(held))  # noqa: B023 - called at once
        assert got == _outcome(lambda: build_plan(list(held.values()), world.me, OPTIONS[opts]))  # noqa: B023
    assert planner._layout is layout and planner.incremental == 3


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



@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("opts", ["default", "ip"])
def test_members_between_changes_are_carried_over_with_their_ranks_moved(job, opts, monkeypatch):
    """A leave and a join re-place the members after the first of them; those whose pods did not change are
    carried over (their node ranks, ranks and ordinals moved by what changed before them), and only the pods
    that changed, and the member after each one that left, are placed one by one from their facts."""
    from agent.core.plan.layout import _Census, _place_each

    world, options = World(JOBS[job](), random.Random(0)), OPTIONS[opts]
    world.pods = dict(world.all)
    order = [m.name for m in build_plan(list(world.pods.values()), world.me, options).topology.members]
    world.me = order[0]
    early, late = order[len(order) // 3], order[2 * len(order) // 3]
    one_by_one: list[int] = []
    real = _place_each

    def counting(layout, start, stop, *args):
        one_by_one.append(stop - start)
        return real(layout, start, stop, *args)

    planner = Planner(options, world.me)
    planner.plan(dict(world.pods))
    monkeypatch.setattr("agent.core.plan.layout._place_each", counting)
    steps = [("leave", early, None), ("join", early, late), ("join", late, early), ("ip", early, None),
             ("join", early, order[-1])]
    for op, name, away in steps:
        one_by_one.clear()
        world.step(op, name)
        if away is not None:
            del world.pods[away]
        held = dict(world.pods)
        got = planner.plan(held)
        assert sum(one_by_one) <= 2, f"after {op} {name}: {one_by_one} placed one by one"
        assert got == build_plan(list(held.values()), world.me, options), f"after {op} {name}"
        _same_views(got)
        layout = planner._layout
        kept, counted = layout.census, _Census(layout.rows.live, layout.rule.position)  # kept == counted
        assert (kept.claims, kept.derived, kept.training) == (counted.claims, counted.derived, counted.training)
        assert {r: n for r, n in kept.role_count.items() if n} == counted.role_count
    assert planner.incremental == len(steps)

def _bare(world: World, names) -> None:
    """These pods as created, before the kubelet reports their IPs (init's wait starts with most of them so)."""
    for name in names:
        pod = world._new(name)
        pod["status"].pop("podIP", None)
        pod["status"].pop("podIPs", None)
        world.pods[name] = world.all[name] = pod


def _touched(before, after):
    return [n for n in sorted(before.keys() | after.keys()) if before.get(n) is not after.get(n)]


@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("opts", OPTION_PARAMS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), steps=st.lists(st.tuples(st.sampled_from((*OPS, "ip", "ip")),
                                                                 st.sampled_from(("follow", "told", "plan"))),
                                                       min_size=1, max_size=25))
def test_a_plan_after_following_the_gathering_pods_equals_planning_from_scratch(job, opts, seed, steps):
    """init's wait: ``follow`` after each change (told which pods changed, or not), some pods without their IP
    yet; a ``plan`` at any point, and at the end, is ``build_plan``'s over the same pods."""
    world, options = World(JOBS[job](), random.Random(seed)), OPTIONS[opts]
    _bare(world, [n for n in world.others() if world.rnd.random() < 0.5])
    planner = Planner(options, world.me)
    held = dict(world.pods)
    planner.follow(held)
    for op, how in [*steps, ("ip", "plan")]:
        before = held
        world.step(op)
        held, nodes = dict(world.pods), world.nodes
        if how != "plan":
            planner.follow(held, _touched(before, held) if how == "told" else None)
            continue
        got = _outcome(lambda: planner.plan(held, nodes=nodes))  # noqa: B023
        want = _outcome(lambda: build_plan(list(held.values()), world.me, options, nodes=nodes))  # noqa: B023
        assert got == want, f"after {op}"
        _same_views(got)


def test_following_a_job_whose_ips_arrive_one_by_one_re_places_one_member_per_ip(monkeypatch):
    """The point of ``follow``: the leader's init carries its layout through the wait, each new IP re-placing
    its own member only, so that the plan once the last IP is in is one change away."""
    from agent.core.plan.layout import _place

    world = World(examples.volcano_job(tasks=(("master", 1), ("worker", 63), ("extras", 2))), random.Random(3))
    world.pods, world.me = dict(world.all), "demo-master-0"
    _bare(world, world.others())
    options = OPTIONS["ip"]
    planner = Planner(options, world.me)
    placed: list[int] = []
    real_place = _place

    def counting(layout, start, stop, *args, **kwargs):
        placed.append(stop - start)
        return real_place(layout, start, stop, *args, **kwargs)

    for module in ("layout", "planner"):  # the layouts from scratch, and the planner's changes
        monkeypatch.setattr(f"agent.core.plan.{module}._place", counting)
    held = dict(world.pods)
    planner.follow(held)  # the LIST: every pod but this one without an IP
    assert placed == [66]
    per_ip = {}
    for name in world.others():
        placed.clear()
        before = held
        world.step("ip", name)
        held = dict(world.pods)
        planner.follow(held, _touched(before, held))
        per_ip[name] = sum(placed)
    assert planner.followed == 65
    # A worker's IP re-places its own member, not the members after it; a pod that does not train joins the
    # host lists with its IP, after every training pod: it re-places the few after it.
    assert {n: k for n, k in per_ip.items() if "worker" in n} == {f"demo-worker-{i}": 1 for i in range(63)}
    assert per_ip["demo-extras-0"] == 2 and per_ip["demo-extras-1"] <= 2
    plan = planner.plan(held)
    assert planner.incremental == 1
    assert plan == build_plan(list(held.values()), world.me, options)


def test_a_layout_from_scratch_is_made_once_the_old_one_is_let_go(monkeypatch):
    """Both layouts were held while the new one was made (the caller's frame held the old one): ~9 MB more at the
    publisher's peak of a 16384-pod job, whose kubelet writes come in bursts of a quarter of the job."""
    import weakref

    from agent.core.plan.layout import _lay_out

    for follow in (False, True):
        world = World(examples.volcano_job(tasks=(("master", 1), ("worker", 7))), random.Random(3))
        world.pods, world.me = dict(world.all), "demo-master-0"
        planner = Planner(OPTIONS["ip"], world.me)
        planner.follow(dict(world.pods)) if follow else planner.plan(dict(world.pods))
        assert planner._layout is not None
        old = weakref.ref(planner._layout)
        held_when_made: list[bool] = []
        real = _lay_out
        monkeypatch.setattr("agent.core.plan.planner._lay_out", lambda *a, **k: held_when_made.append(old() is not None)  # noqa: B023
                            or real(*a, **k))  # noqa: B023
        world.step("clone", "demo-worker-4")  # two pods claim one index: only a layout from scratch says so
        held = dict(world.pods)
        if follow:
            planner.follow(held)
        else:
            assert _outcome(lambda: planner.plan(held)).startswith("refused: ")  # noqa: B023
        assert held_when_made == [False]
        monkeypatch.undo()


def test_following_pods_that_make_no_plan_lays_out_from_scratch_at_most_once_per_sixteenth_of_the_job():
    """Two pods that claim one index refuse every layout: ``follow`` retries from scratch only now and then (its
    cost stays linear in the events), and ``plan`` still refuses with the line ``build_plan`` gives."""
    from agent.core.plan import planner as planning

    world = World(examples.volcano_job(tasks=(("master", 1), ("worker", 63))), random.Random(5))
    world.pods, world.me = dict(world.all), "demo-master-0"
    world.step("clone", "demo-worker-4")
    options = OPTIONS["ip"]
    planner = Planner(options, world.me)
    made = []
    real = planning._lay_out
    planning._lay_out = lambda *a, **k: made.append(1) or real(*a, **k)
    try:
        held = dict(world.pods)
        planner.follow(held)
        for _ in range(64):
            before = held
            world.step("ip", "demo-worker-9")
            held = dict(world.pods)
            planner.follow(held, _touched(before, held))
        assert planner.followed == 0
        every = -(-len(held) // planning.FOLLOW_SCRATCH)  # 65 pods: one layout per 5 calls
        assert len(made) == 1 + 64 // every  # the first call's, then one per 5 calls
        want = _outcome(lambda: build_plan(list(held.values()), world.me, options))
        assert want.startswith("refused: ") and _outcome(lambda: planner.plan(held)) == want
    finally:
        planning._lay_out = real


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
    the bytes ``render_pod`` writes from scratch, which encodes members 1024 at a time; and topology.json
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


def test_a_kept_layout_lets_go_of_a_pods_earlier_version():
    """The layout kept between changes held every pod's first version after the pod changed (the leader's init
    at 16384 pods: ~1 KB per event, 15-20 MB more by the last IP; the sidecar's planner alike)."""
    import weakref

    class Pod(dict):  # a pod object that can be referred to weakly (checked=True: no exact-type check)
        pass

    world = World(examples.volcano_job(tasks=(("master", 1), ("worker", 7))), random.Random(1))
    for follow in (False, True):
        held = dict(world.all)
        held["demo-worker-3"] = Pod(copy.deepcopy(world.all["demo-worker-3"]))
        first = weakref.ref(held["demo-worker-3"])
        planner = Planner(OPTIONS["ip"], "demo-master-0", checked=True)
        planner.follow(held) if follow else planner.plan(held)
        held["demo-worker-3"] = Pod(copy.deepcopy(held["demo-worker-3"]))
        held["demo-worker-3"]["metadata"]["resourceVersion"] = "99999"
        planner.follow(held, ["demo-worker-3"]) if follow else planner.plan(held)
        assert (planner.followed if follow else planner.incremental) == 1
        assert first() is None, "the layout still holds the pod's first version"


def test_the_memo_lets_go_of_a_pods_earlier_facts_once_it_holds_the_new_ones():
    """One version per pod: between two computations (init's wait, where the planner lays out once and then
    follows), a pod's new facts replace those of its earlier version at once, not at the next computation."""
    from agent.core.plan.facts import Memo, PodFacts

    freed: list[str] = []

    class Facts(PodFacts):  # says when it is freed (a NamedTuple takes no weak reference)
        __slots__ = ()

        def __del__(self) -> None:
            freed.append(self.version)

    def facts(version):
        return Facts(name="a", namespace="default", job=None, reason=None, ident=None, error=None, version=version)

    memo = Memo(Options())
    v1 = {"metadata": {"name": "a", "resourceVersion": "1"}}
    v2 = {"metadata": {"name": "a", "resourceVersion": "2"}}
    memo.begin()
    assert memo.key(v1) == ("a", "1") and memo.lookup(("a", "1")) is None
    first = facts("1")
    memo.store(first)
    memo.end()  # a computation over the pods (a layout from scratch) ends: its facts are the ones held
    assert memo.lookup(("a", "1")) is first
    del first
    assert memo.lookup(memo.key(v2)) is None
    second = memo.store(facts("2"))
    assert freed == ["1"]
    assert memo.lookup(("a", "2")) is second and memo.lookup(("a", "1")) is None


def test_a_relist_after_a_long_followed_wait_is_laid_out_again_at_once():
    """The budget counts every call since the last layout from scratch: after a wait carried over event by event,
    a LIST again (a watch that expired: every pod a new object) is laid out at once, not 1/16 of the job later."""
    world = World(examples.volcano_job(tasks=(("master", 1), ("worker", 64))), random.Random(2))
    world.pods, world.me = dict(world.all), "demo-master-0"
    _bare(world, world.others())
    planner = Planner(OPTIONS["ip"], world.me)
    held = dict(world.pods)
    planner.follow(held)
    for name in world.others()[:10]:
        before = held
        world.step("ip", name)
        held = dict(world.pods)
        planner.follow(held, _touched(before, held))
    assert planner.followed == 10
    relisted = {name: copy.deepcopy(pod) for name, pod in held.items()}
    planner.follow(relisted)  # 65 new objects: too many to carry over
    assert planner._layout is not None and planner._layout.pods["demo-worker-0"] is relisted["demo-worker-0"]
    assert planner.followed == 10  # laid out again, not carried over


def test_a_role_whose_pods_mix_both_kinds_of_ordinal_is_placed_member_by_member(monkeypatch):
    """No controller mixes them, but the carry-over does not assume it: where some of a role's pods take their
    ordinal from their identity and others from their place in the role, that run is placed from the facts,
    and the plans still equal ``build_plan``'s (the odd workers here count their place)."""
    from agent.core.controllers.volcano import Volcano
    from agent.core.plan.layout import _place_each

    real_identify = Volcano.identify

    def mixed(self, pod, options):
        ident = real_identify(self, pod, options)
        return ident._replace(ordinal=-1) if ident.role == "worker" and ident.index[0] % 2 else ident

    monkeypatch.setattr(Volcano, "identify", mixed)
    world = World(examples.volcano_job(tasks=(("master", 1), ("worker", 12))), random.Random(4))
    world.pods, world.me = dict(world.all), "demo-master-0"
    planner = Planner(OPTIONS["default"], world.me)
    planner.plan(dict(world.pods))
    one_by_one: list[int] = []
    real = _place_each
    monkeypatch.setattr("agent.core.plan.layout._place_each",
                        lambda lay, start, stop, *a: one_by_one.append(stop - start) or real(lay, start, stop, *a))
    for op, name in (("leave", "demo-worker-3"), ("leave", "demo-worker-6"), ("join", "demo-worker-3")):
        one_by_one.clear()
        world.step(op, name)
        held = dict(world.pods)
        got = planner.plan(held)
        assert sum(one_by_one) > 2, f"after {op} {name}: the mixed run was carried over"
        assert got == build_plan(list(held.values()), world.me, OPTIONS["default"]), f"after {op} {name}"
        workers = got.topology.role_members("worker")
        assert any(m.ordinal != m.index[0] for m in workers) and any(m.ordinal == m.index[0] for m in workers)
    assert planner.incremental == 3


@pytest.mark.parametrize("address", ["dns", "ip"])
def test_a_pods_next_version_shares_the_facts_it_repeats_with_the_earlier_ones(address):
    """A pod that holds every member holds every pod's facts for its life, and its plan keeps the objects of the
    versions it was laid out from: the kubelet's writes (the phase, the readiness) change neither who a pod is,
    nor where its peers reach it, nor how many processes it runs, and those are the earlier version's objects,
    not a copy per version. What changed is the new version's."""
    from agent.core.controllers import detect_controller
    from agent.core.plan.facts import Memo, facts_of
    from agent.core.publication.published import Compactor

    options = Options(address=address)
    pod = examples.volcano_job(tasks=(("master", 1), ("worker", 3)))[2]
    pod["metadata"]["resourceVersion"] = "10"
    pod["status"] = {"phase": "Pending", "podIP": "10.0.0.7"}
    compactor, memo = Compactor(options), Memo(options)
    controller = detect_controller(pod, options)
    first = facts_of(compactor.pod(pod), controller, options, None, memo, checked=True)
    running = copy.deepcopy(pod)
    running["metadata"]["resourceVersion"] = "11"
    running["status"]["phase"] = "Running"
    later = facts_of(compactor.pod(running), controller, options, None, memo, checked=True)
    assert later.version == "11" and later == first._replace(version="11")
    assert later.ident is first.ident and later.place is first.place and later.slots is first.slots
    moved = copy.deepcopy(running)
    moved["metadata"]["resourceVersion"] = "12"
    moved["status"]["podIP"] = "10.0.0.8"
    again = facts_of(compactor.pod(moved), controller, options, None, memo, checked=True)
    assert again.ident is first.ident and again.slots is first.slots
    assert again.place != first.place and again.place.ip == "10.0.0.8"  # the new IP's
    assert again.place.dns_name == first.place.dns_name


def _compact_job(workers: int):  # type: ignore[no-untyped-def]
    """A Volcano job's pods as a follower holds them (one container list per shape), each with a version."""
    from agent.core.publication.published import Compactor

    compactor = Compactor(Options())
    raw = examples.volcano_job(tasks=(("master", 1), ("worker", workers)))
    for k, pod in enumerate(raw):
        pod["metadata"]["resourceVersion"] = str(k + 1)
    return raw, compactor, {p["metadata"]["name"]: compactor.pod(p) for p in raw}


def _facts(planner, pod):  # type: ignore[no-untyped-def]
    return planner.memo.lookup(planner.memo.key(pod))


def test_pods_that_arrive_in_one_change_share_their_shapes_process_count():
    """The pods one change brings (a journal entry of the kubelet's writes: ~1500 pods at 16384) are counted
    once per container shape, as a layout's pass counts them: not one count and rule text per pod."""
    _, _, pods = _compact_job(9)
    arriving = ["demo-worker-7", "demo-worker-8"]
    held = {name: pod for name, pod in pods.items() if name not in arriving}
    planner = Planner(Options(), "demo-master-0", checked=True)
    planner.plan(held)
    planner.plan(pods, touched=arriving)
    assert planner.incremental == 1
    first, second = (_facts(planner, pods[name]) for name in arriving)
    assert first.slots == second.slots and first.slots is second.slots


def test_a_worker_that_comes_back_on_a_new_node_is_placed_without_planning_from_scratch():
    """Under the topology order the sidecar reads a new Node's labels just before it plans the pod that came
    on it: the Nodes only gained one no pod held runs on, so the layout stands and the pod joins its domain
    (from scratch: ~0.75 s at 16384 pods). Labels learned for a Node a held pod runs on place every pod anew."""
    world = World(examples.volcano_job(tasks=(("master", 1), ("worker", 20))), random.Random(4))
    options = OPTIONS["topology"]
    planner = Planner(options, world.me)
    planner.plan(dict(world.pods), nodes=world.nodes)
    joining = sorted(set(world.all) - set(world.pods), key=lambda n: int(n.rsplit("-", 1)[1]))[-1]
    world.all[joining]["spec"]["nodeName"] = "node-back"
    world.pods[joining] = world.all[joining]
    nodes = {**world.nodes, "node-back": {BLOCK: "b-1", SUBBLOCK: "sub-1"}}
    got = planner.plan(dict(world.pods), nodes=nodes)
    assert planner.incremental == 1
    assert got == build_plan(list(world.pods.values()), world.me, options, nodes=nodes)
    moved = world._new(world.others()[0])
    moved["spec"]["nodeName"] = "unknown-node"  # no labels: the job keeps index order
    world.pods[moved["metadata"]["name"]] = moved
    planner.plan(dict(world.pods), nodes=nodes)
    nodes = {**nodes, "unknown-node": {BLOCK: "b-0", SUBBLOCK: "sub-2"}}
    got = planner.plan(dict(world.pods), nodes=nodes)
    assert got == build_plan(list(world.pods.values()), world.me, options, nodes=nodes)
    assert got.topology.rank_order == "topology"
