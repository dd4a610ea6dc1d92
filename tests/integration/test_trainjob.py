"""TrainJobs in the sandbox: the job's objects (JobSet, TrainJob, runtime) decide the roles, and a replicated job
that others depend on never waits for them.

The runtime has the shape of Trainer v2.3.0's shipped DeepSpeed runtime (kubeflow/trainer
manifests/base/runtimes/deepspeed_distributed.yaml at v2.3.0): mlPolicy.mpi with runLauncherAsNode true, replicated
job ``node`` (sshd), then ``launcher`` with ``dependsOn: [{name: node, status: Ready}]``, so JobSet creates the
launcher's pod only once every node pod is Ready, which needs their init containers to finish first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agent import examples
from tests.integration.conftest import finish, start_init

NAME = "ds"


def runtime(*, as_node: bool) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "deepspeed-distributed", "labels": {"trainer.kubeflow.org/framework": "deepspeed"}},
        "spec": {"mlPolicy": {"numNodes": 1, "mpi": {"numProcPerNode": 1, "mpiImplementation": "OpenMPI",
                                                     "sshAuthMountPath": "/home/mpiuser/.ssh",
                                                     "runLauncherAsNode": as_node}},
                 "template": {"spec": {"replicatedJobs": [
                     {"name": "node", "template": {}},
                     {"name": "launcher", "dependsOn": [{"name": "node", "status": "Ready"}], "template": {}}]}}},
    }


def create_trainjob(sandbox, *, num_nodes: int, as_node: bool = True) -> tuple[list[dict], list[dict]]:
    """The runtime, the TrainJob, the JobSet Trainer makes of them, and the pods: node pods now, the launcher's
    pod returned for the test to create once the nodes are Ready (as JobSet does)."""
    sandbox.create("trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", "", runtime(as_node=as_node))
    trainjob = sandbox.create("trainer.kubeflow.org/v1alpha1/trainjobs", "default", {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": NAME},
        "spec": {"runtimeRef": {"name": "deepspeed-distributed"}, "trainer": {"numNodes": num_nodes}}})
    nodes = num_nodes - 1 if as_node else num_nodes
    sandbox.create("jobset.x-k8s.io/v1alpha2/jobsets", "default", {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": NAME, "ownerReferences": [
            {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": NAME,
             "uid": trainjob["metadata"]["uid"], "controller": True}]},
        "spec": {"replicatedJobs": [
            {"name": "node", "replicas": 1, "template": {"spec": {"parallelism": nodes, "completions": nodes}}},
            {"name": "launcher", "replicas": 1, "dependsOn": [{"name": "node", "status": "Ready"}],
             "template": {"spec": {"parallelism": 1, "completions": 1}}}]}})
    pods = examples.trainjob_mpi(NAME, num_nodes)
    if not as_node:
        pods = examples.trainjob_mpi(NAME, num_nodes + 1)
        pods[-1]["spec"]["containers"][0]["name"] = "launcher"
    node_pods = [p for p in pods if p["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] == "node"]
    launcher = [p for p in pods if p not in node_pods]
    for pod in node_pods:
        sandbox.create_pod(pod)
    return node_pods, launcher


def name_of(pod: dict[str, Any]) -> str:
    return pod["metadata"]["name"]


def members(out: Path) -> list[tuple[str, str, bool]]:
    document = json.loads((out / "topology.json").read_text())
    return [(m["name"], m["role"], m["training"]) for m in document["members"]]


def start_sidecar(sandbox, pod: str, out: Path, log: Path) -> subprocess.Popen[str]:
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": pod, "POD_NAMESPACE": "default"}
    env.pop("KUBECONFIG", None)
    with log.open("w") as handle:
        return subprocess.Popen([sys.executable, "-m", "agent.cli", "sidecar", "--out", str(out), "--address", "ip",
                                 "--debounce", "0", "--health-port", "0"], env=env, stderr=handle, text=True)


def wait_for_generation(out: Path, above: int, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            generation = int((out / "generation").read_text())
        except (OSError, ValueError):
            generation = 0
        if generation > above:
            return generation
        time.sleep(0.05)
    raise AssertionError(f"{out}: no generation above {above} within {timeout} s")


def test_node_pods_do_not_wait_for_the_launcher_that_depends_on_them(sandbox, tmp_path):
    node_pods, launcher = create_trainjob(sandbox, num_nodes=3)
    outs = {name_of(p): tmp_path / name_of(p) for p in node_pods + launcher}
    procs = [start_init(sandbox, name_of(p), outs[name_of(p)], "--address", "ip", "--timeout", "30")
             for p in node_pods]
    for proc in procs:
        code, err = finish(proc, timeout=60)
        assert code == 0, err
        assert "not waiting for launcher, created once node is Ready" in err
    first = outs[name_of(node_pods[0])]
    assert members(first) == [(name_of(p), "node", True) for p in node_pods]
    sidecar = start_sidecar(sandbox, name_of(node_pods[0]), first, tmp_path / "sidecar.log")
    try:
        time.sleep(1.0)  # the sidecar follows from init's generation 1
        for pod in launcher:  # JobSet creates the launcher now: the node pods are Ready
            sandbox.create_pod(pod)
        code, err = finish(start_init(sandbox, name_of(launcher[0]), outs[name_of(launcher[0])], "--address", "ip",
                                      "--timeout", "30"), timeout=60)
        assert code == 0, err
        everyone = [(name_of(p), "node", True) for p in node_pods] + [(name_of(launcher[0]), "launcher", True)]
        assert members(outs[name_of(launcher[0])]) == everyone
        hostfile = (outs[name_of(launcher[0])] / "hostfile").read_text().splitlines()
        assert len(hostfile) == 3 and hostfile[-1].startswith(launcher[0]["status"]["podIP"])
        wait_for_generation(first, 1)  # the node's sidecar follows the launcher's arrival
        assert members(first) == everyone
    finally:
        sidecar.terminate()
        sidecar.wait(15)
    assert sidecar.returncode == 0, (tmp_path / "sidecar.log").read_text()


def test_a_launcher_that_is_not_a_node_is_left_out_of_the_world(sandbox, tmp_path):
    node_pods, launcher = create_trainjob(sandbox, num_nodes=2, as_node=False)
    for pod in launcher:
        sandbox.create_pod(pod)
    out = tmp_path / "launcher"
    code, err = finish(start_init(sandbox, name_of(launcher[0]), out, "--address", "ip", "--timeout", "30"))
    assert code == 0, err
    assert "runLauncherAsNode false: training roles node" in err
    assert [m for m in members(out) if m[2]] == [(name_of(p), "node", True) for p in node_pods]
    assert len((out / "hostfile").read_text().splitlines()) == 2
    assert "export WORLD_SIZE=" not in (out / "torch.env").read_text()


def test_a_trainjob_on_the_shipped_runtime_changes_only_its_runtime_ref(sandbox, kubectl, tmp_path):
    """manifests/trainer's runtime applied with kubectl; a TrainJob names it and nothing else of the agent; its
    pods, made by Trainer and JobSet from the runtime's template, run init as the runtime injects it."""
    import yaml

    root = Path(__file__).resolve().parents[2]
    kubectl("apply", "-f", str(root / "manifests" / "trainer" / "torch-distributed-topology.yaml"))
    runtime = json.loads(kubectl("get", "clustertrainingruntime", "torch-distributed-topology", "-o",
                                 "json").stdout)
    template = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "llm"},
                "spec": {"runtimeRef": {"name": "torch-distributed-topology"},  # the one line
                         "trainer": {"numNodes": 3, "image": "trainer:1", "command": ["torchrun", "train.py"]}}}
    kubectl("apply", "-f", "-", input=yaml.safe_dump(trainjob))
    uid = json.loads(kubectl("get", "trainjob", "llm", "-o", "json").stdout)["metadata"]["uid"]
    sandbox.create("jobset.x-k8s.io/v1alpha2/jobsets", "default", {  # what Trainer makes of the two
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "llm", "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1",
                                                         "kind": "TrainJob", "name": "llm", "uid": uid,
                                                         "controller": True}]},
        "spec": {"replicatedJobs": [{"name": "node", "replicas": 1,
                                     "template": {"spec": {"parallelism": 3, "completions": 3,
                                                           "template": template}}}]}})
    pods = [p for p in examples.trainjob("llm", 3) if p["metadata"]["labels"][
        "jobset.sigs.k8s.io/replicatedjob-name"] == "node"]
    for pod in pods:  # the runtime's pod spec, with Trainer's node container (image, command, PET_* env)
        node = {**pod["spec"]["containers"][0], "volumeMounts": template["spec"]["containers"][0]["volumeMounts"]}
        pod["spec"] = {**template["spec"], "containers": [node], "hostname": pod["spec"].get("hostname"),
                       "subdomain": pod["spec"].get("subdomain")}
        pod["metadata"]["annotations"].update(template["metadata"]["annotations"])
        sandbox.create_pod(pod)
    init_args = template["spec"]["initContainers"][0]["args"]
    assert init_args[:3] == ["init", "--out", "/shared"]
    extra = [a for a in init_args[3:] if a != "--wait-dns"]  # no cluster DNS here: peers are found by IP
    procs = {name_of(p): start_init(sandbox, name_of(p), tmp_path / name_of(p), *extra, "--address", "ip",
                                    "--timeout", "30") for p in pods}
    for name, proc in procs.items():
        code, err = finish(proc, timeout=60)
        assert code == 0, err
        env = (tmp_path / name / "torch.env").read_text()
        assert "export WORLD_SIZE=" in env and "export NNODES='3'" in env
    ranks = sorted(int(dict(line.split("=", 1) for line in (tmp_path / n / "torch.env").read_text()
                            .replace("export ", "").replace("'", "").splitlines() if "=" in line)["NODE_RANK"])
                   for n in procs)
    assert ranks == [0, 1, 2]
