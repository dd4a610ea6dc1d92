"""The controllers the agent knows, one module each, and the registry that lists them (as torchx keeps one module
per scheduler and a table of them).

All the agent knows of a controller is in its module: its pods' rules, its job objects' kinds, their pod
templates and its rank-0 rule (``base.Controller`` lists the questions). Everything else asks the registry: the
controller a pod names (``detect_controller``), the labels the published rows keep (``ALL_LABELS``), whose pod
templates a job object holds (``templates_owner``: ``inject`` and the webhook), the job objects the agent reads
and injects (``job_resources``: the webhook's resources, the sandbox's kinds; a test holds the shipped webhook
rules and RBAC to them).

A new controller is a module beside these (its ``Controller`` subclass and instance, label keys and kinds) and one
line in ``CONTROLLERS``; the variables it injects are rows in ``core/injected.py`` and its example pods a builder
in ``agent/examples.py`` (docs/architecture.md, "Adding a controller").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.core.controllers.base import (
    TORCHRUN_MASTER_PORT,
    Controller,
    FrameworkArgs,
    JobResource,
    Objects,
    OwnerOptions,
    PodTemplate,
    meta,
    qualify,
    replicas,
)
from agent.core.controllers.batch import INDEXED_JOB
from agent.core.controllers.jobset import (
    COORDINATOR,
    JOBSET,
    JOBSET_GLOBAL_INDEX,
    JOBSET_JOB_INDEX,
    JOBSET_NAME,
    JOBSET_RJOB,
    TRAINJOB,
    TRAINJOB_PREFIX,
)
from agent.core.controllers.kubeflow import JAXJOB, MPIJOB, PADDLEJOB, PYTORCHJOB, TFJOB, XGBOOSTJOB
from agent.core.controllers.lws import LWS
from agent.core.controllers.selector import GENERIC, parse_selector, selector_matches
from agent.core.controllers.volcano import VOLCANO
from agent.core.model import Options, RawPod
from agent.errors import InputError

__all__ = [
    "ALL_LABELS", "CONTROLLERS", "COORDINATOR", "GENERIC", "INDEXED_JOB", "JAXJOB", "JOBSET", "JOBSET_GLOBAL_INDEX",
    "JOBSET_JOB_INDEX", "JOBSET_NAME", "JOBSET_RJOB", "LWS", "MPIJOB", "PADDLEJOB", "PYTORCHJOB", "TFJOB",
    "TORCHRUN_MASTER_PORT", "TRAINJOB", "VOLCANO", "XGBOOSTJOB", "Controller", "FrameworkArgs", "JobResource",
    "Objects", "OwnerOptions", "PodTemplate", "detect_controller", "is_read_label", "job_resources", "parse_selector",
    "qualify", "replicas", "selector_matches", "templates_owner",
]

CONTROLLERS: dict[str, Controller] = {
    c.key: c for c in (VOLCANO, PYTORCHJOB, TFJOB, XGBOOSTJOB, PADDLEJOB, JAXJOB, MPIJOB, TRAINJOB, JOBSET, LWS,
                       INDEXED_JOB, GENERIC)
}

# Every pod label (and annotation) key some controller reads: the published rows keep these.
ALL_LABELS = frozenset().union(*(c.labels for c in CONTROLLERS.values()))


def is_read_label(key: str) -> bool:
    """A label some controller reads (TrainJob's claim reads any ``trainer.kubeflow.org/`` label)."""
    return key in ALL_LABELS or key.startswith(TRAINJOB_PREFIX)


def job_resources() -> tuple[JobResource, ...]:
    """Every kind of job object some controller reads or injects, once, in the registry's order."""
    found: dict[tuple[str, str], JobResource] = {}
    for controller in CONTROLLERS.values():
        for resource in controller.resources:
            found.setdefault((resource.group, resource.plural), resource)
    return tuple(found.values())


_TEMPLATES_OWNER = {(r.group, r.kind): c for c in CONTROLLERS.values() for r in c.resources if r.templates}


def templates_owner(obj: Mapping[str, Any]) -> Controller | None:
    """The controller whose kind ``obj`` is and whose pod templates it holds (any version of the group)."""
    api, kind = str(obj.get("apiVersion", "")), obj.get("kind")
    return _TEMPLATES_OWNER.get((api.split("/")[0] if "/" in api else "", kind)) if isinstance(kind, str) else None


def detect_controller(pod: RawPod, options: Options) -> Controller:
    """The controller named by ``--controller``/``--selector``, else the one whose labels the pod carries; a
    controller that creates another's objects outranks it (``Controller.supersedes``)."""
    name = meta(pod).name
    if options.choice.controller:
        try:
            return CONTROLLERS[options.choice.controller]
        except KeyError:
            known = ", ".join(CONTROLLERS)
            raise InputError(f"--controller '{options.choice.controller}' is unknown; use one of: {known}") from None
    if options.choice.selector:
        return GENERIC
    found = {c.key for c in CONTROLLERS.values() if c.claims(pod)}
    for key in list(found):
        found -= CONTROLLERS[key].supersedes
    if not found:
        known = ", ".join(c.key for c in CONTROLLERS.values() if c is not GENERIC)
        raise InputError(f"pod '{name}': no controller labels found ({known}); pass --controller, or --selector "
                         "with --index-label")
    if len(found) > 1:
        raise InputError(
            f"pod '{name}': labels of several controllers disagree ({', '.join(sorted(found))}); "
            "pass --controller to choose one"
        )
    return CONTROLLERS[found.pop()]
