"""Objects as the API server reads and writes them: a collection's LIST, WATCH and CREATE (through the
mutating webhooks), one object's GET, DELETE, PUT and PATCH, and the ``status`` subresource, in JSON or the
Kubernetes protobuf kubectl's typed create commands send."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from typing import Any

import jsonpatch
from aiohttp import web

from agent.sandbox import admission, protobuf, tables
from agent.sandbox.discovery import Catalog, Resolved, resource_key
from agent.sandbox.listing import Pager, list_response
from agent.sandbox.responses import metadata_only, partial, status
from agent.sandbox.selectors import SelectorError, parse_field_selector, parse_label_selector
from agent.sandbox.store import Conflict, NotFound, Obj, Store
from agent.sandbox.watching import Watches


class Objects:
    """The handlers of ``/api/...`` and ``/apis/...`` collections and objects, over one store."""

    def __init__(self, store: Store, catalog: Catalog, admission_: admission.Caller, watches: Watches) -> None:
        self.store = store
        self.catalog = catalog
        self.admission = admission_
        self.watches = watches
        self.pager = Pager()

    def store_object(self, resource: str, namespace: str, body: Obj, *, keep_uid: bool = False) -> Obj:
        """Store a created object (Conflict if its name is taken); a CRD's kind is served from now on."""
        created = self.store.create(resource, namespace, body, keep_uid=keep_uid)
        self.catalog.learn(resource, created)
        return created

    # --- collections -------------------------------------------------------------------------------------

    async def collection(self, request: web.Request) -> web.StreamResponse:
        resolved = self.catalog.resolve(request)
        if isinstance(resolved, web.Response):
            return resolved
        namespace = request.match_info.get("namespace") if resolved.namespaced else ""
        if request.method == "GET":
            return await self._list(request, resolved, namespace)
        if request.method == "POST":
            if namespace is None:
                return status(405, "MethodNotAllowed", "create needs a namespace")
            return await self._create(request, resolved, namespace)
        return status(405, "MethodNotAllowed", f"{request.method} is not supported on a collection")

    async def _list(self, request: web.Request, resolved: Resolved, namespace: str | None) -> web.StreamResponse:
        """A LIST, or a WATCH when asked (``?watch=true``), of the objects the selectors match."""
        try:
            matches = matcher(request)
        except SelectorError as err:
            return status(400, "BadRequest", str(err))
        if request.query.get("watch") in ("1", "true"):
            return await self.watches.serve(request, resolved.resource, namespace, matches, resolved.kind,
                                            resolved.api_version)
        limit = int(request.query.get("limit", "0") or 0)
        paged = self.pager.page(self.store, resolved.resource, namespace, matches, limit=limit,
                                token=request.query.get("continue", ""))
        if isinstance(paged, web.Response):
            return paged
        return list_response(request, resolved.kind, resolved.api_version, *paged)

    async def _create(self, request: web.Request, resolved: Resolved, namespace: str) -> web.Response:
        kind = resolved.kind
        body = await read_body(request)
        if isinstance(body, web.Response):
            return body
        if not isinstance(body.get("metadata"), dict) or not (body["metadata"].get("name")
                                                              or body["metadata"].get("generateName")):
            return status(422, "Invalid", f"{kind} is invalid: metadata.name: Required value")
        body.setdefault("apiVersion", resolved.api_version)
        body.setdefault("kind", kind)
        written(kind, body)
        if namespace:
            body["metadata"]["namespace"] = namespace
        admitted = await self._admit(request, kind, namespace, body)
        if isinstance(admitted, web.Response):
            return admitted
        body = admitted
        if request.query.get("dryRun"):  # kubectl --dry-run=server: checked, answered, not stored
            return web.json_response(body, status=201)
        try:
            created = self.store_object(resolved.resource, namespace, body)
        except Conflict:
            name = body["metadata"]["name"]
            return status(409, "AlreadyExists", f'{kind.lower()}s "{name}" already exists',
                          details={"name": name, "kind": kind.lower() + "s"})
        return web.json_response(created, status=201)

    async def _admit(self, request: web.Request, kind: str, namespace: str, body: Obj) -> Obj | web.Response:
        """The mutating admission webhooks, as the API server runs them before it stores a created object."""
        configs = self.store.list(resource_key("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations"),
                                  "")
        if not configs:
            return body
        info = request.match_info
        target = admission.Target(info.get("group", ""), info["version"], info["plural"], kind, namespace,
                                  dry_run=bool(request.query.get("dryRun")))
        try:
            ns = self.store.get(resource_key("", "v1", "namespaces"), "", namespace) if namespace else None
        except NotFound:
            ns = None
        try:
            return await self.admission.admit(configs, target, body, ns)
        except admission.Denied as err:
            return status(err.code, err.reason, err.message)

    # --- one object --------------------------------------------------------------------------------------

    async def item(self, request: web.Request) -> web.StreamResponse:
        resolved = self.catalog.resolve(request)
        if isinstance(resolved, web.Response):
            return resolved
        resource, kind = resolved.resource, resolved.kind
        namespace, name = _address(request, resolved)
        try:
            current = self.store.get(resource, namespace, name)
        except NotFound:
            return status(404, "NotFound", f'{kind.lower()}s "{name}" not found',
                          details={"name": name, "kind": kind.lower() + "s"})
        if request.method == "GET":
            if tables.wants_table(request.headers.get("Accept", "")):
                return web.json_response(tables.table(kind, [current], str(self.store.rv), partial=partial))
            return web.json_response(partial(current) if metadata_only(request) else current)
        if request.method == "DELETE":
            graceful = resource == "/v1/pods" and request.query.get("gracePeriodSeconds") not in (None, "0") \
                and bool(current.get("metadata", {}).get("finalizers"))
            return web.json_response(self.store.delete(resource, namespace, name, graceful=graceful))
        if request.method == "PUT":
            return await self._replace(request, resolved, current)
        if request.method == "PATCH":
            return await self._patch(request, resolved, current)
        return status(405, "MethodNotAllowed", f"{request.method} is not supported")

    async def _replace(self, request: web.Request, resolved: Resolved, current: Obj) -> web.Response:
        """PUT: the object as sent (only its status, on the status subresource), if its resourceVersion is
        still the current one."""
        kind, (namespace, name) = resolved.kind, _address(request, resolved)
        body = await read_body(request)
        if isinstance(body, web.Response):
            return body
        written(kind, body)
        if request.match_info.get("sub") == "status":
            merged = copy.deepcopy(current)
            merged["status"] = body.get("status", {})
            body = merged
        try:
            return web.json_response(self.store.replace(resolved.resource, namespace, name, body))
        except Conflict:
            return status(409, "Conflict", f'Operation cannot be fulfilled on {kind.lower()}s "{name}": '
                                           "the object has been modified; please apply your changes to the "
                                           "latest version and try again")

    async def _patch(self, request: web.Request, resolved: Resolved, current: Obj) -> web.Response:
        """PATCH: a JSON patch, or a merge patch (strategic-merge alike: lists are replaced, enough for the pod
        fields here); the status subresource changes the status only, the object everything but it."""
        patch = await read_body(request)
        if isinstance(patch, web.Response):
            return patch
        new = copy.deepcopy(current)
        if request.content_type == "application/json-patch+json":
            try:
                if not isinstance(patch, list):
                    return status(400, "BadRequest", "a JSON patch is a list of operations")
                new = jsonpatch.apply_patch(new, patch)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError) as err:
                return status(422, "Invalid", f"the JSON patch does not apply: {err}")
        else:
            new = merge_patch(new, patch)
        sub = request.match_info.get("sub")
        if sub == "status":
            kept = copy.deepcopy(current)
            kept["status"] = new.get("status", {})
            new = kept
        elif sub is None:
            new["status"] = current.get("status", {})
        new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        namespace, name = _address(request, resolved)
        return web.json_response(self.store.replace(resolved.resource, namespace, name, new))


def _address(request: web.Request, resolved: Resolved) -> tuple[str, str]:
    """The namespace ("" for a cluster-scoped kind) and name of the object a request names."""
    return request.match_info.get("namespace", "") if resolved.namespaced else "", request.match_info["name"]


def matcher(request: web.Request) -> Callable[[Obj], bool]:
    """The request's label and field selectors as one test (SelectorError if either does not parse)."""
    labels = parse_label_selector(request.query.get("labelSelector"))
    fields = parse_field_selector(request.query.get("fieldSelector"))
    return lambda obj: labels(obj) and fields(obj)


async def read_body(request: web.Request) -> Obj | web.Response:
    """The request's object: JSON, or the Kubernetes protobuf kubectl's typed create commands send."""
    raw = await request.read()
    if request.content_type == "application/vnd.kubernetes.protobuf":
        try:
            return protobuf.decode(raw)
        except protobuf.Unsupported as err:
            return status(415, "UnsupportedMediaType", f"the sandbox reads protobuf for "
                          f"{', '.join(protobuf.KINDS)} only ({err}); send JSON (kubectl apply -f)")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as err:
        return status(400, "BadRequest", f"the body is not JSON ({type(err).__name__}): {str(err)[:120]}")
    if not isinstance(body, (dict, list)):
        return status(400, "BadRequest", "the body is not a JSON object")
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
