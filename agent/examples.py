"""Example jobs: the pods each controller creates, shaped as the API server returns them.

Used by ``examples/*.json`` (regenerate with ``python -m agent.examples examples``), by the tests, and by
``demo``. Labels, names, hostnames and the env the controllers inject follow the controllers' own code, so
the examples exercise the same traps real pods do (Volcano's WORLD_SIZE in a non-training task, for one). The
label keys the agent reads and the job objects' kinds come from the controllers' modules (core/controllers/);
the rest is data as each controller writes it.
Pod IPs are loopback addresses so that anything started from these examples stays on this machine.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agent.core.controllers.base import COMPLETION_INDEX, JOB_NAME, JobResource
from agent.core.controllers.batch import JOBS
from agent.core.controllers.jobset import JOBSET_GLOBAL_INDEX, JOBSET_JOB_INDEX, JOBSET_NAME, JOBSET_RJOB
from agent.core.controllers.kubeflow import (
    JAXJOBS,
    MPI_JOB_ROLE,
    MPI_OPERATOR,
    MPI_OPERATOR_NAME,
    MPIJOBS,
    OPERATORS,
    PADDLEJOBS,
    PYTORCHJOB_INDEX,
    PYTORCHJOB_JOB,
    PYTORCHJOB_TYPE,
    PYTORCHJOBS,
    TFJOBS,
    XGBOOSTJOBS,
)
from agent.core.controllers.lws import LWS_GROUP, LWS_NAME, LWS_SIZE, LWS_WORKER
from agent.core.controllers.volcano import VCJOB, VOLCANO_INDEX, VOLCANO_JOB, VOLCANO_TASK
from agent.core.emulation.objects import suffix_for, uid_for
from agent.core.emulation.placing import loopback_address
from agent.core.injected import injected_env
from agent.core.model import RawEnvVar

Pod = dict[str, Any]
AGENT_IMAGE = "ghcr.io/example/topology-agent:0.1.0"


def owner_uid(kind: str, namespace: str, name: str) -> str:
    """The uid these examples give a job object (``vcjob``, ``pytorchjob``, ``mpijob``, ``job``): the owner
    object a test creates carries it, as the pods' ownerReferences do."""
    return _uid(kind, namespace, name)


def _kind(resource: JobResource) -> dict[str, str]:
    """An ownerReference's kind, as the controller's module names its job object."""
    return {"apiVersion": resource.api_version, "kind": resource.kind}


# uids, generateName suffixes and pod addresses as core/emulation derives them (one rule for both)
_uid = uid_for
_suffix = suffix_for
loopback_ip = loopback_address


def agent_init_container() -> dict[str, Any]:
    return {
        "name": "topology-agent",
        "image": AGENT_IMAGE,
        "args": ["init", "--out", "/shared"],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        ],
        "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
    }


def trainer_container(name: str = "trainer", *, env: Sequence[Mapping[str, Any]] | None = None,
                      cpu: str | None = "2", gpus: int = 0, port: int | None = None,
                      port_name: str = "pytorchjob-port") -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if cpu is not None:
        limits["cpu"] = cpu
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    container: dict[str, Any] = {
        "name": name,
        "image": "ghcr.io/example/pytorch-trainer:2.13",
        "command": ["bash", "-c", ". /shared/torch.env && exec torchrun train.py"],
        "env": env or [],
        "resources": {"limits": limits, "requests": dict(limits)},
        "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
    }
    if port is not None:
        container["ports"] = [{"name": port_name, "containerPort": port, "protocol": "TCP"}]
    return container


def container_statuses(containers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every container running and ready, as the kubelet reports it."""
    return [{"name": c.get("name", ""), "ready": True, "restartCount": 0, "started": True, "image": c.get("image", ""),
             "state": {"running": {"startedAt": "2026-11-22T00:00:10Z"}}} for c in containers]


def make_pod(name: str, *, namespace: str = "default", labels: dict[str, str],
             annotations: dict[str, str] | None = None, hostname: str | None = None,
             subdomain: str | None = None, ip: str | None, phase: str = "Running",
             containers: list[dict[str, Any]] | None = None, owner: dict[str, Any] | None = None,
             terminating: bool = False) -> Pod:
    """A Pod as the API server returns it (the fields the agent reads, plus the usual metadata)."""
    spec: dict[str, Any] = {
        "initContainers": [agent_init_container()],
        "containers": containers or [trainer_container()],
        "volumes": [{"name": "shared", "emptyDir": {}}],
        "restartPolicy": "Never",
    }
    if hostname:
        spec["hostname"] = hostname
    if subdomain:
        spec["subdomain"] = subdomain
    status: dict[str, Any] = {"phase": phase if ip or phase != "Running" else "Pending"}
    if ip:
        status.update(podIP=ip, podIPs=[{"ip": ip}], hostIP="127.0.0.1")
    if status["phase"] == "Running":  # as the kubelet reports a pod whose containers run (kubectl's READY 1/1)
        status["containerStatuses"] = container_statuses(spec["containers"])
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": _uid("pod", namespace, name),
        "labels": labels,
        "annotations": annotations or {},
        "creationTimestamp": "2026-11-22T00:00:00Z",
    }
    if owner:
        metadata["ownerReferences"] = [{**owner, "controller": True, "blockOwnerDeletion": True}]
    if terminating:
        metadata["deletionTimestamp"] = "2026-11-22T00:05:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


def volcano_job(name: str = "demo", tasks: tuple[tuple[str, int], ...] = (("master", 1), ("worker", 3), ("extras", 4)),
                *, namespace: str = "default", ip_base: int = 0, master_port: int = 23456,
                cpu: str = "1", release: str = "v1.15.0", plugins: tuple[str, ...] = ("pytorch", "svc", "env"),
                user_env: list[dict[str, Any]] | None = None, tf_port: int = 2222) -> list[Pod]:
    """A Volcano Job with job plugins (default ``{pytorch: [], svc: [], env: []}``), each appending its block
    to every container in ``plugins`` order (Volcano's is a Go map's: any order), from ``agent.core.injected``.
    ``user_env`` is the template's own env, before the plugins' blocks."""
    owner = {**_kind(VCJOB), "name": name,
             "uid": _uid("vcjob", namespace, name)}
    world = sum(n for task, n in tasks if task in ("master", "worker"))
    tf_config = _volcano_tf_config(name, tasks, tf_port)
    pods, n = [], ip_base
    for task, replicas in tasks:
        for i in range(replicas):
            pod_name = f"{name}-{task}-{i}"
            features = {f"plugin {p}" for p in plugins} | ({"training task"} if task in ("master", "worker") else set())
            if len(tasks) == 1 and replicas == 1:
                features.discard("plugin tensorflow")  # OnPodCreate: no TF_CONFIG for a stand-alone job
            facts = {"plugin_order": plugins, "tasks": [t for t, _ in tasks], "job": name, "index": i,
                     "port": master_port, "replicas": world, "rank": i + 1 if task == "worker" else 0,
                     "tf_config": tf_config(task, i) if "tensorflow" in plugins else None}
            injected = [*(user_env or []), *injected_env("volcano", release, features, facts)]
            labels = {VOLCANO_JOB: name, "volcano.sh/job-namespace": namespace,
                      "volcano.sh/queue-name": "default", VOLCANO_TASK: task,
                      VOLCANO_INDEX: str(i)}
            annotations = {"scheduling.k8s.io/group-name": f"{name}-{owner['uid']}", VOLCANO_JOB: name,
                           VOLCANO_TASK: task, VOLCANO_INDEX: str(i), "volcano.sh/job-version": "0"}
            pods.append(make_pod(
                pod_name, namespace=namespace, labels=labels, annotations=annotations, hostname=pod_name,
                subdomain=name, ip=loopback_ip(n), owner=owner,
                containers=[trainer_container(env=injected, port=master_port, cpu=cpu)],
            ))
            n += 1
    return pods


def pytorchjob(name: str = "mnist", workers: int = 3, *, namespace: str = "default", gpus: int = 0,
               ip_base: int = 0, release: str = "v1.9.0", master: bool = True,
               elastic: tuple[int, int] | None = None, nproc_per_node: str | None = None) -> list[Pod]:
    """A Kubeflow PyTorchJob (training-operator ``release``): a master (unless ``master=False``), N workers, one
    Service per replica; the env the operator appends comes from ``agent.core.injected``."""
    owner = {**_kind(PYTORCHJOBS), "name": name,
             "uid": _uid("pytorchjob", namespace, name)}
    features = {f for f, on in (("master", master), ("elastic", elastic), ("nprocPerNode", nproc_per_node)) if on}
    replicas = workers + (1 if master else 0)
    nproc_int = int(nproc_per_node) if nproc_per_node and nproc_per_node.isdigit() else 1
    pods, n = [], ip_base
    for rtype, count in (("master", 1 if master else 0), ("worker", workers)):
        for i in range(count):
            facts = {"port": 23456, "master": f"{name}-master-0", "replicas": replicas,
                     "world": replicas * nproc_int, "rank": i + 1 if rtype == "worker" else 0,
                     "nproc": nproc_per_node, "rdzv_host": f"{name}-worker-0", "rdzv_port": 23456,
                     "min": elastic[0] if elastic else 0, "max": elastic[1] if elastic else 0}
            injected = injected_env("pytorchjob", release, features, facts)
            labels = {PYTORCHJOB_JOB: name, MPI_OPERATOR_NAME:
                      "pytorchjob-controller", PYTORCHJOB_TYPE: rtype,
                      PYTORCHJOB_INDEX: str(i)}
            if rtype == "master":
                labels[MPI_JOB_ROLE] = "master"
            pods.append(make_pod(
                f"{name}-{rtype}-{i}", namespace=namespace, labels=labels, ip=loopback_ip(n), owner=owner,
                containers=[trainer_container("pytorch", env=injected, port=23456, gpus=gpus,
                                              cpu="4" if not gpus else "8")],
            ))
            n += 1
    return pods


def _volcano_tf_config(job: str, tasks: tuple[tuple[str, int], ...], port: int) -> Callable[[str, int], str]:
    """TF_CONFIG as Volcano's tensorflow plugin writes it with its default task names: cluster keys ps, worker,
    chief, evaluator (its struct's order, empty ones left out), each ``<job>-<task>-<i>.<job>:<port>``
    (tensorflow.go generateTFClusterSpec; helpers.go MakeDomainName). The cluster is the job's, encoded once: a
    pod's TF_CONFIG adds only its task."""
    cluster = json.dumps({kind: [f"{job}-{kind}-{i}.{job}:{port}" for i in range(n)]
                          for kind in ("ps", "worker", "chief", "evaluator") for name, n in tasks
                          if name == kind and n}, separators=(",", ":"))

    def spelled(task: str, index: int) -> str:
        return f'{{"cluster":{cluster},"task":{json.dumps({"type": task, "index": index}, separators=(",", ":"))}}}'
    return spelled


def _operator_pods(name: str, resource: JobResource, container: str, specs: tuple[tuple[str, int], ...], *,
                   namespace: str, ip_base: int, cpu: str, gpus: int, port: tuple[str, int],
                   env: Callable[[str, int], list[RawEnvVar]], master: Callable[[str, int], bool]) -> list[Pod]:
    """The pods training-operator v1.9 creates for a job of ``resource``'s kind: one per replica, named and
    labelled by createNewPod (pkg/controller.v1/common/pod.go), owned by the job, ``env(rtype, index)`` appended to
    the container the kind writes to."""
    owner = {**_kind(resource), "name": name, "uid": _uid(resource.kind.lower(), namespace, name)}
    pods, n = [], ip_base
    for rtype, count in specs:
        for i in range(count):
            labels = {PYTORCHJOB_JOB: name, MPI_OPERATOR_NAME: OPERATORS[resource.kind], PYTORCHJOB_TYPE: rtype,
                      PYTORCHJOB_INDEX: str(i)}
            if master(rtype, i):
                labels[MPI_JOB_ROLE] = "master"
            pods.append(make_pod(
                f"{name}-{rtype}-{i}", namespace=namespace, labels=labels, ip=loopback_ip(n), owner=owner,
                containers=[trainer_container(container, env=env(rtype, i), port=port[1], port_name=port[0],
                                              cpu=cpu, gpus=gpus)]))
            n += 1
    return pods


def tfjob(name: str = "mnist-tf", specs: tuple[tuple[str, int], ...] = (("chief", 1), ("worker", 2), ("ps", 1)), *,
          namespace: str = "default", ip_base: int = 0, port: int = 2222, cpu: str = "2",
          domain: str = "") -> list[Pod]:
    """A TFJob (training-operator v1.9): its replica types (lower-cased), TF_CONFIG in container ``tensorflow`` as
    genClusterSpec writes it (cluster keys sorted as Go marshals a map, ``<job>-<type>-<i>.<ns>.svc[.<domain>]:
    <port>``, the domain being the operator's CUSTOM_CLUSTER_DOMAIN; ``environment: cloud``), none for a one-pod
    job."""
    total = sum(n for _, n in specs)
    suffix = f".{domain}" if domain else ""
    cluster = {rtype: [f"{name}-{rtype}-{i}.{namespace}.svc{suffix}:{port}" for i in range(n)]
               for rtype, n in sorted(specs)}

    def env(rtype: str, i: int) -> list[RawEnvVar]:
        config = json.dumps({"cluster": cluster, "task": {"type": rtype, "index": i}, "environment": "cloud"},
                            separators=(",", ":"))
        return injected_env("tfjob", "v1.9.0", {"distributed"} if total > 1 else set(),
                            {"tf_config": config})

    chief = any(rtype in ("chief", "master") for rtype, _ in specs)
    return _operator_pods(name, TFJOBS, "tensorflow", specs, namespace=namespace, ip_base=ip_base, cpu=cpu,
                          gpus=0, port=("tfjob-port", port), env=env,
                          master=lambda r, i: r in ("chief", "master") if chief else (r == "worker" and i == 0))


def xgboostjob(name: str = "xgb", workers: int = 2, *, namespace: str = "default", ip_base: int = 0,
               port: int = 9999, cpu: str = "2", gpus: int = 0) -> list[Pod]:
    """An XGBoostJob (training-operator v1.9): a master and ``workers`` workers, every container with SetPodEnv's
    variables (RANK master 0, worker index + 1; WORKER_ADDRS of replicas - 1 workers)."""
    total = 1 + workers

    def env(rtype: str, i: int) -> list[RawEnvVar]:
        facts = {"port": port, "job": name, "replicas": total, "rank": i + 1 if rtype == "worker" else 0,
                 "worker_port": port, "worker_addrs": ",".join(f"{name}-worker-{k}" for k in range(total - 1))}
        return injected_env("xgboostjob", "v1.9.0", {"several replicas"} if total > 1 else set(),
                            facts)

    return _operator_pods(name, XGBOOSTJOBS, "xgboost", (("master", 1), ("worker", workers)), namespace=namespace,
                          ip_base=ip_base, cpu=cpu, gpus=gpus, port=("xgboostjob-port", port), env=env,
                          master=lambda r, i: r == "master")


def paddlejob(name: str = "paddle", workers: int = 3, *, masters: int = 0, namespace: str = "default",
              ip_base: int = 0, port: int = 36543, cpu: str = "2", gpus: int = 0) -> list[Pod]:
    """A PaddleJob (training-operator v1.9): ``workers`` workers (collective mode), and with ``masters`` its
    parameter servers (PS mode); setPodEnv's variables in every container."""
    specs = ((("master", masters),) if masters else ()) + (("worker", workers),)
    total = masters + workers
    host = "master" if masters else "worker"

    def env(rtype: str, i: int) -> list[RawEnvVar]:
        own = i == 0 and rtype == host
        features = {"the master's pod"} if own else set()
        if masters:
            features.add(f"ps mode, {rtype}")
        facts = {"job": name, "replicas": total,
                 "master": f"$(POD_IP_DUMMY):{port}" if own else f"{name}-{host}-0:{port}"}
        return injected_env("paddlejob", "v1.9.0", features, facts)

    return _operator_pods(name, PADDLEJOBS, "paddle", specs, namespace=namespace, ip_base=ip_base, cpu=cpu,
                          gpus=gpus, port=("master", port), env=env, master=lambda r, i: r == "master")


def jaxjob(name: str = "jax", workers: int = 3, *, namespace: str = "default", ip_base: int = 0,
           port: int = 6666, cpu: str = "2", gpus: int = 0) -> list[Pod]:
    """A JAXJob (training-operator v1.9): ``workers`` workers, setPodEnv's variables in every container (worker 0
    the coordinator, without a port)."""
    def env(rtype: str, i: int) -> list[RawEnvVar]:
        return injected_env("jaxjob", "v1.9.0", set(),
                            {"port": port, "job": name, "replicas": workers, "index": i})

    return _operator_pods(name, JAXJOBS, "jax", (("worker", workers),), namespace=namespace, ip_base=ip_base,
                          cpu=cpu, gpus=gpus, port=("jaxjob-port", port), env=env, master=lambda r, i: i == 0)


def mpijob(name: str = "allreduce", workers: int = 3, *, namespace: str = "default", ip_base: int = 0,
           cpu: str = "2", running: int | None = None) -> list[Pod]:
    """An MPIJob (MPI operator v2, OpenMPI): a launcher (a batch Job's pod) and N workers owned by the MPIJob,
    with the operator's labels, hostnames and env (pkg/controller/mpi_job_controller.go, v0.5.0-v0.8.0).
    ``running`` workers are Running, the rest Pending with an IP (still starting)."""
    mpi_owner = {**_kind(MPIJOBS), "name": name,
                 "uid": _uid("mpijob", namespace, name)}
    launcher_owner = {**_kind(JOBS), "name": f"{name}-launcher",
                      "uid": _uid("job", namespace, f"{name}-launcher")}
    base = {MPI_OPERATOR_NAME: MPI_OPERATOR, PYTORCHJOB_JOB: name}
    ompi = [{"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
            {"name": "OMPI_MCA_orte_default_hostfile", "value": "/etc/mpi/hostfile"},
            {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"},
            {"name": "OMPI_MCA_orte_set_default_slots", "value": "1"}]
    pods = [make_pod(
        f"{name}-launcher-{_suffix(name, 'launcher')}", namespace=namespace,
        labels={**base, MPI_JOB_ROLE: "launcher"}, hostname=f"{name}-launcher", subdomain=name,
        ip=loopback_ip(ip_base), owner=launcher_owner,
        containers=[trainer_container("launcher", env=[{"name": "K_MPI_JOB_ROLE", "value": "launcher"}, *ompi],
                                      cpu="1")],
    )]
    for i in range(workers):
        phase = "Running" if running is None or i < running else "Pending"
        pods.append(make_pod(
            f"{name}-worker-{i}", namespace=namespace,
            labels={**base, MPI_JOB_ROLE: "worker", PYTORCHJOB_INDEX: str(i)},
            hostname=f"{name}-worker-{i}", subdomain=name, ip=loopback_ip(ip_base + 1 + i), owner=mpi_owner,
            phase=phase, containers=[trainer_container("worker", env=[{"name": "K_MPI_JOB_ROLE", "value": "worker"}],
                                                       cpu=cpu)],
        ))
    return pods


def _jobset_pods(name: str, rjobs: tuple[tuple[str, int, int], ...], *, namespace: str, ip_base: int,
                 extra_labels: dict[str, dict[str, str]], container: str, phases: dict[str, str] | None = None,
                 env: Sequence[Mapping[str, Any]] | None = None) -> list[Pod]:
    pods, n, global_index = [], ip_base, 0
    global_replicas = sum(r for _, r, _ in rjobs)
    for rjob, replicas, parallelism in rjobs:
        for job_index in range(replicas):
            job_name = f"{name}-{rjob}-{job_index}"
            owner = {**_kind(JOBS), "name": job_name,
                     "uid": _uid("job", namespace, job_name)}
            for completion in range(parallelism):
                common = {
                    JOBSET_NAME: name, JOBSET_RJOB: rjob,
                    "jobset.sigs.k8s.io/replicatedjob-replicas": str(replicas),
                    "jobset.sigs.k8s.io/global-replicas": str(global_replicas),
                    JOBSET_JOB_INDEX: str(job_index),
                    JOBSET_GLOBAL_INDEX: str(global_index),
                    "jobset.sigs.k8s.io/restart-attempt": "0",
                    "jobset.sigs.k8s.io/job-key": hashlib.sha1(f"{namespace}/{job_name}".encode()).hexdigest(),
                }
                labels = {**common, **extra_labels.get(rjob, {}),
                          JOB_NAME: job_name, "job-name": job_name,
                          "batch.kubernetes.io/controller-uid": owner["uid"], "controller-uid": owner["uid"],
                          COMPLETION_INDEX: str(completion)}
                annotations = {**common, COMPLETION_INDEX: str(completion)}
                phase = (phases or {}).get(rjob, "Running")
                pods.append(make_pod(
                    f"{job_name}-{completion}-{_suffix(job_name, completion)}", namespace=namespace,
                    labels=labels, annotations=annotations, hostname=f"{job_name}-{completion}",
                    subdomain=name, ip=loopback_ip(n), owner=owner, phase=phase,
                    containers=[trainer_container(rjob if container == "@rjob" else container, env=env)],
                ))
                n += 1
            global_index += 1
    return pods


def jobset(name: str = "trainer", rjobs: tuple[tuple[str, int, int], ...] = (("driver", 1, 1), ("workers", 2, 2)),
           *, namespace: str = "default", ip_base: int = 0) -> list[Pod]:
    """A JobSet: replicated jobs (name, replicas, parallelism) of Indexed Jobs behind one headless Service."""
    return _jobset_pods(name, rjobs, namespace=namespace, ip_base=ip_base, extra_labels={}, container="trainer")


def trainjob(name: str = "llm", num_nodes: int = 3, *, namespace: str = "default", ip_base: int = 0,
             release: str = "v2.3.0", nproc: str = "auto", plugin: str = "torch", workers: int = 0) -> list[Pod]:
    """A Kubeflow TrainJob (Trainer v2) on the torch-distributed runtime: a finished dataset initializer and
    ``num_nodes`` pods of replicated job ``node`` (container ``node``), with the env the torch plugin of
    ``release`` writes (from ``agent.core.injected``); with ``plugin`` "jax" or "xgboost", the env that plugin
    writes instead (jax-distributed, xgboost-distributed; ``workers``: its DMLC_NUM_WORKER)."""
    env = injected_env(
        "trainjob", release, set() if plugin == "torch" else {f"mlPolicy {plugin}"},
        {"nnodes": num_nodes, "nproc": nproc, "trainjob": name, "workers": workers or num_nodes,
         "plugins": ("main",) if plugin == "torch" else (plugin,)})
    initializer = _jobset_pods(
        name, (("dataset-initializer", 1, 1),), namespace=namespace, ip_base=ip_base, container="@rjob",
        extra_labels={"dataset-initializer": {"trainer.kubeflow.org/trainjob-ancestor-step": "dataset-initializer"}},
        phases={"dataset-initializer": "Succeeded"},
    )
    nodes = _jobset_pods(
        name, (("node", 1, num_nodes),), namespace=namespace, ip_base=ip_base + 1, container="node", env=env,
        extra_labels={"node": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
    )
    for pod in nodes:  # Trainer v2 puts the node job after the initializer: global index 1.
        for section in ("labels", "annotations"):
            pod["metadata"][section][JOBSET_GLOBAL_INDEX] = "1"
            pod["metadata"][section]["jobset.sigs.k8s.io/global-replicas"] = "2"
    return initializer + nodes


def trainer_hostfile_volume(trainjob: str) -> dict[str, Any]:
    """The volume Trainer v2's MPI plugin gives the launcher: its hostfile ConfigMap (plugins/mpi/mpi.go,
    pkg/constants/constants.go MPIHostfileVolumeName, MPIHostfileConfigMapSuffix)."""
    return {"name": "mpi-hostfile", "configMap": {"name": f"{trainjob}-mpi-hostfile",
                                                  "items": [{"key": "hostfile", "path": "hostfile", "mode": 0o444}]}}


def trainjob_mpi(name: str = "ds", num_nodes: int = 3, *, namespace: str = "default", ip_base: int = 0,
                 launcher_as_node: bool = True) -> list[Pod]:
    """A TrainJob on Trainer v2's deepspeed-distributed runtime (manifests/base/runtimes/deepspeed_distributed.yaml,
    v2.3.0): replicated job ``node`` (numNodes - 1 pods, sshd) then ``launcher`` (1 pod), both running container
    ``node`` because the runtime sets runLauncherAsNode: true (pkg/constants/constants.go: "When
    RunLauncherAsNode: true, for the launcher Job the container name is node"). ``launcher_as_node=False``: an MPI
    runtime without it, whose launcher runs container ``launcher`` and ``num_nodes`` node pods."""
    count = max(num_nodes - 1, 1) if launcher_as_node else num_nodes
    nodes = _jobset_pods(name, (("node", 1, count),), namespace=namespace, ip_base=ip_base,
                         container="node", extra_labels={})
    launcher = _jobset_pods(name, (("launcher", 1, 1),), namespace=namespace, ip_base=ip_base + len(nodes),
                            container="node" if launcher_as_node else "launcher", extra_labels={})
    for pod in launcher:  # the launcher's Job comes after node's: global index 1 of 2
        for section in ("labels", "annotations"):
            pod["metadata"][section][JOBSET_GLOBAL_INDEX] = "1"
        pod["spec"]["volumes"].append(trainer_hostfile_volume(name))
    for pod in nodes + launcher:
        for section in ("labels", "annotations"):
            pod["metadata"][section]["jobset.sigs.k8s.io/global-replicas"] = "2"
    return nodes + launcher


def leaderworkerset(name: str = "vllm", size: int = 4, groups: int = 2, *, namespace: str = "default",
                    ip_base: int = 0, release: str = "v0.10.0") -> list[Pod]:
    """A LeaderWorkerSet: ``groups`` groups of ``size`` pods; each group is one training world. The env is what
    the LWS webhook of ``release`` puts first (``agent.core.injected``)."""
    pods, n = [], ip_base
    for group in range(groups):
        leader = f"{name}-{group}"
        group_key = hashlib.sha1(f"{namespace}/{leader}".encode()).hexdigest()
        for worker in range(size):
            pod_name = leader if worker == 0 else f"{leader}-{worker}"
            owner_name = leader if worker else name
            owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": owner_name,
                     "uid": _uid("sts", namespace, owner_name)}
            labels = {LWS_NAME: name, LWS_GROUP: str(group),
                      LWS_WORKER: str(worker),
                      "leaderworkerset.sigs.k8s.io/group-key": group_key,
                      "leaderworkerset.sigs.k8s.io/template-revision-hash": "5d4f8b7c9"}
            annotations = {LWS_SIZE: str(size)}
            if worker:
                annotations["leaderworkerset.sigs.k8s.io/leader-name"] = leader
            facts = {"lws": name, "group": group, "subdomain": name, "namespace": namespace, "size": size,
                     "worker": worker}
            env = injected_env("lws", release, set(), facts)
            pods.append(make_pod(
                pod_name, namespace=namespace, labels=labels, annotations=annotations, hostname=pod_name,
                subdomain=name, ip=loopback_ip(n), owner=owner, containers=[trainer_container(env=env, gpus=2)],
            ))
            n += 1
    return pods


def indexed_job(name: str = "sweep", completions: int = 3, *, namespace: str = "default", ip_base: int = 0,
                subdomain: str | None = "sweep") -> list[Pod]:
    """A batch/v1 Job with completionMode Indexed and a headless Service named by ``subdomain``."""
    owner = {**_kind(JOBS), "name": name, "uid": _uid("job", namespace, name)}
    pods = []
    for i in range(completions):
        labels = {JOB_NAME: name, "job-name": name,
                  "batch.kubernetes.io/controller-uid": owner["uid"], "controller-uid": owner["uid"],
                  COMPLETION_INDEX: str(i)}
        pods.append(make_pod(
            f"{name}-{i}-{_suffix(name, i)}", namespace=namespace, labels=labels,
            annotations={COMPLETION_INDEX: str(i)},
            hostname=f"{name}-{i}" if subdomain else None, subdomain=subdomain, ip=loopback_ip(ip_base + i),
            owner=owner, containers=[trainer_container(cpu="2500m")],
        ))
    return pods


RACK = "example.com/rack"
ZONE = "topology.kubernetes.io/zone"


def node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A Node as the API server returns it (metadata is all the agent reads)."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": _uid("node", name), "labels": {"kubernetes.io/hostname": name,
                                                                             **labels}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def racks(pods: list[Pod], count: int = 2, *, zone: str = "zone-a") -> list[dict[str, Any]]:
    """One node per pod, racks taken in turn in list order (``rack-a``, ``rack-b``, ...): the placement a
    spreading scheduler gives, and the worst case for index order (every ring hop crosses racks). Sets each
    pod's ``spec.nodeName``; returns the Nodes."""
    nodes = []
    for k, pod in enumerate(pods):
        name = f"node-{k}"
        pod["spec"]["nodeName"] = name
        nodes.append(node(name, {ZONE: zone, RACK: f"rack-{chr(ord('a') + k % count)}"}))
    return nodes


def as_list(pods: list[Pod]) -> dict[str, Any]:
    """Wrap pods the way ``kubectl get pods -o json`` does."""
    return {"apiVersion": "v1", "kind": "List", "items": pods, "metadata": {"resourceVersion": ""}}


# The shipped examples/*.json: the same jobs as manifests/examples/ (sizes, resources), so that the tables in
# docs/controllers.md describe both (tests/shipped/test_manifests.py checks).
def _volcano_example() -> list[Pod]:
    pods = volcano_job(tasks=(("master", 1), ("worker", 3), ("extras", 2)), cpu="2")
    racks(pods)  # each pod on its node, racks a and b in turn: examples/volcano-nodes.json holds the Nodes
    return pods


EXAMPLES: dict[str, Callable[[], list[Pod]]] = {
    "volcano": _volcano_example,
    "pytorchjob": lambda: pytorchjob(gpus=1),
    "tfjob": tfjob,
    "xgboostjob": xgboostjob,
    "paddlejob": paddlejob,
    "jaxjob": jaxjob,
    "trainjob": trainjob,
    "mpijob": mpijob,
    "jobset": jobset,
    "lws": leaderworkerset,
    "indexed-job": indexed_job,
}


# The Nodes of the examples whose pods are bound to nodes (kubectl get nodes -o json): explain --nodes reads them.
NODE_EXAMPLES: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "volcano": lambda: racks(volcano_job(tasks=(("master", 1), ("worker", 3), ("extras", 2)), cpu="2")),
}


def write_examples(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for key, build in EXAMPLES.items():
        path = directory / f"{key}-pods.json"
        path.write_text(json.dumps(as_list(build()), indent=2) + "\n")
        written.append(path)
    for key, nodes in NODE_EXAMPLES.items():
        path = directory / f"{key}-nodes.json"
        path.write_text(json.dumps(as_list(nodes()), indent=2) + "\n")
        written.append(path)
    return written


if __name__ == "__main__":  # pragma: no cover
    for path in write_examples(Path(sys.argv[1] if len(sys.argv) > 1 else "examples")):
        print(path)
