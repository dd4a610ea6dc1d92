"""Where each pod landed and ``--rank-order topology``: one table over every controller, the level names, and
properties of the order (rank 0 kept, lower bound met at every level, a join moves only what it must).

Node label keys and what they name come from the providers' own documentation:
- ``topology.kubernetes.io/region``, ``/zone``: Kubernetes well-known labels
  (kubernetes.io/docs/reference/labels-annotations-taints).
- ``cloud.google.com/gce-topology-block``, ``-subblock``, ``-host``: GKE, "View the topology of GKE nodes"
  (block, sub-block and host of the VM; on A4X the sub-block is the NVL72 domain).
- ``topology.k8s.aws/network-node-layer-1`` .. ``-4``: EKS user guide, "Place distributed AI/ML workloads with
  network topology labels" (layer 1 the top of the hierarchy, 3 the bottom for most types, 4 on four-layer types).
- ``nvidia.com/gpu.clique``: NVIDIA GPU feature discovery, the multi-node NVLink clique of a GB200 node.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import examples
from agent.core import Options, render_pod
from agent.core.model import Processes
from agent.core.plan.layout import _domain_reader, build_plan
from agent.core.plan.rank import topology_order
from agent.core.pods.placement import (
    DEFAULT_LEVELS,
    domains_used,
    node_domains,
    parse_levels,
    ring_crossings,
)
from agent.core.publication.journal import PublishedState, Publisher
from agent.core.publication.published import decode, pack
from agent.errors import InputError
from tests.conftest import env_of

BLOCK, SUBBLOCK = "cloud.google.com/gce-topology-block", "cloud.google.com/gce-topology-subblock"
TOPO = Options(rank_order="topology", levels=DEFAULT_LEVELS)

JOBS = [
    ("volcano", examples.volcano_job),
    ("pytorchjob", examples.pytorchjob),
    ("trainjob", examples.trainjob),
    ("jobset", examples.jobset),
    ("lws", examples.leaderworkerset),
    ("indexed-job", examples.indexed_job),
    ("mpijob", examples.mpijob),
    ("trainjob-mpi", examples.trainjob_mpi),
]


def _bigger(build):
    """Jobs of 8 training pods or more where the builder takes a size (more hops for the order to fix)."""
    for size in ("workers", "num_nodes", "completions"):
        try:
            return build(**{size: 8})
        except TypeError:
            continue
    return build()


def interleaved(pods, me=None):
    """Each training pod on its own node, racks (sub-blocks) alternating in index order: the worst case for
    index order, every ring hop crosses racks. Returns (pods with spec.nodeName, node labels, index order)."""
    me = me or pods[-1]["metadata"]["name"]
    index_order = [m.name for m in render_pod(pods, me, Options()).plan.topology.members]
    nodes = {}
    for k, name in enumerate(index_order):
        pod = next(p for p in pods if p["metadata"]["name"] == name)
        node = f"gke-node-{k}"
        pod["spec"]["nodeName"] = node
        nodes[node] = {BLOCK: "block-a", SUBBLOCK: f"sub-{k % 2}", "kubernetes.io/hostname": node}
    return pods, nodes, index_order


@pytest.mark.parametrize(("key", "build"), JOBS, ids=[j[0] for j in JOBS])
def test_topology_order_per_controller(key, build):
    pods, nodes, index_order = interleaved(_bigger(build))
    names = index_order  # every member (a finished initializer pod is none)
    plain = {n: render_pod(pods, n, Options(levels=DEFAULT_LEVELS), nodes=nodes) for n in names}
    ordered = {n: render_pod(pods, n, TOPO, nodes=nodes) for n in names}
    any_pod = ordered[names[0]].plan.topology
    training = list(any_pod.training)
    assert len(training) >= 2
    # rank 0 is the pod the controller made rank 0, so MASTER_ADDR does not move
    assert training[0].name == plain[names[0]].plan.topology.training[0].name
    for n in names:
        if ordered[n].plan.topology.me.training:
            assert env_of(ordered[n])["MASTER_ADDR"] == env_of(plain[n])["MASTER_ADDR"]
    # the pods of each sub-block are contiguous (one crossing each way around the ring), index order within
    racks = [nodes[m.node][SUBBLOCK] for m in training]
    assert racks == sorted(racks, key=lambda r: racks.index(r))
    paths = [(nodes[m.node][BLOCK], nodes[m.node][SUBBLOCK], m.node) for m in training]
    assert ring_crossings(paths, 2) == domains_used(paths, 2) == 2
    for rack in set(racks):
        inside = [m.name for m in training if nodes[m.node][SUBBLOCK] == rack]
        assert inside == [n for n in index_order if n in inside]
    # ranks stay dense and every pod agrees on them
    assert [m.node_rank for m in training] == list(range(len(training)))
    keys = {json.dumps([(m.name, m.node_rank, m.first_rank) for m in r.plan.topology.members]) for r in
            ordered.values()}
    assert len(keys) == 1
    # each pod is told where it landed
    for n in names:
        env, me = env_of(ordered[n]), ordered[n].plan.topology.me
        assert env["TOPOLOGY_NODE"] == me.node
        assert env["TOPOLOGY_BLOCK"] == "block-a" and env["TOPOLOGY_SUBBLOCK"] == nodes[me.node][SUBBLOCK]
        assert env["TOPOLOGY_ZONE"] == "" and env["TOPOLOGY_RANK_ORDER"] == "topology"
        assert env["TOPOLOGY_LEVELS"].split(",")[:4] == ["region", "zone", "block", "subblock"]


@pytest.mark.parametrize(("key", "build"), JOBS, ids=[j[0] for j in JOBS])
def test_volcano_host_lists_stay_in_index_order_under_topology_order(key, build):
    """Volcano's svc plugin lists a task's hosts by index (VC_<TASK>_HOSTS and <task>.host), and Volcano-era
    scripts find themselves in them at VC_TASK_INDEX; the rank order is the agent's NODE_RANK and hostfile."""
    pods, nodes, _ = interleaved(_bigger(build))
    names = [m.name for m in render_pod(pods, pods[-1]["metadata"]["name"], TOPO, nodes=nodes).plan.topology.members]
    moved = False
    for name in names:
        rendered = render_pod(pods, name, TOPO, nodes=nodes)
        topo, env = rendered.plan.topology, env_of(rendered)
        assert topo.rank_order == "topology"
        for role in topo.roles:
            by_index = [m.address for m in sorted(topo.role_members(role), key=lambda m: (m.ordinal, m.index))]
            in_rank_order = [m.address for m in topo.role_members(role)]
            moved |= by_index != in_rank_order
            assert env[f"VC_{role.upper().replace('-', '_')}_HOSTS"].split(",") == by_index, (name, role)
            assert rendered.files[f"{role.replace('-', '_')}.host"].decode().splitlines() == by_index
        if key != "lws":  # LWS numbers its workers from 1 (the leader is 0, a role of its own)
            assert env[f"VC_{topo.me.role.upper().replace('-', '_')}_HOSTS"].split(",")[int(env["VC_TASK_INDEX"])] \
                == topo.me.address
        hostfile = [line.split()[0] for line in rendered.files["hostfile"].decode().splitlines()]
        assert hostfile == [m.address for m in topo.training]  # the rank order lives in the agent's own files
    # topology order moved some role's pods out of index order; JobSet's pods have no index within their
    # replicated job but their place in the rank order (VC_TASK_INDEX too), so their lists follow it
    assert moved == (key not in {"jobset", "trainjob", "trainjob-mpi"})


def test_volcano_host_lists_name_the_index_order_of_the_controller():
    pods, nodes, index_order = interleaved(examples.volcano_job(tasks=(("master", 1), ("worker", 5))))
    rendered = render_pod(pods, "demo-worker-4", TOPO, nodes=nodes)
    env = env_of(rendered)
    ranked = [m.name for m in rendered.plan.topology.training]
    assert ranked != index_order and ranked[0] == "demo-master-0"
    assert env["VC_WORKER_HOSTS"] == ",".join(f"demo-worker-{i}.demo" for i in range(5))
    assert rendered.files["worker.host"].decode() == "".join(f"demo-worker-{i}.demo\n" for i in range(5))
    assert env["VC_TASK_INDEX"] == "4" and env["NODE_RANK"] == str(ranked.index("demo-worker-4"))
    source = next(v.source for v in rendered.variables if v.name == "VC_WORKER_HOSTS")
    assert "index order" in source and "VC_TASK_INDEX indexes it" in source


@pytest.mark.parametrize(("key", "build"), JOBS, ids=[j[0] for j in JOBS])
def test_the_published_rows_carry_the_node_labels_and_render_the_same_files(key, build):
    pods, nodes, _ = interleaved(_bigger(build))
    for i, pod in enumerate(pods):
        pod["metadata"]["resourceVersion"] = str(100 + i)
    me = pods[-1]["metadata"]["name"]
    publisher = Publisher(PublishedState(job="job", namespace="default"), TOPO, leader=pods[0]["metadata"]["name"])
    publisher.change({p["metadata"]["name"]: p for p in pods}, [p["metadata"]["name"] for p in pods], nodes)
    state = PublishedState.from_document(decode(pack(publisher.snapshot_document())))
    compact = [next(p for p in pods if p["metadata"]["name"] == me) if n == me else p for n, p in state.pods.items()]
    wanted = {node: {k: v for k, v in labels.items() if k in {lv.label for lv in DEFAULT_LEVELS}}
              for node, labels in nodes.items()}
    assert state.node_labels() == wanted  # only the levels' labels travel
    assert render_pod(compact, me, TOPO, nodes=state.node_labels()).files == \
        render_pod(pods, me, TOPO, nodes=nodes).files


def test_a_pod_whose_node_labels_are_unknown_keeps_index_order_and_says_why():
    pods, nodes, index_order = interleaved(examples.volcano_job(tasks=(("master", 1), ("worker", 5))))
    del nodes["gke-node-3"]  # e.g. Nodes cannot be read (no RBAC), or the node is gone
    rendered = render_pod(pods, "demo-worker-0", TOPO, nodes=nodes)
    topo = rendered.plan.topology
    assert [m.name for m in topo.training] == index_order
    assert topo.rank_order == "index" and "node 'gke-node-3' whose labels are unknown" in topo.order_note
    env = env_of(rendered)
    assert env["TOPOLOGY_RANK_ORDER"] == "index" and env["TOPOLOGY_SUBBLOCK"] == "sub-1"
    me = render_pod(pods, index_order[3], TOPO, nodes=nodes)
    assert "TOPOLOGY_SUBBLOCK" not in env_of(me) and env_of(me)["TOPOLOGY_NODE"] == "gke-node-3"


class _MadeOnRead(Mapping):
    """Node labels whose every read makes a new dict (a lazy mapping): no labels object outlives its read."""

    def __init__(self, nodes: dict) -> None:
        self.nodes = nodes

    def __getitem__(self, key):  # type: ignore[no-untyped-def]
        return dict(self.nodes[key])

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)


def test_each_node_gets_its_own_domains_whether_its_labels_object_is_shared_or_made_on_each_read():
    """A plan reads each distinct labels object once (Nodes of one rack share one, kept by its id): each Node
    still gets its own domains, with its rack's object or with a labels object made at each read (the reader holds
    each object it keeps an id of, so no later one takes that id)."""
    pods, nodes, _ = interleaved(examples.volcano_job(tasks=(("master", 1), ("worker", 11))))
    want = [(m.name, m.domains) for m in render_pod(pods, "demo-worker-0", TOPO, nodes=nodes).plan.topology.members]
    shared: dict = {}  # the levels' labels, one object per rack (as runtime/nodes.py keeps them)
    by_object = {name: shared.setdefault((labels[BLOCK], labels[SUBBLOCK]), {BLOCK: labels[BLOCK],
                                                                             SUBBLOCK: labels[SUBBLOCK]})
                 for name, labels in nodes.items()}
    assert len({id(v) for v in by_object.values()}) == 2 < len(by_object)
    plan = render_pod(pods, "demo-worker-0", TOPO, nodes=by_object).plan
    assert [(m.name, m.domains) for m in plan.topology.members] == want
    for labelled in (by_object, _MadeOnRead(nodes)):  # the reader a plan makes, as the planner calls it
        read = _domain_reader(TOPO, labelled)
        assert [read(node) for node in nodes] == [node_domains(n, labels, DEFAULT_LEVELS)
                                                  for n, labels in nodes.items()]


def test_without_levels_nothing_changes():
    pods, nodes, _ = interleaved(examples.volcano_job())
    before = render_pod(examples.volcano_job(), "demo-worker-0", Options()).files
    after = render_pod(pods, "demo-worker-0", Options(), nodes=nodes)
    assert not [k for k in env_of(after) if k.startswith("TOPOLOGY_") and k not in
                ("TOPOLOGY_ROLE", "TOPOLOGY_TRAINING", "TOPOLOGY_GENERATION")]
    assert after.files["torch.env"] == before["torch.env"] and after.files["hostfile"] == before["hostfile"]


def test_topology_json_lists_every_members_domains():
    pods, nodes, _ = interleaved(examples.volcano_job(tasks=(("master", 1), ("worker", 3))))
    document = json.loads(render_pod(pods, "demo-worker-0", TOPO, nodes=nodes).files["topology.json"])
    assert document["topology"]["rankOrder"] == "topology"
    assert {"name": "subblock", "label": SUBBLOCK} in document["topology"]["levels"]
    for member in document["members"]:
        assert member["domains"]["subblock"] == nodes[member["node"]][SUBBLOCK]
        assert member["domains"]["gpu_clique"] == ""


def test_hostile_label_values_are_refused_in_one_line():
    pods, nodes, _ = interleaved(examples.volcano_job(tasks=(("master", 1), ("worker", 1))))
    nodes["gke-node-1"][SUBBLOCK] = "x'; rm -rf / #"
    with pytest.raises(InputError, match=re.escape(f"node 'gke-node-1': label '{SUBBLOCK}' value")):
        render_pod(pods, "demo-worker-0", TOPO, nodes=nodes)
    pods[0]["spec"]["nodeName"] = "Node With Spaces"
    with pytest.raises(InputError, match=re.escape("spec.nodeName")):
        render_pod(pods, "demo-worker-0", TOPO, nodes=nodes)


LEVELS = [
    ("default", [lv.label for lv in DEFAULT_LEVELS], None),
    ("topology.kubernetes.io/zone,example.com/rack", ["topology.kubernetes.io/zone", "example.com/rack"],
     ["ZONE", "RACK"]),
    ("nvidia.com/gpu.clique, kubernetes.io/hostname", ["nvidia.com/gpu.clique", "kubernetes.io/hostname"],
     ["GPU_CLIQUE", "HOSTNAME"]),
    ("topology.k8s.aws/network-node-layer-1,topology.k8s.aws/network-node-layer-3",
     ["topology.k8s.aws/network-node-layer-1", "topology.k8s.aws/network-node-layer-3"],
     ["NETWORK_LAYER_1", "NETWORK_LAYER_3"]),
    ("rack-id", ["rack-id"], ["RACK_ID"]),
]


@pytest.mark.parametrize(("text", "labels", "names"), LEVELS)
def test_level_names(text, labels, names):
    levels = parse_levels(text)
    assert [lv.label for lv in levels] == labels
    if names is not None:
        assert [lv.name for lv in levels] == names


@pytest.mark.parametrize(("text", "words"), [
    ("a.io/rack,b.io/rack", "would both be TOPOLOGY_RACK"),
    ("example.com/rank_order", "TOPOLOGY_RANK_ORDER, which the agent writes itself"),
    ("example.com/rack,example.com/rack", "listed twice"),
    ("bad key", "is not a label key"),
    ("-x", "is not a label key"),
    (" , ", "is empty"),
])
def test_bad_levels(text, words):
    with pytest.raises(InputError, match=words):
        parse_levels(text)


# Hierarchical paths: zone > block > rack > node, each value named after its parent, as real clusters are.
paths_strategy = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 3), st.integers(0, 5)).map(
        lambda t: (f"z{t[0]}", f"z{t[0]}b{t[1]}", f"z{t[0]}b{t[1]}r{t[2]}", f"z{t[0]}b{t[1]}r{t[2]}n{t[3]}")),
    min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(paths_strategy)
def test_the_order_meets_the_lower_bound_at_every_level_and_keeps_rank_0(paths):
    order = topology_order(paths)
    assert sorted(order) == list(range(len(paths))) and order[0] == 0
    ring = [paths[i] for i in order]
    for depth in range(1, 5):
        assert ring_crossings(ring, depth) == domains_used(ring, depth)
    assert topology_order(paths) == order  # deterministic


@settings(max_examples=300, deadline=None)
@given(paths_strategy, st.data())
def test_a_join_at_the_end_keeps_the_survivors_relative_order(paths, data):
    joiner = data.draw(st.sampled_from(paths)) if data.draw(st.booleans()) else ("zX", "zXb", "zXbr", "zXbrn")
    before = [paths[i] for i in topology_order(paths)]
    after_all = [*paths, joiner]
    after = [i for i in topology_order(after_all) if i < len(paths)]
    assert [paths[i] for i in after] == before
    # a joiner in a new domain goes last: no survivor moves at all
    if joiner[0] == "zX":
        assert topology_order(after_all)[-1] == len(paths)


def _order_by_definition(paths):
    """topology_order's definition, every level kept: each member's key is, level by level, the position of the
    first member of its domain there, then its own position."""
    first: dict = {}
    keys = [(*(first.setdefault(path[:depth], at) for depth in range(1, len(path) + 1)), at)
            for at, path in enumerate(paths)]
    return sorted(range(len(paths)), key=keys.__getitem__)


@settings(max_examples=300, deadline=None)
@given(paths_strategy, st.lists(st.integers(0, 4), max_size=4), st.booleans())
def test_levels_every_member_agrees_on_change_nothing_in_the_order(paths, constant_at, one_node):
    """The levels no Node has (most of the default levels: '' on every member) are left out of the passes;
    the order is the definition's, wherever such a level stands, and when only one level varies or none does."""
    for at in sorted(constant_at, reverse=True):
        paths = [(*p[:at], "", *p[at:]) for p in paths]
    if one_node:  # every member on one node of one domain but for one level, or none
        paths = [(*("" for _ in p[:-1]), p[-1] if len(paths) % 2 else "n") for p in paths]
    assert topology_order(paths) == _order_by_definition(paths)


def test_a_leave_keeps_the_survivors_relative_order_unless_it_led_its_domain():
    rng = random.Random(7)
    paths = [(f"r{rng.randrange(3)}", f"n{i}") for i in range(40)]
    before = topology_order(paths)
    firsts = {}
    for i, p in enumerate(paths):
        firsts.setdefault(p[0], i)
    # domains are ordered by their first member: a leaver that was not one moves nobody else's order
    for gone in [i for i in range(1, 40) if i not in firsts.values()]:
        survivors = [p for i, p in enumerate(paths) if i != gone]
        assert [survivors[i] for i in topology_order(survivors)] == [paths[i] for i in before if i != gone]


def _document(pods, nodes, **options):
    return json.loads(render_pod(pods, pods[0]["metadata"]["name"], Options(**options), nodes=nodes)
                      .files["topology.json"])


def test_trainer_groups_follow_the_domains_and_two_processes_per_pod():
    from agent.trainer import domain_groups

    pods, nodes, _ = interleaved(examples.volcano_job(tasks=(("master", 1), ("worker", 3))))
    document = _document(pods, nodes, rank_order="topology", levels=DEFAULT_LEVELS, processes=Processes(per_node=2))
    assert domain_groups(document, "subblock") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert domain_groups(document, "block") == [list(range(8))]
    assert domain_groups(document, "node") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # index order: racks interleave
    index = _document(pods, nodes, levels=DEFAULT_LEVELS, processes=Processes(per_node=2))
    assert domain_groups(index, "subblock") == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_trainer_mesh_refuses_uneven_domains_and_unknown_levels():
    from agent.trainer import World

    pods, nodes, _ = interleaved(examples.volcano_job(tasks=(("master", 1), ("worker", 2))))
    world = World(generation=1, env={}, document=_document(pods, nodes, rank_order="topology",
                                                            levels=DEFAULT_LEVELS))
    with pytest.raises(ValueError, match="different numbers of ranks"):
        world.mesh("subblock")
    with pytest.raises(ValueError, match=re.escape("level 'rack' is not in topology.json")):
        world.groups("rack")
    assert world.groups("subblock") == [[0, 1], [2]]


@pytest.mark.slow
def test_the_rank_order_bench_meets_the_lower_bound_and_draws_the_ring(tmp_path):
    """bench/rank_order.py exits non-zero when topology order misses the lower bound anywhere."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    picture = tmp_path / "ring.svg"
    run = subprocess.run([sys.executable, str(root / "bench" / "rank_order.py"), "--sizes", "16,64,256", "--seeds",
                          "2", "--svg", str(picture)], capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("| yes |") == 6 and "| NO |" not in run.stdout
    import xml.dom.minidom

    svg = xml.dom.minidom.parse(str(picture))
    assert len(svg.getElementsByTagName("circle")) >= 2 * 48


def test_the_members_of_one_domain_share_one_domains_tuple():
    """A plan holds one domains tuple per distinct set of domains, not one per node."""
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 15)))
    nodes = {f"node-{k}": {BLOCK: f"b-{k % 2}", SUBBLOCK: f"sub-{k % 2}"} for k in range(16)}
    for k, pod in enumerate(pods):
        pod["spec"]["nodeName"] = f"node-{k}"
    members = build_plan(pods, "demo-worker-0", TOPO, nodes=nodes).topology.members
    assert len({m.node for m in members}) == 16
    assert len({id(m.domains) for m in members}) == len({m.domains for m in members}) == 2
