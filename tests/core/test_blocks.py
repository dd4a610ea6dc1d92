"""The summary's topology form (core/publication/blocks.py): every pod's own view from the published summary, its own
Node's labels and its own block against its files from every pod and every Node.

Random placements (spread over the nodes, or packed into few domains), three levels of Node labels, several caps on
the blocks (so the leader cuts at each depth), and the planner property test's random changes (joins, leaves, new
IPs, process counts, moves between nodes): for each training pod, the variables and topology.json's job-wide
fields its own view writes are its full view's (the long host lists aside, which it does not write), and the
files are those a pod holding every member writes in its own view (``own_view``), byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import examples
from agent.core import Options, render_plan, render_pod
from agent.core.files.variables import env_key
from agent.core.plan.layout import build_plan
from agent.core.pods.placement import DEFAULT_LEVELS, Level, node_domains
from agent.core.publication import blocks as blocks_module
from agent.core.publication.blocks import (
    BLOCK_SCHEMA,
    BlockMaker,
    Made,
    block_digest,
    block_key,
    entries_text,
    part_selector,
    text_entries,
)
from agent.core.publication.summary import (
    light_plan,
    own_view,
    read_summary,
    summarize,
    summarize_with_blocks,
    summary_text,
)
from agent.errors import InputError
from tests.core.test_planner import World

LEVELS = (Level("topology.kubernetes.io/zone", "ZONE"), Level("example.com/block", "BLOCK"),
          Level("example.com/rack", "RACK"))
TOPOLOGY = Options(levels=LEVELS, rank_order="topology")
JOBS = {
    "volcano": lambda: examples.volcano_job(tasks=(("master", 1), ("worker", 23), ("extras", 2))),
    "pytorchjob": lambda: examples.pytorchjob(workers=20),
    "jobset": lambda: examples.jobset(rjobs=(("driver", 1, 1), ("workers", 4, 5))),  # two-part indices
    "indexed-job": lambda: examples.indexed_job(completions=20),
    "mpijob": lambda: examples.mpijob(workers=16),
}
OPS = ("ip", "no-ip", "leave", "join", "terminating", "failed", "running", "slots", "node", "self", "burst")


def _nodes(rnd: random.Random, count: int) -> dict[str, dict[str, str]]:
    """``count`` Nodes in 1-3 zones of 1-3 blocks of 1-4 racks (a rack label missing on some)."""
    zones, blocks, racks = rnd.randint(1, 3), rnd.randint(1, 3), rnd.randint(1, 4)
    nodes = {}
    for k in range(count):
        zone, block, rack = rnd.randrange(zones), rnd.randrange(blocks), rnd.randrange(racks)
        labels = {"topology.kubernetes.io/zone": f"zone-{zone}", "example.com/block": f"b{zone}-{block}"}
        if rnd.random() > 0.1:
            labels["example.com/rack"] = f"r{zone}-{block}-{rack}"
        nodes[f"node-{k}"] = labels
    return nodes


def _placed(make, seed: int, ops: list[str], *, packed: bool) -> tuple[list, dict[str, dict[str, str]]]:
    """A job's pods after random changes, on Nodes with labels: spread (each pod its own node, placed at random)
    or packed (a few nodes hold several pods each)."""
    rnd = random.Random(seed)
    world = World(make(), rnd)
    for op in ops:
        world.step(op)
    pods = list(world.pods.values())
    nodes = _nodes(rnd, len(world.all) + 4)
    names = sorted(nodes)
    if packed:
        names = names[:max(1, len(names) // 5)]
    for pod in pods:
        if pod["spec"].get("nodeName"):
            pod["spec"]["nodeName"] = rnd.choice(names)
    return pods, nodes


def _job_wide(rendered) -> dict:
    document = json.loads(rendered.files["topology.json"])
    return {key: document[key] for key in ("controller", "namespace", "job", "jobUid", "self", "trainingRoles",
                                           "masterAddr", "masterPort", "nnodes", "processes", "topology")}


def _written(rendered, withheld: set[str]) -> dict[str, str]:
    written = {v.name: v.value for v in rendered.variables if v.written}
    for role in withheld:
        for name in (f"VC_{env_key(role)}_HOSTS", f"VC_{env_key(role)}_HOSTS_FILE"):
            written.pop(name, None)
    return written


def _own_blocks(made: list[Made], snapshot: str, domains: tuple[str, ...]) -> dict[str, str]:
    """The blocks a pod of ``domains`` lists with the summary (``part_selector``), by their digests."""
    keys = part_selector(snapshot, domains).partition("(")[2].rstrip(")").split(",")
    return {b.digest: b.text for b in made if block_key(snapshot, b.values) in keys}


def _check_every_pod(pods: list, nodes: dict, options: Options) -> int:
    """Each training pod's own view from the summary, its Node and its block against its full view; the number
    compared (0 when the leader's plan makes no summary)."""
    compared = 0
    for pod in pods:
        name = pod["metadata"]["name"]
        try:
            full = render_pod(pods, name, options, nodes=nodes)
        except InputError:
            continue
        topo = full.plan.topology
        if not topo.me.training:
            continue
        raw, made = summarize_with_blocks(full.plan, seq=3, options=options)  # as the leader publishes it
        if raw is None:
            return 0
        assert (topo.rank_order == "topology") == bool(made)
        summary = read_summary(summary_text(raw))
        assert summary is not None and summary.layout is not None
        node = pod["spec"].get("nodeName") or ""
        domains = node_domains(node, nodes.get(node), options.levels or ()) if node else None
        assert domains == topo.me.domains
        if domains is None:  # the order was not applied for want of this pod's Node: the full view then
            with pytest.raises(InputError, match="own Node's labels are not known"):
                light_plan(summary, pod, options, domains=None)
            continue
        plan = light_plan(summary, pod, options, domains=domains, blocks=_own_blocks(made, "job-topology", domains))
        assert plan is not None, f"{name} is in the summary's blocks"
        light = render_plan(plan, options)
        assert light.plan.topology.me == topo.me
        withheld = {role for role, _, hosts in summary.roles if hosts is None}
        assert _written(light, withheld) == _written(full, withheld)
        assert _job_wide(light) == _job_wide(full)
        own, why = own_view(full.plan, dataclasses.replace(options, view="own"), ssh=False, published=True)
        assert own is not None and why == "", why
        assert render_plan(own, options).files == light.files
        compared += 1
    return compared


@pytest.mark.parametrize("job", sorted(JOBS))
# the leader cuts at the outermost level, one in between, the deepest; the fast lane: in between
@pytest.mark.parametrize("cap", [pytest.param(1, marks=pytest.mark.slow), 3, pytest.param(64, marks=pytest.mark.slow)])
@pytest.mark.parametrize("packed", [False, True], ids=["spread", "packed"])
@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # one cap per test
@given(seed=st.integers(0, 2**32 - 1), ops=st.lists(st.sampled_from(OPS), min_size=0, max_size=8))
def test_a_pods_own_view_from_its_block_is_its_full_view(job, cap, packed, seed, ops, monkeypatch):
    monkeypatch.setattr(blocks_module, "MAX_BLOCKS", cap)
    pods, nodes = _placed(JOBS[job], seed, ops, packed=packed)
    _check_every_pod(pods, nodes, TOPOLOGY)


@pytest.mark.slow
@pytest.mark.parametrize("job", sorted(JOBS))
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), ops=st.lists(st.sampled_from(OPS), min_size=0, max_size=8))
def test_a_pods_own_view_with_node_labels_in_index_order_is_its_full_view(job, seed, ops):
    pods, nodes = _placed(JOBS[job], seed, ops, packed=False)
    _check_every_pod(pods, nodes, Options(levels=LEVELS))


@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("packed", [False, True], ids=["spread", "packed"])
def test_every_training_pod_of_a_topology_ordered_job_is_compared(job, packed):
    """Not vacuous: with every pod scheduled on a labelled Node, the order applies and every training pod reads
    its place from its block."""
    pods, nodes = _placed(JOBS[job], 7, [], packed=packed)
    for k, pod in enumerate(pods):
        pod["spec"]["nodeName"] = sorted(nodes)[k % (4 if packed else len(nodes))]
    plans = [build_plan(pods, p["metadata"]["name"], TOPOLOGY, nodes=nodes) for p in pods]
    training = sum(plan.topology.me.training for plan in plans)
    assert plans[0].topology.rank_order == "topology" and training > 1
    assert _check_every_pod(pods, nodes, TOPOLOGY) == training


def _job(workers: int = 60, zones: int = 2, racks: int = 3) -> tuple[list, dict]:
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", workers)))
    rnd = random.Random(5)
    nodes = {f"node-{k}": {"topology.kubernetes.io/zone": f"z{k % zones}", "example.com/block": "b",
                           "example.com/rack": f"r{rnd.randrange(racks)}"} for k in range(workers + 1)}
    for k, pod in enumerate(pods):
        pod["spec"]["nodeName"] = f"node-{k}"
    return pods, nodes


def test_the_leader_cuts_at_the_deepest_level_of_few_domains():
    pods, nodes = _job()
    plan = build_plan(pods, "demo-master-0", TOPOLOGY, nodes=nodes)
    raw, made = summarize_with_blocks(plan, seq=1)
    assert raw is not None and [len(b.values) for b in made] == [3] * 6  # 2 zones x 1 block x 3 racks
    assert sum(b.count for b in made) == 61 and len(summary_text(raw)) < 1200
    assert sum(len(b.text) for b in made) < len(made) * 120 + 61 * 7  # a few bytes per member


def test_members_a_spreading_scheduler_placed_each_take_a_number_in_their_block():
    """Spread at random, most members are runs of one, each of the role, process count and prefix of the run
    before: written as the step from its index to the index before, a few bytes each, not a list."""
    pods, nodes = _job(workers=600, zones=1, racks=2)
    _, made = summarize_with_blocks(build_plan(pods, "demo-master-0", TOPOLOGY, nodes=nodes), seq=1)
    members = [m for block in made for m in json.loads(block.text)["members"]]
    ones = [m for m in members if isinstance(m, int) or len(m) == 2]  # runs of one member
    assert len(ones) > 100 and sum(isinstance(m, int) for m in ones) > 0.9 * len(ones)
    assert sum(len(b.text) for b in made) < len(made) * 120 + 601 * 5


@pytest.mark.parametrize("members, complaint", [
    ([3], "first member is a number"),
    ([[1, 5], -9], "index is -4"),
], ids=["first", "negative"])
def test_a_member_number_that_names_no_index_is_refused_in_one_line(members, complaint):
    raw, made, me, domains = _pair()
    entry = next(b for b in made if domains[:len(b.values)] == b.values)
    block = json.loads(entry.text)
    block["members"] = members
    text = json.dumps(block, separators=(",", ":"))
    _rename(raw, entry.digest, block_digest(text))
    summary = read_summary(summary_text(raw))
    with pytest.raises(InputError) as err:
        light_plan(summary, me, TOPOLOGY, domains=domains, blocks={block_digest(text): text})
    assert complaint in str(err.value) and "\n" not in str(err.value)


def test_a_summary_entry_leaves_off_one_process_per_member_and_names_its_block_in_eleven_characters():
    """Every pod reads the summary's blocks: a block of one process per member (a spreading scheduler's, one GPU
    process or one launcher per pod) says its member count alone, and its digest's 64 bits take 11 characters."""
    pods, nodes = _job()
    for pod in pods[:4]:  # two processes in each of the first pods: their blocks say so
        pod["spec"]["containers"][0]["env"].append({"name": "PET_NPROC_PER_NODE", "value": "2"})
    raw, made = summarize_with_blocks(build_plan(pods, "demo-master-0", TOPOLOGY, nodes=nodes), seq=1)
    assert raw is not None
    entries = text_entries(raw["topology"]["blocks"])
    assert {len(e) for e in entries} == {2, 3}  # both kinds here
    assert [len(e) for e in entries] == [2 if b.processes == b.count else 3 for b in made]
    assert all(len(e[-1]) == 11 and e[-1] == b.digest for e, b in zip(entries, made, strict=True))
    summary = read_summary(summary_text(raw))
    assert summary is not None and summary.layout is not None
    assert [(b.count, b.processes) for b in summary.layout.blocks] == [(b.count, b.processes) for b in made]


def test_too_many_domains_at_every_level_make_no_summary(monkeypatch):
    monkeypatch.setattr(blocks_module, "MAX_BLOCKS", 1)
    pods, nodes = _job()
    assert summarize(build_plan(pods, "demo-master-0", TOPOLOGY, nodes=nodes), seq=1) is None
    own, why = own_view(build_plan(pods, "demo-worker-3", TOPOLOGY, nodes=nodes),
                        dataclasses.replace(TOPOLOGY, view="own"), ssh=False, published=True)
    assert own is None and "domains" in why


@pytest.mark.parametrize("change", ["leave", "join"])
def test_a_member_joining_or_leaving_changes_only_its_own_blocks_text(change):
    """A block's text does not depend on the blocks before it: the leader rewrites one block and the summary
    for a member that joins or leaves, not every block after it."""
    pods, nodes = _job(workers=120, zones=2, racks=4)
    before = {b.values: b.text for b in summarize_with_blocks(
        build_plan(pods, "demo-master-0", TOPOLOGY, nodes=nodes), seq=1)[1]}
    if change == "leave":
        pods = [p for p in pods if p["metadata"]["name"] != "demo-worker-5"]
    else:
        extra = examples.volcano_job(tasks=(("master", 1), ("worker", 122)))[-1]
        extra["spec"]["nodeName"] = "node-3"  # a node of a domain the job holds
        pods = [*pods, extra]
    after = {b.values: b.text for b in summarize_with_blocks(
        build_plan(pods, "demo-master-0", TOPOLOGY, nodes=nodes), seq=2)[1]}
    assert len(before) == len(after) == 8 and before.keys() == after.keys()
    assert sum(before[values] != after[values] for values in before) == 1


def test_a_block_of_another_format_is_refused_not_misread():
    """A block of a format before (its own ``seen``, schema 1 and 2) under a summary that names its digest: refused
    (the pod reads the whole topology), never read as this format's."""
    raw, made, me, domains = _pair()
    entry = next(b for b in made if domains[:len(b.values)] == b.values)
    block = json.loads(entry.text)
    for schema in (1, 2):
        old = json.dumps({**block, "schema": schema, "seen": {"master": 1}}, separators=(",", ":"))
        named = json.loads(json.dumps(raw))
        _rename(named, entry.digest, block_digest(old))
        summary = read_summary(summary_text(named))
        with pytest.raises(InputError, match="not the one its summary lists"):
            light_plan(summary, me, TOPOLOGY, domains=domains, blocks={block_digest(old): old})


def test_a_block_whose_members_per_role_are_not_its_entrys_is_refused():
    """The summary says how many members of each role a block holds (the ordinals of the blocks after it add up
    from them): a block that holds others is refused, not read with the wrong ordinals."""
    raw, made, _, _ = _pair()
    pods, nodes = _job()
    master = pods[0]
    domains = node_domains(master["spec"]["nodeName"], nodes[master["spec"]["nodeName"]], LEVELS)
    items = raw["topology"]["roleBlocks"]
    mine = next(k for k, b in enumerate(made) if domains[:len(b.values)] == b.values)
    later = mine + 1 if mine + 1 < len(made) else mine - 1
    assert items == [[[mine, 1]]]  # the master's one block; the workers are the rest of every block
    items[0] = [[later, 1]]
    summary = read_summary(summary_text(raw))
    with pytest.raises(InputError, match="members per role are not the ones"):
        light_plan(summary, master, TOPOLOGY, domains=domains, blocks={b.digest: b.text for b in made})


def _rename(raw: dict, digest: str, new: str) -> None:
    """The summary names the block of ``digest`` by ``new``."""
    assert raw["topology"]["blocks"].count(digest) == 1
    raw["topology"]["blocks"] = raw["topology"]["blocks"].replace(digest, new)


def _pair() -> tuple[dict, list[Made], dict, tuple[str, ...]]:
    pods, nodes = _job()
    raw, made = summarize_with_blocks(build_plan(pods, "demo-master-0", TOPOLOGY, nodes=nodes), seq=1)
    me = pods[7]
    return raw, made, me, node_domains(me["spec"]["nodeName"], nodes[me["spec"]["nodeName"]], LEVELS)


def test_a_block_the_summary_does_not_name_is_waited_for():
    """A block written after the summary (a newer one) or not written yet: its digest is not the summary's, so the
    pod waits for the pair, as it waits for a summary that does not place it yet."""
    raw, made, me, domains = _pair()
    summary = read_summary(summary_text(raw))
    mine = _own_blocks(made, "job-topology", domains)
    assert light_plan(summary, me, TOPOLOGY, domains=domains, blocks=mine) is not None
    stale = [text.replace(f'"schema":{BLOCK_SCHEMA}', f'"schema":{BLOCK_SCHEMA} ') for text in mine.values()]
    assert all(old != new for old, new in zip(mine.values(), stale, strict=True))
    assert light_plan(summary, me, TOPOLOGY, domains=domains, blocks={block_digest(t): t for t in stale}) is None
    assert light_plan(summary, me, TOPOLOGY, domains=domains, blocks={}) is None
    with pytest.raises(InputError, match="not the one the summary names"):  # held under a digest not its own
        light_plan(summary, me, TOPOLOGY, domains=domains, blocks=dict(zip(mine, stale, strict=True)))


@pytest.mark.parametrize("mutate, complaint", [
    (lambda t: t["blocks"][1].__setitem__(0, 1), "the blocks make"),  # too few pods
    (lambda t: t["blocks"].append(t["blocks"][-1]), "the blocks make"),
    (lambda t: t["blocks"][0].__setitem__(-1, "$(reboot)AA"), "digest is '$(reboot)AA'"),
    (lambda t: t["blocks"][0].__setitem__(-1, t["blocks"][0][-1][:-1]), "not 11 base64url"),
    (lambda t: t["blocks"][1].__setitem__(-1, t["blocks"][0][-1]), "name a block twice"),  # counts add up
    (lambda t: t.update(levelsDigest=["topology.kubernetes.io/zone"]), "the levels' digest is"),
    (lambda t: t.update(levels=["topology.kubernetes.io/zone"]), "not {levelsDigest"),  # another release's form
    (lambda t: t.update(order="random"), "not {levels"),
    (lambda t: t.pop("blocks"), "without its blocks"),
    (lambda t: t["blocks"][0].__setitem__(0, 0), "count is 0"),
    (lambda t: t["blocks"][0].insert(1, 1), "processes is 1"),  # fewer processes than members
    (lambda t: t["roleBlocks"][0][0].__setitem__(1, 10**6), "members per role make"),
    (lambda t: t.pop("roleBlocks"), "each of the 2 training roles"),  # several roles, none counted
    (lambda t: t["roleBlocks"][0].append(list(t["roleBlocks"][0][0])), "out of order"),
    (lambda t: t["roleBlocks"][0][0].__setitem__(0, len(t["blocks"])), "past the last"),
    (lambda t: t["roleBlocks"][0][0].__setitem__(1, 0), "members of a role is 0"),
    (lambda t: t.update(roleCounts=[[1, 0]] * len(t["blocks"])), "another release"),
], ids=["gap", "twice", "digest", "short", "digest-twice", "level", "old-levels", "order", "no-blocks", "empty",
        "processes", "per-role", "no-roles", "role-twice", "role-past", "role-none", "old-form"])
def test_a_topology_section_that_does_not_add_up_is_refused_in_one_line(mutate, complaint):
    raw, _, _, _ = _pair()
    section = raw["topology"]
    section["blocks"] = text_entries(section["blocks"])  # mutated as lists, published as text
    mutate(section)
    if isinstance(section.get("blocks"), list):
        section["blocks"] = entries_text(section["blocks"])
    with pytest.raises(InputError) as err:
        read_summary(summary_text(raw))
    assert complaint in str(err.value) and "\n" not in str(err.value)


def test_a_block_that_does_not_add_up_is_refused_in_one_line(monkeypatch):
    """A block whose digest the summary names but whose members do not make its count (a leader of another
    release, a hand edit with the digest fixed up) is refused, not misread."""
    raw, made, me, domains = _pair()
    entry = next(b for b in made if domains[:len(b.values)] == b.values)
    block = json.loads(entry.text)
    block["members"] = block["members"][:-1]
    text = json.dumps(block, separators=(",", ":"))
    digest = block_digest(text)
    _rename(raw, entry.digest, digest)
    summary = read_summary(summary_text(raw))
    with pytest.raises(InputError, match="a block makes") as err:
        light_plan(summary, me, TOPOLOGY, domains=domains, blocks={digest: text})
    assert "\n" not in str(err.value)


def test_a_pod_whose_levels_are_not_the_leaders_reads_the_whole_topology():
    raw, made, me, domains = _pair()
    summary = read_summary(summary_text(raw))
    other = Options(levels=DEFAULT_LEVELS, rank_order="topology")
    with pytest.raises(InputError, match="other Node label levels"):
        light_plan(summary, me, other, domains=domains, blocks={b.digest: b.text for b in made})
    with pytest.raises(InputError, match="other Node label levels"):
        light_plan(summary, me, Options(), domains=domains)


def test_the_summary_names_its_levels_by_a_digest_not_their_labels():
    """Every pod reads the summary at start and at each rewrite: the levels' labels (~370 B for the default ten)
    are in every pod's own options, so the summary names them by the digest of labels and names in order."""
    pods, nodes = _job()
    for levels in (LEVELS, DEFAULT_LEVELS):
        raw, _ = summarize_with_blocks(build_plan(pods, "demo-master-0", Options(levels=levels, rank_order="topology"),
                                                  nodes=nodes), seq=1)
        assert "levels" not in raw["topology"] and not any(level.label in summary_text(raw) for level in levels)
    raw, made, me, domains = _pair()
    assert read_summary(summary_text(raw)).layout.levels == raw["topology"]["levelsDigest"]
    plan = light_plan(read_summary(summary_text(raw)), me, TOPOLOGY, domains=domains,
                      blocks={b.digest: b.text for b in made})
    assert plan is not None and plan.topology.levels == LEVELS
    reordered = Options(levels=(LEVELS[1], LEVELS[0], *LEVELS[2:]), rank_order="topology")
    with pytest.raises(InputError, match="other Node label levels"):
        light_plan(read_summary(summary_text(raw)), me, reordered, domains=domains)


def test_the_summary_lists_its_blocks_as_one_line_without_quotes_or_values():
    """The block entries are text in the summary, itself text in the ConfigMap's data: as JSON lists each
    entry's quotes would be escaped on the wire. Written as count/digest they read back the same; their domain
    values, in each block's text and each pod's own Node, are not in the summary every pod reads."""
    raw, made, _, _ = _pair()
    text = raw["topology"]["blocks"]
    assert isinstance(text, str) and '"' not in text and len(text.split(";")) == len(made)
    assert text == ";".join(f"{b.count},{b.processes},{b.digest}" if b.processes != b.count else f"{b.count},{b.digest}"
                            for b in made)  # no domain values
    layout = read_summary(summary_text(raw)).layout
    assert [(e.count, e.processes, e.digest) for e in layout.blocks] == \
        [(b.count, b.processes, b.digest) for b in made]
    assert entries_text(text_entries(text)) == text
    listed = json.loads(summary_text(raw))
    listed["topology"]["blocks"] = text_entries(text)  # another release's form: a list
    with pytest.raises(InputError, match="without its blocks"):
        read_summary(summary_text(listed))


@pytest.mark.parametrize("text", ["", "61", "x,AAAAAAAAAAA", "61,2,3,AAAAAAAAAAA", "61,AAAAAAAAAAA;",
                                  "\u0661,AAAAAAAAAAA", "61,AAAAAAAAAA", "61,AAAAAAAAAA/", "61,AAAAAAAAAAA,",
                                  "0/a,61,AAAAAAAAAAA", "1/a/b,61,AAAAAAAAAAA"])
def test_a_block_entry_that_is_not_count_digest_is_refused(text):
    raw, _, _, _ = _pair()
    raw["topology"]["blocks"] = json.loads(f'"{text}"')
    with pytest.raises(InputError) as err:
        read_summary(summary_text(raw))
    assert "\n" not in str(err.value)


def test_a_summary_whose_entries_name_domain_values_is_refused_not_misread():
    """A summary of another release, its entries ``shared/value/...,count[,processes],digest``: refused in one
    line (the pod reads the whole topology), never read as counts and digests."""
    raw, made, _, _ = _pair()
    entries, before = [], ()
    for block in made:
        shared = next(k for k in range(len(block.values), -1, -1) if block.values[:k] == before[:k])
        processes = [block.processes] if block.processes != block.count else []
        entries.append(",".join(["/".join([str(shared), *block.values[shared:]]), str(block.count),
                                 *map(str, processes), block.digest]))
        before = block.values
    raw["topology"]["blocks"] = ";".join(entries)
    with pytest.raises(InputError, match="not count,processes,digest") as err:
        read_summary(summary_text(raw))
    assert "\n" not in str(err.value) and "reads the whole topology" in str(err.value)


def test_blocks_deeper_than_the_levels_are_refused():
    """The summary does not say how deep its blocks are: a pod's block whose values are more than the pod's
    levels is refused where its text is read."""
    raw, made, me, domains = _pair()
    entry = next(b for b in made if domains[:len(b.values)] == b.values)
    block = json.loads(entry.text)
    block["values"] = [*entry.values, *(f"x{k}" for k in range(len(LEVELS)))]
    text = json.dumps(block, separators=(",", ":"))
    _rename(raw, entry.digest, block_digest(text))
    with pytest.raises(InputError, match="deeper than its levels") as err:
        light_plan(read_summary(summary_text(raw)), me, TOPOLOGY, domains=domains, blocks={block_digest(text): text})
    assert "\n" not in str(err.value)


def test_a_pod_finds_its_block_among_the_blocks_it_holds_by_its_values():
    """The summary names blocks by digest alone: of the blocks a pod holds (one per depth of its domains), its own
    is the one the summary lists whose values begin its domains; blocks the summary does not list, or of other
    domains, are not it, and two listed blocks of its domains are refused."""
    raw, made, me, domains = _pair()
    summary = read_summary(summary_text(raw))
    entry = next(b for b in made if domains[:len(b.values)] == b.values)
    other = next(b for b in made if b is not entry)
    shallow = json.dumps({**json.loads(entry.text), "values": list(domains[:1])}, separators=(",", ":"))
    held = {entry.digest: entry.text, block_digest(shallow): shallow}  # a cut of another depth, not listed
    plan = light_plan(summary, me, TOPOLOGY, domains=domains, blocks=held)
    pods, nodes = _job()
    full = build_plan(pods, me["metadata"]["name"], TOPOLOGY, nodes=nodes).topology.me
    assert plan is not None and (plan.topology.me.node_rank, plan.topology.me.first_rank) == \
        (full.node_rank, full.first_rank)
    assert light_plan(summary, me, TOPOLOGY, domains=domains, blocks={other.digest: other.text}) is None
    _rename(raw, other.digest, block_digest(shallow))  # the summary lists both: not one block of its domains
    with pytest.raises(InputError, match="lists 2 blocks of this pod's domains") as err:
        light_plan(read_summary(summary_text(raw)), me, TOPOLOGY, domains=domains, blocks=held)
    assert "\n" not in str(err.value)


def test_a_plans_blocks_are_made_once_for_the_leaders_files_and_its_summary():
    """The leader makes one plan's blocks for its own files (own_view) and for the summary it publishes: the same
    blocks, made once by the one maker both are given; another plan's are its own (a member's new process count is
    in its block's text)."""
    pods, nodes = _job()
    plan = build_plan(pods, "demo-master-0", TOPOLOGY, nodes=nodes)
    maker = BlockMaker()
    _, made = summarize_with_blocks(plan, seq=1, blocks=maker)
    _, again = summarize_with_blocks(plan, seq=2, blocks=maker)
    assert made and all(a is b for a, b in zip(made, again, strict=True))
    _, apart = summarize_with_blocks(plan, seq=2, blocks=BlockMaker())  # another maker's: its own, the same text
    assert [b.text for b in apart] == [b.text for b in made]
    assert not any(a is b for a, b in zip(apart, made, strict=True))
    pods[3]["spec"]["containers"][0].setdefault("resources", {}).setdefault("limits", {})["nvidia.com/gpu"] = "4"
    other = build_plan(pods, "demo-master-0", TOPOLOGY, nodes=nodes)
    _, anew = summarize_with_blocks(other, seq=1, blocks=maker)
    fresh = [b.text for b in BlockMaker().make(other.topology) or ()]  # nothing carried: made from its members
    assert [b.text for b in anew] == fresh != [b.text for b in made]


def test_a_change_makes_anew_only_the_blocks_whose_members_it_altered():
    """The leader carries a block from its last plan while its members' roles, indices and process counts are
    the same: a change makes one block's text, not all of them; what it carries is what it would make."""
    pods, nodes = _job(workers=120, zones=2, racks=4)
    maker = BlockMaker()
    before = {b.values: b for b in summarize_with_blocks(
        build_plan(pods, "demo-master-0", TOPOLOGY, nodes=nodes), seq=1, blocks=maker)[1]}
    pods = [p for p in pods if p["metadata"]["name"] != "demo-worker-5"]
    plan = build_plan(pods, "demo-master-0", TOPOLOGY, nodes=nodes)
    after = {b.values: b for b in summarize_with_blocks(plan, seq=2, blocks=maker)[1]}
    assert len(after) == 8 and sum(after[values] is not before[values] for values in after) == 1
    assert [b.text for b in after.values()] == [b.text for b in BlockMaker().make(plan.topology) or ()]


def test_a_training_member_without_an_index_makes_no_blocks():
    """A block states its members as runs of indices: a training member without one (a pod found by a selector
    alone) leaves the job with no blocks, whichever block it falls in, carried or made anew."""
    pods, nodes = _job()
    topology = build_plan(pods, "demo-master-0", TOPOLOGY, nodes=nodes).topology
    maker = BlockMaker()
    assert maker.make(topology)
    members = list(topology.members)
    at = next(k for k, m in enumerate(members) if m.training and m.role == "worker")
    members[at] = members[at]._replace(index=())
    assert maker.make(dataclasses.replace(topology, members=tuple(members))) is None
    assert BlockMaker().make(dataclasses.replace(topology, members=tuple(members))) is None
