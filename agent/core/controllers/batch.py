"""A plain Indexed Job (batch/v1): one role, each pod labelled with its completion index."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from agent.core.controllers.base import (
    COMPLETION_INDEX,
    JOB_NAME,
    JOB_POD_LABELS,
    Controller,
    JobResource,
    PodTemplate,
    at,
    is_job_pod_by_dns,
    number,
    owner_ref_path,
    replicas,
    required,
    spec_of,
)
from agent.core.model import Identity, Options, RawPod

JOBS = JobResource("batch", "v1", "Job", "jobs")
POD_LABELS = JOB_POD_LABELS  # a pod with one of these was made by a Job: its template was a Job's


class IndexedJob(Controller):
    key, title, marker = "indexed-job", "Indexed Job", JOB_NAME
    labels = frozenset({JOB_NAME, COMPLETION_INDEX})
    resources = (JOBS,)
    owner_is_job = True

    def identify(self, pod: RawPod, options: Options) -> Identity:
        job = required(pod, JOB_NAME, fix="the pod must be created by a batch/v1 Job (or pass --controller)")
        index = number(pod, COMPLETION_INDEX, fix="the Job must use completionMode: Indexed")
        return Identity(job=job, role="worker", index=(index,), ordinal=index)

    # dns_name: the Job controller sets hostname <job>-<index> only when the template has a subdomain; without a
    # headless Service of that name there is no DNS record, so None makes the caller ask for --address ip.

    def names_by_dns(self, pod: Mapping[str, Any]) -> bool:
        """A Job's pod (or a JobSet's) with a subdomain, as its Job's template has it."""
        return is_job_pod_by_dns(pod)

    def owner_path(self, pod: RawPod) -> str | None:
        return owner_ref_path(pod, JOBS)

    def pod_templates(self, job: Mapping[str, Any]) -> Iterator[PodTemplate]:
        """``spec.template``: min(parallelism, completions) pods at once (fewer than parallelism when fewer
        completions are left: JobSpec.Parallelism, k8s.io/api/batch/v1/types.go), named by DNS when it has a
        subdomain."""
        spec = spec_of(job)
        parallelism = replicas(spec.get("parallelism"))
        template = spec.get("template")
        yield PodTemplate("worker", "", ("spec", "template"), template,
                          min(parallelism, replicas(spec.get("completions"), parallelism)),
                          by_dns=bool(at(template, "spec", "subdomain")))


INDEXED_JOB = IndexedJob()
