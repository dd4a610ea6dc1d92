"""The Job controller (kubernetes pkg/controller/job, v1.28+): the pods of an Indexed Job, its own or a JobSet's.

Each pod is named ``<job>-<index>-<5 chars>`` (generateName ``<job>-<index>-``), its hostname ``<job>-<index>``,
and it carries the completion index as a label and an annotation; ``JOB_COMPLETION_INDEX`` is given to every
container and init container from that annotation (indexed_job_utils.go addCompletionIndexEnvVariables). The
labels are the controller's uid and the job's name, each with and without the ``batch.kubernetes.io/`` prefix
(k8s.io/api/batch/v1/types.go). ``min(parallelism, completions)`` pods exist at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.core.controllers.base import COMPLETION_INDEX, JOB_NAME
from agent.core.emulation.objects import (
    Obj,
    count,
    make_pod,
    name_of,
    namespace_of,
    refuse,
    suffix_for,
    template_at,
    uid_of,
)

COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"
CONTROLLER_UID = "batch.kubernetes.io/controller-uid"


def indexed_size(job: Mapping[str, Any], spec: Mapping[str, Any], where: str) -> int:
    """How many pods an Indexed Job runs at once; a Job that is not Indexed is refused (its pods have no index)."""
    if spec.get("completionMode") != "Indexed":
        raise refuse(job, f"{where}completionMode is {spec.get('completionMode', 'NonIndexed')!r}: its pods have "
                          "no index to rank by", f"set {where}completionMode: Indexed")
    parallelism = count(job, spec.get("parallelism"), f"{where}parallelism")
    completions = count(job, spec.get("completions"), f"{where}completions", default=parallelism)
    return min(parallelism, completions)


def job_pods(job: Mapping[str, Any], *, labels: Mapping[str, str] | None = None,
             annotations: Mapping[str, str] | None = None, subdomain: str | None = None) -> list[Obj]:
    """The pods the Job controller makes of ``job`` (a batch/v1 Job with metadata.uid), with ``labels`` and
    ``annotations`` of the controller that made the Job (JobSet's) under its own."""
    spec = job.get("spec") or {}
    size = indexed_size(job, spec, "spec.")
    template = template_at(job, spec.get("template"), "spec.template")
    name, uid = name_of(job), uid_of(job)
    pods = []
    for index in range(size):
        own = {CONTROLLER_UID: uid, JOB_NAME: name, "controller-uid": uid, "job-name": name,
               COMPLETION_INDEX: str(index)}
        pod = make_pod(f"{name}-{index}-{suffix_for(namespace_of(job), name, index)}", template, owner=job,
                       labels={**(labels or {}), **own},
                       annotations={**(annotations or {}), COMPLETION_INDEX: str(index)},
                       hostname=f"{name}-{index}",
                       subdomain=subdomain or (template.get("spec") or {}).get("subdomain"))
        entry = {"name": COMPLETION_INDEX_ENV,
                 "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}}
        for container in [*(pod["spec"].get("initContainers") or []), *pod["spec"]["containers"]]:
            env = container.setdefault("env", [])
            if not any(e.get("name") == COMPLETION_INDEX_ENV for e in env):
                env.append(dict(entry))
        pods.append(pod)
    return pods
