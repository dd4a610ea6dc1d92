"""--rank-order topology against the sandbox over real HTTPS: one init reads the Nodes, the others get the labels
through the published topology; without RBAC for Nodes, one warning line and index order."""

from __future__ import annotations

import json
import time

from agent import examples
from agent.core.placement import domains_used, ring_crossings
from tests.integration.conftest import finish, start_init
from tests.integration.test_init import create_volcano_job

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
    procs = {n: start_init(sandbox, n, tmp_path / n, *args) for n in reversed(names)}  # followers first
    errors = {}
    for name, proc in procs.items():
        code, err = finish(proc)
        assert code == 0, err
        errors[name] = err
    return errors


def test_ranks_follow_the_racks_and_only_the_leader_reads_nodes(sandbox, tmp_path):
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
    leader = stats["topology-agent/0.1.0 init (default/demo-master-0)"]
    # get pod, get owner, list pods, one metadata GET per node (7), create snapshot, journal and Lease
    assert leader["requests"] - leader["watches"] == 6 + len(pods)
    for name in names[1:]:
        follower = stats[f"topology-agent/0.1.0 init (default/{name})"]
        assert follower["requests"] - follower["watches"] <= 4, name  # 4: the writer pod (issue 23)


def test_without_rbac_for_nodes_one_line_and_index_order(sandbox, tmp_path):
    pods, _ = job_on_two_racks(sandbox)
    names = [p["metadata"]["name"] for p in pods]
    sandbox.faults(status=403, path="/api/v1/nodes", count=-1)
    errors = run_inits(sandbox, tmp_path, names, *ARGS)
    lines = [line for line in errors["demo-master-0"].splitlines() if "cannot read Nodes" in line]
    assert len(lines) == 1 and "manifests/rbac/nodes" in lines[0]
    assert not any("cannot read Nodes" in errors[n] for n in names[1:])  # followers never asked
    doc = json.loads((tmp_path / "demo-worker-0" / "topology.json").read_text())
    assert [m["name"] for m in doc["members"] if m["training"]] == names[:6]
    assert doc["env"]["TOPOLOGY_RANK_ORDER"] == "index" and "TOPOLOGY_RACK" not in doc["env"]
    assert "labels are unknown" in doc["topology"]["note"]


def test_init_waits_until_every_training_pod_is_scheduled(sandbox, tmp_path):
    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 2)), with_ips=False)
    nodes = examples.racks(pods)
    for node in nodes:
        sandbox.create_node(node)
    names = [p["metadata"]["name"] for p in pods]
    # --address dns: without --rank-order topology the gang would be complete now (DNS names need no IP)
    procs = {n: start_init(sandbox, n, tmp_path / n, *ARGS) for n in names}
    time.sleep(1.0)
    assert all(proc.poll() is None for proc in procs.values())
    for k, name in enumerate(names):
        sandbox.schedule("default", name, examples.loopback_ip(k), node=nodes[k]["metadata"]["name"])
    for proc in procs.values():
        code, err = finish(proc)
        assert code == 0, err
    doc = json.loads((tmp_path / "demo-worker-1" / "topology.json").read_text())
    assert [m["name"] for m in doc["members"]] == ["demo-master-0", "demo-worker-1", "demo-worker-0"]


def test_a_join_lands_in_its_racks_block_for_the_follower_and_only_the_publisher_reads_its_node(sandbox, tmp_path):
    from tests.integration.test_sidecar import start_sidecar, stop_sidecars, wait_for

    pods, _ = job_on_two_racks(sandbox)
    names = [p["metadata"]["name"] for p in pods]
    run_inits(sandbox, tmp_path, names, *ARGS)
    levels = ARGS[:4]
    procs = {n: start_sidecar(sandbox, tmp_path, n, *levels) for n in ("demo-master-0", "demo-worker-4")}
    try:
        wait_for(lambda: "(follower)" in (tmp_path / "demo-worker-4.log").read_text(), what="follower started")
        agent = "topology-agent/0.1.0 sidecar (default/demo-worker-4)"
        wait_for(lambda: sandbox.stats()["byAgent"].get(agent, {}).get("watches", 0) >= 1, what="follower watching")
        sandbox.create_node(examples.node("node-new", {examples.ZONE: "zone-a", examples.RACK: "rack-a"}))
        pod = examples.volcano_job("demo", (("master", 1), ("worker", 6)))[-1]  # demo-worker-5
        pod["spec"]["nodeName"] = "node-new"
        pod["status"].update(podIP="127.1.0.99", podIPs=[{"ip": "127.1.0.99"}])  # extras-0 holds the next one
        sandbox.reset_stats()
        sandbox.create_pod(pod)
        out = tmp_path / "demo-worker-4"

        def order() -> list[str]:
            doc = json.loads((out / "topology.json").read_text())
            return [m["name"] for m in doc["members"] if m["training"]]
        wait_for(lambda: "demo-worker-5" in order(), what="the follower sees the new worker")
        # rack-a: master-0, worker-1, worker-3, then the joiner; rack-b after it, each survivor in its order
        assert order() == ["demo-master-0", "demo-worker-1", "demo-worker-3", "demo-worker-5",
                           "demo-worker-0", "demo-worker-2", "demo-worker-4"]
        env = json.loads((out / "topology.json").read_text())["env"]
        assert env["TOPOLOGY_RANK_ORDER"] == "topology" and env["NODE_RANK"] == "6"
        stats = sandbox.stats()["byAgent"]
        follower = stats["topology-agent/0.1.0 sidecar (default/demo-worker-4)"]
        assert follower["requests"] == 0  # the node's labels came in the journal entry
        leader = stats["topology-agent/0.1.0 sidecar (default/demo-master-0)"]
        assert leader["requests"] >= 2  # GET node-new and the journal write (Lease renewals come on top)
    finally:
        stop_sidecars(procs)
