"""The admission webhook's answer to one AdmissionReview (admission.k8s.io/v1): the transform `inject` applies
(injection.py), returned as a JSONPatch.

A Pod is injected from what it carries (its annotations, PET_NNODES, its subdomain) over the namespace's
settings. A job object (Volcano Job, PyTorchJob, JobSet, ...) is injected whole, as `inject` does it, so its
own annotations and elasticPolicy count. A template that is already injected, by `inject` or by this webhook
at the job's level, is not injected again (the job's settings are not in its pods to be read again); only a
container added since by another webhook gets the shared mount (reinvocation). Bad settings deny the request
with the one line `inject` would print. A job none of whose pods would train (a Volcano Job whose tasks no rule
makes training), which `inject` refuses, is admitted with that line as a warning (kubectl prints it): a namespace
that adopts every job holds jobs that are no training jobs, and refusing them would stop work the agent does not
serve.

The patch is built from what the transform changed, never by diffing the whole object: a 3 MiB object costs
a parse, not a deep copy and a tree diff (which would take a webhook to 80-110 times the object's size). The
transform touches only the agent's pieces of a template (injection.py), and each is recorded one level deep
before it runs: list entries the transform keeps are the same objects afterwards, so removals and insertions are
found by identity.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.adoption.injection import (
    INIT,
    INJECTED,
    SIDECAR,
    Settings,
    Template,
    complete,
    escape,
    inject,
    is_injected,
    templates,
)
from agent.core.controllers import job_resources
from agent.core.pods.validation import json_values, not_json
from agent.errors import InputError

API_VERSION = "admission.k8s.io/v1"
# JSON values a review may hold (validation.json_values), counted before it is parsed. A 3 MiB object of real
# shape has at most ~350000 (a Volcano Job whose 3 MiB is one env list: 137000 commas, as many colons, 69000
# objects); the parsed object costs up to ~70 bytes a value, so this bounds what the webhook's reviewing process
# holds (docs/adopt.md sizes its memory from the worst shape under it).
MAX_VALUES = 1 << 19
# Deeper than Python 3.11's and 3.12's JSON decoder goes (RecursionError near 1000); 3.13's goes on to thousands,
# so the bound is the webhook's own, the same on every interpreter. No Kubernetes object nests this deep.
MAX_DEPTH = 1000


def _job_resources() -> dict[str, tuple[str, ...]]:
    """group -> the resources of the job objects the webhook takes: each controller's kinds that hold pod
    templates, as the MutatingWebhookConfiguration's rules name them."""
    found: dict[str, tuple[str, ...]] = {}
    for resource in job_resources():
        if resource.templates:
            found[resource.group] = (*found.get(resource.group, ()), resource.plural)
    return found


JOB_RESOURCES = _job_resources()


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


def _annotations(template: Template) -> Mapping[str, Any] | None:
    meta = template.template.get("metadata")
    return meta.get("annotations") if isinstance(meta, Mapping) else None


def _check(template: Template, check: Callable[[list[str], str], None]) -> None:
    spec = template.template.get("spec") or {}
    for container in spec.get("initContainers") or []:
        if isinstance(container, Mapping) and container.get("name") in (INIT, SIDECAR):
            check([str(a) for a in container.get("args") or []], f"{template.where} {container['name']}")


def answer(request: Request, namespace_settings: Settings, *, version: str,
           check: Callable[[list[str], str], None]) -> dict[str, Any]:
    """The AdmissionReview response: allowed, with a JSONPatch when anything was added and a warning for a job
    that trains nothing; denied (400) with the one line that says which setting to fix. ``request.obj`` is
    changed in place (the caller drops it)."""
    response: dict[str, Any] = {"uid": request.uid, "allowed": True}
    if request.operation == "CREATE":
        warned: list[str] = []
        try:
            ops = patch(request.obj, namespace_settings, version=version, check=check, warnings=warned)
        except InputError as err:
            response = deny(request.uid, str(err))
        else:
            if warned:
                response["warnings"] = [f"topology-agent: {line}" for line in warned]
            if ops:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(ops, separators=(",", ":")).encode()).decode()
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def deny(uid: str, why: str) -> dict[str, Any]:
    """A refusal the API server shows its caller; a message quoting a caller's value is kept to one short line."""
    message = f"topology-agent: {why}"
    if len(message) > 1024:
        message = message[:1000] + " ... (cut)"
    return {"uid": uid, "allowed": False, "status": {"code": 400, "reason": "BadRequest", "message": message}}


def patch(obj: dict[str, Any], namespace_settings: Settings, *, version: str,
          check: Callable[[list[str], str], None], warnings: list[str] | None = None) -> list[dict]:
    """Inject ``obj`` in place as the webhook does and return the JSONPatch that does the same to the object
    as sent; ``warnings`` gets the line that says its job trains nothing."""
    ops: list[dict[str, Any]] = []
    for template in templates(obj, namespace_settings):
        if warnings is not None and template.untrained is not None and template.untrained not in warnings:
            warnings.append(template.untrained)
        template.settings = template.settings.over(_annotations(template), template.where)
        before = _Before(template.template)
        if is_injected(template):
            if not complete(template):
                continue
        else:
            inject(template, version=version)
            _check(template, check)
        ops += before.changes(template.template, template.pointer)
    return ops


_ABSENT: Any = object()
_SPEC_VALUES = ("serviceAccountName", "automountServiceAccountToken")
_SPEC_LISTS = ("initContainers", "volumes")


def _shallow(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


class _Before:
    """The parts of one pod template the transform may change (injection.py: its containers and volumes, the
    user's mounts, the ServiceAccount, the injected annotation), copied one level deep."""

    def __init__(self, template: dict[str, Any]) -> None:
        meta = template.get("metadata", _ABSENT)
        annotations = meta.get("annotations", _ABSENT) if isinstance(meta, dict) else _ABSENT
        self.meta, self.annotations = meta, annotations
        self.injected = annotations.get(INJECTED, _ABSENT) if isinstance(annotations, dict) else _ABSENT
        spec = template.get("spec")
        self.spec: dict[str, Any] = spec if isinstance(spec, dict) else {}
        self.values = {key: self.spec.get(key, _ABSENT) for key in _SPEC_VALUES + _SPEC_LISTS}
        self.lists = {key: _shallow(self.values[key]) for key in _SPEC_LISTS}
        containers = self.spec.get("containers")
        self.mounts = [(i, c, c.get("volumeMounts", _ABSENT), _shallow(c.get("volumeMounts")))
                       for i, c in enumerate(containers if isinstance(containers, list) else [])
                       if isinstance(c, dict)]

    def changes(self, template: dict[str, Any], at: str) -> list[dict[str, Any]]:
        ops: list[dict[str, Any]] = []
        meta = template.get("metadata", _ABSENT)
        if meta is not self.meta:
            ops.append(_set(f"{at}/metadata", meta))
        elif isinstance(meta, dict):
            annotations = meta.get("annotations", _ABSENT)
            if annotations is not self.annotations:
                ops.append(_set(f"{at}/metadata/annotations", annotations))
            elif isinstance(annotations, dict) and annotations.get(INJECTED, _ABSENT) != self.injected:
                ops.append(_set(f"{at}/metadata/annotations/{escape(INJECTED)}", annotations.get(INJECTED, _ABSENT)))
        spec = template.get("spec")
        if spec is not self.spec:
            return ops if spec is None else [*ops, _set(f"{at}/spec", spec)]
        for key in _SPEC_VALUES:
            value = spec.get(key, _ABSENT)
            if value is not self.values[key] and value != self.values[key]:
                ops.append(_set(f"{at}/spec/{key}", value))
        for key in _SPEC_LISTS:
            ops += _list_changes(f"{at}/spec/{key}", self.values[key], self.lists[key], spec.get(key, _ABSENT))
        for index, container, value, copied in self.mounts:
            ops += _list_changes(f"{at}/spec/containers/{index}/volumeMounts", value, copied,
                                 container.get("volumeMounts", _ABSENT))
        return ops


def _set(path: str, value: Any) -> dict[str, Any]:
    return {"op": "remove", "path": path} if value is _ABSENT else {"op": "add", "path": path, "value": value}


def _list_changes(path: str, before: Any, copied: Any, after: Any) -> list[dict[str, Any]]:
    """The list at ``path``: entries removed (from the end, so indices hold) and entries inserted, by identity;
    a value that was not this list before is set whole."""
    if after is not before or not isinstance(after, list):
        return [] if after is before else [_set(path, after)]
    kept = {id(entry) for entry in after}
    ops = [{"op": "remove", "path": f"{path}/{i}"} for i in reversed(range(len(copied)))
           if id(copied[i]) not in kept]
    old = {id(entry) for entry in copied}
    return ops + [{"op": "add", "path": f"{path}/{i}", "value": entry} for i, entry in enumerate(after)
                  if id(entry) not in old]


def read_review(body: bytes | bytearray) -> Request:
    """The request of an AdmissionReview's bytes, or InputError (the server answers 400) with the reason."""
    values = json_values(body)
    if values > MAX_VALUES:
        raise InputError(f"the review holds about {values} JSON values, more than the webhook reads ({MAX_VALUES}); "
                         "no Kubernetes object of 3 MiB has that many; label it topology-agent.io/inject=disabled "
                         "to create it without the agent")
    too_deep = InputError(f"the review is nested too deep to read (over {MAX_DEPTH} levels); no Kubernetes object "
                          "nests that deep")
    try:
        parsed = json.loads(body, parse_constant=not_json)
    except RecursionError:
        raise too_deep from None
    except ValueError as err:
        raise InputError(f"the body is not JSON: {err}") from None
    if body.count(b"{") + body.count(b"[") > MAX_DEPTH and _deeper_than(parsed, MAX_DEPTH):
        raise too_deep
    return parse_review(parsed)


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` containers deep, without recursing (a loop over its
    containers, run only for a body with more than ``limit`` of them)."""
    level: list[Any] = [value]
    for _ in range(limit):
        level = [child for item in level
                 for child in (item.values() if isinstance(item, dict) else item if isinstance(item, list) else ())
                 if isinstance(child, (dict, list))]
        if not level:
            return False
    return bool(level)


def namespace_settings(namespace: Mapping[str, Any] | None, *, defaults: Settings | None = None) -> Settings:
    """A namespace's ``topology-agent.io/*`` annotations over ``defaults`` (the webhook's ``--set``): the defaults
    of every job and pod in it."""
    meta = namespace.get("metadata") if isinstance(namespace, Mapping) else None
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else "?"
    return (defaults or Settings()).over(annotations, f"Namespace {name}")
