"""The sandbox API server: the slice of the Kubernetes API that the agent and kubectl use, over real HTTPS.

It is the embedded default (``topology-agent sandbox``, ``demo``) and the test fixture. It serves discovery (with
short names), OpenAPI v3 (so kubectl leaves field validation to it), namespaced and cluster-scoped CRUD for the
kinds in ``RESOURCES`` and for any CRD created in it, JSON and merge patches, the ``status`` subresource,
Kubernetes protobuf bodies for kubectl's typed create commands (protobuf.py), server-side tables for ``kubectl
get`` (tables.py), metadata-only answers, list/watch with label and field selectors, resourceVersion semantics,
BOOKMARKs and 410 Gone, and mutating admission webhooks at CREATE (admission.py). No authorization and no
schema checks (docs/sandbox.md). Fault knobs (``POST /sandbox/faults``) make it refuse connections, fail with a
status (5xx, 429 with Retry-After, 403), slow down, drop watch streams or forget its event log, so tests can
prove the agent's behaviour under each fault. ``GET /sandbox/stats`` counts requests and bytes per client
(User-Agent).

This module says what is served and puts the pieces together: discovery.py (the served kinds, discovery and
OpenAPI), objects.py (CRUD), listing.py (paged LISTs), watching.py (WATCH streams), faults.py (the knobs),
credentials.py (TLS, kubeconfig, service account mount), store.py (objects, resourceVersions, the event log).
An API request is a ``Call`` (calls.py) from the moment it is read: ``Sandbox.answer`` meets the faults and asks the
objects, for a request that came over HTTPS and for one made in memory (memory.py) alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from agent.core.controllers import job_resources
from agent.errors import InputError
from agent.sandbox import admission
from agent.sandbox.calls import Answer, Call, patterns
from agent.sandbox.controllers import Controllers
from agent.sandbox.credentials import KUBECONFIG, SERVICEACCOUNT, make_tls, write_client_files
from agent.sandbox.discovery import Catalog, Kind, resource_key
from agent.sandbox.faults import Faults, Knobs, Stats, fault_answer, trickle
from agent.sandbox.objects import Objects
from agent.sandbox.responses import constant, http, status
from agent.sandbox.store import Obj, Store
from agent.sandbox.watching import Watch, Watches

log = logging.getLogger("topology_agent.sandbox")
# (group, version, plural) -> what it serves; short names as the API server gives them (kubectl get ns, po, cm).
BUILT_IN: dict[tuple[str, str, str], Kind] = {
    ("", "v1", "pods"): Kind("Pod", True, ("po",), ("all",)),
    ("", "v1", "services"): Kind("Service", True, ("svc",), ("all",)),
    ("", "v1", "secrets"): Kind("Secret", True),
    ("", "v1", "configmaps"): Kind("ConfigMap", True, ("cm",)),
    ("", "v1", "namespaces"): Kind("Namespace", False, ("ns",)),
    ("", "v1", "nodes"): Kind("Node", False, ("no",)),
    ("", "v1", "serviceaccounts"): Kind("ServiceAccount", True, ("sa",)),
    ("", "v1", "events"): Kind("Event", True, ("ev",)),
    ("events.k8s.io", "v1", "events"): Kind("Event", True, ("ev",), stored_as=("", "v1", "events")),  # events.py
    ("apps", "v1", "deployments"): Kind("Deployment", True, ("deploy",), ("all",)),
    ("apps", "v1", "statefulsets"): Kind("StatefulSet", True, ("sts",), ("all",)),
    ("batch", "v1", "jobs"): Kind("Job", True, (), ("all",)),
    ("coordination.k8s.io", "v1", "leases"): Kind("Lease", True),
    ("resource.k8s.io", "v1", "resourceclaims"): Kind("ResourceClaim", True),
    ("resource.k8s.io", "v1", "resourceclaimtemplates"): Kind("ResourceClaimTemplate", True),
    ("policy", "v1", "poddisruptionbudgets"): Kind("PodDisruptionBudget", True, ("pdb",)),
    ("networking.k8s.io", "v1", "networkpolicies"): Kind("NetworkPolicy", True, ("netpol",)),
    ("rbac.authorization.k8s.io", "v1", "roles"): Kind("Role", True),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"): Kind("RoleBinding", True),
    ("rbac.authorization.k8s.io", "v1", "clusterroles"): Kind("ClusterRole", False),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings"): Kind("ClusterRoleBinding", False),
    ("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies"): Kind("ValidatingAdmissionPolicy", False),
    ("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings"):
        Kind("ValidatingAdmissionPolicyBinding", False),
    ("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations"):
        Kind("MutatingWebhookConfiguration", False),
    ("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations"):
        Kind("ValidatingWebhookConfiguration", False),
    ("flowcontrol.apiserver.k8s.io", "v1", "flowschemas"): Kind("FlowSchema", False),
    ("flowcontrol.apiserver.k8s.io", "v1", "prioritylevelconfigurations"): Kind("PriorityLevelConfiguration", False),
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions"): Kind("CustomResourceDefinition", False,
                                                                    ("crd", "crds")),
}
# Plus the controllers' job objects (their CRDs, served as if installed), from the controllers' registry.
RESOURCES = {**BUILT_IN, **{(r.group, r.version, r.plural): Kind(r.kind, r.namespaced, r.short)
                            for r in job_resources() if (r.group, r.version, r.plural) not in BUILT_IN}}
CRDS = "apiextensions.k8s.io/v1/customresourcedefinitions"
NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")  # every cluster has them
SUBRESOURCES = {("", "v1", "pods"): ("status",), ("batch", "v1", "jobs"): ("status",),
                ("resource.k8s.io", "v1", "resourceclaims"): ("status",), ("", "v1", "nodes"): ("status",)}
VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.0-sandbox", "platform": "linux/amd64",
           "goVersion": "go1.23", "compiler": "gc", "buildDate": "2026-01-01T00:00:00Z", "gitCommit": "sandbox",
           "gitTreeState": "clean"}


class Cut(Exception):
    """The connection is closed without an answer: the API server is down, or a fault resets it."""


COUNTED = web.RequestKey("sandbox.counted", int)  # per request: the bytes of its answer's body counted already
STREAMED = web.RequestKey("sandbox.streamed", bool)  # per request: a watch, which counts its own bytes


def head_size(request: web.BaseRequest) -> int:
    """The bytes of a request's line and headers as they came ('Name: value' per line, as aiohttp parsed them)."""
    version = request.version
    line = f"{request.method} {request.raw_path} HTTP/{version.major}.{version.minor}\r\n"
    return len(line.encode()) + sum(len(name) + len(value) + 4 for name, value in request.raw_headers) + 2


def counting(knobs: Knobs) -> type[AbstractAccessLogger]:
    """aiohttp's access log, as the place that knows each answer's bytes on the wire once it is sent: what is
    not the body counted already (its status line and headers) is counted as ``headers``. A watch counts its own
    as it is written (watching.py)."""

    class Counted(AbstractAccessLogger):
        def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
            if not request.get(STREAMED):
                knobs.stats.count(request.headers.get("User-Agent", "?"),
                                  headers=max(0, response.body_length - request.get(COUNTED, 0)))

    return Counted


class Listener:
    """Where the sandbox listens: 127.0.0.1 on one port (0: a free one, then kept), closed and opened again on
    it by go_down, so clients come back to the same address. ``access``: the access log class (it counts)."""

    def __init__(self, app: web.Application, port: int, access: type[AbstractAccessLogger] | None = None) -> None:
        self.app = app
        self.port = port
        self.access = access
        self._ssl: ssl.SSLContext | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    async def start(self, context: ssl.SSLContext | None) -> None:
        self._ssl = context
        self._runner = web.AppRunner(self.app, handle_signals=False, **(
            {"access_log_class": self.access, "access_log": log} if self.access else {"access_log": None}))
        await self._runner.setup()
        await self.listen()

    async def listen(self) -> None:
        if self._runner is None:  # never started: a sandbox served in memory
            return
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self._ssl, reuse_address=True)
        await self._site.start()
        if self.port == 0:
            server = self._site._server  # aiohttp exposes the bound port only here
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def pause(self) -> None:
        """Stop listening (connections are refused) until listen() again."""
        if self._site:
            await self._site.stop()

    async def close(self) -> bool:
        """Whether there was anything to close (a sandbox served in memory never listened)."""
        if not self._runner:
            return False
        server = self._runner.server
        transports = list(getattr(server, "_connections", {}).values()) if server else []
        await self._runner.cleanup()
        for transport in transports:  # keep-alive connections: abort, a TLS close would wait for the peer
            transport.abort()
        return True


class Sandbox:
    """One sandbox API server. ``start()`` listens on 127.0.0.1; ``kubeconfig`` points kubectl at it."""

    def __init__(self, state_dir: Path, *, port: int = 0, token: str = "sandbox-token",
                 bookmark_interval: float = 1.0, tls: bool = True, history: int = 100_000,
                 services: Mapping[str, str] | None = None, controllers: bool = False, nodes: int = 4) -> None:
        """``controllers``: play the controllers on ``nodes`` Nodes (controllers.py); without it the sandbox
        serves the API only, and a job object makes no pods."""
        self.state_dir = state_dir
        self.token = token
        self.tls = tls
        self.store = Store(history=history)
        self.knobs = Knobs()
        self.watches = Watches(self.store, self.knobs, bookmark_interval)
        self.catalog = Catalog(RESOURCES, SUBRESOURCES, version=VERSION["gitVersion"], definitions=CRDS)
        self.admission = admission.Caller(services)  # mutating webhooks (admission.py)
        self.objects = Objects(self.store, self.catalog, self.admission)
        self._restart: asyncio.Task[None] | None = None
        self.controllers = Controllers(self.store, self.objects, self.catalog, nodes=nodes) if controllers else None
        self._controlling: asyncio.Task[None] | None = None
        for name in NAMESPACES:
            self.store.create(resource_key("", "v1", "namespaces"), "", {
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}, "status": {"phase": "Active"}})
        self.app = self._build_app()
        self.listener = Listener(self.app, port, counting(self.knobs))

    # --- what tests, the demo and the command line read and turn -----------------------------------------

    @property
    def port(self) -> int:
        return self.listener.port

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / KUBECONFIG

    @property
    def serviceaccount_dir(self) -> Path:
        """An in-cluster service account mount: token, ca.crt, namespace (the agent's production path)."""
        return self.state_dir / SERVICEACCOUNT

    @property
    def faults(self) -> Faults:
        return self.knobs.faults

    @faults.setter
    def faults(self, faults: Faults) -> None:
        self.knobs.faults = faults

    @property
    def stats(self) -> Stats:
        return self.knobs.stats

    @stats.setter
    def stats(self, stats: Stats) -> None:
        self.knobs.stats = stats

    @property
    def resources(self) -> dict[tuple[str, str, str], Kind]:
        """The kinds served: ``RESOURCES`` plus those of the CRDs created in this sandbox."""
        return self.catalog.resources

    @property
    def watch_tasks(self) -> set[asyncio.Task[Any]]:
        return self.watches.tasks

    def store_object(self, resource: str, namespace: str, body: Obj, *, keep_uid: bool = False) -> Obj:
        """Store a created object (Conflict if its name is taken); a CRD's kind is served from now on."""
        return self.objects.store_object(resource, namespace, body, keep_uid=keep_uid)

    # --- lifecycle ---------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        await self.listener.start(make_tls(self.state_dir) if self.tls else None)
        write_client_files(self.state_dir, url=self.url, token=self.token, tls=self.tls)
        if self.controllers and self._controlling is None:
            self.controllers.start()
            self._controlling = asyncio.create_task(self.controllers.run())

    async def stop(self) -> None:
        if self._restart:
            self._restart.cancel()
        if self._controlling:
            self._controlling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._controlling
        await self.admission.close()
        await self._drop_watches()
        if await self.listener.close():
            await asyncio.sleep(0.05)  # let the transports' connection_lost callbacks run before the loop ends

    async def go_down(self, seconds: float) -> None:
        """Refuse connections for ``seconds``: stop listening, cut open streams, then listen again."""
        loop = asyncio.get_running_loop()
        self.faults.down_until = loop.time() + seconds
        await self._drop_watches()
        await self.listener.pause()

        async def come_back() -> None:
            await asyncio.sleep(seconds)
            self.faults.down_until = 0.0
            await self.listener.listen()

        self._restart = asyncio.create_task(come_back())

    async def come_up(self) -> None:
        """End a ``go_down`` now: listen again at once."""
        if self._restart is not None and not self._restart.done():
            self._restart.cancel()
            self.faults.down_until = 0.0
            await self.listener.listen()

    async def _drop_watches(self) -> None:
        await self.watches.drop()

    # --- API requests -----------------------------------------------------------------------------------

    async def answer(self, call: Call) -> Answer | Watch:
        """An API request, as the API server answers it: counted, through the faults asked for (a delay, then a
        failure), then from the objects (a ``Watch`` for the caller to stream). ``Cut`` when the connection is to
        be closed without an answer (the server down, or a fault that resets it)."""
        if self.faults.down_until:
            raise Cut("the API server is down")
        self.stats.count(call.agent, request=True, sent=len(call.body),
                         lease=call.path.startswith("/apis/coordination.k8s.io/") and "/leases" in call.path)
        failed = await self._faults(call.path, call.method)
        if failed is not None:
            return failed
        answered = await self.objects.answer(call)
        if isinstance(answered, Answer):
            self.stats.count(call.agent, nbytes=len(answered.encoded))
        return answered

    async def _faults(self, path: str, method: str) -> Answer | None:
        """The faults asked for, met by one request: a delay, then a failure (``Cut``: the connection reset)."""
        delay = self.faults.take_delay(path)
        if delay:
            with self.watches.cancellable():  # stop() cancels it, as it cancels open watches
                await asyncio.sleep(delay)
        code = self.faults.take_status(path)
        if code is None:
            return None
        if self.faults.reset:
            raise Cut(f"a fault resets the connection ({code})")
        return fault_answer(self.faults, code, method)

    # --- HTTP --------------------------------------------------------------------------------------------

    def _build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_get("/sandbox/stats", self._get_stats)
        r.add_post("/sandbox/stats/reset", self._reset_stats)
        r.add_post("/sandbox/faults", self._set_faults)
        r.add_delete("/sandbox/faults", self._clear_faults)
        r.add_get("/version", constant(VERSION))
        r.add_get("/healthz", constant("ok"))
        r.add_get("/readyz", constant("ok"))
        self.catalog.add_routes(r)
        for pattern in patterns():  # the object paths (calls.py)
            r.add_route("*", pattern, self._objects)
        return app

    async def _objects(self, request: web.Request) -> web.StreamResponse:
        call = Call(request.method, request.path, dict(request.match_info), dict(request.query),
                    accept=request.headers.get("Accept", ""), content_type=request.content_type,
                    body=await request.read(), agent=request.headers.get("User-Agent", "?"))
        self.stats.count(call.agent, sent=head_size(request))
        try:
            answered = await self.answer(call)
        except Cut:
            if request.transport:
                request.transport.abort()
            raise web.HTTPServiceUnavailable() from None
        if isinstance(answered, Watch):
            request[STREAMED] = True  # its headers and framing are counted as it is written (watching.py)
            return await self.watches.serve(request, answered)
        request[COUNTED] = len(answered.encoded)
        response = http(answered)
        if self.faults.trickle > 0 and self.faults.applies(request.path):
            return await trickle(request, response, self.knobs)
        return response

    @web.middleware
    async def _middleware(self, request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """What every request meets before its handler: the server down (the connection cut), and for the API
        the token; the discovery documents are counted and trickled here, the objects in ``answer``."""
        if self.faults.down_until and request.transport:
            request.transport.abort()
            raise web.HTTPServiceUnavailable()
        if request.path.startswith("/sandbox/"):
            return await handler(request)
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            self.stats.count(request.headers.get("User-Agent", "?"), request=True,
                             sent=head_size(request) + (request.content_length or 0))
            return status(401, "Unauthorized", "Unauthorized")
        if request.match_info.handler == self._objects:
            return await handler(request)
        return await self._other(request, handler)

    async def _other(self, request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """Discovery, OpenAPI, /version: counted and failed as ``answer`` does for the objects."""
        agent = request.headers.get("User-Agent", "?")
        self.stats.count(agent, request=True, sent=head_size(request) + len(await request.read()))
        try:
            failed = await self._faults(request.path, request.method)
        except Cut:
            if request.transport:
                request.transport.abort()
            raise web.HTTPServiceUnavailable() from None
        if failed is not None:
            return http(failed)
        response = await handler(request)
        if isinstance(response, web.Response) and response.body is not None:
            self.stats.count(agent, nbytes=len(response.body))  # type: ignore[arg-type]
            request[COUNTED] = len(response.body)  # type: ignore[arg-type]
            if self.faults.trickle > 0 and self.faults.applies(request.path):
                return await trickle(request, response, self.knobs)
        return response

    async def _get_stats(self, _: web.Request) -> web.Response:
        return web.json_response({"requests": self.stats.requests, "bytes": self.stats.bytes,
                                  "watches": self.stats.watches, "byAgent": self.stats.by_agent,
                                  "lastEventAt": self.stats.last_event,
                                  "resourceVersion": self.store.rv})

    async def _reset_stats(self, _: web.Request) -> web.Response:
        self.knobs.stats = Stats()
        return web.json_response({})

    async def _set_faults(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("dropWatches"):
            await self._drop_watches()
        if body.get("compact"):
            self.store.compact()
        if "downFor" in body:
            await self.go_down(float(body["downFor"]))
        self.faults.apply(body)
        return web.json_response({"ok": True})

    async def _clear_faults(self, _: web.Request) -> web.Response:
        self.knobs.faults = Faults()
        return web.json_response({"ok": True})


async def serve(state_dir: Path, *, port: int, ready: Callable[[Sandbox], None] | None = None,
                stop: asyncio.Event | None = None, **kwargs: Any) -> None:
    """Run a sandbox until ``stop`` is set (or forever)."""
    sandbox = Sandbox(state_dir, port=port, **kwargs)
    await sandbox.start()
    try:
        if ready:
            ready(sandbox)
        await (stop or asyncio.Event()).wait()
    finally:
        await sandbox.stop()


def run_sandbox(state_dir: Path, *, port: int, **kwargs: Any) -> None:
    """``topology-agent sandbox``: serve until interrupted, saying where and how to reach it; a port that cannot be
    listened on is bad input (one line), not a bug."""
    def ready(server: Sandbox) -> None:
        print(f"sandbox API server at {server.url}\nexport KUBECONFIG={server.kubeconfig}", flush=True)

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(state_dir, port=port, ready=ready, **kwargs))
    except OSError as err:
        raise InputError(f"--port {port}: cannot listen on 127.0.0.1 ({err.strerror or err}); choose another "
                         "port, or 0 for any free one") from None


@contextlib.asynccontextmanager
async def running(state_dir: Path, **kwargs: Any) -> AsyncIterator[Sandbox]:
    sandbox = Sandbox(state_dir, **kwargs)
    await sandbox.start()
    try:
        yield sandbox
    finally:
        await sandbox.stop()
