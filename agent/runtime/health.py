"""The sidecar's HTTP endpoints: /healthz, /readyz, /metrics (Prometheus), /topology (topology.json)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from agent.errors import InputError

if TYPE_CHECKING:
    from agent.runtime.sidecar import Sidecar


def make_app(sidecar: Sidecar) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        if sidecar.healthy:
            return web.Response(text="ok\n")
        return web.Response(status=503, text="watch made no progress (no event, bookmark or reconnect)\n")

    async def readyz(_: web.Request) -> web.Response:
        if sidecar.ready:
            return web.Response(text=f"generation {sidecar.generation}\n")
        return web.Response(status=503, text="files do not yet match the current membership\n")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=sidecar.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def topology(_: web.Request) -> web.Response:
        if sidecar.document is None:
            return web.json_response({"error": "no topology written yet"}, status=503)
        return web.Response(body=sidecar.document, content_type="application/json")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/topology", topology)
    return app


async def start_health(sidecar: Sidecar, host: str, port: int, *, label: str) -> tuple[web.AppRunner, int]:
    """Bind first, before the sidecar talks to the API: a port in use is the user's to fix, at once."""
    runner = web.AppRunner(make_app(sidecar), access_log=None, handle_signals=False)
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
