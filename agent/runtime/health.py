"""The sidecar's HTTP endpoints: /healthz, /readyz, /metrics (Prometheus), /topology (topology.json, opt-in).

It serves a ``Status`` (the sidecar is one) and knows nothing else of the sidecar. Four fixed paths need no router:
it runs on aiohttp's low-level server (``aiohttp.web_server.Server``, the request handler aiohttp's applications
are served by), so the sidecar, in every pod of a job, imports none of aiohttp.web's application, router and
runner modules.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST

from agent.errors import InputError
from agent.k8s.aio import BaseRequest, Response, Server, StreamResponse
from agent.runtime.metrics import SidecarMetrics

Handler = Callable[[BaseRequest], Awaitable[StreamResponse]]
SHUTDOWN = 1.0  # seconds a probe still being answered gets at stop


class Status(Protocol):
    metrics: SidecarMetrics

    @property
    def healthy(self) -> bool: ...

    @property
    def generation(self) -> int: ...

    @property
    def document(self) -> bytes | None: ...

    def unready(self) -> str | None: ...


def health_handler(sidecar: Status, *, topology: bool = False) -> Handler:
    """Each request's answer: GET (or HEAD) of one of the four paths; 404 for any other path, 405 for another
    method. ``topology``: also serve topology.json (off by default: the health port is open to the pod network,
    for the kubelet's probes, and the job's addresses and layout are not everyone's to read)."""
    def healthz() -> Response:
        if sidecar.healthy:
            return Response(text="ok\n")
        return Response(status=503, text="the watch loop made no request lately (stuck)\n")

    def readyz() -> Response:
        why = sidecar.unready()
        if why is None:
            return Response(text=f"generation {sidecar.generation}\n")
        return Response(status=503, text=f"not ready: {why}\n")

    def metrics() -> Response:
        return Response(body=sidecar.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def topology_json() -> Response:
        if not topology:
            return Response(status=404, text="not served: start the sidecar with --health-topology\n")
        if sidecar.document is None:
            return Response(status=503, text=json.dumps({"error": "no topology planned by this sidecar yet"}),
                            content_type="application/json")
        return Response(body=sidecar.document, content_type="application/json")

    routes: dict[str, Callable[[], Response]] = {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics,
                                                 "/topology": topology_json}

    async def handle(request: BaseRequest) -> StreamResponse:
        answer = routes.get(request.path)
        if answer is None:
            return Response(status=404, text="404: Not Found")
        if request.method not in ("GET", "HEAD"):
            return Response(status=405, text="405: Method Not Allowed", headers={"Allow": "GET, HEAD"})
        return answer()

    return handle


class HealthServer:
    """The listening socket and the connections' handler, closed together (``close``)."""

    def __init__(self, server: Server, listener: asyncio.Server) -> None:
        self.server, self.listener = server, listener

    @property
    def port(self) -> int:
        sockets = self.listener.sockets
        return int(sockets[0].getsockname()[1]) if sockets else 0

    async def close(self) -> None:
        self.listener.close()
        await self.server.shutdown(SHUTDOWN)
        await self.listener.wait_closed()


async def start_health(sidecar: Status, host: str, port: int, *, label: str,
                       topology: bool = False) -> tuple[HealthServer, int]:
    """Bind first, before the sidecar talks to the API: a port in use is the user's to fix, at once."""
    server = Server(health_handler(sidecar, topology=topology), access_log=None)
    try:
        listener = await asyncio.get_running_loop().create_server(server, host, port)
    except OSError as err:
        raise InputError(f"{label}: cannot listen ({err.strerror or err}); choose another port, or 0 to turn "
                         "the health server off") from None
    served = HealthServer(server, listener)
    return served, served.port or port


async def serve_health(served: HealthServer) -> None:
    """Serve until cancelled, then close the listener."""
    try:
        await asyncio.Event().wait()
    finally:
        await served.close()
