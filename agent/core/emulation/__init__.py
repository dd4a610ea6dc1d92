"""The objects a controller makes of a job manifest: the intermediate owners (a TrainJob's JobSet, a JobSet's Jobs,
a LeaderWorkerSet's leader StatefulSet) and the pods, as the controller creates them, before any scheduler or
kubelet has seen them (Pending, no node, no IP).

Pure: a manifest in, objects out. Names, labels and owners follow each controller's conventions; the uids of the
objects it makes are derived from the job's uid, so the same job always gives the same objects.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]

# training-operator's kinds: the replica specs' field and the operator-name label value.
OPERATOR_KINDS = {"PyTorchJob": ("pytorchReplicaSpecs", "pytorchjob-controller"),
                  "TFJob": ("tfReplicaSpecs", "tfjob-controller"),
                  "XGBoostJob": ("xgbReplicaSpecs", "xgboostjob-controller"),
                  "PaddleJob": ("paddleReplicaSpecs", "paddlejob-controller"),
                  "JAXJob": ("jaxReplicaSpecs", "jaxjob-controller")}


@dataclass(frozen=True)
class Emulation:
    """What a controller creates for one job: intermediate owners, then pods (each naming its owner's uid)."""

    owners: tuple[Obj, ...]
    pods: tuple[Obj, ...]


def _uid(*parts: object) -> str:
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _reference(obj: Mapping[str, Any]) -> Obj:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def _pod(name: str, template: Mapping[str, Any], owner: Mapping[str, Any], namespace: str, labels: Mapping[str, str],
         *, annotations: Mapping[str, str] | None = None, hostname: str | None = None,
         subdomain: str | None = None) -> Obj:
    meta = template.get("metadata") or {}
    spec = copy.deepcopy(dict(template.get("spec") or {}))
    if hostname:
        spec["hostname"] = hostname
    if subdomain or spec.get("subdomain"):
        spec["subdomain"] = subdomain or spec["subdomain"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {**(meta.get("labels") or {}), **labels},
                         "annotations": {**(meta.get("annotations") or {}), **(annotations or {})},
                         "ownerReferences": [_reference(owner)]},
            "spec": spec, "status": {"phase": "Pending"}}


def _made(api_version: str, kind: str, name: str, namespace: str, owner: Mapping[str, Any], spec: Any,
          labels: Mapping[str, str] | None = None) -> Obj:
    return {"apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "namespace": namespace, "uid": _uid(owner["metadata"]["uid"], kind, name),
                         "labels": dict(labels or {}), "ownerReferences": [_reference(owner)]},
            "spec": copy.deepcopy(spec)}


def _jobset_objects(jobset: Mapping[str, Any], namespace: str) -> tuple[list[Obj], list[Obj]]:
    name = jobset["metadata"]["name"]
    owners: list[Obj] = []
    pods: list[Obj] = []
    global_index = 0
    for rjob in jobset["spec"].get("replicatedJobs") or []:
        job_spec = rjob["template"]["spec"]
        for job_index in range(rjob.get("replicas", 1)):
            job_name = f"{name}-{rjob['name']}-{job_index}"
            labels = {"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
                      "jobset.sigs.k8s.io/job-index": str(job_index),
                      "jobset.sigs.k8s.io/job-global-index": str(global_index)}
            job = _made("batch/v1", "Job", job_name, namespace, jobset, job_spec, labels)
            owners.append(job)
            for completion in range(job_spec.get("parallelism", 1)):
                host = f"{job_name}-{completion}"
                pods.append(_pod(f"{host}-{_uid(job['metadata']['uid'], completion)[:5]}", job_spec["template"],
                                 job, namespace,
                                 {**labels, "batch.kubernetes.io/job-completion-index": str(completion),
                                  "batch.kubernetes.io/job-name": job_name},
                                 annotations={"batch.kubernetes.io/job-completion-index": str(completion)},
                                 hostname=host, subdomain=name))
            global_index += 1
    return owners, pods


def _trainjob_jobset(job: Mapping[str, Any], namespace: str, runtimes: Sequence[Mapping[str, Any]]) -> Obj:
    ref = job["spec"].get("runtimeRef") or {}
    runtime = next((r for r in runtimes if r["metadata"]["name"] == ref.get("name")), None)
    if runtime is None:
        raise ValueError(f"TrainJob {job['metadata']['name']}: runtime {ref.get('name')!r} not given")
    spec = copy.deepcopy(runtime["spec"]["template"]["spec"])
    trainer = job["spec"].get("trainer") or {}
    for rjob in spec.get("replicatedJobs") or []:
        if rjob["name"] == "node":
            nodes = trainer.get("numNodes") or runtime["spec"].get("mlPolicy", {}).get("numNodes", 1)
            rjob["template"].setdefault("spec", {}).update(parallelism=nodes, completions=nodes,
                                                           completionMode="Indexed")
            for container in rjob["template"]["spec"]["template"]["spec"].get("containers") or []:
                if container.get("name") == "node":
                    container.update({k: trainer[k] for k in ("image", "command", "args") if k in trainer})
    return _made("jobset.x-k8s.io/v1alpha2", "JobSet", job["metadata"]["name"], namespace, job, spec,
                 {"trainer.kubeflow.org/trainjob-name": job["metadata"]["name"]})


def emulate(job: Mapping[str, Any], *, runtimes: Sequence[Mapping[str, Any]] = ()) -> Emulation:
    kind, name = job["kind"], job["metadata"]["name"]
    namespace = job["metadata"].get("namespace") or "default"
    spec = job.get("spec") or {}
    pods: list[Obj] = []
    owners: list[Obj] = []
    if kind == "Job" and job["apiVersion"].startswith("batch.volcano.sh"):
        for task in spec.get("tasks") or []:
            for i in range(task.get("replicas", 1)):
                pod_name = f"{name}-{task['name']}-{i}"
                labels = {"volcano.sh/job-name": name, "volcano.sh/task-spec": task["name"],
                          "volcano.sh/task-index": str(i)}
                pods.append(_pod(pod_name, task["template"], job, namespace, labels, hostname=pod_name,
                                 subdomain=name))
    elif kind in OPERATOR_KINDS:
        field, operator = OPERATOR_KINDS[kind]
        for rtype, replica in (spec.get(field) or {}).items():
            for i in range(replica.get("replicas", 1)):
                labels = {"training.kubeflow.org/job-name": name, "training.kubeflow.org/operator-name": operator,
                          "training.kubeflow.org/replica-type": rtype.lower(),
                          "training.kubeflow.org/replica-index": str(i)}
                pods.append(_pod(f"{name}-{rtype.lower()}-{i}", replica["template"], job, namespace, labels))
    elif kind == "MPIJob":
        base = {"training.kubeflow.org/operator-name": "mpi-operator", "training.kubeflow.org/job-name": name}
        for i in range((spec["mpiReplicaSpecs"].get("Worker") or {}).get("replicas", 0)):
            pods.append(_pod(f"{name}-worker-{i}", spec["mpiReplicaSpecs"]["Worker"]["template"], job, namespace,
                             {**base, "training.kubeflow.org/job-role": "worker",
                              "training.kubeflow.org/replica-index": str(i)},
                             hostname=f"{name}-worker-{i}", subdomain=name))
        launcher = _made("batch/v1", "Job", f"{name}-launcher", namespace, job, {})
        owners.append(launcher)
        pods.insert(0, _pod(f"{name}-launcher-{_uid(launcher['metadata']['uid'])[:5]}",
                            spec["mpiReplicaSpecs"]["Launcher"]["template"], launcher, namespace,
                            {**base, "training.kubeflow.org/job-role": "launcher"},
                            hostname=f"{name}-launcher", subdomain=name))
    elif kind == "JobSet":
        owners, pods = _jobset_objects(job, namespace)
    elif kind == "TrainJob":
        jobset = _trainjob_jobset(job, namespace, runtimes)
        jobs, pods = _jobset_objects(jobset, namespace)
        owners = [jobset, *jobs]
    elif kind == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        sts = _made("apps/v1", "StatefulSet", name, namespace, job, {"replicas": spec.get("replicas", 1)})
        owners.append(sts)
        for group in range(spec.get("replicas", 1)):
            for worker in range(lwt.get("size", 1)):
                host = f"{name}-{group}" if worker == 0 else f"{name}-{group}-{worker}"
                template = lwt.get("leaderTemplate", lwt["workerTemplate"]) if worker == 0 else lwt["workerTemplate"]
                labels = {"leaderworkerset.sigs.k8s.io/name": name,
                          "leaderworkerset.sigs.k8s.io/group-index": str(group),
                          "leaderworkerset.sigs.k8s.io/worker-index": str(worker)}
                pods.append(_pod(host, template, sts, namespace, labels, hostname=host, subdomain=name,
                                 annotations={"leaderworkerset.sigs.k8s.io/size": str(lwt.get("size", 1))}))
    elif kind == "Job":
        subdomain = (spec.get("template") or {}).get("spec", {}).get("subdomain")
        for i in range(spec.get("parallelism", 1)):
            labels = {"batch.kubernetes.io/job-name": name, "batch.kubernetes.io/job-completion-index": str(i)}
            pods.append(_pod(f"{name}-{i}-{_uid(job['metadata'].get('uid'), i)[:5]}", spec["template"], job,
                             namespace, labels, annotations={"batch.kubernetes.io/job-completion-index": str(i)},
                             hostname=f"{name}-{i}" if subdomain else None, subdomain=subdomain))
    return Emulation(tuple(owners), tuple(pods))
