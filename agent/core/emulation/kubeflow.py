"""Kubeflow training-operator v1.9 (PyTorchJob, TFJob, XGBoostJob, PaddleJob, JAXJob) and the MPI operator v2
(MPIJob, v0.5-v0.8), as their controllers create pods.

training-operator makes ``<job>-<type>-<index>`` (the replica type lower-cased) for each replica, owned by the job,
labelled with the job's name, the operator's name, the replica type and index, and ``job-role: master`` on the
pod that leads (pkg/controller.v1/common/pod.go createNewPod; each kind's IsMasterRole); one Service of the same
name per pod gives its address. Each kind's env is its setPodEnv's (core/injected.py's rows, v1.9.0), with the
job's port read from the named container port as the operator reads it.

The MPI operator makes workers ``<job>-worker-<index>`` owned by the MPIJob, and a batch/v1 Job
``<job>-launcher`` whose pod is ``<job>-launcher-<5 chars>``; the launcher and the workers have hostname = the
pod's own (the launcher's: the Job's name) and subdomain = the job's headless Service (its name)
(pkg/controller/mpi_job_controller.go newWorker, newLauncherJob). K_MPI_JOB_ROLE goes to each pod's first
container, and the launcher's MPI implementation's variables after it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from typing import Any

from agent.core.controllers.base import JOB_NAME
from agent.core.controllers.kubeflow import (
    MPI_JOB_ROLE,
    MPI_OPERATOR,
    OPERATOR_NAME,
    OPERATORS,
    PYTORCHJOB_INDEX,
    PYTORCHJOB_JOB,
    PYTORCHJOB_TYPE,
)
from agent.core.emulation.batch import CONTROLLER_UID
from agent.core.emulation.objects import (
    Obj,
    add_env,
    child,
    container_port,
    count,
    make_pod,
    name_of,
    namespace_of,
    refuse,
    suffix_for,
    template_at,
    uid_of,
)
from agent.core.injected import injected_env
from agent.core.model import RawEnvVar

OPERATOR_RELEASE = "v1.9.0"
MPI_RELEASE = "v0.8.0"


class Kind:
    """One training-operator kind: its replica specs' field, the container and port name its env is about."""

    def __init__(self, field: str, controller: str, container: str, port_name: str, port: int) -> None:
        self.field, self.controller, self.container = field, controller, container
        self.port_name, self.port = port_name, port


# Each kind's replica-specs field, its key in core/injected.py, its default container and port (the job's port:
# GetPortFrom<Kind>Job; the defaults from pkg/apis/kubeflow.org/v1/<kind>_types.go).
KINDS: Mapping[str, Kind] = {
    "PyTorchJob": Kind("pytorchReplicaSpecs", "pytorchjob", "pytorch", "pytorchjob-port", 23456),
    "TFJob": Kind("tfReplicaSpecs", "tfjob", "tensorflow", "tfjob-port", 2222),
    "XGBoostJob": Kind("xgbReplicaSpecs", "xgboostjob", "xgboost", "xgboostjob-port", 9999),
    "PaddleJob": Kind("paddleReplicaSpecs", "paddlejob", "paddle", "master", 36543),
    "JAXJob": Kind("jaxReplicaSpecs", "jaxjob", "jax", "jaxjob-port", 6666),
}
Env = Callable[[str, int], list[RawEnvVar]]


def _specs(job: Mapping[str, Any], field: str) -> list[tuple[str, int, Mapping[str, Any]]]:
    specs = (job.get("spec") or {}).get(field)
    if not isinstance(specs, Mapping) or not specs:
        raise refuse(job, f"spec.{field} is missing or empty", f"give spec.{field} its replica types")
    out = []
    for rtype, spec in specs.items():
        where = f"spec.{field}.{rtype}"
        if not isinstance(spec, Mapping):
            raise refuse(job, f"{where} is not a replica spec", f"give {where} replicas and a template")
        out.append((str(rtype), count(job, spec.get("replicas"), f"{where}.replicas"),
                    template_at(job, spec.get("template"), f"{where}.template")))
    return out


def _port(specs: list[tuple[str, int, Mapping[str, Any]]], kind: Kind, prefer: str | None = None) -> int:
    chosen = next((t for r, _, t in specs if r.lower() == prefer), None) if prefer else None
    template = chosen or specs[0][2]
    return container_port(template, kind.container, kind.port_name, kind.port)


def _counts(specs: list[tuple[str, int, Mapping[str, Any]]]) -> dict[str, int]:
    return {rtype.lower(): n for rtype, n, _ in specs}


def _pytorch_env(job: Mapping[str, Any], specs: list[tuple[str, int, Mapping[str, Any]]]) -> Env:
    """setPodEnv (envvar.go) after the defaulter (pytorch_defaults.go): nprocPerNode "auto" unless the elastic
    policy gives nProcPerNode, an elastic policy's missing bound taken from the other or the workers' replicas."""
    name, spec = name_of(job), job.get("spec") or {}
    counts = _counts(specs)
    elastic = dict(spec["elasticPolicy"]) if isinstance(spec.get("elasticPolicy"), Mapping) else None
    nproc = spec.get("nprocPerNode")
    if nproc is None and (elastic is None or elastic.get("nProcPerNode") is None):
        nproc = "auto"
    if elastic is not None:
        low, high = elastic.get("minReplicas"), elastic.get("maxReplicas")
        workers = counts.get("worker", 0)
        elastic["minReplicas"] = low if low is not None else high if high is not None else workers
        elastic["maxReplicas"] = high if high is not None else elastic["minReplicas"]
    features = {f for f, on in (("master", "master" in counts), ("elastic", elastic is not None),
                                ("nprocPerNode", nproc is not None)) if on}
    for key in ("maxRestarts", "nProcPerNode", "rdzvId", "rdzvConf", "standalone"):
        if elastic is not None and elastic.get(key) is not None and elastic.get(key) is not False:
            features.add(f"elastic.{key}")
    replicas = sum(counts.values())
    port = _port(specs, KINDS["PyTorchJob"], "master")
    worker_port = _port(specs, KINDS["PyTorchJob"], "worker")
    facts = {"port": port, "master": f"{name}-master-0", "replicas": replicas,
             "world": replicas * (int(str(nproc)) if str(nproc).isdigit() else 1),
             "nproc": str(nproc) if nproc is not None else str((elastic or {}).get("nProcPerNode", "")),
             "rdzv_host": (elastic or {}).get("rdzvHost") or f"{name}-worker-0",
             "rdzv_port": (elastic or {}).get("rdzvPort") or worker_port,
             "min": (elastic or {}).get("minReplicas", ""), "max": (elastic or {}).get("maxReplicas", ""),
             "max_restarts": (elastic or {}).get("maxRestarts", ""), "rdzv_id": (elastic or {}).get("rdzvId", ""),
             "rdzv_conf": ",".join(f"{c.get('key')}={c.get('value')}" for c in (elastic or {}).get("rdzvConf") or [])}
    master = "master" in counts
    return lambda rtype, i: injected_env("pytorchjob", OPERATOR_RELEASE, features,
                                         {**facts, "rank": i + 1 if rtype == "worker" and master else i})


def _tf_env(job: Mapping[str, Any], specs: list[tuple[str, int, Mapping[str, Any]]]) -> Env:
    """TF_CONFIG: the cluster (keys sorted, as Go marshals a map), ``<job>-<type>-<i>.<ns>.svc:<port>`` with each
    type's port, this pod's task, ``environment: cloud``; none for a job of one pod (isDistributed)."""
    name, namespace = name_of(job), namespace_of(job)
    cluster = {rtype.lower(): [f"{name}-{rtype.lower()}-{i}.{namespace}.svc:"
                               f"{container_port(t, 'tensorflow', 'tfjob-port', 2222)}" for i in range(n)]
               for rtype, n, t in sorted(specs, key=lambda s: s[0].lower())}
    distributed = {"distributed"} if sum(n for _, n, _ in specs) > 1 else set()

    def env(rtype: str, i: int) -> list[RawEnvVar]:
        config = json.dumps({"cluster": cluster, "task": {"type": rtype, "index": i}, "environment": "cloud"},
                            separators=(",", ":"))
        return injected_env("tfjob", OPERATOR_RELEASE, distributed, {"tf_config": config})
    return env


def _xgboost_env(job: Mapping[str, Any], specs: list[tuple[str, int, Mapping[str, Any]]]) -> Env:
    name, counts = name_of(job), _counts(specs)
    total = sum(counts.values())
    port = _port(specs, KINDS["XGBoostJob"], "master")
    facts = {"port": port, "job": name, "replicas": total, "worker_port": port,
             "worker_addrs": ",".join(f"{name}-worker-{k}" for k in range(total - 1))}
    features = {"several replicas"} if total > 1 else set()
    masters = counts.get("master", 0)
    return lambda rtype, i: injected_env("xgboostjob", OPERATOR_RELEASE, features,
                                         {**facts, "rank": i + masters if rtype == "worker" else i})


def _paddle_env(job: Mapping[str, Any], specs: list[tuple[str, int, Mapping[str, Any]]]) -> Env:
    name, counts = name_of(job), _counts(specs)
    host = "master" if counts.get("master") else "worker"
    port = _port(specs, KINDS["PaddleJob"], host)
    ps = bool(counts.get("master"))

    def env(rtype: str, i: int) -> list[RawEnvVar]:
        own = i == 0 and rtype == host
        features = {"the master's pod"} if own else set()
        if ps:
            features.add(f"ps mode, {rtype}")
        facts = {"job": name, "replicas": sum(counts.values()),
                 "master": f"$(POD_IP_DUMMY):{port}" if own else f"{name}-{host}-0:{port}"}
        return injected_env("paddlejob", OPERATOR_RELEASE, features, facts)
    return env


def _jax_env(job: Mapping[str, Any], specs: list[tuple[str, int, Mapping[str, Any]]]) -> Env:
    facts = {"port": _port(specs, KINDS["JAXJob"], "worker"), "job": name_of(job),
             "replicas": sum(_counts(specs).values())}
    return lambda rtype, i: injected_env("jaxjob", OPERATOR_RELEASE, set(), {**facts, "index": i})


ENVS: Mapping[str, Callable[[Mapping[str, Any], list[tuple[str, int, Mapping[str, Any]]]], Env]] = {
    "PyTorchJob": _pytorch_env, "TFJob": _tf_env, "XGBoostJob": _xgboost_env, "PaddleJob": _paddle_env,
    "JAXJob": _jax_env,
}


def _leads(kind: str, counts: Mapping[str, int]) -> Callable[[str, int], bool]:
    """The pod labelled ``job-role: master`` (each kind's IsMasterRole)."""
    if kind == "TFJob":
        chief = next((r for r in ("chief", "master") if counts.get(r)), None)
        return (lambda r, i: r == chief) if chief else (lambda r, i: r == "worker" and i == 0)
    if kind == "JAXJob":
        return lambda r, i: r == "worker" and i == 0
    return lambda r, i: r == "master"


def _with_default_port(template: Mapping[str, Any], kind: Kind) -> Mapping[str, Any]:
    """The template as the kind's defaulter leaves it: its port (named as the kind names it) on the container of
    the kind's name, else the first (defaulting_utils.go setDefaultPort; the API server adds protocol TCP)."""
    spec = template.get("spec") or {}
    containers = spec.get("containers") or []
    at = next((i for i, c in enumerate(containers) if c.get("name") == kind.container), 0)
    if any(p.get("name") == kind.port_name for p in containers[at].get("ports") or []):
        return template
    out = copy.deepcopy(dict(template))
    target = out["spec"]["containers"][at]
    target["ports"] = [*(target.get("ports") or []),
                       {"name": kind.port_name, "containerPort": kind.port, "protocol": "TCP"}]
    return out


# PyTorchJob's workers wait for the master's DNS name in an init container of the operator's (initcontainer.go,
# v1.9.0: its default image and tries, config.go), appended after the template's.
PYTORCH_INIT_IMAGE, PYTORCH_INIT_TRIES = "alpine:3.10", 100


def _pytorch_init_container(master: str) -> dict[str, Any]:
    return {"name": "init-pytorch", "image": PYTORCH_INIT_IMAGE, "imagePullPolicy": "IfNotPresent",
            "resources": {"limits": {"cpu": "100m", "memory": "20Mi"}, "requests": {"cpu": "50m", "memory": "10Mi"}},
            "command": ["sh", "-c", f"err=1;for i in $(seq {PYTORCH_INIT_TRIES}); do if nslookup {master}; then "
                        "err=0 && break; fi;echo waiting for master; sleep 2; done; exit $err"]}


def emulate_operator(job: Mapping[str, Any]) -> tuple[list[Obj], list[Obj]]:
    kind = KINDS[str(job["kind"])]
    name = name_of(job)
    specs = [(rtype, n, _with_default_port(t, kind)) for rtype, n, t in _specs(job, kind.field)]
    env = ENVS[str(job["kind"])](job, specs)
    leads = _leads(str(job["kind"]), _counts(specs))
    pods = []
    for rtype, replicas, template in specs:
        lower = rtype.lower()
        for i in range(replicas):
            labels = {PYTORCHJOB_JOB: name, OPERATOR_NAME: OPERATORS[str(job["kind"])], PYTORCHJOB_TYPE: lower,
                      PYTORCHJOB_INDEX: str(i)}
            if leads(lower, i):
                labels[MPI_JOB_ROLE] = "master"
            pod = make_pod(f"{name}-{lower}-{i}", template, owner=job, labels=labels)
            containers = pod["spec"]["containers"]
            if str(job["kind"]) == "TFJob":  # TF_CONFIG: the container named tensorflow only
                containers = [c for c in containers if c.get("name") == kind.container]
            add_env(containers, env(lower, i))
            if str(job["kind"]) == "PyTorchJob" and lower == "worker" and "master" in _counts(specs):
                pod["spec"]["initContainers"] = [*(pod["spec"].get("initContainers") or []),
                                                 _pytorch_init_container(f"{name}-master-0")]
            pods.append(pod)
    return [], pods


SSH_VOLUME = "ssh-auth"  # mpi_job_controller.go setupSSHOnPod: the operator's key pair, in each pod's first container
CONFIG_VOLUME, CONFIG_PATH = "mpi-job-config", "/etc/mpi"  # the launcher's hostfile and discover_hosts.sh


def _with_ssh(spec: dict[str, Any], job: str, mount: str) -> None:
    spec["volumes"] = [*(spec.get("volumes") or []), {"name": SSH_VOLUME, "secret": {
        **({"defaultMode": 0o600} if mount == "/root/.ssh" else {}), "secretName": f"{job}-ssh",
        "items": [{"key": "ssh-privatekey", "path": "id_rsa"}, {"key": "ssh-publickey", "path": "id_rsa.pub"},
                  {"key": "ssh-publickey", "path": "authorized_keys"}]}}]
    first = spec["containers"][0]
    first["volumeMounts"] = [*(first.get("volumeMounts") or []), {"name": SSH_VOLUME, "mountPath": mount}]


def emulate_mpijob(job: Mapping[str, Any]) -> tuple[list[Obj], list[Obj]]:
    """newLauncherJob, newLauncherPodTemplate and newWorker (mpi_job_controller.go, v0.8.0) after the defaulter
    (v2beta1/default.go: slotsPerWorker 1, sshAuthMountPath /root/.ssh, OpenMPI)."""
    name, namespace = name_of(job), namespace_of(job)
    spec = job.get("spec") or {}
    specs = {rtype: (n, t) for rtype, n, t in _specs(job, "mpiReplicaSpecs")}
    if "Launcher" not in specs or specs["Launcher"][0] != 1:
        raise refuse(job, "spec.mpiReplicaSpecs.Launcher must have exactly 1 replica",
                     "give Launcher replicas: 1 and a template")
    implementation = spec.get("mpiImplementation", "OpenMPI")
    if implementation not in ("OpenMPI", "Intel", "MPICH"):
        raise refuse(job, f"spec.mpiImplementation {implementation!r} is not one the operator knows",
                     "use OpenMPI, Intel or MPICH")
    slots = count(job, spec.get("slotsPerWorker"), "spec.slotsPerWorker")
    base = {OPERATOR_NAME: MPI_OPERATOR, PYTORCHJOB_JOB: name}
    launcher_name = f"{name}-launcher"
    mount = str(spec.get("sshAuthMountPath") or "/root/.ssh")
    launcher_job = child("batch/v1", "Job", launcher_name, owner=job, labels={"app": name},
                         spec={"template": specs["Launcher"][1]})
    uid = uid_of(launcher_job)
    job_labels = {CONTROLLER_UID: uid, JOB_NAME: launcher_name, "controller-uid": uid, "job-name": launcher_name}
    launcher = make_pod(f"{launcher_name}-{suffix_for(namespace, launcher_name)}", specs["Launcher"][1],
                        owner=launcher_job, labels={**base, MPI_JOB_ROLE: "launcher", **job_labels},
                        hostname=launcher_name, subdomain=name)
    features = {f"launcher, {implementation}"}
    if spec.get("runLauncherAsWorker") is not True:
        features.add("launcher, not runLauncherAsWorker")
    if spec.get("runLauncherAsWorker") is True:
        launcher["metadata"]["labels"][PYTORCHJOB_INDEX] = "0"
    add_env(launcher["spec"]["containers"][:1],
            injected_env("mpijob", MPI_RELEASE, features, {"role": "launcher", "slots": slots}))
    _with_ssh(launcher["spec"], name, mount)
    launcher["spec"]["volumes"].append({"name": CONFIG_VOLUME, "configMap": {"name": f"{name}-config", "items": [
        {"key": "hostfile", "path": "hostfile", "mode": 0o444},
        {"key": "discover_hosts.sh", "path": "discover_hosts.sh", "mode": 0o555}]}})
    first = launcher["spec"]["containers"][0]
    first["volumeMounts"] = [*(first.get("volumeMounts") or []), {"name": CONFIG_VOLUME, "mountPath": CONFIG_PATH}]
    pods = [launcher]
    workers, worker_t = specs.get("Worker", (0, None))
    for i in range(workers):
        assert worker_t is not None
        pod = make_pod(f"{name}-worker-{i}", worker_t, owner=job,
                       labels={**base, MPI_JOB_ROLE: "worker", PYTORCHJOB_INDEX: str(i)},
                       hostname=f"{name}-worker-{i}", subdomain=name)
        first = pod["spec"]["containers"][0]
        if not first.get("command") and not first.get("args"):
            first["command"] = ["/usr/sbin/sshd", "-De"]
        dns = pod["spec"].setdefault("dnsConfig", {})
        dns["searches"] = [*(dns.get("searches") or []), f"{name}.{namespace}.svc.cluster.local"]
        add_env(pod["spec"]["containers"][:1],
                injected_env("mpijob", MPI_RELEASE, set(), {"role": "worker", "slots": slots}))
        _with_ssh(pod["spec"], name, mount)
        pods.append(pod)
    return [launcher_job], pods
