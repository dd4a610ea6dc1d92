"""A plain Indexed Job (batch/v1): one role, each pod labelled with its completion index."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from agent.core.controllers.base import (
    COMPLETION_INDEX,
    JOB_NAME,
    Controller,
    JobResource,
    PodTemplate,
    at,
    number,
    owner_ref_path,
    replicas,
    required,
    spec_of,
)
from agent.core.model import Identity, Options, RawPod

JOBS = JobResource("batch", "v1", "Job", "jobs")
# The labels the Job controller puts on its pods (JobSet's pods are a Job's too): such a pod's template was a Job's.
# JobNameLabel and the unprefixed one it keeps for earlier releases (k8s.io/api/batch/v1/types.go).
POD_LABELS = (JOB_NAME, "job-name")


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
        labels = at(pod, "metadata", "labels")
        return bool(at(pod, "spec", "subdomain")) and isinstance(labels, Mapping) and any(
            key in labels for key in POD_LABELS)

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
