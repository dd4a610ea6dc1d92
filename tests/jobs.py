"""Jobs as the tests' clusters hold them, for the sandbox over HTTPS (tests/integration) and in memory (the fast
lane): both are a ``SandboxThread`` with the same helpers. And what the tests read of a pod's files."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import yaml

from agent import examples
from agent.runtime.demo import volcano_owner


def create_volcano_job(sandbox: Any, tasks=(("master", 1), ("worker", 3), ("extras", 1)), *,
                       with_ips: bool = True) -> list[dict[str, Any]]:
    owner = volcano_owner()
    owner["spec"]["tasks"] = [{"name": n, "replicas": r, "template": {}} for n, r in tasks]
    created = sandbox.create("batch.volcano.sh/v1alpha1/jobs", "default", owner)
    pods = examples.volcano_job("demo", tasks)
    for pod in pods:
        pod["metadata"]["ownerReferences"][0]["uid"] = created["metadata"]["uid"]
        if not with_ips:
            pod["status"] = {"phase": "Pending"}
        sandbox.create_pod(pod)
    return pods


def create_elastic_pytorchjob(sandbox: Any, name: str, *, low: int, high: int, replicas: int,
                              workers: int = 3) -> list[dict[str, Any]]:
    """An elastic PyTorchJob (c10d rendezvous, ``low`` to ``high`` workers, ``replicas`` asked for) in the sandbox,
    and the pods its operator makes for ``workers`` workers, owned by it: returned, not created."""
    owner = sandbox.create("kubeflow.org/v1/pytorchjobs", "default", {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
        "spec": {"elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": low, "maxReplicas": high},
                 "pytorchReplicaSpecs": {"Worker": {"replicas": replicas}}}})
    pods = examples.pytorchjob(name, workers=workers, master=False, elastic=(low, high))
    for pod in pods:
        pod["metadata"]["ownerReferences"][0]["uid"] = owner["metadata"]["uid"]
    return pods


def ssh_secret(directory: Path, job: str = "demo") -> Path:
    """``job``'s SSH Secret as its pods mount it (``topology-agent keygen``), in ``directory``."""
    from agent.ssh.material import generate_secret_manifest

    directory.mkdir(mode=0o700, parents=True)
    for key, value in yaml.safe_load(generate_secret_manifest(job, "default"))["data"].items():
        (directory / key).write_bytes(base64.b64decode(value))
        (directory / key).chmod(0o400)
    return directory


def on_nodes_of_their_own(sandbox: Any, pods: list[dict[str, Any]]) -> None:
    """Pod k of ``pods`` scheduled on Node ``node-k``, each Node created without labels."""
    for k, pod in enumerate(pods):
        sandbox.create_node(examples.node(f"node-{k}", {}))
        sandbox.update_pod("default", pod["metadata"]["name"],
                           lambda p, k=k: p["spec"].__setitem__("nodeName", f"node-{k}"))


def add_worker(sandbox: Any, index: int, ip_index: int) -> None:
    pod = examples.volcano_job("demo", (("master", 1), ("worker", index + 1)))[-1]
    pod["status"].update(podIP=examples.loopback_ip(ip_index), podIPs=[{"ip": examples.loopback_ip(ip_index)}])
    sandbox.create_pod(pod)


def rogue(name: str, role: str, index: int, ip: int) -> dict[str, Any]:
    """A pod someone else created with the job's labels: no ownerReference to the job."""
    pod = examples.volcano_job("demo", (("master", 1), ("worker", 1)))[1]
    pod["metadata"]["name"] = name
    pod["metadata"]["labels"].update({"volcano.sh/task-spec": role, "volcano.sh/task-index": str(index)})
    pod["metadata"].pop("ownerReferences")
    pod["spec"]["hostname"] = name
    pod["status"].update(podIP=examples.loopback_ip(ip), podIPs=[{"ip": examples.loopback_ip(ip)}])
    return pod


def forge_publication(sandbox: Any, pods: list[dict[str, Any]], *, writer: str, writer_uid: str,
                      forged_ip: str = "127.9.9.9") -> None:
    """`demo-topology`, its journal and its summary, made before the job's leader publishes, by ``writer`` (the
    admission policy binds data.leader and data.leaderUid to the writer's token, not to the job)."""
    from agent.core import Options
    from agent.core.plan.layout import build_plan
    from agent.core.publication.journal import JOURNAL_KEY, PublishedState, Publisher, journal_body, summary_name
    from agent.core.publication.published import configmap_body, configmap_name, pack
    from agent.core.publication.summary import SUMMARY_KEY, summarize, summary_text

    forged_pods = copy.deepcopy(pods)
    for pod in forged_pods:
        pod["status"].update(podIP=forged_ip, podIPs=[{"ip": forged_ip}])
    forger = Publisher(PublishedState(job="demo", namespace="default"), Options(address="ip"), leader=writer,
                       leader_uid=writer_uid)
    forger.change({p["metadata"]["name"]: p for p in forged_pods}, [p["metadata"]["name"] for p in forged_pods])
    sandbox.create("/v1/configmaps", "default", configmap_body(
        configmap_name("demo"), pack(forger.snapshot_document()), generation=forger.state.seq, leader=writer,
        leader_uid=writer_uid, owner=None))
    forger.start_from_snapshot()
    sandbox.create("/v1/configmaps", "default", journal_body(configmap_name("demo"), forger.journal_data(),
                                                             owner=None))
    seq = str(forger.state.seq)
    data = {**forger.journal_data(), "base": seq, JOURNAL_KEY: "[]"}  # what a follower in its own view reads
    data[SUMMARY_KEY] = summary_text(summarize(build_plan(forged_pods, writer if writer in {
        p["metadata"]["name"] for p in forged_pods} else forged_pods[0]["metadata"]["name"], Options(address="ip")),
        seq=forger.state.seq) or {})
    sandbox.create("/v1/configmaps", "default", journal_body(configmap_name("demo"), data, owner=None,
                                                             name=summary_name(configmap_name("demo"))))


def configmap(sandbox: Any, name: str) -> dict[str, Any]:
    return sandbox.sandbox.store.get("/v1/configmaps", "default", name)


def policy_admits(sandbox: Any, operation: str, writer: str, obj: dict[str, Any], old: dict[str, Any] | None) -> bool:
    """What manifests/policy says of the agent's real write ``obj`` (over ``old``) by pod ``writer``'s bound token,
    evaluated by a real CEL engine (tests/vap.py); Deny is raised with the policy's message."""
    from tests.vap import Policy, agent_request

    pod = sandbox.sandbox.store.get("/v1/pods", "default", writer)
    request = agent_request(operation, namespace="default", pod=writer, pod_uid=pod["metadata"]["uid"],
                            name=obj["metadata"]["name"])
    return Policy().admit(request, obj, old)


def generation(out: Path) -> int:
    try:
        return int((out / "generation").read_text())
    except (OSError, ValueError):
        return 0


def world(out: Path) -> tuple[str, str]:
    env = json.loads((out / "topology.json").read_text())["env"]
    return env["WORLD_SIZE"], env["MASTER_ADDR"]


# --- a TrainJob on Trainer's DeepSpeed runtime (Trainer v2.3.0's manifests/base/runtimes/deepspeed_distributed.yaml:
# mlPolicy.mpi with runLauncherAsNode, replicated job ``node``, then ``launcher`` that dependsOn node Ready) ---

TRAINJOB = "ds"


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
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": TRAINJOB},
        "spec": {"runtimeRef": {"name": "deepspeed-distributed"}, "trainer": {"numNodes": num_nodes}}})
    nodes = num_nodes - 1 if as_node else num_nodes
    sandbox.create("jobset.x-k8s.io/v1alpha2/jobsets", "default", {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": TRAINJOB, "ownerReferences": [
            {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": TRAINJOB,
             "uid": trainjob["metadata"]["uid"], "controller": True}]},
        "spec": {"replicatedJobs": [
            {"name": "node", "replicas": 1, "template": {"spec": {"parallelism": nodes, "completions": nodes}}},
            {"name": "launcher", "replicas": 1, "dependsOn": [{"name": "node", "status": "Ready"}],
             "template": {"spec": {"parallelism": 1, "completions": 1}}}]}})
    pods = examples.trainjob_mpi(TRAINJOB, num_nodes)
    if not as_node:
        pods = examples.trainjob_mpi(TRAINJOB, num_nodes + 1)
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
