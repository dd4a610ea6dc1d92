"""JobSet (kubernetes-sigs/jobset, v0.12.0) and Kubeflow Trainer v2 (kubeflow/trainer, v2.3.0), as their
controllers create objects.

A JobSet makes one Indexed Job per replica of each replicated job, ``<jobset>-<rjob>-<index>``, owned by the
JobSet; the Job controller makes the pods (batch.py). The JobSet puts its labels on the Job and on its pod
template, as labels and annotations (pkg/controllers/jobset_controller.go constructJob, labelAndAnnotateObject):
its name and uid, the replicated job's name and replicas, the Job's index and global index, the global replicas,
the restart attempt, the job key (sha1 of ``<namespace>/<job>``), and the group (``groupName``, default
"default"), its replicas and the Job's index in it. Its webhook defaults ``completionMode: Indexed``,
``network.enableDNSHostnames: true`` and the subdomain to the JobSet's name, which every pod gets.

A TrainJob makes one JobSet of its name from its runtime's ``spec.template`` (pkg/runtime/framework/plugins/
jobset): the replicated job ``node`` runs ``trainer.numNodes`` pods (the runtime's ``mlPolicy.numNodes`` when the
TrainJob gives none; one less beside an MPI launcher that runs as a node, plugins/mpi/mpi.go), the TrainJob's
``trainer`` fields (image, command, args, env, resourcesPerNode) go to container ``node``, and the ML policy's
plugin upserts its env there (core/injected.py's ``trainjob`` rows: torch, jax, xgboost).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from agent.core.controllers.jobset import (
    COORDINATOR,
    JOBSET_GLOBAL_INDEX,
    JOBSET_JOB_INDEX,
    JOBSET_NAME,
    JOBSET_RJOB,
    JOBSETS,
    RUNTIME_KINDS,
    TRAINER_LAUNCHER,
    TRAINER_NODE,
)
from agent.core.emulation.batch import job_pods
from agent.core.emulation.objects import (
    Obj,
    add_env,
    child,
    count,
    name_of,
    namespace_of,
    refuse,
    uid_of,
    with_uid,
)
from agent.core.injected import injected_env

TRAINER_RELEASE = "v2.3.0"  # the rows of core/injected.py the TrainJob's env is made from
NODE_CONTAINER = "node"  # pkg/constants/constants.go Node: the container the ML policy's plugin writes to


def _rjobs(jobset: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    rjobs = (jobset.get("spec") or {}).get("replicatedJobs")
    if not isinstance(rjobs, list) or not rjobs or not all(isinstance(r, Mapping) and r.get("name") for r in rjobs):
        raise refuse(jobset, "spec.replicatedJobs is not a list of named replicated jobs",
                     "give each replicated job a name and a template")
    names = [r["name"] for r in rjobs]
    if len(set(names)) != len(names):
        raise refuse(jobset, f"two replicated jobs share a name ({', '.join(names)})", "give each its own name")
    return rjobs


def emulate_jobset(jobset: Mapping[str, Any]) -> tuple[list[Obj], list[Obj]]:
    """The Jobs and pods of ``jobset`` (with its uid)."""
    name, namespace = name_of(jobset), namespace_of(jobset)
    spec = jobset.get("spec") or {}
    network = spec.get("network") or {}
    subdomain = (network.get("subdomain") or name) if network.get("enableDNSHostnames", True) is not False else None
    rjobs = _rjobs(jobset)
    sizes = [count(jobset, r.get("replicas"), f"replicatedJobs '{r['name']}' replicas") for r in rjobs]
    coordinator = spec.get("coordinator") if isinstance(spec.get("coordinator"), Mapping) else None
    groups = [str(r.get("groupName") or "default") for r in rjobs]  # the CRD's default
    jobs: list[Obj] = []
    pods: list[Obj] = []
    global_index = 0
    in_group: dict[str, int] = {}
    for rjob, replicas, group in zip(rjobs, sizes, groups, strict=True):
        template = rjob.get("template") or {}
        job_spec = copy.deepcopy(dict(template.get("spec") or {}))
        job_spec.setdefault("completionMode", "Indexed")
        for job_index in range(replicas):
            job_name = f"{name}-{rjob['name']}-{job_index}"
            stamped = {JOBSET_NAME: name, "jobset.sigs.k8s.io/jobset-uid": uid_of(jobset),
                       JOBSET_RJOB: str(rjob["name"]), "jobset.sigs.k8s.io/restart-attempt": "0",
                       "jobset.sigs.k8s.io/replicatedjob-replicas": str(replicas),
                       "jobset.sigs.k8s.io/global-replicas": str(sum(sizes)),
                       JOBSET_JOB_INDEX: str(job_index),
                       "jobset.sigs.k8s.io/job-key": hashlib.sha1(f"{namespace}/{job_name}".encode()).hexdigest(),
                       JOBSET_GLOBAL_INDEX: str(global_index), "jobset.sigs.k8s.io/group-name": group,
                       "jobset.sigs.k8s.io/group-replicas": str(sum(n for n, g in zip(sizes, groups, strict=True)
                                                                    if g == group)),
                       "jobset.sigs.k8s.io/job-group-index": str(in_group.get(group, 0) + job_index)}
            if coordinator is not None:
                stamped[COORDINATOR] = (f"{name}-{coordinator.get('replicatedJob')}-{coordinator.get('jobIndex', 0)}"
                                        f"-{coordinator.get('podIndex', 0)}.{subdomain or name}")
            meta_t = template.get("metadata") or {}
            job = child("batch/v1", "Job", job_name, owner=jobset,
                        labels={**(meta_t.get("labels") or {}), **stamped},
                        annotations={**(meta_t.get("annotations") or {}), **stamped}, spec=job_spec)
            jobs.append(job)
            pods += job_pods(job, labels=stamped, annotations=stamped, subdomain=subdomain)
            global_index += 1
        in_group[group] = in_group.get(group, 0) + replicas
    return jobs, pods


def find_runtime(trainjob: Mapping[str, Any], runtimes: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    ref = (trainjob.get("spec") or {}).get("runtimeRef") or {}
    wanted, kind = ref.get("name"), ref.get("kind", "ClusterTrainingRuntime")
    if not wanted:
        raise refuse(trainjob, "spec.runtimeRef.name is not set", "name the (Cluster)TrainingRuntime it runs on")
    for runtime in runtimes:
        if runtime.get("kind") == kind and name_of(runtime) == wanted:
            return runtime
    given = ", ".join(f"{r.get('kind')} '{name_of(r)}'" for r in runtimes) or "none"
    raise refuse(trainjob, f"its runtime {kind} '{wanted}' is not given (runtimes given: {given})",
                 "pass it with --runtime, or put it in the same YAML stream")


ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"  # pkg/constants: the label that marks the trainer's job
GPU = "gpu"  # runtime.go numGPU: any resource whose name holds "gpu"


def _quantity(value: Any) -> int:
    """A CPU or GPU quantity as resource.Quantity.Value() gives it (rounded up to a whole number)."""
    text = str(value)
    try:
        number = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        return 0
    return int(-(-number // 1))


def _per_node(resources: Mapping[str, Any], *, gpu: bool) -> int:
    """runtime.go GetNumGPUPerNode (requests, else limits) and torch.go getNumCPUPerNode (requests, else limits)."""
    def find(section: str) -> int:
        listed = resources.get(section) or {}
        if gpu:
            return next((_quantity(v) for k, v in listed.items() if GPU in str(k).lower()), 0)
        return _quantity(listed["cpu"]) if "cpu" in listed else 0
    return find("requests") or find("limits")


def _is_trainer(rjob: Mapping[str, Any]) -> bool:
    return ((rjob.get("template") or {}).get("metadata") or {}).get("labels", {}).get(ANCESTOR) == "trainer"


def trainjob_jobset(trainjob: Mapping[str, Any], runtime: Mapping[str, Any]) -> Obj:
    """The JobSet Trainer makes of ``trainjob`` on ``runtime`` (v2.3.0): plugins/jobset/builder.go Trainer (the
    TrainJob's image, command and args on container ``node`` of the replicated job labelled as the trainer, which
    runs one Job; its env there, and on ``node`` beside a launcher that runs as a node), the ML policy's plugin
    (plugins/torch/torch.go: PET_* upserted in that container; numProcPerNode the TrainJob's, else "auto", which
    without a GPU is the node's CPU count), and the node count (``trainer.numNodes``, else the runtime's)."""
    if runtime.get("kind") not in RUNTIME_KINDS:
        raise refuse(trainjob, f"its runtime is a {runtime.get('kind')}", "give a (Cluster)TrainingRuntime")
    name = name_of(trainjob)
    policy = (runtime.get("spec") or {}).get("mlPolicy") or {}
    trainer = (trainjob.get("spec") or {}).get("trainer")
    given = trainer if isinstance(trainer, Mapping) else {}
    nodes = count(trainjob, given.get("numNodes", policy.get("numNodes")), "spec.trainer.numNodes")
    mpi = policy.get("mpi") if isinstance(policy.get("mpi"), Mapping) else None
    as_node = bool(mpi and mpi.get("runLauncherAsNode") is True)
    template = (runtime.get("spec") or {}).get("template") or {}
    spec = copy.deepcopy(dict(template.get("spec") or {}))
    rjobs = spec.get("replicatedJobs") or []
    launcher = any(r.get("name") == TRAINER_LAUNCHER for r in rjobs)
    plugin = next((p for p in ("jax", "xgboost") if isinstance(policy.get(p), Mapping)), None)
    torch = isinstance(policy.get("torch"), Mapping)
    for rjob in rjobs:
        job_spec = rjob.setdefault("template", {}).setdefault("spec", {})
        if rjob.get("name") == TRAINER_NODE:
            size = max(nodes - 1, 1) if as_node and launcher else nodes
            job_spec.update(parallelism=size, completions=size)
        trains = _is_trainer(rjob)
        if trains:
            rjob["replicas"] = 1
        containers = (job_spec.get("template") or {}).get("spec", {}).get("containers") or []
        for container in containers:
            if container.get("name") != NODE_CONTAINER:
                continue
            if trains:
                for field in ("image", "command", "args"):
                    if given.get(field) is not None:
                        container[field] = copy.deepcopy(given[field])
                if given.get("resourcesPerNode") is not None:
                    container["resources"] = copy.deepcopy(given["resourcesPerNode"])
            if (trains or (as_node and rjob.get("name") == TRAINER_NODE)) and given.get("env"):
                add_env([container], given["env"], mode="upsert")
            if not trains or trainer is None or (plugin is None and not torch):
                continue
            resources = container.get("resources") or {}
            gpus = _per_node(resources, gpu=True)
            nproc = given.get("numProcPerNode", "auto")
            if nproc == "auto" and not gpus:
                nproc = max(1, _per_node(resources, gpu=False))
            facts = {"nnodes": nodes, "nproc": str(nproc), "trainjob": name, "workers": nodes * (gpus or 1),
                     "plugins": (plugin or "main",)}
            features = {f"mlPolicy {plugin}"} if plugin else set()
            add_env([container], injected_env("trainjob", TRAINER_RELEASE, features, facts),
                    mode="upsert")
    meta_t = template.get("metadata") or {}
    return child(JOBSETS.api_version, JOBSETS.kind, name, owner=trainjob, labels=meta_t.get("labels") or {},
                 annotations=meta_t.get("annotations") or {}, spec=spec)


def emulate_trainjob(trainjob: Mapping[str, Any], runtimes: Sequence[Mapping[str, Any]]) -> tuple[list[Obj],
                                                                                                   list[Obj]]:
    jobset = trainjob_jobset(with_uid(trainjob), find_runtime(trainjob, runtimes))
    jobs, pods = emulate_jobset(jobset)
    return [jobset, *jobs], pods
