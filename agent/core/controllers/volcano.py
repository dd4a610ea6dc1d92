"""Volcano Job (batch.volcano.sh): tasks of pods, each pod labelled with its job, task and index."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from agent.core.controllers.base import (
    Controller,
    JobResource,
    PodTemplate,
    list_at,
    meta,
    number,
    owner_ref_path,
    qualify,
    replicas,
    required,
    spec_dns,
)
from agent.core.model import Identity, Options, RawPod

VOLCANO_JOB = "volcano.sh/job-name"
VOLCANO_TASK = "volcano.sh/task-spec"
VOLCANO_INDEX = "volcano.sh/task-index"

# The Job CRD (config/crd/volcano/bases/batch.volcano.sh_jobs.yaml: short names vcjob, vj).
VCJOB = JobResource("batch.volcano.sh", "v1alpha1", "Job", "jobs", short=("vcjob", "vj"))


class Volcano(Controller):
    key, title, marker = "volcano", "Volcano Job", VOLCANO_JOB
    labels = frozenset({VOLCANO_JOB, VOLCANO_TASK, VOLCANO_INDEX})
    resources = (VCJOB,)
    default_roles = ("master", "worker")  # the pytorch plugin's --master and --worker defaults
    owner_is_job = True
    checks_index = True

    def identify(self, pod: RawPod, options: Options) -> Identity:
        fix = "the pod must be created by a Volcano Job (or pass --controller)"
        job = required(pod, VOLCANO_JOB, fix=fix)
        role = required(pod, VOLCANO_TASK, fix=fix)
        index = number(pod, VOLCANO_INDEX, fix="Volcano >= 1.7 sets it; set it on the pod or use --selector")
        return Identity(job=job, role=role, index=(index,), ordinal=index)

    def dns_name(self, pod: RawPod, ident: Identity, namespace: str, cluster_domain: str | None) -> str:
        # Volcano's svc plugin gives every pod hostname=<pod name>, subdomain=<job name> and a headless Service.
        hostname, subdomain = spec_dns(pod) or (meta(pod)[0], ident.job)
        return qualify(f"{hostname}.{subdomain}", namespace, cluster_domain)

    def owner_path(self, pod: RawPod) -> str | None:
        return owner_ref_path(pod, VCJOB)

    def pod_templates(self, job: Mapping[str, Any]) -> Iterator[PodTemplate]:
        """One template per task (``spec.tasks[i].template``), ``replicas`` pods each."""
        for i, task in enumerate(list_at(job, "spec", "tasks")):
            if isinstance(task, Mapping):
                name = task.get("name")
                yield PodTemplate(task.get("name", ""), f"tasks[{i}] ({name})", ("spec", "tasks", i, "template"),
                                  task.get("template"), replicas(task.get("replicas")))


VOLCANO = Volcano()
