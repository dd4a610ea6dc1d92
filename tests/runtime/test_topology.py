"""--rank-order topology in this process against the sandbox's API in memory (tests/fakeapi.py): without RBAC for
Nodes, one warning line and index order; init waits for every training pod's node; a join lands in its rack's
block for a follower. tests/integration/test_topology.py keeps the whole job of real processes over HTTPS."""

from __future__ import annotations

import json

import pytest

from agent import examples
from agent.core import Options, render_pod
from agent.core.pods.placement import Level
from agent.core.publication.blocks import BlockMaker
from tests.fakeapi import agent_name
from tests.jobs import configmap, create_volcano_job
from tests.runtime.test_sidecar import follower_watching, init, start_sidecar

TASKS = (("master", 1), ("worker", 5), ("extras", 1))
ARGS = ("--rank-order", "topology", "--topology-levels", f"{examples.ZONE},{examples.RACK}", "--timeout", "60")


def job_on_two_racks(memory):
    pods = create_volcano_job(memory, TASKS)
    for node in examples.racks(pods):
        memory.create_node(node)
    for pod in pods:
        memory.update_pod("default", pod["metadata"]["name"],
                          lambda p, n=pod["spec"]["nodeName"]: p["spec"].update(nodeName=n))
    return pods, {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}


def run_inits(inits, tmp_path, names, *args):
    """Every init at once, rank 0's last: the first training pod's init to run publishes
    (core/publication/leading.py)."""
    started = {n: inits.start(n, tmp_path / n, *args) for n in reversed(names)}
    errors = {}
    for name, who in started.items():
        ran = inits.finish(who)
        assert ran.code == 0, ran.err
        errors[name] = ran.err
    return errors


def test_without_rbac_for_nodes_one_line_and_index_order(memory, inits, tmp_path):
    pods, _ = job_on_two_racks(memory)
    names = [p["metadata"]["name"] for p in pods]
    memory.faults(status=403, path="/api/v1/nodes", count=-1)
    errors = run_inits(inits, tmp_path, names, *ARGS)
    publisher = configmap(memory, "demo-topology")["data"]["leader"]
    lines = [line for line in errors[publisher].splitlines() if "cannot read Nodes" in line]
    assert len(lines) == 1 and "manifests/rbac/nodes" in lines[0]
    assert not any("cannot read Nodes" in errors[n] for n in names if n != publisher)  # followers never asked
    doc = json.loads((tmp_path / "demo-worker-0" / "topology.json").read_text())
    assert [m["name"] for m in doc["members"] if m["training"]] == names[:6]
    assert doc["env"]["TOPOLOGY_RANK_ORDER"] == "index" and "TOPOLOGY_RACK" not in doc["env"]
    assert "labels are unknown" in doc["topology"]["note"]


def test_init_waits_until_every_training_pod_is_scheduled(memory, api, inits, tmp_path):
    pods = create_volcano_job(memory, (("master", 1), ("worker", 2)), with_ips=False)
    nodes = examples.racks(pods)
    for node in nodes:
        memory.create_node(node)
    names = [p["metadata"]["name"] for p in pods]
    # --address dns: without --rank-order topology the gang would be complete now (DNS names need no IP)
    started = {n: inits.start(n, tmp_path / n, *ARGS) for n in names}
    # The leader (the first init to take the Lease) waits for the pods, the others for its publication: each is
    # waiting once it watches.
    def waiting() -> bool:
        pods_ = [n for n in names if api.watching(agent_name("init", n), "/api/v1/namespaces/default/pods")]
        return len(pods_) == 1 and all(api.watching(agent_name("init", n), "/api/v1/namespaces/default/configmaps")
                                       for n in names if n not in pods_)

    api.notice.wait_until(waiting, what="every init waiting")
    assert all(inits.running(who) for who in started.values())
    for k, name in enumerate(names):
        memory.schedule("default", name, examples.loopback_ip(k), node=nodes[k]["metadata"]["name"])
    for who in started.values():
        ran = inits.finish(who)
        assert ran.code == 0, ran.err
    doc = json.loads((tmp_path / "demo-worker-1" / "topology.json").read_text())
    assert [m["name"] for m in doc["members"]] == ["demo-master-0", "demo-worker-1", "demo-worker-0"]


async def test_a_join_lands_in_its_racks_block_for_the_follower_and_only_the_publisher_reads_its_node(
        memory, api, logs, sidecars, tmp_path):
    pods, _ = job_on_two_racks(memory)
    names = [p["metadata"]["name"] for p in pods]
    for name in names:  # the leader first, so each follower finds its publication
        await init(api, logs, name, tmp_path / name, *ARGS)
    levels = ARGS[:4]
    await start_sidecar(sidecars, tmp_path, "demo-master-0", *levels)
    follower = await start_sidecar(sidecars, tmp_path, "demo-worker-4", *levels)
    await logs.until("demo-worker-4", "(follower)")
    await follower_watching(api, "demo-worker-4")
    # a follower plans with the Node labels its rows carry: it keeps no copy of its own (a standby keeps one)
    assert not follower.sidecar.nodes
    memory.create_node(examples.node("node-new", {examples.ZONE: "zone-a", examples.RACK: "rack-a"}))
    pod = examples.volcano_job("demo", (("master", 1), ("worker", 6)))[-1]  # demo-worker-5
    pod["spec"]["nodeName"] = "node-new"
    pod["status"].update(podIP="127.1.0.99", podIPs=[{"ip": "127.1.0.99"}])  # extras-0 holds the next one
    memory.reset_stats()
    memory.create_pod(pod)
    out = tmp_path / "demo-worker-4"

    def order() -> list[str]:
        doc = json.loads((out / "topology.json").read_text())
        return [m["name"] for m in doc["members"] if m["training"]]
    await follower.until(lambda: "demo-worker-5" in order(), what="the follower sees the new worker")
    # rack-a: master-0, worker-1, worker-3, then the joiner; rack-b after it, each survivor in its order
    assert order() == ["demo-master-0", "demo-worker-1", "demo-worker-3", "demo-worker-5",
                       "demo-worker-0", "demo-worker-2", "demo-worker-4"]
    env = json.loads((out / "topology.json").read_text())["env"]
    assert env["TOPOLOGY_RANK_ORDER"] == "topology" and env["NODE_RANK"] == "6"
    stats = memory.stats()["byAgent"]
    follower_stats = stats[agent_name("sidecar", "demo-worker-4")]
    assert follower_stats["requests"] == 0  # the node's labels came in the journal entry
    leader = stats[agent_name("sidecar", "demo-master-0")]
    assert leader["requests"] >= 2  # GET node-new and the journal write (Lease renewals come on top)


async def test_with_view_own_a_topology_ordered_follower_reads_its_node_the_summary_and_its_block(
        memory, api, logs, sidecars, tmp_path, monkeypatch):
    """The leader publishes the order as a summary and one block per rack (core/publication/blocks.py); a follower
    reads its own Node (metadata only), then the summary and its rack's block by label, never the pods or the
    snapshot, and writes the variables its full view writes. Its sidecar follows the pair from init's reads: a
    worker joining its rack moves it, and its files follow. The leader makes each plan's blocks once, for its own
    files and for the summary (init and its sidecar each give both one BlockMaker)."""
    made: list[object] = []  # every topology made into blocks (held: no id is reused)
    making = BlockMaker._make
    monkeypatch.setattr(BlockMaker, "_make", lambda self, topology: (made.append(topology), making(self, topology))[1])
    pods = create_volcano_job(memory, (("master", 1), ("worker", 11)))
    for node in examples.racks(pods, 3):
        memory.create_node(node)
    for pod in pods:
        memory.update_pod("default", pod["metadata"]["name"],
                          lambda p, n=pod["spec"]["nodeName"]: p["spec"].update(nodeName=n))
    names = [p["metadata"]["name"] for p in pods]
    own = (*ARGS, "--view", "own", "--address", "ip")
    errors = {}
    for name in names:  # the leader first, so each follower finds its publication
        errors[name] = (await init(api, logs, name, tmp_path / name, *own)).err
    blocks = [c for c in memory.sandbox.store.list("/v1/configmaps", "default")
              if c["metadata"]["name"].startswith("demo-topology-block-")]
    assert len(blocks) == 3  # one per rack
    listed = memory.sandbox.store.list("/v1/pods", "default")
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in memory.sandbox.store.list("/v1/nodes", "")}
    def labels_of(name: str) -> str:
        return next(p["spec"]["nodeName"] for p in listed if p["metadata"]["name"] == name)

    full = Options(address="ip", levels=(Level(examples.ZONE, "ZONE"), Level(examples.RACK, "RACK")),
                   rank_order="topology")
    for name in names[1:]:
        doc = json.loads((tmp_path / name / "topology.json").read_text())
        assert doc["view"] == "own" and "reading the whole topology" not in errors[name], errors[name]
        want = render_pod(listed, name, full, nodes=labels)
        env = {v.name: v.value for v in want.variables if v.written and not v.name.startswith("VC_WORKER_HOSTS")}
        assert {k: doc["env"].get(k) for k in env} == env, name
        calls = [r for who, r in list(api.requests) if who == agent_name("init", name)]
        assert not any(r.path.endswith("/pods") or "/configmaps/" in r.path for r in calls), name  # no LIST, no GET
        assert [r.path for r in calls if "/nodes" in r.path] == [f"/api/v1/nodes/{labels_of(name)}"], name
        lists = [dict(r.query).get("labelSelector", "") for r in calls if r.verb == "list"]
        assert lists and all(s.startswith("topology-agent.io/part in (") for s in lists), name
    watching = (*ARGS[:4], "--view", "own")
    await start_sidecar(sidecars, tmp_path, "demo-master-0", *watching)
    follower = await start_sidecar(sidecars, tmp_path, "demo-worker-10", *watching)
    await logs.until("demo-worker-10", "(follower)")
    await follower_watching(api, "demo-worker-10")
    out = tmp_path / "demo-worker-10"
    before = json.loads((out / "topology.json").read_text())["env"]
    memory.create_node(examples.node("node-new", {examples.ZONE: "zone-a", examples.RACK: "rack-b"}))
    pod = examples.volcano_job("demo", (("master", 1), ("worker", 12)))[-1]  # demo-worker-11, in rack-b
    pod["spec"]["nodeName"] = "node-new"
    pod["status"].update(podIP="127.1.0.99", podIPs=[{"ip": "127.1.0.99"}])
    memory.create_pod(pod)
    def placed() -> bool:  # the leader orders once it has read the new Node (index order meanwhile, as every pod)
        env = json.loads((out / "topology.json").read_text())["env"]
        return env["NNODES"] == "13" and env["TOPOLOGY_RANK_ORDER"] == "topology"
    await follower.until(placed, what="the follower sees the new worker in its place")
    after = json.loads((out / "topology.json").read_text())["env"]
    listed = memory.sandbox.store.list("/v1/pods", "default")
    labels["node-new"] = {examples.ZONE: "zone-a", examples.RACK: "rack-b"}
    want = render_pod(listed, "demo-worker-10", full, nodes=labels)
    assert after["NODE_RANK"] == next(v.value for v in want.variables if v.name == "NODE_RANK") \
        and after["NODE_RANK"] != before["NODE_RANK"]  # rack-b's new member comes before rack-c's
    assert "reading the whole topology" not in logs.text("demo-worker-10")
    leader_gets = [r.path for who, r in list(api.requests) if who == agent_name("sidecar", "demo-master-0")
                   and r.verb == "get" and r.path.startswith("/api/v1/nodes/")]
    # its own Node (its domains, for its own view), then the new one: the others' labels came with its own rows,
    # as its init read them (the lost-Node watch lists no labels)
    assert leader_gets == ["/api/v1/nodes/node-0", "/api/v1/nodes/node-new"]
    assert len(made) >= 2 and len({id(t) for t in made}) == len(made)  # init's plan and the sidecar's, once each


@pytest.mark.slow  # seconds of real waiting (a stolen Lease, probes): the whole suite runs it
async def test_a_follower_back_from_the_pods_lists_its_block_again(memory, api, logs, sidecars, tmp_path):
    """A follower that followed the pods while the publisher was away returns to the summary from the LIST that
    found the publication sound (the snapshot, the journal and the summary, by their label): its block is not
    among them, so it lists the summary and its block again, and a change of rank 0's address, which rewrites the
    summary and no block, still reaches its files."""
    from tests.runtime.test_faults import _renew

    job_on_two_racks(memory)
    names = ["demo-master-0", *(f"demo-worker-{k}" for k in range(5)), "demo-extras-0"]
    own = (*ARGS[:4], "--view", "own", "--address", "ip")
    for name in names:
        await init(api, logs, name, tmp_path / name, *own, "--timeout", "60")
    lease = ("--lease-seconds", "2")
    await start_sidecar(sidecars, tmp_path, "demo-master-0", *own, *lease)
    follower = await start_sidecar(sidecars, tmp_path, "demo-worker-4", *own, *lease, "--probe-every", "1")
    await logs.until("demo-worker-4", "(follower)")
    await logs.until("demo-master-0", "started publishing")
    await sidecars.stop("demo-master-0")

    def steal(lease):
        lease["spec"]["holderIdentity"] = "not-a-member"
    for _ in range(2):
        _renew(memory, steal)
    await logs.until("demo-worker-4", "the publisher stopped", timeout=20)
    await start_sidecar(sidecars, tmp_path, "demo-master-0", *own, *lease)
    _renew(memory, lambda lease: lease["spec"].update(holderIdentity="", leaseDurationSeconds=1))
    await logs.until("demo-worker-4", "the published topology is sound again", timeout=30)
    await follower_watching(api, "demo-worker-4")
    memory.update_pod("default", "demo-master-0", lambda p: p["status"].update(
        podIP="127.1.0.77", podIPs=[{"ip": "127.1.0.77"}]))
    out = tmp_path / "demo-worker-4"
    await follower.until(lambda: json.loads((out / "topology.json").read_text())["env"]["MASTER_ADDR"]
                         == "127.1.0.77", timeout=30, what="the follower sees rank 0's new address")


async def test_more_nodes_than_a_few_gets_are_read_by_one_list_of_their_labels(memory, api):
    """Past NODE_GETS nodes, one paged LIST of the Nodes' metadata: each asked node's labels of the levels asked
    for, None for a node that is not there; the others' are not kept."""
    from agent.runtime.nodes import NODE_GETS, read_nodes

    count = NODE_GETS + 4
    for k in range(count + 3):
        memory.create_node(examples.node(f"node-{k}", {examples.ZONE: f"zone-{k % 2}", examples.RACK: f"rack-{k}",
                                                       "example.com/other": "x"}))
    names = [f"node-{k}" for k in range(count)] + ["node-gone"]
    options = Options(levels=(Level(examples.ZONE, "ZONE"), Level(examples.RACK, "RACK")))
    async with api.async_client("reader") as client:
        found = await read_nodes(client, names, options)
    assert found == {**{f"node-{k}": {examples.ZONE: f"zone-{k % 2}", examples.RACK: f"rack-{k}"}
                        for k in range(count)}, "node-gone": None}
    calls = [r for who, r in list(api.requests) if who == "reader"]
    assert [r.verb for r in calls] == ["list"]


async def test_nodes_of_one_rack_read_by_a_list_share_one_dict_of_labels(memory, api, monkeypatch):
    """The labels of the levels asked for are one dict per distinct set, shared by the Nodes that have it (a job
    on thousands of Nodes holds a few hundred sets), across the LIST's pages."""
    from agent.runtime import nodes as nodes_module

    monkeypatch.setattr(nodes_module, "PAGE", 5)  # several pages
    count = nodes_module.NODE_GETS + 4
    for k in range(count):
        memory.create_node(examples.node(f"node-{k}", {examples.ZONE: f"zone-{k % 2}", examples.RACK: f"rack-{k % 3}",
                                                       "example.com/other": f"x-{k}"}))
    options = Options(levels=(Level(examples.ZONE, "ZONE"), Level(examples.RACK, "RACK")))
    async with api.async_client("reader") as client:
        found = await nodes_module.read_nodes(client, [f"node-{k}" for k in range(count)], options)
    assert len(found) == count and all(found[f"node-{k}"] == {examples.ZONE: f"zone-{k % 2}",
                                                              examples.RACK: f"rack-{k % 3}"} for k in range(count))
    assert len({id(labels) for labels in found.values()}) == 6  # 2 zones x 3 racks
    assert [r.verb for who, r in list(api.requests) if who == "reader"] == ["list"] * 4
