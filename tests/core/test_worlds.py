"""Two worlds in one torch.env: WORLD_SIZE and RANK for a trainer started without a launcher (one process per
training pod), NNODES, NODE_RANK and NPROC_PER_NODE (and the hostfile's slots) for the launchers, which set each
process's own WORLD_SIZE and RANK. One table over the controllers, on pods that run more than one process each."""

from __future__ import annotations

import json

import pytest

from agent import examples
from agent.core.files.variables import warnings_for
from agent.core.model import Processes
from tests.conftest import env_of, render


def _cpu(pods, cpu):
    for pod in pods:
        for container in pod["spec"]["containers"]:
            container.setdefault("resources", {}).setdefault("limits", {})["cpu"] = cpu
    return pods


# (id, pods, self, options, torch.env's values, the training processes in topology.json, the hostfile's slots)
CASES = [
    ("Volcano with cpu 2: the pods' world, as Volcano's pytorch plugin writes it",
     lambda: examples.volcano_job(tasks=(("master", 1), ("worker", 3)), cpu="2"), "demo-worker-2", {},
     {"WORLD_SIZE": "4", "RANK": "3", "NODE_RANK": "3", "NNODES": "4", "NPROC_PER_NODE": "2",
      "PET_NPROC_PER_NODE": "2", "LOCAL_WORLD_SIZE": "2"}, 8, [2, 2, 2, 2]),
    ("PyTorchJob with 2 GPUs a pod", lambda: examples.pytorchjob(workers=3, gpus=2), "mnist-worker-1", {},
     {"WORLD_SIZE": "4", "RANK": "2", "NODE_RANK": "2", "NPROC_PER_NODE": "2", "PET_NODE_RANK": "2"}, 8,
     [2, 2, 2, 2]),
    ("TrainJob nodes with cpu 2", lambda: examples.trainjob(num_nodes=3), "llm-node-0-2-f59jk", {},
     {"WORLD_SIZE": "3", "RANK": "2", "NODE_RANK": "2", "NPROC_PER_NODE": "2"}, 6, [2, 2, 2]),
    ("Indexed Job with cpu 2500m: three processes a pod", lambda: examples.indexed_job(completions=3),
     "sweep-1-h9q5m", {}, {"WORLD_SIZE": "3", "RANK": "1", "NPROC_PER_NODE": "3"}, 9, [3, 3, 3]),
    ("--nproc-per-node 4 moves no WORLD_SIZE", lambda: examples.volcano_job(tasks=(("master", 1), ("worker", 2))),
     "demo-worker-1", {"processes": Processes(per_node=4)}, {"WORLD_SIZE": "3", "RANK": "2", "NPROC_PER_NODE": "4"}, 12,
     [4, 4, 4]),
    ("elastic: the pods there are now", lambda: _cpu(examples.volcano_job(tasks=(("master", 1), ("worker", 2))), "2"),
     "demo-worker-0", {"elastic": (2, 4)},
     {"WORLD_SIZE": "3", "RANK": "1", "PET_NNODES": "2:4", "NPROC_PER_NODE": "2"}, 6, [2, 2, 2]),
    ("Volcano with cpu 3", lambda: examples.volcano_job(tasks=(("master", 1), ("worker", 2)), cpu="3"),
     "demo-worker-1", {}, {"WORLD_SIZE": "3", "RANK": "2", "NPROC_PER_NODE": "3"}, 9, [3, 3, 3]),
]


@pytest.mark.parametrize(("build", "me", "options", "expected", "processes", "slots"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_world_size_and_rank_count_pods_and_the_processes_go_to_the_launchers(build, me, options, expected,
                                                                             processes, slots):
    rendered = render(build(), me, **options)
    env = env_of(rendered)
    assert {key: env.get(key) for key in expected} == expected
    document = json.loads(rendered.files["topology.json"])
    assert (document["nnodes"], document["processes"]) == (int(env["WORLD_SIZE"]), processes)
    assert "worldSize" not in document  # one name per world: nnodes (torch.env's WORLD_SIZE) and processes
    me_json = next(m for m in document["members"] if m["name"] == me)
    assert me_json["nodeRank"] == int(env["RANK"]) and me_json["rank"] == sum(slots[:int(env["RANK"])])
    hostfile = rendered.files["hostfile"].decode().splitlines()
    assert [int(line.rpartition("slots=")[2]) for line in hostfile] == slots


def test_pods_that_differ_number_their_processes_in_topology_json_and_their_pods_in_torch_env():
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2)))
    for pod, gpus in zip(pods, ("1", "4", "2"), strict=True):
        pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": gpus}
    for name, rank, first in (("demo-master-0", 0, 0), ("demo-worker-0", 1, 1), ("demo-worker-1", 2, 5)):
        rendered = render(pods, name)
        env = env_of(rendered)
        assert (env["WORLD_SIZE"], env["RANK"], env["NODE_RANK"]) == ("3", str(rank), str(rank))
        document = json.loads(rendered.files["topology.json"])
        assert document["processes"] == 7
        assert [m["rank"] for m in document["members"]] == [0, 1, 5]
        rank_rule = next(v.source for v in rendered.variables if v.name == "RANK")
        assert f"this pod's first: rank {first}" in rank_rule


def test_explain_says_which_trainer_reads_world_size_and_rank_and_agrees_with_volcano():
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 3)), cpu="2")  # Volcano wrote WORLD_SIZE=4
    rendered = render(pods, "demo-worker-1")
    source = {v.name: v.source for v in rendered.variables}
    for name in ("WORLD_SIZE", "RANK"):
        assert "without a launcher" in source[name] and "Lightning's KubeflowEnvironment" in source[name]
        assert "ImageNet" in source[name] and "torchrun, deepspeed, mpirun and accelerate" in source[name]
        assert "replaces" not in source[name]  # Volcano's pytorch plugin injected the same pods' world
    assert "(8 processes)" in source["WORLD_SIZE"] and "this pod's first: rank 4" in source["RANK"]
    assert source["NPROC_PER_NODE"].startswith("CPU limit 2")


def test_a_user_world_size_of_processes_is_kept_and_named_as_the_pods_world_it_contradicts():
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 3)), cpu="2")
    env = pods[1]["spec"]["containers"][0]["env"]  # the user's before and after Volcano's block, as in
    env.insert(0, {"name": "WORLD_SIZE", "value": "8"})  # test_fidelity: the one a container ends with is the user's
    env.append({"name": "WORLD_SIZE", "value": "8"})
    rendered = render(pods, "demo-worker-0")
    assert "WORLD_SIZE" not in env_of(rendered)
    assert [w for w in warnings_for(rendered.plan, rendered.variables) if w.startswith("WORLD_SIZE=8")] == [
        "WORLD_SIZE=8 set by the user is kept, but the job's pods make WORLD_SIZE=4; torchrun and "
        "torch.distributed will wait for ranks that never come (or refuse extra ones)"]


def test_explains_member_table_gives_each_pod_its_node_rank_and_the_process_ranks_a_launcher_gives_it():
    from agent.core.files.explaining import format_explanation

    text = format_explanation(render(examples.volcano_job(tasks=(("master", 1), ("worker", 2)), cpu="2"),
                                     "demo-worker-0"))
    table = text[text.index("members in rank order:"):].splitlines()
    assert table[1].split()[:4] == ["NODE_RANK", "PROCESS", "RANKS", "SLOTS"]
    assert [line.split()[:3] for line in table[2:5]] == [["0", "0-1", "2"], ["1", "2-3", "2"], ["2", "4-5", "2"]]
