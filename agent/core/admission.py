"""The admission webhook's answer to one AdmissionReview (admission.k8s.io/v1): the transform `inject` applies
(injection.py), returned as a JSONPatch.

A Pod is injected from what it carries (its annotations, PET_NNODES, its subdomain) over the namespace's
settings. A job object (Volcano Job, PyTorchJob, JobSet, ...) is injected whole, as `inject` does it, so its
own annotations and elasticPolicy count. A template that is already injected, by `inject` or by this webhook
at the job's level, is not injected again (the job's settings are not in its pods to be read again); only a
container added since by another webhook gets the shared mount (reinvocation). Bad settings deny the request
with the one line `inject` would print.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jsonpatch

from agent.core.injection import INIT, SIDECAR, Settings, Template, complete, inject, is_injected, templates
from agent.errors import InputError

API_VERSION = "admission.k8s.io/v1"
CheckArgs = Callable[[list[str], str], None]  # the CLI's parser: refuses a flag or value init/sidecar refuse

# (group, resource) the webhook takes, as its MutatingWebhookConfiguration's rules name them.
JOB_RESOURCES = {"batch.volcano.sh": ("jobs",), "kubeflow.org": ("pytorchjobs", "mpijobs"),
                 "jobset.x-k8s.io": ("jobsets",), "leaderworkerset.x-k8s.io": ("leaderworkersets",),
                 "batch": ("jobs",), "trainer.kubeflow.org": ("trainingruntimes", "clustertrainingruntimes")}


@dataclass(frozen=True)
class Request:
    """The parts of an AdmissionReview request the decision reads."""

    uid: str
    operation: str
    namespace: str
    obj: dict[str, Any]
    where: str


def parse_review(body: Any) -> Request:
    """The request of an AdmissionReview, or InputError (the server answers 400) when it is not one."""
    if not isinstance(body, Mapping) or body.get("kind") != "AdmissionReview":
        raise InputError("the body is not an AdmissionReview")
    if body.get("apiVersion") != API_VERSION:
        raise InputError(f"AdmissionReview {body.get('apiVersion')!r}: only {API_VERSION} is served; set "
                         "admissionReviewVersions: [v1] in the MutatingWebhookConfiguration")
    request = body.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise InputError("the AdmissionReview has no request.uid")
    raw = request.get("object")
    kind: Mapping[str, Any] = request["kind"] if isinstance(request.get("kind"), Mapping) else {}
    obj: dict[str, Any] = dict(raw) if isinstance(raw, Mapping) else {}
    # The API server sends the object with apiVersion and kind; fill them from request.kind if a client did not.
    if "kind" not in obj and kind.get("kind"):
        obj["kind"] = kind["kind"]
    if "apiVersion" not in obj and kind.get("version"):
        obj["apiVersion"] = f"{kind['group']}/{kind['version']}" if kind.get("group") else kind["version"]
    namespace: str = request["namespace"] if isinstance(request.get("namespace"), str) else ""
    where = f"{namespace + '/' if namespace else ''}{request.get('name') or ''}"
    return Request(request["uid"], str(request.get("operation", "")), namespace, obj, where)


def mutate(obj: dict[str, Any], namespace_settings: Settings, *, version: str, check: CheckArgs) -> list[str]:
    """Inject ``obj`` in place as the webhook does; the templates it changed. Raises InputError for settings
    that cannot work."""
    changed = []
    for template in templates(obj, namespace_settings):
        template.settings = template.settings.over(_annotations(template), template.where)
        if is_injected(template):
            if complete(template):
                changed.append(template.where)
            continue
        inject(template, version=version)
        _check(template, check)
        changed.append(template.where)
    return changed


def _annotations(template: Template) -> Mapping[str, Any] | None:
    meta = template.template.get("metadata")
    return meta.get("annotations") if isinstance(meta, Mapping) else None


def _check(template: Template, check: CheckArgs) -> None:
    spec = template.template.get("spec") or {}
    for container in spec.get("initContainers") or []:
        if isinstance(container, Mapping) and container.get("name") in (INIT, SIDECAR):
            check([str(a) for a in container.get("args") or []], f"{template.where} {container['name']}")


def answer(request: Request, namespace_settings: Settings, *, version: str, check: CheckArgs) -> dict[str, Any]:
    """The AdmissionReview response: allowed, with a JSONPatch when anything was added; denied (400) with the
    one line that says which setting to fix."""
    response: dict[str, Any] = {"uid": request.uid, "allowed": True}
    if request.operation == "CREATE":
        mutated = copy.deepcopy(request.obj)
        try:
            changed = mutate(mutated, namespace_settings, version=version, check=check)
        except InputError as err:
            response = {"uid": request.uid, "allowed": False,
                        "status": {"code": 400, "reason": "BadRequest", "message": f"topology-agent: {err}"}}
        else:
            if changed:
                ops = jsonpatch.make_patch(request.obj, mutated).patch
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(ops, separators=(",", ":")).encode()).decode()
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def namespace_settings(namespace: Mapping[str, Any] | None) -> Settings:
    """A namespace's ``topology-agent.io/*`` annotations: the defaults of every job and pod in it."""
    meta = namespace.get("metadata") if isinstance(namespace, Mapping) else None
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else "?"
    return Settings().over(annotations, f"Namespace {name}")
