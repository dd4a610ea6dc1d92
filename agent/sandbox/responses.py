"""The answers every part of the sandbox gives as the API server gives them: a Status on failure, a constant
document, an object's metadata only (client-go's metadata client)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from agent.sandbox.store import Obj


def status(code: int, reason: str, message: str, *, details: dict[str, Any] | None = None) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if details:
        body["details"] = details
    return web.json_response(body, status=code)


def constant(body: Any) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A handler that answers ``body`` whatever is asked: text for a string, JSON for anything else."""
    async def handler(_: web.Request) -> web.Response:
        return web.Response(text=body) if isinstance(body, str) else web.json_response(body)

    return handler


def metadata_only(request: web.Request) -> bool:
    """``Accept: application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`` (client-go's metadata
    client): the API server answers with the objects' metadata only."""
    return "as=PartialObjectMetadata" in request.headers.get("Accept", "")


def partial(obj: Obj) -> Obj:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata", {})}
