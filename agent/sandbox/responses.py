"""The answers every part of the sandbox gives as the API server gives them: a Status on failure, a constant
document, an object's metadata only (client-go's metadata client); and an ``Answer`` as an aiohttp response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from agent.sandbox.calls import Answer, failure
from agent.sandbox.store import Obj


def http(answer: Answer) -> web.Response:
    """The HTTPS server's response for an ``Answer``."""
    if isinstance(answer.body, str):
        return web.Response(text=answer.body, status=answer.status, headers=dict(answer.headers))
    return web.Response(body=answer.encoded, status=answer.status, headers=dict(answer.headers),
                        content_type="application/json", charset="utf-8")


def status(code: int, reason: str, message: str, *, details: dict[str, Any] | None = None) -> web.Response:
    return http(failure(code, reason, message, details=details))


def constant(body: Any) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A handler that answers ``body`` whatever is asked: text for a string, JSON for anything else."""
    async def handler(_: web.Request) -> web.Response:
        return web.Response(text=body) if isinstance(body, str) else web.json_response(body)

    return handler


def metadata_only(accept: str) -> bool:
    """``Accept: application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`` (client-go's metadata
    client): the API server answers with the objects' metadata only."""
    return "as=PartialObjectMetadata" in accept


def partial(obj: Obj) -> Obj:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata", {})}
