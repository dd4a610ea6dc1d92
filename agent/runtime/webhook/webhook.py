"""`topology-agent webhook`: the mutating admission webhook. It answers AdmissionReviews over HTTPS with
core/adoption/admission.py's decision (the transform `inject` applies) and keeps its own TLS current (tls.py, certs.py),
or serves files another issuer writes (cert-manager).

Any pod that can reach its port can send it anything, and any user who may create a pod can make the API server
send it any object up to 3 MiB, so its memory and time are bounded whatever arrives: connections, heads and TLS
by serving.py; a body is read only once it fits the bytes in flight (``BODIES``) and its length is known; a
large one is reviewed in a process of its own (reviewing.py); nothing a caller chooses is kept but a bounded
number of namespaces' settings; every review is answered before the API server's ``?timeout=`` runs out, with
the reason when it is a refusal.

Per request it reads nothing from the API server but the namespace's settings, cached for ``namespace_ttl``
seconds, so a burst of pods costs one GET per namespace. A namespace it cannot read denies the pod with the
reason: a pod injected without its namespace's settings would start with the wrong ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import ssl
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agent.core.adoption import admission
from agent.core.adoption.injection import Settings
from agent.core.pods.validation import is_dns1123_label
from agent.errors import ApiError, ApiNotFound, InputError
from agent.flags.parser import check_command_line
from agent.flags.webhook import WebhookOwn
from agent.k8s.async_client import AsyncApi
from agent.runtime.webhook.reviewing import SMALL, Outcome, Reviewer, Unavailable
from agent.runtime.webhook.serving import BoundedServer, Limits
from agent.runtime.webhook.tls import keep_tls

log = logging.getLogger("topology_agent.webhook")

MAX_BODY = 8 << 20  # bytes: an AdmissionReview of the largest object the API server takes (3 MiB) re-encoded
BODIES = 16 << 20  # bytes of bodies held at once (read, or waiting for the reviewing process)
DEFAULT_TIMEOUT = 10.0  # seconds: the API server's own default timeoutSeconds, when ?timeout= is not given
MARGIN = 0.5  # seconds before the API server's deadline by which an answer is on its way
NAMESPACE_MARGIN = 0.2  # seconds before that by which a namespace read is given up, to answer with the reason
REVIEWER = (sys.executable, "-m", "agent.runtime.webhook.reviewing")  # the reviewing process (reviewing.py)


@dataclass(frozen=True, kw_only=True)
class WebhookSettings(WebhookOwn):
    """Everything the webhook runs with: its flags' settings (flags/webhook.py), and what no flag sets."""

    hosts: tuple[str, ...] = ()  # every name and address the serving certificate covers
    namespace_ttl: float = 30.0
    namespaces: int = 1024  # namespaces whose settings are kept (least recently used go first)
    limits: Limits = field(default_factory=Limits)
    reviewer: Sequence[str] = REVIEWER  # the command of the reviewing process (reviewing.py)
    metrics: CollectorRegistry = field(default_factory=CollectorRegistry, compare=False)

    @classmethod
    def of(cls, own: WebhookOwn, *, hosts: tuple[str, ...]) -> WebhookSettings:
        return cls(**{f.name: getattr(own, f.name) for f in dataclasses.fields(WebhookOwn)}, hosts=hosts)


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.reviews = Counter("topology_agent_webhook_reviews_total", "AdmissionReviews answered, by result",
                               ["result"], registry=registry)
        self.latency = Histogram("topology_agent_webhook_review_seconds", "From request read to answer written",
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
                                 registry=registry)
        self.connections = Gauge("topology_agent_webhook_connections", "Connections open", registry=registry)


class Namespaces:
    """Each namespace's settings, read once per ``ttl`` and shared by the reviews that wait for the same read.

    Only names the API server could send are asked for (DNS-1123 labels: nothing else reaches the path), the
    read is a task of its own (a review that gives up does not end it for the others), and its failure reaches
    every review that waits for it. At most ``size`` namespaces are kept."""

    def __init__(self, api: AsyncApi, *, ttl: float, size: int, clock: Callable[[], float],
                 defaults: Settings | None = None) -> None:
        self.api, self.ttl, self.size, self.clock = api, ttl, size, clock
        self.defaults = defaults or Settings()  # the webhook's --set, under each namespace's annotations
        self._kept: OrderedDict[str, tuple[float, Settings | InputError]] = OrderedDict()
        self._reading: dict[str, asyncio.Task[Settings | InputError]] = {}

    def cached(self, namespace: str) -> Settings | InputError | None:
        if not namespace:
            return self.defaults  # a cluster-scoped object (ClusterTrainingRuntime)
        if not is_dns1123_label(namespace):
            return InputError(f"namespace {namespace[:80]!r} is not a Kubernetes namespace name")
        kept = self._kept.get(namespace)
        if kept is None or self.clock() - kept[0] > self.ttl:
            return None
        self._kept.move_to_end(namespace)
        return kept[1]

    async def get(self, namespace: str, *, within: float) -> Settings | InputError:
        cached = self.cached(namespace)
        if cached is not None:
            return cached
        reading = self._reading.get(namespace)
        if reading is None:
            reading = self._reading[namespace] = asyncio.create_task(self._read(namespace))
        try:
            return await asyncio.wait_for(asyncio.shield(reading), max(within, 0.0))
        except TimeoutError:
            return InputError(f"cannot read Namespace {namespace}'s topology-agent.io/ settings in time (the API "
                              "server did not answer); the pod is refused rather than started without them; "
                              "create it again")

    async def _read(self, namespace: str) -> Settings | InputError:
        try:
            result: Settings | InputError = admission.namespace_settings(
                await self.api.get_object(f"/api/v1/namespaces/{namespace}"), defaults=self.defaults)
        except ApiNotFound:
            result = self.defaults
        except InputError as err:
            result = err
        except ApiError as err:
            return InputError(f"cannot read Namespace {namespace}'s topology-agent.io/ settings ({err}); the pod is "
                              "refused rather than started without them; check the webhook's RBAC (get "
                              "namespaces) and the API server")
        finally:
            self._reading.pop(namespace, None)
        self._kept[namespace] = (self.clock(), result)
        self._kept.move_to_end(namespace)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)
        return result


class Budget:
    """Bytes of request bodies held at once: a body is read only when its length fits."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def hold(self, size: int) -> Any:
        async with self._changed:
            await self._changed.wait_for(lambda: self.used + size <= self.limit)
            self.used += size
        try:
            yield
        finally:
            async with self._changed:
                self.used -= size
                self._changed.notify_all()


def review_timeout(value: str | None) -> float:
    """The API server's ``?timeout=`` (a Go duration: ``5s``, ``30s``, ``1m0s``, ``2500ms``) in seconds."""
    if not value:
        return DEFAULT_TIMEOUT
    parts = re.fullmatch(r"(?:(\d+)m)?(?:(\d+(?:\.\d+)?)(s|ms))?", value)
    if not parts or not any(parts.groups()):
        return DEFAULT_TIMEOUT
    minutes, amount, unit = parts.groups()
    seconds = int(minutes or 0) * 60 + (float(amount) / (1000 if unit == "ms" else 1) if amount else 0.0)
    return min(max(seconds, 1.0), 30.0)


class Webhook:
    def __init__(self, api: AsyncApi, settings: WebhookSettings, *, version: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api, self.settings, self.version, self.clock = api, settings, version, clock
        self.check = _remembering(check_command_line)
        self.metrics = Metrics(settings.metrics)
        self.namespaces = Namespaces(api, ttl=settings.namespace_ttl, size=settings.namespaces, clock=clock,
                                     defaults=settings.defaults)
        self.bodies = Budget(BODIES)
        self.reviewer = Reviewer(settings.reviewer)
        self.tls: ssl.SSLContext | None = None

    async def review(self, request: web.Request) -> web.Response:
        started = self.clock()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + review_timeout(request.query.get("timeout")) - MARGIN
        size = request.content_length
        if size is None:
            return self._refused("bad-request", 411, "send the AdmissionReview with a Content-Length")
        if size > MAX_BODY:
            return self._refused("too-large", 413, f"the AdmissionReview is {size} bytes, more than the webhook "
                                                   f"reads ({MAX_BODY})")
        try:
            async with asyncio.timeout_at(deadline):
                async with self.bodies.hold(size):
                    body = await _read(request, size)
                    outcome = await (self._review_here(body, deadline) if len(body) <= SMALL else
                                     self.reviewer.review(body, lambda ns: self._settings(ns, deadline)))
        except TimeoutError:
            return self._refused("busy", 503, "the webhook could not review this in time (busy); the API server "
                                              "retries or the creation is refused; try again")
        except Unavailable as err:
            log.warning("%s", err)
            return self._refused("busy", 503, f"{err}; try again")
        if outcome.status != 200:
            return self._refused("bad-request" if outcome.status == 400 else "error", outcome.status,
                                 outcome.body.decode(errors="replace").strip())
        response: dict[str, Any] = json.loads(outcome.body)["response"]
        result = "denied" if not response["allowed"] else "patched" if "patch" in response else "unchanged"
        if result == "denied":
            log.info("denied %s: %s", outcome.uid, response["status"]["message"])
        self.metrics.reviews.labels(result).inc()
        self.metrics.latency.observe(self.clock() - started)
        return web.Response(body=outcome.body, content_type="application/json")

    def _refused(self, result: str, status: int, text: str) -> web.Response:
        self.metrics.reviews.labels(result).inc()
        return web.Response(status=status, text=f"{text}\n")

    @staticmethod
    def _within(deadline: float) -> float:
        return deadline - NAMESPACE_MARGIN - asyncio.get_running_loop().time()

    async def _settings(self, namespace: str, deadline: float) -> Settings:
        got = await self.namespaces.get(namespace, within=self._within(deadline))
        if isinstance(got, InputError):
            raise got
        return got

    async def _review_here(self, body: bytes | bytearray, deadline: float) -> Outcome:
        """A small body, reviewed on the event loop (at most 64 KiB: milliseconds). A parsed object never waits
        on the network: when the namespace is not cached, the body is parsed again after the read."""
        try:
            request = admission.read_review(body)
        except InputError as err:
            return Outcome(400, f"{err}\n".encode())
        settings = self.namespaces.cached(request.namespace)
        if settings is None:
            namespace = request.namespace
            del request
            settings = await self.namespaces.get(namespace, within=self._within(deadline))
            request = admission.read_review(body)
        if isinstance(settings, InputError):
            answer = {"apiVersion": admission.API_VERSION, "kind": "AdmissionReview",
                      "response": admission.deny(request.uid, str(settings))}
        else:
            answer = admission.answer(request, settings, version=self.version, check=self.check)
        return Outcome(200, json.dumps(answer).encode(), request.uid)

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


async def _read(request: web.Request, size: int) -> bytearray:
    """The body, in one buffer of its announced size (aiohttp's ``read()`` holds it twice at the end)."""
    body = bytearray()
    async for chunk in request.content.iter_any():
        body += chunk
        if len(body) > size:
            break  # more than Content-Length: aiohttp's parser never lets this happen
    return body


def _remembering(check: Callable[[list[str], str], None], size: int = 4096) -> Callable[[list[str], str], None]:
    """The agent's parser, run once per distinct command line (a job's pods share theirs). What is kept is a
    digest per command line, at most ``size`` of them: a caller's values are not."""
    import hashlib

    accepted: OrderedDict[bytes, None] = OrderedDict()

    def checked(argv: list[str], where: str) -> None:
        key = hashlib.sha256("\0".join(argv).encode("utf-8", "surrogatepass")).digest()
        if key in accepted:
            accepted.move_to_end(key)
            return
        check(argv, where)
        accepted[key] = None
        if len(accepted) > size:
            accepted.popitem(last=False)

    return checked


async def run_webhook(api: AsyncApi, settings: WebhookSettings, *, version: str, stop: asyncio.Event,
                      ready: Callable[[int], None] | None = None) -> None:
    """Get a certificate, listen, serve until ``stop``."""
    webhook = Webhook(api, settings, version=version)
    keeper = asyncio.create_task(keep_tls(api, webhook, stop=stop))
    while webhook.tls is None and not keeper.done():
        await asyncio.sleep(0.05)
    if keeper.done():
        keeper.result()  # the first certificate failed: its error, once
        return

    def serving() -> ssl.SSLContext:  # reloaded in place, or replaced, by keep_tls
        assert webhook.tls is not None
        return webhook.tls

    server = BoundedServer(webhook.app(), serving, settings.limits)
    webhook.metrics.connections.set_function(lambda: server.open)
    try:
        port = await server.start(settings.host, settings.port)
    except OSError as err:
        keeper.cancel()
        raise InputError(f"--port {settings.port}: cannot listen on {settings.host} ({err.strerror or err}); "
                         "choose another port") from None
    log.info("webhook listening on https://%s:%d/mutate", settings.host, port)
    if ready:
        ready(port)
    try:
        await stop.wait()
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        await server.close()
        await webhook.reviewer.close()
