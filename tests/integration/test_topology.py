"""--rank-order topology against the sandbox over real HTTPS: one init process reads the Nodes, the others get
the labels through the published topology. The other topology scenarios run in process, over the sandbox's API
in memory: tests/runtime/test_topology.py."""

from __future__ import annotations

import json

from agent import examples
from agent.core.pods.placement import domains_used, ring_crossings
from tests.integration.conftest import finish, start_init
from tests.jobs import create_volcano_job

TASKS = (("master", 1), ("worker", 5), ("extras", 1))
ARGS = ("--rank-order", "topology", "--topology-levels", f"{examples.ZONE},{examples.RACK}", "--timeout", "60")


def job_on_two_racks(sandbox):
    pods = create_volcano_job(sandbox, TASKS)
    for node in examples.racks(pods):
        sandbox.create_node(node)
    for pod in pods:
        sandbox.update_pod("default", pod["metadata"]["name"],
                           lambda p, n=pod["spec"]["nodeName"]: p["spec"].update(nodeName=n))
    return pods, {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}


def run_inits(sandbox, tmp_path, names, *args):
    """One process per pod, all at once, rank 0's last: the first training pod's init to run publishes."""
    procs = {n: start_init(sandbox, n, tmp_path / n, *args) for n in reversed(names)}
    errors = {}
    for name, proc in procs.items():
        code, err = finish(proc)
        assert code == 0, err
        errors[name] = err
    return errors


def test_ranks_follow_the_racks_and_only_the_publisher_reads_nodes(sandbox, tmp_path):
    pods, node_of = job_on_two_racks(sandbox)
    names = [p["metadata"]["name"] for p in pods]
    sandbox.reset_stats()
    run_inits(sandbox, tmp_path, names, *ARGS)
    docs = {n: json.loads((tmp_path / n / "topology.json").read_text()) for n in names}
    views = {json.dumps([(m["name"], m["nodeRank"], m["domains"]) for m in d["members"]]) for d in docs.values()}
    assert len(views) == 1
    training = [m for m in docs["demo-worker-0"]["members"] if m["training"]]
    assert [m["name"] for m in training] == ["demo-master-0", "demo-worker-1", "demo-worker-3",
                                             "demo-worker-0", "demo-worker-2", "demo-worker-4"]
    assert [m["domains"]["rack"] for m in training] == ["rack-a"] * 3 + ["rack-b"] * 3
    paths = [(m["domains"]["zone"], m["domains"]["rack"], m["node"]) for m in training]
    assert ring_crossings(paths, 2) == domains_used(paths, 2) == 2
    env = docs["demo-worker-0"]["env"]
    assert env["NODE_RANK"] == "3" and env["MASTER_ADDR"].startswith("demo-master-0.")
    assert env["TOPOLOGY_RACK"] == "rack-b" and env["TOPOLOGY_ZONE"] == "zone-a"
    assert env["TOPOLOGY_NODE"] == node_of["demo-worker-0"] and env["TOPOLOGY_RANK_ORDER"] == "topology"
    torch_env = (tmp_path / "demo-worker-0" / "torch.env").read_text()
    assert "export TOPOLOGY_RACK='rack-b'" in torch_env and "export TOPOLOGY_LEVELS='zone,rack'" in torch_env
    stats = sandbox.stats()["byAgent"]
    publisher = sandbox.sandbox.store.get("/v1/configmaps", "default", "demo-topology")["data"]["leader"]
    leader = stats[f"topology-agent/0.1.0 init (default/{publisher})"]
    # get pod, get owner, look for a copy already there (its summary: a 404), list pods, one metadata GET per node
    # (7), create snapshot, journal and summary; and the Lease: read, created, renewed while it waited
    assert leader["requests"] - leader["watches"] - leader["leases"] == 7 + len(pods)
    assert leader["leases"] >= 2
    for name in names:
        if name != publisher:
            follower = stats[f"topology-agent/0.1.0 init (default/{name})"]
            # 4: the writer pod (its provenance); the Lease apart (tests/runtime/test_init.py counts its reads)
            assert follower["requests"] - follower["watches"] - follower["leases"] <= 4, name


def test_with_view_own_each_pod_reads_its_node_and_its_block_and_writes_its_full_views_variables(sandbox, tmp_path):
    """Real processes over HTTPS: the publisher writes the order as a summary and one block per rack; every other
    training pod reads its own Node, then the summary and its block (core/publication/blocks.py), and writes the
    variables the full view gives it from every pod and Node."""
    from agent.core import Options, render_pod
    from agent.core.pods.placement import Level

    pods, node_of = job_on_two_racks(sandbox)
    names = [p["metadata"]["name"] for p in pods]
    sandbox.reset_stats()
    errors = run_inits(sandbox, tmp_path, names, *ARGS, "--view", "own")
    store = sandbox.sandbox.store
    blocks = [c for c in store.list("/v1/configmaps", "default") if "-topology-block-" in c["metadata"]["name"]]
    assert len(blocks) == 2  # rack-a's and rack-b's
    listed = store.list("/v1/pods", "default")
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in store.list("/v1/nodes", "")}
    full = Options(levels=(Level(examples.ZONE, "ZONE"), Level(examples.RACK, "RACK")), rank_order="topology")
    publisher = store.get("/v1/configmaps", "default", "demo-topology")["data"]["leader"]
    stats = sandbox.stats()["byAgent"]
    for name in names:
        if name == publisher or name.startswith("demo-extras"):  # the extras pod does not train: every member
            continue
        doc = json.loads((tmp_path / name / "topology.json").read_text())
        assert doc["view"] == "own" and "reading the whole topology" not in errors[name], errors[name]
        want = render_pod(listed, name, full, nodes=labels)
        env = {v.name: v.value for v in want.variables if v.written and not v.name.startswith("VC_WORKER_HOSTS")}
        assert {k: doc["env"].get(k) for k in env} == env, name
        assert doc["env"]["TOPOLOGY_NODE"] == node_of[name]
        follower = stats[f"topology-agent/0.1.0 init (default/{name})"]
        # the writer pod, its own Node, and the summary with its block in one LIST (the Lease apart)
        assert follower["requests"] - follower["watches"] - follower["leases"] <= 6, name
