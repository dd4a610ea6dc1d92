"""A job manifest in, the objects and pods its controller would create out: the one place that knows what pods
controller X makes from manifest Y. Pure (no I/O, no clock): ``plan`` renders these pods, the sandbox plays the
controllers with them, and the tests build their pods from them.

Each controller's module carries its facts with the upstream file they were read from: names (Volcano
``<job>-<task>-<i>``, training-operator ``<job>-<type>-<i>``, MPIJob ``<job>-launcher-<5>`` and
``<job>-worker-<i>``, Job ``<job>-<index>-<5>``, JobSet ``<js>-<rjob>-<index>-<completion>-<5>``, LWS
``<lws>-<group>[-<worker>]``), labels, annotations, the controller chain of ownerReferences, hostname and
subdomain, and the env each controller writes (core/injected.py's rows, the release each module names).

What a real cluster draws at random is derived instead: uids (a job's own ``metadata.uid`` is kept), the
5-character name suffixes. The pods are Pending on no node, with no IP: placing them is the caller's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.core.controllers import templates_owner
from agent.core.controllers.jobset import TRAINJOBS
from agent.core.emulation.batch import job_pods
from agent.core.emulation.jobset import emulate_jobset, emulate_trainjob, find_runtime
from agent.core.emulation.kubeflow import KINDS, emulate_mpijob, emulate_operator
from agent.core.emulation.lws import emulate_lws
from agent.core.emulation.objects import Obj, name_of, with_uid
from agent.core.emulation.volcano import emulate_volcano
from agent.errors import InputError

__all__ = ["KINDS_EMULATED", "Emulation", "emulate", "is_job", "pod_templates"]

# (API group, kind) -> what its controller makes; a TrainJob's pods come from its runtime.
KINDS_EMULATED: Mapping[tuple[str, str], str] = {
    ("batch.volcano.sh", "Job"): "Volcano Job",
    **{("kubeflow.org", kind): kind for kind in KINDS},
    ("kubeflow.org", "MPIJob"): "MPIJob",
    ("trainer.kubeflow.org", "TrainJob"): "TrainJob",
    ("jobset.x-k8s.io", "JobSet"): "JobSet",
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): "LeaderWorkerSet",
    ("batch", "Job"): "Indexed Job",
}


@dataclass(frozen=True)
class Emulation:
    """What the controller creates for one job: the objects between the job and its pods (a TrainJob's JobSet, a
    JobSet's Jobs, an MPIJob's launcher Job, an LWS's StatefulSets), each owned as the controller owns it, and the
    pods, in the controller's order (each role's in index order)."""

    job: dict[str, Any]  # the job as the API server holds it (its namespace and uid set)
    owners: tuple[dict[str, Any], ...]
    pods: tuple[dict[str, Any], ...]


def _group(obj: Mapping[str, Any]) -> str:
    api = str(obj.get("apiVersion", ""))
    return api.split("/")[0] if "/" in api else ""


def is_job(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj`` is a job object whose pods ``emulate`` makes."""
    return (_group(obj), str(obj.get("kind", ""))) in KINDS_EMULATED


def emulate(job: Mapping[str, Any], *, runtimes: Sequence[Mapping[str, Any]] = ()) -> Emulation:
    """The objects and pods the controller of ``job`` creates (``runtimes``: a TrainJob's (Cluster)TrainingRuntime
    among them). A kind no controller here makes, or a manifest its controller would refuse: ``InputError``."""
    if not isinstance(job, Mapping) or not isinstance(job.get("metadata"), Mapping) or not name_of(job):
        raise InputError("the job manifest has no metadata.name; give the job a name")
    key = (_group(job), str(job.get("kind", "")))
    if key not in KINDS_EMULATED:
        known = ", ".join(sorted(set(KINDS_EMULATED.values())))
        raise InputError(f"{job.get('kind', '?')} '{name_of(job)}' ({job.get('apiVersion', '?')}) is not a job "
                         f"whose pods the agent knows how to make; give one of: {known}")
    held = with_uid(job)
    kind = key[1]
    if key == ("batch.volcano.sh", "Job"):
        owners, pods = emulate_volcano(held)
    elif key[0] == "kubeflow.org" and kind == "MPIJob":
        owners, pods = emulate_mpijob(held)
    elif key[0] == "kubeflow.org":
        owners, pods = emulate_operator(held)
    elif kind == TRAINJOBS.kind:
        owners, pods = emulate_trainjob(held, runtimes)
    elif kind == "JobSet":
        owners, pods = emulate_jobset(held)
    elif kind == "LeaderWorkerSet":
        owners, pods = emulate_lws(held)
    else:
        owners, pods = [], job_pods(held)
    return Emulation(job=held, owners=tuple(owners), pods=tuple(pods))


def pod_templates(job: Mapping[str, Any], *, runtimes: Sequence[Mapping[str, Any]] = ()) -> list[Obj]:
    """Every pod template of a job object (a runtime's too; a TrainJob's are its runtime's), as its controller's
    module in core/controllers finds them, in the object's order: the object's own (a caller may change them)."""
    if job.get("kind") == TRAINJOBS.kind:
        job = find_runtime(job, runtimes)
    controller = templates_owner(job)
    if controller is None:
        return []
    return [t.template for t in controller.pod_templates(job) if isinstance(t.template, dict)]
