"""Make the pods a controller would create from one of our example manifests (names, labels, hostnames per the
controller's conventions; the spec from the manifest's template), so tests can feed them to render."""

from __future__ import annotations

import copy
from typing import Any

from agent.examples import loopback_ip, make_pod


def _pod(name: str, template: dict[str, Any], labels: dict[str, str], n: int, *, annotations=None,
         hostname=None, subdomain=None, namespace="default") -> dict[str, Any]:
    spec = copy.deepcopy(template.get("spec", {}))
    pod = make_pod(name, namespace=namespace, labels=labels, annotations=annotations, hostname=hostname,
                   subdomain=subdomain or spec.get("subdomain"), ip=loopback_ip(n),
                   containers=spec.get("containers"))
    pod["spec"]["initContainers"] = spec.get("initContainers", [])
    return pod


# training-operator's kinds: their replica specs' field and the operator-name label value (PyTorchJob's pods are
# made without it here: a pod that names no operator is taken for a PyTorchJob's).
OPERATOR_KINDS = {"PyTorchJob": ("pytorchReplicaSpecs", None), "TFJob": ("tfReplicaSpecs", "tfjob-controller"),
                  "XGBoostJob": ("xgbReplicaSpecs", "xgboostjob-controller"),
                  "PaddleJob": ("paddleReplicaSpecs", "paddlejob-controller"),
                  "JAXJob": ("jaxReplicaSpecs", "jaxjob-controller")}


def pods_for(doc: dict[str, Any]) -> list[dict[str, Any]]:
    kind, name = doc["kind"], doc["metadata"]["name"]
    spec = doc["spec"]
    pods: list[dict[str, Any]] = []
    if kind == "Job" and doc["apiVersion"].startswith("batch.volcano.sh"):
        for task in spec["tasks"]:
            for i in range(task["replicas"]):
                pod_name = f"{name}-{task['name']}-{i}"
                labels = {"volcano.sh/job-name": name, "volcano.sh/task-spec": task["name"],
                          "volcano.sh/task-index": str(i)}
                pods.append(_pod(pod_name, task["template"], labels, len(pods), hostname=pod_name, subdomain=name))
    elif kind in OPERATOR_KINDS:
        field, operator = OPERATOR_KINDS[kind]
        for rtype, replica in spec[field].items():
            for i in range(replica["replicas"]):
                labels = {"training.kubeflow.org/job-name": name, "training.kubeflow.org/replica-type": rtype.lower(),
                          "training.kubeflow.org/replica-index": str(i)}
                if operator:  # training-operator v1.9 labels every kind's pods with its reconciler's name
                    labels["training.kubeflow.org/operator-name"] = operator
                pods.append(_pod(f"{name}-{rtype.lower()}-{i}", replica["template"], labels, len(pods)))
    elif kind == "MPIJob":
        base = {"training.kubeflow.org/operator-name": "mpi-operator", "training.kubeflow.org/job-name": name}
        launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]
        pods.append(_pod(f"{name}-launcher-abcde", launcher, {**base, "training.kubeflow.org/job-role": "launcher"},
                         0, hostname=f"{name}-launcher", subdomain=name))
        worker = spec["mpiReplicaSpecs"]["Worker"]
        for i in range(worker["replicas"]):
            labels = {**base, "training.kubeflow.org/job-role": "worker", "training.kubeflow.org/replica-index": str(i)}
            pods.append(_pod(f"{name}-worker-{i}", worker["template"], labels, i + 1, hostname=f"{name}-worker-{i}",
                             subdomain=name))
    elif kind == "JobSet":
        global_index = 0
        for rjob in spec["replicatedJobs"]:
            job_spec = rjob["template"]["spec"]
            for job_index in range(rjob.get("replicas", 1)):
                for completion in range(job_spec.get("parallelism", 1)):
                    host = f"{name}-{rjob['name']}-{job_index}-{completion}"
                    labels = {"jobset.sigs.k8s.io/jobset-name": name,
                              "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
                              "jobset.sigs.k8s.io/job-index": str(job_index),
                              "jobset.sigs.k8s.io/job-global-index": str(global_index),
                              "batch.kubernetes.io/job-completion-index": str(completion),
                              # the Job controller's own label: a JobSet's pods are its Jobs' pods
                              "batch.kubernetes.io/job-name": f"{name}-{rjob['name']}-{job_index}"}
                    pods.append(_pod(f"{host}-abcde", job_spec["template"], labels, len(pods), hostname=host,
                                     subdomain=name))
                global_index += 1
    elif kind == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        for group in range(spec.get("replicas", 1)):
            for worker in range(lwt["size"]):
                host = f"{name}-{group}" if worker == 0 else f"{name}-{group}-{worker}"
                template = lwt.get("leaderTemplate", lwt["workerTemplate"]) if worker == 0 else lwt["workerTemplate"]
                labels = {"leaderworkerset.sigs.k8s.io/name": name,
                          "leaderworkerset.sigs.k8s.io/group-index": str(group),
                          "leaderworkerset.sigs.k8s.io/worker-index": str(worker)}
                pods.append(_pod(host, template, labels, len(pods), hostname=host, subdomain=name,
                                 annotations={"leaderworkerset.sigs.k8s.io/size": str(lwt["size"])}))
    elif kind == "Job":
        for i in range(spec.get("parallelism", 1)):
            labels = {"batch.kubernetes.io/job-name": name, "batch.kubernetes.io/job-completion-index": str(i)}
            subdomain = spec["template"]["spec"].get("subdomain")
            pods.append(_pod(f"{name}-{i}-abcde", spec["template"], labels, i,
                             hostname=f"{name}-{i}" if subdomain else None, subdomain=subdomain))
    return pods


def pod_templates(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every PodTemplateSpec inside a manifest (core Jobs included)."""
    kind, spec = doc["kind"], doc.get("spec", {})
    if kind == "Job" and doc["apiVersion"].startswith("batch.volcano.sh"):
        return [t["template"] for t in spec["tasks"]]
    if kind in OPERATOR_KINDS:
        return [r["template"] for r in spec[OPERATOR_KINDS[kind][0]].values()]
    if kind == "MPIJob":
        return [r["template"] for r in spec["mpiReplicaSpecs"].values()]
    if kind == "JobSet":
        return [r["template"]["spec"]["template"] for r in spec["replicatedJobs"]]
    if kind == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        return [t for t in (lwt.get("leaderTemplate"), lwt["workerTemplate"]) if t]
    if kind == "Job":
        return [spec["template"]]
    return []
