"""``topology-agent init``: read my pod, find my peers, wait for the gang with one watch, write the files.

API cost is fixed whatever the job size: GET own pod, GET the owner object (skipped with ``--expect`` and
for LeaderWorkerSets), one LIST of the job's pods, then one WATCH from the list's resourceVersion until the
gang is complete (and one LIST of the namespace's ResourceClaims when a pod's trainer takes DRA claims). A
watch that the server ends or that breaks resumes from the last resourceVersion seen; a 410 Gone relists. No
polling. From 256 training pods one pod (the leader: the first training pod whose init runs, as the publisher
Lease says, core/publication/leading.py) lists the pods and publishes them; every other pod reads the
publication (runtime/publication/publishing.py), or in its own view (the default's for most pods,
core/publication/view_choice.py) its summary.

init is written against the async client face (``AsyncApi``) as the sidecar is, over its own blocking client
(k8s/blocking.py): one ``asyncio.run`` for the whole command. Where its pods come from is decided first, from
the own pod and the job's objects alone (``Source``, pure), then done.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.core import Memo, Rendered
from agent.core.controllers import Controller, detect_controller
from agent.core.files.variables import warnings_for
from agent.core.model import Identity, RawPod
from agent.core.plan.gang import Expectation, Roster, expectation_from_job, expectation_from_pod, roster_of
from agent.core.plan.planner import Planner
from agent.core.plan.restarts import jobset_attempt, jobset_in_place
from agent.core.pods.validation import check_pod
from agent.core.publication.journal import PublishedState, Publisher
from agent.core.publication.leading import is_guard, is_rank_zero, rank_zero_identity
from agent.core.publication.provenance import WriterCheck
from agent.core.publication.published import configmap_name
from agent.core.publication.view_choice import LARGE_JOB
from agent.core.report.events import Occurrence, outcome_note
from agent.errors import AgentError, ApiError, ApiNotFound, GangTimeout, InputError
from agent.flags.init import InitSettings
from agent.k8s.blocking import Blocking
from agent.k8s.client import Client
from agent.runtime.claims import with_claims
from agent.runtime.events import Sink
from agent.runtime.init.barrier import Rerun, restart_barrier
from agent.runtime.init.calls import Calls, PodEvents
from agent.runtime.init.gang import BLOCKED, LINGER, from_pods
from agent.runtime.init.publication import elect, follow, owner_of, with_placement
from agent.runtime.jobs import read_job
from agent.runtime.output import write_generation
from agent.runtime.publication.handoff import Handoff, write_handoff
from agent.runtime.publication.leading import InitLease
from agent.runtime.restarts import Run, read_run, write_run
from agent.runtime.views import PodView

if TYPE_CHECKING:  # the protocol's module imports aiohttp, which init does not load
    from agent.k8s.async_client import AsyncApi

__all__ = ["BLOCKED", "LINGER", "PUBLISH_THRESHOLD", "Held", "Init", "InitSettings", "Source", "check_dns", "decide",
           "owner_of", "peak_rss_mb", "resolves", "run_init", "with_placement"]

log = logging.getLogger("topology_agent.init")
Resolver = Callable[[str], bool]

PUBLISH_THRESHOLD = LARGE_JOB  # training pods from which a job publishes (core/publication/view_choice.py)


def resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, None)
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class Source:
    """Where this pod's topology comes from, decided before anything is waited for."""

    controller: Controller
    me: Identity
    selector: str
    kind: str  # "pods" | "published"
    configmap: str
    training: bool = False  # a training pod of a job that publishes: it may lead (core/publication/leading.py)
    rank_zero: bool = False  # the pod of rank 0 by the job's objects: it leads where Leases cannot be read
    guard: bool = False  # it guards the leading init while it waits (core/publication/leading.is_guard)
    large: bool = False  # the job publishes by its size (view_choice.why_full_view)


def choose_source(settings: InitSettings, expected: Expectation) -> str:
    if settings.source != "auto":
        return settings.source
    if settings.options.levels is not None:
        return "published"  # one pod reads the Nodes and publishes their labels with the pods, whatever the size
    return "published" if expected.total >= PUBLISH_THRESHOLD else "pods"


def decide(me: RawPod, settings: InitSettings, expected: Expectation, objects: tuple[Mapping[str, Any], ...]) -> Source:
    """The plan of init's work (pure): the pods themselves, or a publication; and, where the job publishes, this
    pod's part in who leads (core/publication/leading.py: the Lease decides between the training pods)."""
    options = settings.options
    controller = detect_controller(me, options)
    identity = controller.identify(me, options)
    kind = choose_source(settings, expected)
    zero = None
    if kind == "published" and identity.role in controller.waits_for(objects):
        # Created once others are Ready (JobSet dependsOn): the leader published before this pod existed.
        log.info("role %s starts once %s are Ready; reading the pods directly", identity.role,
                 ", ".join(sorted(controller.waits_for(objects)[identity.role])))
        kind = "pods"
    if kind == "published":
        zero = rank_zero_identity(controller, expected, objects, controller.training_roles(options))
        if zero is None:
            log.info("cannot tell which pod is rank 0 (no per-role counts); reading the pods directly")
            kind = "pods"
    training = kind == "published" and identity.role in (expected.per_role or {})
    return Source(controller, identity, controller.selector(me, options), kind, configmap_name(identity.job),
                  training=training, rank_zero=training and is_rank_zero(identity, zero),
                  guard=training and is_guard(identity, zero), large=expected.total >= PUBLISH_THRESHOLD)


@dataclass(repr=False)
class Held:
    """What init holds when its files are written: ``console`` ends the process without freeing it (a 16384-pod
    job's objects take ~50 ms to free one by one, on the job's start-up path). No dataclass repr: on Python 3.11
    ``asyncio.run`` formats its main task's result twice as it restores the SIGINT handler, and spelling out the
    whole job would cost every init 0.12 s of CPU and ~42 MB of page faults after its files are written."""

    rendered: Rendered | None = None
    memo: Memo | None = None
    pods: PodView | None = None
    planner: Planner | None = None
    publisher: Publisher | None = None
    published: PublishedState | None = None


@dataclass
class Part:
    """An init's part in a large job's publication, as it is decided: its own pod, where its pods come from, who
    may have written what it reads, the Lease as it sees it, whether it leads (core/publication/leading.py says who)."""

    pod: RawPod | None = None  # as read at start
    source: Source | None = None  # once decided
    check: WriterCheck | None = None  # one for init's life (``publication.writer_check``)
    lease: InitLease | None = None  # a training pod's, once it looked
    leading: bool = False  # this init lists the pods and publishes them
    followed: bool = False  # this init waited for a publication (and said why its view is what it is)


class Init:
    """One init: its settings (the job's objects may fill options), its calls within its deadline, the pod's
    Events, what it read and holds, and its run in the pod; its steps are this package's modules (gang.py: a
    small job's wait; publication.py: who leads, the guard, the followers; barrier.py: a rerun's restart barrier)."""

    def __init__(self, api: AsyncApi, settings: InitSettings, *, clock: Callable[[], float],
                 sleep: Callable[[float], None], resolver: Resolver, ssh: object | None,
                 events: Sink | None = None) -> None:
        self.api, self.settings, self.resolver, self.ssh = api, settings, resolver, ssh
        self.calls = Calls(timeout=settings.timeout, watch_idle=settings.watch_idle, clock=clock, sleep=sleep)
        self.events = PodEvents(events)  # where the pod's Events go (their own client: runtime/events.py)
        self.memo = Memo(settings.options)  # each pod's facts are computed once per resourceVersion
        self.objects: tuple[Mapping[str, Any], ...] = ()  # the job's objects as read (the owner first)
        self.roster: Roster | None = None  # who may be a member, once the owner is read
        self.held = Held(memo=self.memo)
        self.reads = Handoff()  # what the sidecar would read again at start (runtime/publication/handoff.py)
        self.part = Part()  # its part in a large job's publication
        self.rerun = Rerun()  # this run in the pod: the one before it, on an in-place restart

    async def own_pod(self) -> RawPod:
        s = self.settings
        try:
            me = await self.calls.retried(lambda: self.api.get_pod(s.namespace, s.pod_name), "get own pod")
        except ApiNotFound as err:
            raise InputError(
                f"own pod '{s.pod_name}' not found in namespace '{s.namespace}'; set POD_NAME and POD_NAMESPACE "
                "from the downward API (metadata.name, metadata.namespace)"
            ) from err
        check_pod(me)  # a malformed own pod: one line, nothing to wait for
        self.reads.pod = me
        return me

    async def expectation(self, me: RawPod) -> Expectation:
        s = self.settings
        if s.expect is not None:
            return Expectation(total=s.expect, per_role=None, source="--expect")
        controller = detect_controller(me, s.options)
        from_pod = expectation_from_pod(controller, me)
        if from_pod is not None:
            return from_pod
        if controller.owner_path(me) is None:
            raise InputError(f"pod '{s.pod_name}': cannot tell how many pods the {controller.title} has (no owner "
                             "to read); pass --expect N")
        async def get(path: str) -> Any:
            obj = await self.calls.retried(lambda: self.api.get_object(path), f"get {path}")
            self.reads.objects[path] = obj
            return obj

        try:
            view = await read_job(get, me, s.options)
        except ApiNotFound as err:
            raise InputError(f"owner {controller.owner_path(me)} of pod '{s.pod_name}' not found; pass --expect N") \
                from err
        self.objects, self.roster = view.objects, roster_of(view)
        for note in view.notes:
            log.info("%s", note)
        if view.options != s.options:
            self.settings = s = dataclasses.replace(s, options=view.options)
            self.memo = self.held.memo = Memo(view.options)
        role = view.controller.identify(me, s.options).role
        return expectation_from_job(view.controller, view.objects, view.controller.training_roles(s.options),
                                    s.options, role=role)

    async def read_claims(self, pods: Iterable[RawPod]) -> bool:
        """Read the DRA claims when a pod's trainer takes some (runtime/claims.py); True: the options changed."""
        s = self.settings
        options = await with_claims(self.api, s.namespace, pods, s.options, retry=self.calls.retried)
        if options is s.options:
            return False
        self.settings = dataclasses.replace(s, options=options)
        self.memo = self.held.memo = Memo(options)
        return True

    async def main(self) -> Held:
        """``run``, its outcome told on the pod's Events (given at most ``EXIT_GRACE`` to be sent)."""
        try:
            return await self.run()
        except AgentError as err:
            reason = "GangTimeout" if isinstance(err, GangTimeout) else "InitFailed"
            self.events.tell(Occurrence(reason, f"gave up: {err}"))
            raise
        finally:
            if self.part.lease is not None:
                self.part.lease.stop()  # the sidecar renews it from now on
            self.events.close()

    async def run(self) -> Held:
        self.part.pod = me = await self.own_pod()
        self.events.start(me, self.settings.namespace, self.settings.pod_name)
        self.rerun.uid = me.get("metadata", {}).get("uid") or ""
        self.rerun.previous = read_run(self.settings.state_dir, self.rerun.uid)
        if self.rerun.previous is not None:
            self.rerun.generation = self.rerun.previous.generation + 1
            log.info("init runs again in this pod (an in-place restart: %d run(s) completed before, generation %d "
                     "last written): generation %d, once every member has restarted too", self.rerun.previous.runs,
                     self.rerun.previous.generation, self.rerun.generation)
        expected = await self.expectation(me)
        s = self.settings  # the job's objects may have filled options the user left open (MPI roles, slots)
        if self.rerun.previous is None and jobset_in_place(self.objects) is not None:
            self.rerun.attempt = jobset_attempt(me)  # JobSet's agent, placed before this init, wrote it for this run
        self.part.source = source = decide(me, s, expected, self.objects)
        self.events.name_job(source.me.job)
        self.part.leading = await elect(self, me, source)
        log.info("pod %s: %s, selector %s, expecting %d training pods (%s); topology from %s", s.pod_name,
                 source.controller.title, source.selector, expected.total, expected.source,
                 "the pods" if source.kind == "pods" else "the pods, published for the others (leader)"
                 if self.part.leading else f"configmap {source.configmap}")
        rendered = None
        if source.kind == "published" and not self.part.leading:
            rendered = await follow(self, me, source)
        if rendered is None:  # the pods themselves: a small job, the leader, or a publication not to be used
            rendered = await from_pods(self, me, source, expected)
        self.held.rendered = rendered
        s = self.settings  # the DRA claims read for the process count are in its options now
        # Told before the files are written: the Event is on its way while they are, so init's exit hardly waits.
        how = f"read the published topology {source.configmap}" if self.held.pods is None \
            else f"gang complete: {rendered.plan.topology.nnodes} training pods"
        if self.rerun.previous is not None:
            await restart_barrier(self, me, source, rendered)
        generation, previous = self.rerun.generation, self.rerun.previous
        self.events.tell(Occurrence("GangComplete", outcome_note(rendered.plan, how=how, generation=generation),
                                    generation=generation))
        if s.wait_dns:
            await check_dns(self.api, rendered, s, resolver=self.resolver, clock=self.calls.clock,
                            sleep=self.calls.sleep, deadline=self.calls.deadline)
        for warning in warnings_for(rendered.plan, rendered.variables):
            log.warning("%s", warning)
        names = write_generation(s.out_dir, rendered, s.options, self.ssh)
        write_handoff(s.state_dir, self.reads)
        write_run(s.state_dir, Run(self.rerun.uid, (previous.runs if previous else 0) + 1, generation,
                                   self.rerun.attempt))
        member = rendered.plan.topology.me
        log.info("wrote %s to %s: role %s, node rank %s of %d (peak RSS %s MB)", ", ".join(names), s.out_dir,
                 member.role, member.node_rank, rendered.plan.topology.nnodes, peak_rss_mb())
        return self.held



async def check_dns(api: AsyncApi, rendered: Rendered, settings: InitSettings, *, resolver: Resolver,
                    clock: Callable[[], float], sleep: Callable[[float], None], deadline: float) -> None:
    """Wait until every peer's name resolves, after ruling out the headless-Service trap."""
    topo = rendered.plan.topology
    names = [m.address for m in topo.members if m.dns_name and m.address == m.dns_name]
    subdomain = rendered.plan.self_pod.get("spec", {}).get("subdomain")
    if subdomain:
        await _check_service(api, settings.namespace, subdomain)
    pending = list(names)
    delay = 0.2
    while pending:
        pending = [name for name in pending if not resolver(name)]
        if not pending:
            break
        if clock() + delay > deadline:
            elapsed = settings.timeout - (deadline - clock())
            raise GangTimeout(f"timed out after {elapsed:.1f} s waiting for DNS: "
                              f"{', '.join(pending[:8])} do not resolve; check the headless Service and CoreDNS")
        log.info("waiting for DNS: %d name(s) do not resolve yet (%s)", len(pending), pending[0])
        sleep(delay)
        delay = min(delay * 2, 5.0)


async def _check_service(api: AsyncApi, namespace: str, subdomain: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/services/{subdomain}"
    try:
        service = await api.get_object(path)
    except ApiNotFound as err:
        raise InputError(f"--wait-dns: headless Service '{subdomain}' (the pods' spec.subdomain) does not exist; "
                         "create it (clusterIP: None, selecting the job's pods) or drop --wait-dns") from err
    except ApiError as err:
        log.warning("cannot read Service '%s' to check publishNotReadyAddresses: %s", subdomain, err)
        return
    if not service.get("spec", {}).get("publishNotReadyAddresses"):
        raise InputError(
            f"--wait-dns would wait forever: headless Service '{subdomain}' has no publishNotReadyAddresses, "
            "so pods still in their init containers get no DNS record; set spec.publishNotReadyAddresses: true "
            "(Volcano: svc plugin --publish-not-ready-addresses=true) or drop --wait-dns"
        )


def run_init(api: Client | AsyncApi, settings: InitSettings, *, resolver: Resolver = resolves,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
             ssh: object | None = None, events: Sink | None = None) -> Held:
    """Configure this pod (the module's docstring); what it held, with the files it rendered. ``events``: the
    client the pod's Events are sent with (its own: a slow Event never holds init's calls up), or none."""
    if isinstance(api, Client):
        api.budget.deadline = clock() + settings.timeout  # every request ends by --timeout, connect included
        api = Blocking(api)
    init = Init(api, settings, clock=clock, sleep=sleep, resolver=resolver, ssh=ssh, events=events)
    return asyncio.run(init.main())



def peak_rss_mb() -> str:
    """This process's own peak RSS (VmHWM): rusage would include the parent's memory at fork."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return f"{int(line.split()[1]) / 1024:.0f}"
    except OSError:
        pass
    return "?"
