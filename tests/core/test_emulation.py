"""The pods each controller makes from the shipped example manifests, as core/emulation makes them: names,
labels, the chain of controller owners up to the job, hostname and subdomain, and the controller's env, one row
per controller (the conventions as each module's docstring cites them)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.core.emulation import emulate, is_job
from agent.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
SUFFIX = "[bcdfghjklmnpqrstvwxz2456789]{5}"


def job_of(name: str) -> dict[str, Any]:
    return next(d for d in yaml.safe_load_all((ROOT / "manifests" / "examples" / name).read_text())
                if d and is_job(d))


def trainjob(runtime: str, nodes: int = 2) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    shipped = yaml.safe_load((ROOT / "manifests" / "trainer" / f"{runtime}.yaml").read_text())
    job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "t"},
           "spec": {"runtimeRef": {"name": runtime}, "trainer": {"numNodes": nodes}}}
    return job, [shipped]


def chain(pod: dict[str, Any], objects: list[dict[str, Any]]) -> list[str]:
    """The kinds of the controller owners from the pod up, each reference checked against its object's uid."""
    by_uid = {o["metadata"]["uid"]: o for o in objects}
    kinds, at = [], pod
    while at["metadata"].get("ownerReferences"):
        (ref,) = [r for r in at["metadata"]["ownerReferences"] if r.get("controller")]
        owner = by_uid[ref["uid"]]
        assert (owner["kind"], owner["metadata"]["name"]) == (ref["kind"], ref["name"])
        assert ref["apiVersion"] == owner["apiVersion"] and ref["blockOwnerDeletion"] is True
        kinds.append(ref["kind"])
        at = owner
    return kinds


def env(pod: dict[str, Any], container: int = 0) -> dict[str, str]:
    return {e["name"]: e.get("value", "(ref)") for e in pod["spec"]["containers"][container].get("env") or []}


# manifest, the pods' names (a regex where the controller adds a random suffix), the pod looked at, its owners'
# kinds up to the job, its hostname.subdomain, labels it has, env it has (in this order, among its container's).
ROWS = [
    ("volcano-job.yaml", ["demo-master-0", "demo-worker-0", "demo-worker-1", "demo-worker-2", "demo-extras-0",
                          "demo-extras-1"], 1, ["Job"], "demo-worker-0.demo",
     {"volcano.sh/job-name": "demo", "volcano.sh/task-spec": "worker", "volcano.sh/task-index": "0",
      "volcano.sh/queue-name": "default"},
     [("MASTER_ADDR", "demo-master-0.demo"), ("MASTER_PORT", "23456"), ("WORLD_SIZE", "4"), ("RANK", "1"),
      ("VC_MASTER_HOSTS", "(ref)"), ("VC_EXTRAS_NUM", "(ref)"), ("VC_TASK_INDEX", "0")]),
    ("pytorchjob.yaml", ["mnist-master-0", "mnist-worker-0", "mnist-worker-1", "mnist-worker-2"], 2,
     ["PyTorchJob"], None,
     {"training.kubeflow.org/job-name": "mnist", "training.kubeflow.org/replica-type": "worker",
      "training.kubeflow.org/replica-index": "1", "training.kubeflow.org/operator-name": "pytorchjob-controller"},
     [("PYTHONUNBUFFERED", "1"), ("MASTER_PORT", "23456"), ("MASTER_ADDR", "mnist-master-0"), ("WORLD_SIZE", "4"),
      ("RANK", "2"), ("PET_NODE_RANK", "2"), ("PET_NPROC_PER_NODE", "auto"), ("PET_NNODES", "4")]),
    ("elastic-pytorchjob.yaml", ["elastic-worker-0", "elastic-worker-1", "elastic-worker-2"], 0, ["PyTorchJob"],
     None, {"training.kubeflow.org/replica-type": "worker"},
     [("PYTHONUNBUFFERED", "1"), ("PET_RDZV_ENDPOINT", "elastic-worker-0:23456"), ("PET_RDZV_BACKEND", "c10d"),
      ("PET_NNODES", "2:4"), ("PET_MAX_RESTARTS", "10")]),
    ("tfjob.yaml", ["mnist-tf-chief-0", "mnist-tf-worker-0", "mnist-tf-worker-1", "mnist-tf-ps-0"], 0, ["TFJob"],
     None, {"training.kubeflow.org/job-role": "master", "training.kubeflow.org/operator-name": "tfjob-controller"},
     [("TF_CONFIG", '{"cluster":{"chief":["mnist-tf-chief-0.default.svc:2222"],"ps":["mnist-tf-ps-0.default.svc:'
                    '2222"],"worker":["mnist-tf-worker-0.default.svc:2222","mnist-tf-worker-1.default.svc:2222"]},'
                    '"task":{"type":"chief","index":0},"environment":"cloud"}')]),
    ("xgboostjob.yaml", ["xgb-master-0", "xgb-worker-0", "xgb-worker-1"], 1, ["XGBoostJob"], None,
     {"training.kubeflow.org/replica-type": "worker"},
     [("MASTER_PORT", "9999"), ("MASTER_ADDR", "xgb-master-0"), ("WORLD_SIZE", "3"), ("RANK", "1"),
      ("WORKER_ADDRS", "xgb-worker-0,xgb-worker-1")]),
    ("paddlejob.yaml", ["paddle-worker-0", "paddle-worker-1", "paddle-worker-2"], 1, ["PaddleJob"], None,
     {"training.kubeflow.org/operator-name": "paddlejob-controller"},
     [("PADDLE_JOB_ID", "paddle"), ("PADDLE_NNODES", "3"), ("PADDLE_MASTER", "paddle-worker-0:36543")]),
    ("jaxjob.yaml", ["jax-worker-0", "jax-worker-1", "jax-worker-2"], 2, ["JAXJob"], None,
     {"training.kubeflow.org/operator-name": "jaxjob-controller"},
     [("COORDINATOR_PORT", "6666"), ("COORDINATOR_ADDRESS", "jax-worker-0"), ("NUM_PROCESSES", "3"),
      ("PROCESS_ID", "2")]),
    ("mpijob.yaml", [f"allreduce-launcher-{SUFFIX}", "allreduce-worker-0", "allreduce-worker-1",
                     "allreduce-worker-2"], 0, ["Job", "MPIJob"], "allreduce-launcher.allreduce",
     {"training.kubeflow.org/job-role": "launcher", "training.kubeflow.org/operator-name": "mpi-operator",
      "batch.kubernetes.io/job-name": "allreduce-launcher"},
     [("K_MPI_JOB_ROLE", "launcher"), ("OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile"),
      ("OMPI_MCA_orte_set_default_slots", "2")]),
    ("jobset.yaml", [f"trainer-driver-0-0-{SUFFIX}", f"trainer-workers-0-0-{SUFFIX}", f"trainer-workers-0-1-{SUFFIX}",
                     f"trainer-workers-1-0-{SUFFIX}", f"trainer-workers-1-1-{SUFFIX}"], 3, ["Job", "JobSet"],
     "trainer-workers-1-0.trainer",
     {"jobset.sigs.k8s.io/jobset-name": "trainer", "jobset.sigs.k8s.io/replicatedjob-name": "workers",
      "jobset.sigs.k8s.io/job-index": "1", "jobset.sigs.k8s.io/job-global-index": "2",
      "batch.kubernetes.io/job-completion-index": "0", "batch.kubernetes.io/job-name": "trainer-workers-1"},
     [("JOB_COMPLETION_INDEX", "(ref)")]),
    ("leaderworkerset.yaml", ["vllm-0", "vllm-0-1", "vllm-0-2", "vllm-0-3", "vllm-1", "vllm-1-1", "vllm-1-2",
                              "vllm-1-3"], 6, ["StatefulSet", "Pod", "StatefulSet", "LeaderWorkerSet"],
     "vllm-1-2.vllm",
     {"leaderworkerset.sigs.k8s.io/name": "vllm", "leaderworkerset.sigs.k8s.io/group-index": "1",
      "leaderworkerset.sigs.k8s.io/worker-index": "2"},
     [("LWS_LEADER_ADDRESS", "vllm-1.vllm.default"), ("LWS_GROUP_SIZE", "4"), ("LWS_WORKER_INDEX", "2")]),
    ("indexed-job.yaml", [f"sweep-0-{SUFFIX}", f"sweep-1-{SUFFIX}", f"sweep-2-{SUFFIX}"], 1, ["Job"], "sweep-1.sweep",
     {"batch.kubernetes.io/job-completion-index": "1", "batch.kubernetes.io/job-name": "sweep", "job-name": "sweep"},
     [("JOB_COMPLETION_INDEX", "(ref)")]),
    ("deepspeed-job.yaml", [f"ds-0-{SUFFIX}", f"ds-1-{SUFFIX}", f"ds-2-{SUFFIX}"], 0, ["Job"], "ds-0.ds",
     {"batch.kubernetes.io/job-completion-index": "0"}, [("JOB_COMPLETION_INDEX", "(ref)")]),
]


@pytest.mark.parametrize(("manifest", "names", "at", "owners", "dns", "labels", "written"), ROWS,
                         ids=[r[0] for r in ROWS])
def test_the_controllers_pods_follow_its_conventions(manifest, names, at, owners, dns, labels, written):
    job = job_of(manifest)
    emulation = emulate(job)
    pods = list(emulation.pods)
    assert len(pods) == len(names)
    for pod, name in zip(pods, names, strict=True):
        assert re.fullmatch(name, pod["metadata"]["name"]), (pod["metadata"]["name"], name)
        assert pod["status"] == {"phase": "Pending"} and "nodeName" not in pod["spec"]
    pod = pods[at]
    assert chain(pod, [emulation.job, *emulation.owners, *pods]) == owners
    spec = pod["spec"]
    assert (f"{spec['hostname']}.{spec['subdomain']}" if "subdomain" in spec else None) == dns
    assert labels.items() <= pod["metadata"]["labels"].items()
    have = env(pod)
    assert [(k, have.get(k)) for k, _ in written] == written
    positions = [list(have).index(k) for k, _ in written]
    assert positions == sorted(positions)  # in the controller's order
    assert emulate(job) == emulation  # the same manifest gives the same objects


@pytest.mark.parametrize(("runtime", "names", "plugin_env"), [
    ("torch-distributed-topology", [f"t-node-0-0-{SUFFIX}", f"t-node-0-1-{SUFFIX}"],
     [("PET_NNODES", "2"), ("PET_NPROC_PER_NODE", "1"), ("PET_MASTER_ADDR", "t-node-0-0.t"),
      ("PET_MASTER_PORT", "29500")]),
    ("jax-distributed-topology", [f"t-node-0-0-{SUFFIX}", f"t-node-0-1-{SUFFIX}"],
     [("JAX_NUM_PROCESSES", "2"), ("JAX_COORDINATOR_ADDRESS", "t-node-0-0.t:29500")]),
    ("xgboost-distributed-topology", [f"t-node-0-0-{SUFFIX}", f"t-node-0-1-{SUFFIX}"],
     [("DMLC_TRACKER_URI", "t-node-0-0.t"), ("DMLC_NUM_WORKER", "2")]),
    ("deepspeed-distributed-topology", [f"t-node-0-0-{SUFFIX}", f"t-launcher-0-0-{SUFFIX}"], []),
])
def test_a_trainjob_makes_its_jobset_from_its_runtime(runtime, names, plugin_env):
    job, runtimes = trainjob(runtime)
    emulation = emulate(job, runtimes=runtimes)
    kinds = [(o["kind"], o["metadata"]["name"]) for o in emulation.owners]
    assert kinds[0] == ("JobSet", "t") and all(k == "Job" for k, _ in kinds[1:])
    assert [re.fullmatch(n, p["metadata"]["name"]) is not None for p, n in
            zip(emulation.pods, names, strict=True)] == [True] * len(names)
    pod = emulation.pods[0]
    assert chain(pod, [emulation.job, *emulation.owners]) == ["Job", "JobSet", "TrainJob"]
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("t-node-0-0", "t")
    node = next(c for c in pod["spec"]["containers"] if c["name"] == "node")
    have = {e["name"]: e.get("value") for e in node.get("env") or []}
    assert [(k, have.get(k)) for k, _ in plugin_env] == plugin_env


def test_the_jobs_own_uid_is_the_one_its_pods_name():
    job = job_of("pytorchjob.yaml")
    job["metadata"].update(uid="1111-2222", namespace="team-a")
    pods = emulate(job).pods
    assert {(p["metadata"]["namespace"], p["metadata"]["ownerReferences"][0]["uid"]) for p in pods} == \
        {("team-a", "1111-2222")}


@pytest.mark.parametrize(("change", "said"), [
    (lambda j: j.update(kind="Deployment", apiVersion="apps/v1"), "Deployment 'mnist' (apps/v1) is not a job"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas=-1), "replicas is -1"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"].pop("template"), "Worker.template is not a pod template"),
    (lambda j: j["spec"].pop("pytorchReplicaSpecs"), "spec.pytorchReplicaSpecs is missing"),
], ids=["unknown kind", "negative replicas", "no template", "no replica specs"])
def test_a_manifest_the_controller_would_refuse_is_one_line(change, said):
    job = job_of("pytorchjob.yaml")
    change(job)
    with pytest.raises(InputError, match=re.escape(said)):
        emulate(job)


def test_volcano_refuses_two_tasks_of_one_name_and_a_job_not_indexed_is_refused():
    job = job_of("volcano-job.yaml")
    job["spec"]["tasks"][2]["name"] = "worker"
    with pytest.raises(InputError, match="two tasks share a name"):
        emulate(job)
    indexed = job_of("indexed-job.yaml")
    indexed["spec"].pop("completionMode")
    with pytest.raises(InputError, match="completionMode: Indexed"):
        emulate(indexed)
    tj, _ = trainjob("torch-distributed-topology")
    with pytest.raises(InputError, match="pass it with --runtime"):
        emulate(tj)


def test_training_operators_defaults_and_init_container_are_in_the_pods():
    """The defaulter's port on the kind's container, and PyTorchJob's init-pytorch after the template's init
    containers on each worker (not on the master, nor without a master)."""
    elastic = emulate(job_of("elastic-pytorchjob.yaml")).pods[0]
    trainer = next(c for c in elastic["spec"]["containers"] if c["name"] == "pytorch")
    assert {"name": "pytorchjob-port", "containerPort": 23456, "protocol": "TCP"} in trainer["ports"]
    assert [c["name"] for c in elastic["spec"]["initContainers"]] == ["topology-agent", "topology-sidecar"]
    pods = emulate(job_of("pytorchjob.yaml")).pods
    assert [[c["name"] for c in p["spec"]["initContainers"]] for p in pods] == \
        [["topology-agent"]] + [["topology-agent", "init-pytorch"]] * 3
    assert "nslookup mnist-master-0;" in pods[1]["spec"]["initContainers"][1]["command"][2]


def test_an_mpijob_launcher_has_the_operators_volumes_and_its_workers_run_sshd():
    emulation = emulate(job_of("mpijob.yaml"))
    (launcher_job,) = emulation.owners
    assert launcher_job["metadata"]["labels"] == {"app": "allreduce"}
    launcher, worker = emulation.pods[0], emulation.pods[1]
    volumes = {v["name"]: v for v in launcher["spec"]["volumes"]}
    assert volumes["mpi-job-config"]["configMap"]["name"] == "allreduce-config"
    assert volumes["ssh-auth"]["secret"]["secretName"] == "allreduce-ssh"
    mounts = {m["name"]: m["mountPath"] for m in launcher["spec"]["containers"][0]["volumeMounts"]}
    assert (mounts["mpi-job-config"], mounts["ssh-auth"]) == ("/etc/mpi", "/root/.ssh")
    assert worker["spec"]["dnsConfig"]["searches"] == ["allreduce.default.svc.cluster.local"]


def test_a_jobsets_pods_carry_its_uid_and_group():
    emulation = emulate(job_of("jobset.yaml"))
    labels = emulation.pods[4]["metadata"]["labels"]
    assert labels["jobset.sigs.k8s.io/jobset-uid"] == emulation.job["metadata"]["uid"]
    assert (labels["jobset.sigs.k8s.io/group-name"], labels["jobset.sigs.k8s.io/group-replicas"],
            labels["jobset.sigs.k8s.io/job-group-index"]) == ("default", "3", "2")
    assert emulation.pods[4]["metadata"]["annotations"]["jobset.sigs.k8s.io/job-group-index"] == "2"


def test_volcanos_plugins_write_init_containers_mount_the_hosts_and_open_the_port():
    job = job_of("volcano-job.yaml")
    pod = emulate(job).pods[4]  # demo-extras-0: not a training task
    agent = pod["spec"]["initContainers"][0]
    assert [e["name"] for e in agent["env"]][-8:] == [  # env and svc write init containers; pytorch does not
        "VC_MASTER_HOSTS", "VC_MASTER_NUM", "VC_WORKER_HOSTS", "VC_WORKER_NUM", "VC_EXTRAS_HOSTS", "VC_EXTRAS_NUM",
        "VK_TASK_INDEX", "VC_TASK_INDEX"]
    assert {"name": "demo-svc", "mountPath": "/etc/volcano"} in pod["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "demo-svc", "configMap": {"name": "demo-svc"}} in pod["spec"]["volumes"]
    assert {"name": "pytorchjob-port", "containerPort": 23456, "protocol": "TCP"} in pod["spec"]["containers"][0][
        "ports"]
    assert "RANK" not in env(pod) and env(pod)["WORLD_SIZE"] == "4"  # the pytorch plugin's, on every pod
    assert pod["spec"]["schedulerName"] == "volcano"
    job["spec"]["plugins"] = {"mpi": ["--master=master", "--worker=worker"]}  # mpi turns svc on
    master = emulate(job).pods[0]
    assert env(master)["MPI_HOST"] == "demo-worker-0.demo,demo-worker-1.demo,demo-worker-2.demo"
    assert (master["spec"]["hostname"], master["spec"]["subdomain"]) == ("demo-master-0", "demo")
    assert "MPI_HOST" in {e["name"] for e in master["spec"]["initContainers"][0]["env"]}


@pytest.mark.parametrize(("trainer", "nproc"), [
    ({"resourcesPerNode": {"limits": {"nvidia.com/gpu": 2}}}, "auto"),  # GPUs: torchrun counts them
    ({"resourcesPerNode": {"requests": {"cpu": "2500m"}, "limits": {"cpu": "8"}}}, "3"),  # requests, rounded up
    ({"numProcPerNode": 4}, "4"),
], ids=["gpus", "cpus", "given"])
def test_a_trainjobs_processes_per_node_are_torch_plugins(trainer, nproc):
    job, runtimes = trainjob("torch-distributed-topology")
    job["spec"]["trainer"].update(trainer, image="me/train:1", env=[{"name": "LR", "value": "0.1"}])
    node = emulate(job, runtimes=runtimes).pods[0]["spec"]["containers"]
    container = next(c for c in node if c["name"] == "node")
    assert env({"spec": {"containers": [container]}})["PET_NPROC_PER_NODE"] == nproc
    assert container["image"] == "me/train:1" and env({"spec": {"containers": [container]}})["LR"] == "0.1"
