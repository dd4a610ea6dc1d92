"""`topology-agent webhook`: the mutating admission webhook. It answers AdmissionReviews over HTTPS with
core/admission.py's decision (the transform `inject` applies) and keeps its own TLS current (tls.py, certs.py),
or serves files another issuer writes (cert-manager).

Per request it reads nothing from the API server but the namespace's settings, cached for ``namespace_ttl``
seconds, so a burst of pods costs one GET per namespace. A namespace it cannot read denies the pod with the
reason: a pod injected without its namespace's settings would start with the wrong ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from agent.core import admission
from agent.core.injection import Settings
from agent.errors import ApiError, ApiNotFound, InputError
from agent.k8s.async_client import AsyncApi
from agent.runtime.tls import keep_tls

log = logging.getLogger("topology-agent.webhook")

MAX_BODY = 8 * 1024 * 1024  # an AdmissionReview holds the object (at most ~3 MiB in etcd) twice at worst


@dataclass(frozen=True)
class WebhookSettings:
    host: str = "0.0.0.0"
    port: int = 8443
    namespace: str = "topology-agent-system"  # where the webhook runs: its Secret
    service: str = "topology-agent-webhook"
    secret: str = "topology-agent-webhook-tls"
    config: str = "topology-agent"  # the MutatingWebhookConfiguration whose caBundle it keeps
    hosts: tuple[str, ...] = ()  # every name and address the serving certificate covers
    tls_dir: Path | None = None  # tls.crt + tls.key written by someone else (cert-manager): no Secret, no caBundle
    namespace_ttl: float = 30.0
    check_every: float = 3600.0  # how often the certificates are checked for renewal
    metrics: CollectorRegistry = field(default_factory=CollectorRegistry, compare=False)


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.reviews = Counter("topology_agent_webhook_reviews_total", "AdmissionReviews answered, by result",
                               ["result"], registry=registry)
        self.latency = Histogram("topology_agent_webhook_review_seconds", "From request read to answer written",
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
                                 registry=registry)


class Webhook:
    def __init__(self, api: AsyncApi, settings: WebhookSettings, *, version: str,
                 check: admission.CheckArgs, clock: Callable[[], float] = time.monotonic) -> None:
        self.api, self.settings, self.version, self.clock = api, settings, version, clock
        self.check = _remembering(check)
        self.metrics = Metrics(settings.metrics)
        self._namespaces: dict[str, tuple[float, Settings | InputError]] = {}
        self._pending: dict[str, asyncio.Future[Settings | InputError]] = {}
        self.tls: ssl.SSLContext | None = None

    async def namespace_settings(self, namespace: str) -> Settings:
        """The namespace's settings (cached; concurrent requests share one GET)."""
        if not namespace:
            return Settings()  # a cluster-scoped object (ClusterTrainingRuntime)
        cached = self._namespaces.get(namespace)
        if cached is None or self.clock() - cached[0] > self.settings.namespace_ttl:
            pending = self._pending.get(namespace)
            if pending is None:
                pending = self._pending[namespace] = asyncio.get_running_loop().create_future()
                try:
                    result = await self._read_namespace(namespace)
                    self._namespaces[namespace] = (self.clock(), result)
                    pending.set_result(result)
                finally:
                    del self._pending[namespace]
                    if not pending.done():
                        pending.cancel()
            else:
                result = await asyncio.shield(pending)
        else:
            result = cached[1]
        if isinstance(result, InputError):
            raise result
        return result

    async def _read_namespace(self, namespace: str) -> Settings | InputError:
        try:
            return admission.namespace_settings(await self.api.get_object(f"/api/v1/namespaces/{namespace}"))
        except ApiNotFound:
            return Settings()
        except InputError as err:
            return err
        except ApiError as err:
            raise InputError(f"cannot read Namespace {namespace}'s topology-agent.io/ settings ({err}); the pod is "
                             "refused rather than started without them; check the webhook's RBAC (get namespaces) "
                             "and the API server") from None

    async def review(self, request: web.Request) -> web.Response:
        started = self.clock()
        try:
            body = json.loads(await request.read())
            parsed = admission.parse_review(body)
        except (ValueError, InputError) as err:
            self.metrics.reviews.labels("bad-request").inc()
            return web.Response(status=400, text=f"{err}\n")
        try:
            settings = await self.namespace_settings(parsed.namespace)
        except InputError as err:
            answer: dict[str, Any] = {"apiVersion": admission.API_VERSION, "kind": "AdmissionReview",
                      "response": {"uid": parsed.uid, "allowed": False, "status": {
                          "code": 400, "reason": "BadRequest", "message": f"topology-agent: {err}"}}}
        else:
            answer = admission.answer(parsed, settings, version=self.version, check=self.check)
        response: dict[str, Any] = answer["response"]
        result = "denied" if not response["allowed"] else "patched" if "patch" in response else "unchanged"
        if result == "denied":
            log.info("denied %s %s: %s", parsed.obj.get("kind"), parsed.where, response["status"]["message"])
        self.metrics.reviews.labels(result).inc()
        self.metrics.latency.observe(self.clock() - started)
        return web.json_response(answer)

    def app(self) -> web.Application:
        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok\n")

        async def readyz(_: web.Request) -> web.Response:
            return web.Response(text="ready\n") if self.tls else web.Response(status=503, text="no certificate\n")

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=generate_latest(self.metrics.registry),
                                headers={"Content-Type": CONTENT_TYPE_LATEST})

        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/mutate", self.review)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", metrics)
        return app


def _remembering(check: admission.CheckArgs) -> admission.CheckArgs:
    """The agent's parser, run once per distinct command line (a job's pods share theirs)."""
    accepted: set[tuple[str, ...]] = set()

    def checked(argv: list[str], where: str) -> None:
        key = tuple(argv)
        if key not in accepted:
            check(argv, where)
            if len(accepted) > 4096:
                accepted.clear()
            accepted.add(key)

    return checked


async def run_webhook(api: AsyncApi, settings: WebhookSettings, *, version: str, check: admission.CheckArgs,
                      stop: asyncio.Event, ready: Callable[[int], None] | None = None) -> None:
    """Get a certificate, listen, serve until ``stop``."""
    webhook = Webhook(api, settings, version=version, check=check)
    keeper = asyncio.create_task(keep_tls(api, webhook, stop=stop))
    while webhook.tls is None and not keeper.done():
        await asyncio.sleep(0.05)
    if keeper.done():
        keeper.result()  # the first certificate failed: its error, once
        return
    runner = web.AppRunner(webhook.app(), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port, ssl_context=webhook.tls, backlog=512)
        await site.start()
    except OSError as err:
        await runner.cleanup()
        keeper.cancel()
        raise InputError(f"--port {settings.port}: cannot listen on {settings.host} ({err.strerror or err}); "
                         "choose another port") from None
    server = site._server
    port = server.sockets[0].getsockname()[1] if server and server.sockets else settings.port  # type: ignore
    log.info("webhook listening on https://%s:%d/mutate", settings.host, port)
    if ready:
        ready(port)
    try:
        await stop.wait()
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        await runner.cleanup()
