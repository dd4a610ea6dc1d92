"""The sidecar's HTTP endpoints: /healthz, /readyz, /metrics (Prometheus), /topology (topology.json, opt-in).

It serves a ``Status`` (the sidecar is one) and knows nothing else of the sidecar.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from agent.errors import InputError
from agent.runtime.metrics import SidecarMetrics


class Status(Protocol):
    metrics: SidecarMetrics

    @property
    def healthy(self) -> bool: ...

    @property
    def generation(self) -> int: ...

    @property
    def document(self) -> bytes | None: ...

    def unready(self) -> str | None: ...


def make_app(sidecar: Status, *, topology: bool = False) -> web.Application:
    """``topology``: also serve topology.json (off by default: the health port is open to the pod network, for
    the kubelet's probes, and the job's addresses and layout are not everyone's to read)."""
    async def healthz(_: web.Request) -> web.Response:
        if sidecar.healthy:
            return web.Response(text="ok\n")
        return web.Response(status=503, text="the watch loop made no request lately (stuck)\n")

    async def readyz(_: web.Request) -> web.Response:
        why = sidecar.unready()
        if why is None:
            return web.Response(text=f"generation {sidecar.generation}\n")
        return web.Response(status=503, text=f"not ready: {why}\n")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=sidecar.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def topology_json(_: web.Request) -> web.Response:
        if not topology:
            return web.Response(status=404, text="not served: start the sidecar with --health-topology\n")
        if sidecar.document is None:
            return web.json_response({"error": "no topology planned by this sidecar yet"}, status=503)
        return web.Response(body=sidecar.document, content_type="application/json")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/topology", topology_json)
    return app


async def start_health(sidecar: Status, host: str, port: int, *, label: str,
                       topology: bool = False) -> tuple[web.AppRunner, int]:
    """Bind first, before the sidecar talks to the API: a port in use is the user's to fix, at once."""
    runner = web.AppRunner(make_app(sidecar, topology=topology), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
    except OSError as err:
        await runner.cleanup()
        raise InputError(f"{label}: cannot listen ({err.strerror or err}); choose another port, or 0 to turn "
                         "the health server off") from None
    server = site._server
    return runner, (server.sockets[0].getsockname()[1] if server and server.sockets else port)  # type: ignore


async def serve_health(runner: web.AppRunner) -> None:
    """Serve until cancelled, then close the listener."""
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
