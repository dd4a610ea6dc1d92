"""Objects as the API server reads and writes them: a collection's LIST, WATCH and CREATE (through the
mutating webhooks), one object's GET, DELETE, PUT and PATCH, and the ``status`` subresource, in JSON or the
Kubernetes protobuf kubectl's typed create commands send. Each request is a ``Call`` and each answer an
``Answer`` (calls.py), whether it came over HTTPS (server.py) or in memory (memory.py)."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Mapping
from typing import Any

import jsonpatch

from agent.sandbox import admission, events, protobuf, tables
from agent.sandbox.calls import Answer, Call, failure
from agent.sandbox.discovery import Catalog, Resolved, resource_key
from agent.sandbox.listing import Pager, list_answer
from agent.sandbox.responses import metadata_only, partial
from agent.sandbox.selectors import SelectorError, parse_field_selector, parse_label_selector
from agent.sandbox.store import Conflict, NotFound, Obj, Store
from agent.sandbox.watching import Watch


class Objects:
    """The answers to ``/api/...`` and ``/apis/...`` collections and objects, over one store."""

    def __init__(self, store: Store, catalog: Catalog, admission_: admission.Caller) -> None:
        self.store = store
        self.catalog = catalog
        self.admission = admission_
        self.pager = Pager()

    def store_object(self, resource: str, namespace: str, body: Obj, *, keep_uid: bool = False) -> Obj:
        """Store a created object (Conflict if its name is taken); a CRD's kind is served from now on."""
        created = self.store.create(resource, namespace, body, keep_uid=keep_uid)
        self.catalog.learn(resource, created)
        return created

    async def answer(self, call: Call) -> Answer | Watch:
        """The answer to a call on an object path; a ``Watch`` for the caller to stream when one is asked."""
        resolved = self.catalog.resolve(call.route)
        if isinstance(resolved, Answer):
            return resolved
        if call.is_item:
            return await self._item(call, resolved)
        namespace = call.route.get("namespace") if resolved.namespaced else ""
        if call.method == "GET":
            return self._list(call, resolved, namespace)
        if call.method == "POST":
            if namespace is None:
                return failure(405, "MethodNotAllowed", "create needs a namespace")
            return await self._create(call, resolved, namespace)
        return failure(405, "MethodNotAllowed", f"{call.method} is not supported on a collection")

    # --- collections -------------------------------------------------------------------------------------

    def _list(self, call: Call, resolved: Resolved, namespace: str | None) -> Answer | Watch:
        """A LIST, or a WATCH when asked (``?watch=true``), of the objects the selectors match."""
        try:
            matches = matcher(call.query, resolved)
        except SelectorError as err:
            return failure(400, "BadRequest", str(err))
        shown = _shown(resolved)
        if call.query.get("watch") in ("1", "true"):
            return Watch(resolved.resource, namespace, matches, resolved.kind, resolved.api_version, call.path,
                         resource_version=call.query.get("resourceVersion", ""),
                         bookmarks=call.query.get("allowWatchBookmarks") in ("true", "1"),
                         timeout=float(call.query.get("timeoutSeconds", "0") or 0) or None, agent=call.agent,
                         shown=shown)
        limit = int(call.query.get("limit", "0") or 0)
        paged = self.pager.page(self.store, resolved.resource, namespace, matches, limit=limit,
                                token=call.query.get("continue", ""))
        if isinstance(paged, Answer):
            return paged
        items, meta = paged
        return list_answer(call.accept, resolved.kind, resolved.api_version, [shown(o) for o in items] if shown
                           else items, meta, include=call.query.get("includeObject", ""))

    async def _create(self, call: Call, resolved: Resolved, namespace: str) -> Answer:
        kind = resolved.kind
        body = read_body(call)
        if isinstance(body, Answer):
            return body
        if not isinstance(body.get("metadata"), dict) or not (body["metadata"].get("name")
                                                              or body["metadata"].get("generateName")):
            return failure(422, "Invalid", f"{kind} is invalid: metadata.name: Required value")
        body.setdefault("apiVersion", resolved.api_version)
        body.setdefault("kind", kind)
        written(kind, body)
        if namespace:
            body["metadata"]["namespace"] = namespace
        if _converted(resolved):  # an events.k8s.io Event, validated and stored in v1's form
            why = events.invalid_create(body)
            if why is not None:
                return failure(422, "Invalid", f'Event.events.k8s.io "{body["metadata"].get("name", "")}" is '
                                               f"invalid: {why}")
            body = events.to_core(body)
        admitted = await self._admit(call, kind, namespace, body)
        if isinstance(admitted, Answer):
            return admitted
        body = admitted
        if call.query.get("dryRun"):  # kubectl --dry-run=server: checked, answered, not stored
            return Answer(201, body)
        try:
            created = self.store_object(resolved.resource, namespace, body)
        except Conflict:
            name = body["metadata"]["name"]
            return failure(409, "AlreadyExists", f'{kind.lower()}s "{name}" already exists',
                           details={"name": name, "kind": kind.lower() + "s"})
        return Answer(201, _show(resolved, created))

    async def _admit(self, call: Call, kind: str, namespace: str, body: Obj) -> Obj | Answer:
        """The mutating admission webhooks, as the API server runs them before it stores a created object."""
        configs = self.store.list(resource_key("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations"),
                                  "")
        if not configs:
            return body
        info = call.route
        target = admission.Target(info.get("group", ""), info["version"], info["plural"], kind, namespace,
                                  dry_run=bool(call.query.get("dryRun")))
        try:
            ns = self.store.get(resource_key("", "v1", "namespaces"), "", namespace) if namespace else None
        except NotFound:
            ns = None
        try:
            return await self.admission.admit(configs, target, body, ns)
        except admission.Denied as err:
            return failure(err.code, err.reason, err.message)

    # --- one object --------------------------------------------------------------------------------------

    async def _item(self, call: Call, resolved: Resolved) -> Answer:
        resource, kind = resolved.resource, resolved.kind
        namespace, name = _address(call, resolved)
        try:
            current = self.store.get(resource, namespace, name)
        except NotFound:
            return failure(404, "NotFound", f'{kind.lower()}s "{name}" not found',
                           details={"name": name, "kind": kind.lower() + "s"})
        if call.method == "GET":
            if tables.wants_table(call.accept):
                return Answer(200, tables.table(kind, [current], {"resourceVersion": str(self.store.rv)},
                                                partial=partial))
            return Answer(200, partial(current) if metadata_only(call.accept) else _show(resolved, current))
        if call.method == "DELETE":
            graceful = resource == "/v1/pods" and call.query.get("gracePeriodSeconds") not in (None, "0") \
                and bool(current.get("metadata", {}).get("finalizers"))
            return Answer(200, _show(resolved, self.store.delete(resource, namespace, name, graceful=graceful)))
        if call.method == "PUT":
            return self._replace(call, resolved, current)
        if call.method == "PATCH":
            return self._patch(call, resolved, current)
        return failure(405, "MethodNotAllowed", f"{call.method} is not supported")

    def _replace(self, call: Call, resolved: Resolved, current: Obj) -> Answer:
        """PUT: the object as sent (only its status, on the status subresource), if its resourceVersion is
        still the current one."""
        kind, (namespace, name) = resolved.kind, _address(call, resolved)
        body = read_body(call)
        if isinstance(body, Answer):
            return body
        written(kind, body)
        if call.route.get("sub") == "status":
            merged = copy.deepcopy(current)
            merged["status"] = body.get("status", {})
            body = merged
        if _converted(resolved):
            body = events.to_core(body)
            why = events.invalid_update(body, current)
            if why is not None:
                return failure(422, "Invalid", f'Event.events.k8s.io "{name}" is invalid: {why}')
        try:
            return Answer(200, _show(resolved, self.store.replace(resolved.resource, namespace, name, body)))
        except Conflict:
            return failure(409, "Conflict", f'Operation cannot be fulfilled on {kind.lower()}s "{name}": '
                                            "the object has been modified; please apply your changes to the "
                                            "latest version and try again")

    def _patch(self, call: Call, resolved: Resolved, current: Obj) -> Answer:
        """PATCH: a JSON patch, or a merge patch (strategic-merge alike: lists are replaced, enough for the pod
        fields here); the status subresource changes the status only, the object everything but it."""
        patch = read_body(call)
        if isinstance(patch, Answer):
            return patch
        new = copy.deepcopy(_show(resolved, current))
        if call.content_type == "application/json-patch+json":
            try:
                if not isinstance(patch, list):
                    return failure(400, "BadRequest", "a JSON patch is a list of operations")
                new = jsonpatch.apply_patch(new, patch)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError) as err:
                return failure(422, "Invalid", f"the JSON patch does not apply: {err}")
        else:
            new = merge_patch(new, patch)
        sub = call.route.get("sub")
        if sub == "status":
            kept = copy.deepcopy(current)
            kept["status"] = new.get("status", {})
            new = kept
        elif sub is None:
            new["status"] = current.get("status", {})
        new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        namespace, name = _address(call, resolved)
        if _converted(resolved):
            new = events.to_core(new)
            why = events.invalid_update(new, current)
            if why is not None:
                return failure(422, "Invalid", f'Event.events.k8s.io "{name}" is invalid: {why}')
        return Answer(200, _show(resolved, self.store.replace(resolved.resource, namespace, name, new)))


def _address(call: Call, resolved: Resolved) -> tuple[str, str]:
    """The namespace ("" for a cluster-scoped kind) and name of the object a call names."""
    return call.route.get("namespace", "") if resolved.namespaced else "", call.route["name"]


def _converted(resolved: Resolved) -> bool:
    """Whether the kind is served from another version's store: events.k8s.io's Events, kept in v1's form."""
    return resolved.resource == events.CORE and resolved.api_version != "v1"


def _shown(resolved: Resolved) -> Callable[[Obj], Obj] | None:
    """How a stored object is shown in the request's version (None: as stored)."""
    return events.to_events if _converted(resolved) else None


def _show(resolved: Resolved, obj: Obj) -> Obj:
    return events.to_events(obj) if _converted(resolved) else obj


def matcher(query: Mapping[str, str], resolved: Resolved | None = None) -> Callable[[Obj], bool]:
    """The query's label and field selectors as one test (SelectorError if either does not parse); Events are
    selected by the fields the API server offers for them, in the request's version's names."""
    labels = parse_label_selector(query.get("labelSelector"))
    if resolved is not None and resolved.resource == events.CORE:
        fields = events.matcher(query.get("fieldSelector"), group=resolved.api_version.rpartition("/")[0])
    else:
        fields = parse_field_selector(query.get("fieldSelector"))
    return lambda obj: labels(obj) and fields(obj)


def read_body(call: Call) -> Obj | Answer:
    """The call's object: JSON, or the Kubernetes protobuf kubectl's typed create commands send."""
    raw = call.body
    if call.content_type == "application/vnd.kubernetes.protobuf":
        try:
            return protobuf.decode(raw)
        except protobuf.Unsupported as err:
            return failure(415, "UnsupportedMediaType", f"the sandbox reads protobuf for "
                           f"{', '.join(protobuf.KINDS)} only ({err}); send JSON (kubectl apply -f)")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as err:
        return failure(400, "BadRequest", f"the body is not JSON ({type(err).__name__}): {str(err)[:120]}")
    if not isinstance(body, (dict, list)):
        return failure(400, "BadRequest", "the body is not a JSON object")
    return body  # type: ignore[return-value]


def written(kind: str, obj: Obj) -> None:
    """What the API server does to an object as it is written, where kubectl relies on it: a Secret's
    ``stringData`` is merged into ``data`` (base64) and not stored."""
    if kind == "Secret" and isinstance(obj.get("stringData"), dict):
        if not isinstance(obj.get("data"), dict):
            obj["data"] = {}
        data = obj["data"]
        for key, value in obj.pop("stringData").items():
            data[key] = base64.b64encode(str(value).encode()).decode()


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):  # strategic-merge directives ($patch, $retainKeys): not needed here
            continue
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result
