"""What the sandbox serves and how clients find it: the served kinds (the sandbox's table plus each created
CRD's kind), the discovery documents kubectl reads (/api, /apis, resource lists with short names and
categories) and OpenAPI, whose fieldValidation parameter makes kubectl leave field validation to the server."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from aiohttp import web

from agent.sandbox.calls import Answer, failure
from agent.sandbox.responses import constant, status
from agent.sandbox.store import Obj

GVR = tuple[str, str, str]  # (group, version, plural)


@dataclass(frozen=True)
class Kind:
    """A served resource: its kind, scope, and what kubectl's discovery reads (short names, categories)."""

    kind: str
    namespaced: bool
    short: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    stored_as: GVR | None = None  # another version's store, converted at each request (events.k8s.io's Events)


class Resolved(NamedTuple):
    """The resource a request names: the store's key for it, its kind, apiVersion and scope."""

    resource: str
    kind: str
    api_version: str
    namespaced: bool


def resource_key(group: str, version: str, plural: str) -> str:
    return f"{group}/{version}/{plural}"


class Catalog:
    """The kinds served, asked by every request's routing and by discovery; a created CRD adds its kind."""

    def __init__(self, resources: Mapping[GVR, Kind], subresources: Mapping[GVR, tuple[str, ...]], *,
                 version: str, definitions: str) -> None:
        self.resources = dict(resources)  # plus the kinds of the CRDs created in this sandbox
        self.subresources = subresources
        self.version = version  # the gitVersion the OpenAPI documents name
        self.definitions = definitions  # the resource whose objects (CRDs) add kinds

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/api", constant({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}))
        router.add_get("/apis", self._apis)
        router.add_get("/api/v1", self._core_resources)
        router.add_get("/apis/{group}/{version}", self._group_resources)
        # OpenAPI v3 with each kind's PATCH operation and its fieldValidation parameter: kubectl's default
        # --validate=strict then leaves validation to the server (cli-runtime pkg/resource/
        # query_param_verifier_v3.go). A v2 document without definitions for what kubectl validates itself (a
        # v1 List): a kind it has no schema for passes.
        router.add_get("/openapi/v2", self._openapi_v2)
        router.add_get("/openapi/v3", self._openapi_index)
        router.add_get("/openapi/v3/{path:.+}", self._openapi_group)

    # --- the served kinds --------------------------------------------------------------------------------

    def resolve(self, route: Mapping[str, str]) -> Resolved | Answer:
        """The resource an object path names (calls.route), or 404."""
        group, version, plural = route.get("group", ""), route["version"], route["plural"]
        found = self.resources.get((group, version, plural))
        if found is None:
            return failure(404, "NotFound", "the server could not find the requested resource")
        return Resolved(resource_key(*(found.stored_as or (group, version, plural))), found.kind,
                        f"{group}/{version}" if group else version, found.namespaced)

    def learn(self, resource: str, created: Obj) -> None:
        """A CustomResourceDefinition's kind is served from its creation (no schema checks: stored as sent)."""
        if resource != self.definitions:
            return
        spec = created.get("spec") or {}
        names = spec.get("names") or {}
        group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
        if not (isinstance(group, str) and isinstance(plural, str) and isinstance(kind, str)):
            return
        for version in spec.get("versions") or []:
            if isinstance(version, dict) and version.get("served", True) and isinstance(version.get("name"), str):
                self.resources[(group, version["name"], plural)] = Kind(
                    kind, spec.get("scope", "Namespaced") != "Cluster", tuple(names.get("shortNames") or ()),
                    tuple(names.get("categories") or ()))

    def _group_versions(self) -> list[tuple[str, str]]:
        return sorted({(g, v) for g, v, _ in self.resources})

    # --- discovery ---------------------------------------------------------------------------------------

    async def _apis(self, _: web.Request) -> web.Response:
        groups: dict[str, list[str]] = {}
        for group, version, _plural in self.resources:
            if group and version not in groups.setdefault(group, []):
                groups[group].append(version)
        body = {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
             "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
            for g, vs in groups.items()]}
        return web.json_response(body)

    async def _core_resources(self, _: web.Request) -> web.Response:
        return self._resource_list("", "v1")

    async def _group_resources(self, request: web.Request) -> web.Response:
        return self._resource_list(request.match_info["group"], request.match_info["version"])

    def _resource_list(self, group: str, version: str) -> web.Response:
        resources = []
        for (g, v, plural), served in self.resources.items():
            if (g, v) != (group, version):
                continue
            resources.append({"name": plural, "singularName": served.kind.lower(), "namespaced": served.namespaced,
                              "kind": served.kind,
                              "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                              **({"shortNames": list(served.short)} if served.short else {}),
                              **({"categories": list(served.categories)} if served.categories else {})})
            for sub in self.subresources.get((g, v, plural), ()):
                resources.append({"name": f"{plural}/{sub}", "singularName": "", "namespaced": served.namespaced,
                                  "kind": served.kind, "verbs": ["get", "patch", "update"]})
        if not resources:
            return status(404, "NotFound", f"the server could not find the requested resource {group}/{version}")
        return web.json_response({"kind": "APIResourceList", "apiVersion": "v1",
                                  "groupVersion": f"{group}/{version}" if group else version,
                                  "resources": resources})

    # --- OpenAPI -----------------------------------------------------------------------------------------

    async def _openapi_v2(self, request: web.Request) -> web.Response:
        if "protobuf" in request.headers.get("Accept", ""):
            # gnostic's openapi_v2.Document with field 1 (swagger) = "2.0", as client-go's discovery reads it
            return web.Response(body=b"\n\x032.0",
                                content_type="application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
        return web.json_response({"swagger": "2.0", "info": {"title": "Kubernetes", "version": self.version},
                                  "paths": {}})

    async def _openapi_index(self, _: web.Request) -> web.Response:
        paths = {}
        for group, version in self._group_versions():
            path = f"apis/{group}/{version}" if group else f"api/{version}"
            paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={len(self.resources)}"}
        return web.json_response({"paths": paths})

    async def _openapi_group(self, request: web.Request) -> web.Response:
        parts = request.match_info["path"].split("/")
        group, version = ("", parts[1]) if parts[0] == "api" and len(parts) == 2 else \
            (parts[1], parts[2]) if parts[0] == "apis" and len(parts) == 3 else ("?", "?")
        paths: dict[str, Any] = {}
        validation = [{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}}]
        for (g, v, plural), served in self.resources.items():
            if (g, v) != (group, version):
                continue
            prefix = f"/apis/{g}/{v}" if g else f"/api/{v}"
            scope = "/namespaces/{namespace}" if served.namespaced else ""
            gvk = {"group": g, "version": v, "kind": served.kind}
            paths[f"{prefix}{scope}/{plural}/{{name}}"] = {
                "patch": {"x-kubernetes-group-version-kind": gvk, "parameters": validation,
                          "responses": {"200": {"description": "OK"}}}}
            paths[f"{prefix}{scope}/{plural}"] = {
                "post": {"x-kubernetes-group-version-kind": gvk, "parameters": validation,
                         "responses": {"201": {"description": "Created"}}}}
        if not paths:
            return status(404, "NotFound", f"no OpenAPI v3 document for {request.match_info['path']}")
        return web.json_response({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": self.version},
                                  "paths": paths, "components": {"schemas": {}}})
