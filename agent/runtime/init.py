"""``topology-agent init``: read my pod, find my peers, wait for the gang with one watch, write the files.

API cost is fixed whatever the job size: GET own pod, GET the owner object (skipped with ``--expect`` and
for LeaderWorkerSets), one LIST of the job's pods, then one WATCH from the list's resourceVersion until the
gang is complete (and one LIST of the namespace's ResourceClaims when a pod's trainer takes DRA claims). A
watch that the server ends or that breaks resumes from the last resourceVersion seen; a 410 Gone relists. No
polling. From 256 training pods one pod (the leader: the first training pod whose init runs, as the publisher
Lease says, core/publication/leading.py) lists the pods and publishes them; every other pod reads the
publication (runtime/publishing.py), or in its own view (the default's for most pods, core/publication/view_choice.py)
its summary.

init is written against the async client face (``AsyncApi``) as the sidecar is, over its own blocking client
(k8s/blocking.py): one ``asyncio.run`` for the whole command. Where its pods come from is decided first, from
the own pod and the job's objects alone (``Source``, pure), then done.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agent.core import Memo, Options, Rendered, render_plan, render_pod
from agent.core.controllers import Controller, detect_controller
from agent.core.files.variables import warnings_for
from agent.core.model import Identity, RawPod
from agent.core.plan.gang import (
    Expectation,
    GangStatus,
    GangTracker,
    Roster,
    expectation_from_job,
    expectation_from_pod,
    roster_of,
)
from agent.core.plan.restarts import (
    gate_after_agent,
    jobset_attempt,
    jobset_in_place,
    restarts_in_place,
    wanted_jobset_attempt,
)
from agent.core.plan.topology import Planner
from agent.core.pods.validation import check_pod
from agent.core.publication.journal import PublishedState, Publisher
from agent.core.publication.leading import is_guard, is_rank_zero, must_publish_again, rank_zero_identity, standbys
from agent.core.publication.lease import Record, Timing
from agent.core.publication.provenance import Writer, WriterCheck, writer_of
from agent.core.publication.published import SELECT_LABEL, configmap_name, select_value
from agent.core.publication.summary import own_view
from agent.core.publication.view_choice import why_full_view
from agent.core.report.events import Occurrence, Ref, outcome_note, waiting_note
from agent.errors import AgentError, ApiError, ApiForbidden, ApiNotFound, GangTimeout, InputError
from agent.k8s.blocking import Blocking
from agent.k8s.client import Client
from agent.k8s.core import PAGE, WatchEvent, pods_path
from agent.k8s.reflector import AsyncOps, Reflector, Store, aclose, reflect
from agent.k8s.reflector import Settings as ReflectorSettings
from agent.k8s.retrying import DeadlineExceeded, retried
from agent.k8s.transport import IDLE
from agent.runtime.claims import with_claims
from agent.runtime.events import Sink, ThreadRecorder
from agent.runtime.handoff import Handoff, write_handoff
from agent.runtime.jobs import read_job
from agent.runtime.leading import InitLease
from agent.runtime.nodes import read_nodes, wanted_nodes
from agent.runtime.output import write_generation
from agent.runtime.publishing import existing_copy, first_publisher, publish_first, vouch
from agent.runtime.restarts import JobSetAttempt, PodAttempts, Run, cut_page, read_run, write_run
from agent.runtime.views import (
    HOLDING,
    READING,
    PodView,
    PublicationView,
    SummaryView,
    full_view_line,
    journal_if_summary_gone,
)

if TYPE_CHECKING:  # the protocol's module imports aiohttp, which init does not load
    from agent.k8s.async_client import AsyncApi

log = logging.getLogger("topology_agent.init")
Resolver = Callable[[str], bool]
T = TypeVar("T")

PUBLISH_THRESHOLD = 256
LINGER = 0.1  # seconds: while many pods are awaited and events come densely, let them pile up between reads
BLOCKED = 0.001  # a read that took longer than this waited for the network


def resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, None)
    except OSError:
        return False
    return True


@dataclass
class InitSettings:
    namespace: str
    pod_name: str
    options: Options
    out_dir: Path
    expect: int | None = None
    timeout: float = 600.0
    wait_dns: bool = False
    source: str = "auto"  # pods | published | auto (published from PUBLISH_THRESHOLD training pods up)
    watch_idle: float | None = None  # seconds without progress before a watch counts as dead (None: derived)
    lease_seconds: int = 15  # the publisher Lease's duration (large jobs only)
    state_dir: Path | None = None  # mounted by the agent's containers alone: init's reads for the sidecar go there


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
                  guard=training and is_guard(identity, zero))


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
    check: WriterCheck | None = None  # one for init's life (``Init.writer_check``)
    lease: InitLease | None = None  # a training pod's, once it looked
    leading: bool = False  # this init lists the pods and publishes them
    followed: bool = False  # this init waited for a publication (and said why its view is what it is)


class _Gang:
    """The gang wait's watcher of the pods: a ``GangTracker`` (complete yet?) and the ``Planner`` that lays the
    job out as the pods arrive, so the plan is one change away when the gang is complete."""

    def __init__(self, view: PodView, settings: InitSettings, expected: Expectation, memo: Memo,
                 lock: threading.Lock) -> None:
        self.view, self.settings, self.expected, self.memo = view, settings, expected, memo
        self.tracker: GangTracker | None = None
        self.planner = Planner(settings.options, settings.pod_name, checked=True, memo=memo)  # the intake checked
        # What the pod's Events say of the wait, read in the events thread: the tracker and the pods the intake
        # refused (name -> the roster's line, and the LIST it came in), changed under ``lock``.
        self.lock = lock
        self.refused: dict[str, tuple[str, int]] = {}
        self.lists = 0
        self.rv = ""  # the pods' resourceVersion once the gang is complete
        self.just_refused = ""

    def ready(self) -> bool:
        return self.tracker is not None and self.tracker.ready()

    def dense(self) -> bool:
        return self.tracker is not None and self.tracker.pending() > max(2, self.expected.total // 100)

    def reset(self, pods: Mapping[str, RawPod]) -> None:
        s = self.settings
        tracker = GangTracker(pods[s.pod_name], s.pod_name, s.options, self.expected, memo=self.memo,
                              checked=True)  # every pod held passed the intake
        for pod in pods.values():
            tracker.put(pod)
        with self.lock:
            self.tracker = tracker
            self.refused = {name: why for name, why in self.refused.items() if why[1] == self.lists}  # this LIST's
            self.lists += 1
        self.planner.follow(self.view.pods)
        log.info("waiting for the gang: %s", tracker.status().describe())

    def changed(self, name: str, pod: RawPod | None) -> None:
        assert self.tracker is not None
        with self.lock:
            if pod is None:
                self.tracker.remove(name)
                if name != self.just_refused:  # deleted, not refused: no longer a reason to wait
                    self.refused.pop(name, None)
            else:
                self.tracker.put(pod)
                self.refused.pop(name, None)
            self.just_refused = ""
        self.planner.follow(self.view.pods, (name,))

    def refuse(self, pod: Any, why: str) -> None:
        """The intake left ``pod`` out (the view's ``refused``): the Events name it until it is let in or gone."""
        name = str(pod.get("metadata", {}).get("name", "?"))
        with self.lock:
            self.refused[name] = (why, self.lists)
            if len(self.refused) > 64:  # a note names 3: the rest need not be kept
                self.refused.pop(next(iter(self.refused)))
            self.just_refused = name

    def waiting(self) -> Occurrence | None:
        """Why the gang is not complete, for the pod's Events (called under ``lock``, in the events thread)."""
        tracker = self.tracker
        if tracker is None:
            return None
        try:
            status = tracker.status()
        except InputError:
            return None  # init ends with this error: its last Event says it
        if status.ready:
            return None
        unscheduled, no_ip = tracker.unplaced()
        return Occurrence("WaitingForGang", waiting_note(status, source=self.expected.source, unscheduled=unscheduled,
                                                         no_ip=no_ip, refused={n: w for n, (w, _) in
                                                                               self.refused.items()}))


class Init:
    """One init: its settings (the job's objects may fill options), its deadline, its client."""

    def __init__(self, api: AsyncApi, settings: InitSettings, *, clock: Callable[[], float],
                 sleep: Callable[[float], None], resolver: Resolver, ssh: object | None,
                 events: Sink | None = None) -> None:
        self.api, self.settings, self.clock, self.sleep = api, settings, clock, sleep
        self.resolver, self.ssh = resolver, ssh
        self.sink = events  # where the pod's Events go (their own client: runtime/events.py)
        self.recorder: ThreadRecorder | None = None
        self.started = clock()
        self.deadline = self.started + settings.timeout
        self.memo = Memo(settings.options)  # each pod's facts are computed once per resourceVersion
        self.objects: tuple[Mapping[str, Any], ...] = ()  # the job's objects as read (the owner first)
        self.roster: Roster | None = None  # who may be a member, once the owner is read
        self.held = Held(memo=self.memo)
        self.reads = Handoff()  # what the sidecar would read again at start (runtime/handoff.py)
        self.part = Part()  # its part in a large job's publication
        self.uid = ""  # the own pod's, once read
        self.previous: Run | None = None  # init's last completed run in this pod (an in-place restart), if any
        self.generation = 1  # the generation this run writes: the one after the pod's last, on a rerun
        self.attempt: int | None = None  # the JobSet in-place restart attempt this run belongs to (JobSet's protocol)
        # A watch that shows no progress for a third of --timeout is dead (60 s at most): init sees a hung watch
        # in time to list again before its deadline.
        self.reflecting = ReflectorSettings.with_idle(settings.watch_idle or min(IDLE, max(3.0, settings.timeout / 3)))

    async def pause(self, seconds: float) -> None:
        self.sleep(seconds)

    def elapsed(self) -> float:
        return self.clock() - self.started

    async def retried(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        try:
            return await retried(call, what=what, deadline=self.deadline, sleep=self.pause, clock=self.clock)
        except DeadlineExceeded as err:
            raise GangTimeout(f"timed out after {self.elapsed():.1f} s: the API server kept failing "
                              f"({err.last}); check the API server and the pod's network") from err

    async def own_pod(self) -> RawPod:
        s = self.settings
        try:
            me = await self.retried(lambda: self.api.get_pod(s.namespace, s.pod_name), "get own pod")
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
            obj = await self.retried(lambda: self.api.get_object(path), f"get {path}")
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

    def ops(self, list_call: Callable[[], Awaitable[tuple[list[Any], str]]],
            watch_call: Callable[[str, float, float], AsyncIterator[WatchEvent]]) -> AsyncOps:
        return AsyncOps(list_call, watch_call, clock=self.clock, sleep=self.pause)

    async def reflect(self, what: str, ops: AsyncOps, store: Store, done: Callable[[], bool]) -> Reflector:
        reflector = Reflector(what, self.reflecting, now=self.clock())
        await reflect(reflector, ops, store, deadline=self.deadline, done=done)
        return reflector

    # --- who leads -----------------------------------------------------------------------------------------------

    async def elect(self, me: RawPod, source: Source) -> bool:
        """Whether this init leads a large job's publication (core/publication/leading.py): a training pod's init looks
        at the Lease once (a guard again while it waits); a pod that does not train follows, and looks at nothing."""
        if not source.training:
            return False
        s = self.settings
        check = self.writer_check(me, source)

        async def judge(record: Record) -> str | None:
            """The holder pod, read once as metadata: accepted, it is the writer of what this pod reads."""
            writer = Writer(record.holder, record.holder_uid)
            path = check.path(writer)
            if path is None:
                return f"{record.holder[:80]!r} is not a pod name"
            try:
                pod: Any = await self.retried(lambda: self.api.get_object(path, metadata_only=True),
                                              f"get pod {record.holder}")
            except ApiNotFound:
                pod = None
            except ApiForbidden:
                return None  # cannot tell: the Lease is followed
            uid = record.holder_uid or (pod or {}).get("metadata", {}).get("uid") or ""
            return check.vet(Writer(record.holder, uid), pod)

        lease = InitLease(self.api, s.namespace, source.configmap, s.pod_name, owner=owner_of(me),
                          timing=Timing(s.lease_seconds), clock=self.clock,
                          blocking=self.api.client if isinstance(self.api, Blocking) else None,
                          uid=me.get("metadata", {}).get("uid") or "", judge=judge)
        try:
            leads = await lease.claim(self.retried)
        except ApiForbidden as err:
            log.warning("cannot read or write lease %s (%s); %s, without leader failover (grant leases: "
                        "manifests/rbac)", source.configmap, err,
                        "this pod, rank 0, publishes" if source.rank_zero else "the pod of rank 0 publishes")
            return source.rank_zero
        self.part.lease = lease
        return leads and await self.lead_now(me, source)

    async def lead_now(self, me: RawPod, source: Source) -> bool:
        """This init holds the Lease (it took it first, or a guard took it over): it leads, renewing the Lease,
        unless a copy a pod of this job wrote is there, whose writer must publish again (``give_way``: this init
        then waits for it as a follower does)."""
        assert self.part.lease is not None
        if await self.give_way(me, source, first=True):
            return False
        self.part.lease.keep()
        return True

    async def give_way(self, me: RawPod, source: Source, *, first: bool = False) -> bool:
        """A publication is there already, written by a pod of this job (its earlier incarnation, or a leader that
        took the Lease meanwhile): only that pod may write over it, so it gets the Lease, and True. ``first``:
        before this leader lists the pods, the summary alone is looked for (one GET, a 404 at a job's first
        start); after its snapshot create found one, any of the three. A copy this pod wrote is its own to
        continue; one no member wrote is left to the readers, who refuse it."""
        lease = self.part.lease
        if lease is None or not lease.holding:
            return False
        try:
            copy = await existing_copy(self.api, self.settings.namespace, source.configmap, summary_only=first)
            writer = writer_of(copy) if copy is not None else None
            if copy is None or writer is None or writer.name in ("", self.settings.pod_name):
                return False
            why, superseded = await vouch(self.api.get_object, self.writer_check(me, source), [copy],
                                          source.configmap)
        except ApiError as err:
            log.info("cannot tell who wrote configmap %s (%s); keeping lease %s", source.configmap, err, lease.name)
            return False
        if why is not None and not superseded:
            return False
        await lease.hand_to(writer.name)
        return True

    # --- the pods themselves ------------------------------------------------------------------------------------

    async def gang(self, me: RawPod, source: Source, expected: Expectation,
                   publisher: Publisher | None) -> tuple[PodView, _Gang]:
        """List the job's pods, then watch until the gang is complete; ``GangTimeout`` naming what is missing at
        the deadline. Each event costs O(1) (``GangTracker``)."""
        s = self.settings
        view = PodView(s.pod_name, s.options, roster=self.roster, whole_own=True)
        view.me = me
        view.stage = publisher.stage if publisher is not None else None  # the leader's rows, as the pods arrive
        gang = _Gang(view, s, expected, self.memo, self.recorder.lock if self.recorder else threading.Lock())
        view.watchers.append(gang)
        view.refused = gang.refuse
        self.stand(gang.waiting)
        collection = pods_path(s.namespace)
        ops = self.ops(lambda: self.api.list_objects(collection, label_selector=source.selector, limit=PAGE,
                                                     keep=view.intake),
                       lambda rv, timeout, idle: self._paced(gang, self.api.watch_objects(
                           collection, rv, timeout=timeout, label_selector=source.selector, idle=idle)))
        reflector = await self.reflect(f"pods of {source.selector}", ops, view, gang.ready)
        self.stand(None)
        if gang.tracker is None:
            raise GangTimeout(f"timed out after {self.elapsed():.1f} s (--timeout {s.timeout:g}): the API server "
                              f"kept failing ({reflector.last_error}); check the API server and the pod's network")
        if not gang.ready():
            why = f"; last API error: {reflector.last_error}" if reflector.last_error else ""
            raise GangTimeout(self._timeout_message(gang.tracker.status(), source.selector) + why)
        gang.rv = reflector.rv
        return view, gang

    async def _paced(self, gang: _Gang, events: AsyncIterator[WatchEvent]) -> AsyncIterator[WatchEvent]:
        """Pods arriving densely while many are still awaited are read in batches: each read that waits is a
        wakeup, and on a VM a wakeup costs more than the event's parsing (every pod of a 4096-pod job late: 2.3 s
        of CPU against 0.7 s with none). The last 1 % are read as they come; before them a pod is read at most
        LINGER late."""
        read_from = self.clock()
        try:
            async for event in events:
                waited = self.clock() - read_from
                yield event
                if BLOCKED < waited < LINGER and gang.dense():
                    self.sleep(LINGER)
                read_from = self.clock()
        finally:
            await aclose(events)

    def _timeout_message(self, current: GangStatus, selector: str) -> str:
        s = self.settings
        return (f"timed out after {self.elapsed():.1f} s (--timeout {s.timeout:g}) waiting for the gang: "
                f"{current.describe()}; see "
                f"kubectl get pods -n {s.namespace} -l {selector} (unscheduled pods? quota? wrong --expect?)")

    async def from_pods(self, me: RawPod, source: Source, expected: Expectation) -> Rendered:
        """A small job, or the leader of a large one: the pods, waited for; the leader publishes them first."""
        s = self.settings
        uid = me.get("metadata", {}).get("uid") or ""
        publisher = first_publisher(s.namespace, s.options, job=source.me.job, leader=s.pod_name,
                                    leader_uid=uid) if self.part.leading else None
        view, gang = await self.gang(me, source, expected, publisher)
        self.held.pods, self.held.planner, self.held.publisher = view, gang.planner, publisher
        assert gang.tracker is not None
        status = gang.tracker.status()
        log.info("gang complete: %s", status.describe())
        if status.present > status.expected and s.expect is not None:
            log.warning("--expect %d, but %d training pods are present: the files name all of them; give --expect "
                        "the job's size, or delete the pods that are not the job's", status.expected, status.present)
        names = wanted_nodes(view.pods.values(), s.options, {})
        nodes = await self.retried(lambda: read_nodes(self.api, names, s.options, transient=True),
                                   "read nodes") if names else None
        planner = gang.planner
        if await self.read_claims(view.pods.values()):  # the wait's plan counted no DRA devices: plan again
            s = self.settings
            planner = self.held.planner = Planner(s.options, s.pod_name, checked=True, memo=self.memo)
        plan = planner.plan(view.pods, nodes=nodes)  # the layout the wait carried over, or from scratch
        log.debug("plan: %d changes followed during the wait, %s", planner.followed,
                  "carried over" if planner.incremental else "made from scratch")
        # The leader publishes first (a valid plan): every other pod of the job is waiting for it. Its own files
        # come from the pods it has just listed, whether or not its snapshot was created: a `<job>-topology` that
        # exists already is never followed by the pod that leads: whoever wrote it first is not trusted for that.
        if publisher is not None and not await publish_first(
                self.api, s.namespace, source.configmap, list(view.pods.values()), s.options, job=source.me.job,
                leader=s.pod_name, leader_uid=uid, owner=owner_of(me),
                standby=standbys((m.name for m in plan.topology.training), s.pod_name), nodes=nodes, plan=plan,
                publisher=publisher, retry=self.retried,
                # a pod left out here (an index past the replicas) may be a member to the sidecar, whose roster
                # lets the job grow: it lists the pods then
                pods_rv="" if gang.refused else gang.rv, ssh=self.ssh is not None):
            await self.give_way(me, source)
        own, why = own_view(plan, s.options, ssh=self.ssh is not None, published=source.kind == "published")
        if why and not (self.part.followed and why == why_full_view(s.options)):  # a follower said that one already
            log.log(*full_view_line(s.options.view, why, HOLDING))
        return render_plan(own or plan, s.options, generation=self.generation, files_dir=str(s.out_dir.absolute()))

    async def read_claims(self, pods: Iterable[RawPod]) -> bool:
        """Read the DRA claims when a pod's trainer takes some (runtime/claims.py); True: the options changed."""
        s = self.settings
        options = await with_claims(self.api, s.namespace, pods, s.options, retry=self.retried)
        if options is s.options:
            return False
        self.settings = dataclasses.replace(s, options=options)
        self.memo = self.held.memo = Memo(options)
        return True

    # --- the leader's publication -------------------------------------------------------------------------------

    def writer_check(self, me: RawPod, source: Source) -> WriterCheck:
        """Who may have written what this pod reads (core/publication/provenance.py): one check for init's life, so a
        writer read once (the Lease's holder, say) is not read again."""
        s = self.settings
        if self.part.check is None:
            self.part.check = WriterCheck(source.controller, s.options, source.me.job, s.namespace, self.roster,
                                     me=Writer(s.pod_name, me.get("metadata", {}).get("uid") or ""))
        return self.part.check

    async def from_publication(self, me: RawPod, source: Source) -> Rendered | None:
        """A follower of a large job: its plan from the summary (its own view) or its pods from the snapshot;
        None when the publication cannot be used (said in one line: the caller reads the pods instead), or when
        this pod leads from now on (``leading``: a guard took the Lease over, or the copy is this pod's own)."""
        s = self.settings
        self.part.followed = True
        if self.ssh is not None:  # its keys and certificate are made once the wait is over: import their code now
            import agent.ssh.material  # noqa: F401  (~30 ms on the start-up path of every pod of an SSH job)
        check = self.writer_check(me, source)
        self.reads.writers = check.accepted  # the writers vouched for: the sidecar need not read them again
        why_full = why_full_view(s.options)
        files_dir = str(s.out_dir.absolute())
        if why_full is not None and s.options.view != "full":
            log.log(*full_view_line(s.options.view, why_full, READING))
        elif why_full is None:
            plan = await self.summary(me, source, check)
            if plan is not None:
                return render_plan(plan, s.options, generation=self.generation, files_dir=files_dir)
        if self.part.leading:
            return None
        published = await self.publication(source, check)
        if published is None:
            return None
        self.held.published = published
        mine = with_placement(me, published.pods[s.pod_name])
        pods = [mine if name == s.pod_name else pod for name, pod in published.pods.items()]
        if await self.read_claims(pods):
            s = self.settings
        return render_pod(pods, s.pod_name, s.options, generation=self.generation, memo=self.memo,
                          files_dir=files_dir,
                          nodes=published.node_labels(), checked=True)  # the published rows were checked

    async def publication(self, source: Source, check: WriterCheck) -> PublishedState | None:
        """The published state once it includes this pod; ``GangTimeout`` at the deadline. One LIST by label reads
        the snapshot and the journal together; while this pod is not in them yet, a WATCH with the same label
        brings the publisher's writes in order (a snapshot always before the journal that needs it)."""
        s, name = self.settings, source.configmap
        view, gate = PublicationView(name), self._gate(check, name)
        gate.superseded_then = view.clear
        log.info("waiting for %s to publish configmap %s", self._publisher(), name)
        self.stand(self._publication_wait(name))
        ops = self._vouched_ops(gate, label=f"{SELECT_LABEL}={select_value(name)}")
        reflector = await self.reflect(f"configmap {name}", ops, view,
                                       lambda: self.part.leading or gate.refused is not None or view.has(s.pod_name))
        self.stand(None)
        if self.part.leading:
            return None
        if gate.refused is not None:
            log.warning("the published topology is not used (%s); reading the pods instead", gate.refused)
            self.tell(Occurrence("PublicationRefused", f"the published topology {name} is not used "
                                                       f"({gate.refused}); reading the pods instead"))
            return None
        if not view.has(s.pod_name):
            raise GangTimeout(f"timed out waiting for the job's publisher to publish configmap {name} (with pod "
                              f"'{s.pod_name}'){_last(reflector)}; {self._look_at()}; "
                              f"kubectl get configmap {name} -n {s.namespace}")
        assert view.state is not None
        log.info("read the published topology %s: sequence %d, %d pods", name, view.state.seq, len(view.state.pods))
        return view.state

    async def summary(self, me: RawPod, source: Source, check: WriterCheck) -> Any:
        """This pod's own view: its plan from the published summary once it places this pod; None (said in one
        line) when it cannot be used, or its files name every member (``--view auto``), or it is gone while the
        journal is published (deleted: ``summary_gone``), or this pod leads from now on. Only the summary is
        listed and watched, by name (a few KiB, not the snapshot); when it is not there, the journal's metadata
        says whether it was deleted."""
        s = self.settings
        view = SummaryView(source.configmap, me, s.options, ssh=self.ssh is not None)
        gate = self._gate(check, source.configmap)
        journal = view.name
        log.info("waiting for %s to publish its summary in configmap %s (--view %s)", self._publisher(), journal,
                 s.options.view)
        self.stand(self._publication_wait(journal))
        reflector = await self.reflect(
            f"configmap {journal}", self._vouched_ops(gate, field=f"metadata.name={journal}",
                                                      summary_of=source.configmap), view,
            lambda: self.part.leading or gate.refused is not None or view.unsummarized is not None or
            view.plan is not None or view.gone is not None)
        self.stand(None)
        if self.part.leading:
            return None
        if gate.refused is None and view.unsummarized is None and view.plan is None and view.gone is None:
            raise GangTimeout(f"timed out waiting for the job's publisher to publish configmap {journal} placing "
                              f"pod '{s.pod_name}'{_last(reflector)}; {self._look_at()}; "
                              f"kubectl get configmap {journal} -n {s.namespace}")
        if gate.refused is not None:
            log.warning("the published summary is not used (%s)", gate.refused)
        elif view.gone is not None and view.plan is None:
            log.warning("%s", view.gone)
        elif view.plan is None:
            log.log(*full_view_line(s.options.view, view.unsummarized or "", READING))
        else:
            self.reads.summary = view.placing  # its sidecar watches it from here, without a LIST of its own
        return view.plan

    def _gate(self, check: WriterCheck, name: str) -> _Vouched:
        gate = _Vouched(self.api, check, name, me=self.settings.pod_name)
        gate.publish_again = self._publish_again
        return gate

    def _publish_again(self, why: str) -> None:
        """The copy found is this pod's earlier incarnation's: no other pod may write over it
        (core/publication/leading.py)."""
        log.warning("this pod publishes the topology again: %s", why)
        self.part.leading = True

    def _vouched_ops(self, gate: _Vouched, *, label: str = "", field: str = "",
                     summary_of: str = "") -> AsyncOps:
        """The published ConfigMaps' list and watch, each object's writer vouched for before a view sees it
        (``summary_of``: a LIST of that publication's summary says whether its journal is there when the summary
        is not: ``journal_if_summary_gone``). A guard looks at the Lease before each watch, and its watches end
        every few seconds so that it does (``guarding``)."""
        collection = f"/api/v1/namespaces/{self.settings.namespace}/configmaps"
        guarding = self.guarding()

        async def listed() -> tuple[list[Any], str]:
            items, rv = await self.api.list_objects(collection, label_selector=label, field_selector=field)
            admitted = items if await gate.admits(items) else []
            if summary_of:
                admitted = admitted + await journal_if_summary_gone(self.api, collection, summary_of, items)
            return admitted, rv

        async def watched(rv: str, timeout: float, idle: float) -> AsyncIterator[WatchEvent]:
            if guarding is not None:
                if await guarding.guard() and self.part.pod is not None and self.part.source is not None:
                    self.part.leading = await self.lead_now(self.part.pod, self.part.source)
                if self.part.leading:
                    return
                timeout = min(timeout, guarding.timing.renew_every)
            events = self.api.watch_objects(collection, rv, timeout=timeout, label_selector=label,
                                            field_selector=field, idle=idle)
            try:
                async for event in events:
                    if event.type not in ("ADDED", "MODIFIED") or await gate.admits([event.object]):
                        yield event
                    elif gate.refused is not None or self.part.leading:
                        return
            finally:
                await aclose(events)

        return self.ops(listed, watched)

    def guarding(self) -> InitLease | None:
        """The Lease this init guards while it waits (core/publication/leading.is_guard), if it does."""
        part = self.part
        return part.lease if part.lease is not None and part.source is not None and part.source.guard else None

    # --- the whole -------------------------------------------------------------------------------------------

    # --- an in-place restart ----------------------------------------------------------------------------------

    async def restart_barrier(self, me: RawPod, source: Source, rendered: Rendered) -> None:
        """A rerun in this pod (an in-place restart): wait until every member has restarted too (core/plan/restarts.py
        says when), by JobSet's protocol where the job uses it (the JobSet watched by name), else by the pods'
        init restartCounts (the job's pods listed and watched, each cut to its init containers). ``GangTimeout``
        at the deadline, naming who has not."""
        assert self.previous is not None
        s = self.settings
        jobset = jobset_in_place(self.objects)
        store: JobSetAttempt | PodAttempts
        if jobset is not None and (gate := gate_after_agent(me)) is not None:
            # Waiting here would hold JobSet's agent, which the JobSet needs to mark the attempt current; it holds
            # the trainer itself until then, and this pod's attempt is the one after the last recorded.
            self.attempt = (self.previous.attempt if self.previous.attempt is not None else -1) + 1
            log.info("restart barrier: init container '%s' (JobSet's in-place restart agent) comes after this one "
                     "and starts the trainer once JobSet's attempt %d is current; the files are written now",
                     gate, self.attempt)
            return
        if jobset is not None:
            meta = jobset.get("metadata") or {}
            name = str(meta.get("name", ""))
            collection = f"/apis/{jobset.get('apiVersion') or 'jobset.x-k8s.io/v1alpha2'}/namespaces/" \
                         f"{meta.get('namespace') or s.namespace}/jobsets"
            self.attempt = wanted_jobset_attempt(me, self.previous.attempt)
            store = JobSetAttempt(jobset, self.attempt)
            field = f"metadata.name={name}"
            ops = self.ops(lambda: self.api.list_objects(collection, field_selector=field),
                           lambda rv, timeout, idle: self.api.watch_objects(collection, rv, timeout=timeout,
                                                                            field_selector=field, idle=idle))
            what, look = f"JobSet {name}", f"kubectl get jobset {name} -n {s.namespace} -o yaml"
        elif not restarts_in_place(me):
            log.info("restart barrier: none (no container of this pod has the restart rule RestartAllContainers: "
                     "its containers started again on their own, a new sandbox or a node restart, which restarts "
                     "no other member); generation %d now", self.generation)
            return
        else:
            topology = rendered.plan.topology
            store = PodAttempts(frozenset(m.name for m in topology.members) if topology.whole is None else None,
                                self.previous.runs)
            collection = pods_path(s.namespace)
            ops = self.ops(lambda: self.api.list_objects(collection, label_selector=source.selector, limit=PAGE,
                                                         keep=cut_page),
                           lambda rv, timeout, idle: self.api.watch_objects(collection, rv, timeout=timeout,
                                                                            label_selector=source.selector,
                                                                            idle=idle))
            what, look = f"pods of {source.selector}", f"kubectl get pods -n {s.namespace} -l {source.selector}"
        if store.down():  # JobSet's agent held this init until the JobSet lifted its barrier
            log.info("restart barrier: %s", store.barrier().describe())
            return
        log.info("waiting at the restart barrier: every member at restart attempt %d (%s)", store.barrier().attempt,
                 "JobSet's in-place restart" if jobset is not None else "the pods' init restartCounts")
        self.stand(lambda: Occurrence("WaitingForRestart", f"generation {self.generation}: "
                                                           f"{store.barrier().describe()}"))
        said: list[Any] = [None, 0.0]  # the last line said, and when

        def down() -> bool:
            """``store.down()``, and a line when where the barrier stands changed (at most one a second)."""
            if store.down():
                return True
            line = store.barrier().describe() if self.clock() - said[1] >= 1.0 else said[0]
            if line != said[0]:
                log.info("restart barrier: %s", line)
                said[:] = [line, self.clock()]
            return False

        try:
            reflector = await self.reflect(what, ops, store, down)
        except ApiForbidden as err:
            raise ApiForbidden(f"{err}; a rerun of init lists and watches the {what} at its restart barrier: grant "
                               "list and watch on them (manifests/rbac)", status=err.status) from err
        finally:
            self.stand(None)
        if not store.down():
            why = f"; last API error: {reflector.last_error}" if reflector.last_error else ""
            raise GangTimeout(f"timed out after {self.elapsed():.1f} s (--timeout {s.timeout:g}) at the restart "
                              f"barrier: {store.barrier().describe()}{why}; every member restarts in place "
                              f"(RestartAllContainers) before any trainer starts again; see {look}")
        log.info("restart barrier down: %s", store.barrier().describe())

    # --- the pod's Events ------------------------------------------------------------------------------------

    def start_events(self, me: RawPod) -> None:
        """Record on this pod from now on (its uid known), if init was given where to."""
        if self.sink is None:
            return
        meta, s = me.get("metadata", {}), self.settings
        self.recorder = ThreadRecorder(self.sink, Ref(s.pod_name, s.namespace, meta.get("uid") or ""))

    def stand(self, source: Callable[[], Occurrence | None] | None) -> None:
        if self.recorder is not None:
            self.recorder.stand(source)

    def tell(self, occurrence: Occurrence) -> None:
        if self.recorder is not None:
            self.recorder.record(occurrence)

    def _publisher(self) -> str:
        """Who this pod waits for, in its log line and Event."""
        lease, source = self.part.lease, self.part.source
        name = source.configmap if source is not None else "?"
        if lease is None and source is not None and source.training:
            return "the job's publisher (the pod of rank 0: the Lease cannot be read)"
        if lease is None or not lease.holder:
            return f"the job's publisher (the holder of lease {name})"
        return f"the job's publisher, pod {lease.holder} (the holder of lease {name})"

    def _look_at(self) -> str:
        source = self.part.source
        if self.part.lease is None and source is not None and source.training:
            return "is the pod of rank 0 running its init container?"
        name = source.configmap if source is not None else "?"
        return f"is the pod that holds lease {name} running its init container? kubectl get lease {name} -n " \
               f"{self.settings.namespace}"

    def _publication_wait(self, name: str) -> Callable[[], Occurrence]:
        occurrence = Occurrence("WaitingForPublication", f"waiting for {self._publisher()} to publish configmap "
                                                         f"{name} with this pod")
        return lambda: occurrence

    async def main(self) -> Held:
        """``run``, its outcome told on the pod's Events (given at most ``EXIT_GRACE`` to be sent)."""
        try:
            return await self.run()
        except AgentError as err:
            reason = "GangTimeout" if isinstance(err, GangTimeout) else "InitFailed"
            self.tell(Occurrence(reason, f"gave up: {err}"))
            raise
        finally:
            if self.part.lease is not None:
                self.part.lease.stop()  # the sidecar renews it from now on
            if self.recorder is not None:
                self.recorder.close()

    async def run(self) -> Held:
        self.part.pod = me = await self.own_pod()
        self.start_events(me)
        self.uid = me.get("metadata", {}).get("uid") or ""
        self.previous = read_run(self.settings.state_dir, self.uid)
        if self.previous is not None:
            self.generation = self.previous.generation + 1
            log.info("init runs again in this pod (an in-place restart: %d run(s) completed before, generation %d "
                     "last written): generation %d, once every member has restarted too", self.previous.runs,
                     self.previous.generation, self.generation)
        expected = await self.expectation(me)
        s = self.settings  # the job's objects may have filled options the user left open (MPI roles, slots)
        if self.previous is None and jobset_in_place(self.objects) is not None:
            self.attempt = jobset_attempt(me)  # JobSet's agent, placed before this init, wrote it for this run
        self.part.source = source = decide(me, s, expected, self.objects)
        if self.recorder is not None:
            self.recorder.recording.correlator.job = source.me.job
        self.part.leading = await self.elect(me, source)
        log.info("pod %s: %s, selector %s, expecting %d training pods (%s); topology from %s", s.pod_name,
                 source.controller.title, source.selector, expected.total, expected.source,
                 "the pods" if source.kind == "pods" else "the pods, published for the others (leader)"
                 if self.part.leading else f"configmap {source.configmap}")
        rendered = None
        if source.kind == "published" and not self.part.leading:
            rendered = await self.from_publication(me, source)
        if rendered is None:  # the pods themselves: a small job, the leader, or a publication not to be used
            rendered = await self.from_pods(me, source, expected)
        self.held.rendered = rendered
        s = self.settings  # the DRA claims read for the process count are in its options now
        # Told before the files are written: the Event is on its way while they are, so init's exit hardly waits.
        how = f"read the published topology {source.configmap}" if self.held.pods is None \
            else f"gang complete: {rendered.plan.topology.nnodes} training pods"
        if self.previous is not None:
            await self.restart_barrier(me, source, rendered)
        self.tell(Occurrence("GangComplete", outcome_note(rendered.plan, how=how, generation=self.generation),
                             generation=self.generation))
        if s.wait_dns:
            await check_dns(self.api, rendered, s, resolver=self.resolver, clock=self.clock, sleep=self.sleep,
                            deadline=self.deadline)
        for warning in warnings_for(rendered.plan, rendered.variables):
            log.warning("%s", warning)
        names = write_generation(s.out_dir, rendered, s.options, self.ssh)
        write_handoff(s.state_dir, self.reads)
        write_run(s.state_dir, Run(self.uid, (self.previous.runs if self.previous else 0) + 1, self.generation,
                                   self.attempt))
        member = rendered.plan.topology.me
        log.info("wrote %s to %s: role %s, node rank %s of %d (peak RSS %s MB)", ", ".join(names), s.out_dir,
                 member.role, member.node_rank, rendered.plan.topology.nnodes, peak_rss_mb())
        return self.held


class _Vouched:
    """Who wrote the published objects, before they are used (core/publication/provenance.py). A copy written by an
    earlier incarnation of a member (its controller re-created the pod) is not used, but that pod publishes again, so
    init waits for it as for a first publication, or publishes itself when that pod is this one
    (``publish_again``); any other refusal ends the wait (``refused``)."""

    def __init__(self, api: AsyncApi, check: WriterCheck, name: str, *, me: str = "") -> None:
        self.api, self.check, self.name, self.me = api, check, name, me
        self.refused: str | None = None
        self.superseded: str | None = None
        self.superseded_then: Callable[[], None] = lambda: None
        self.publish_again: Callable[[str], None] = lambda why: None  # the copy is this pod's earlier incarnation's

    async def admits(self, items: list[Any]) -> bool:
        if self.refused is not None:
            return False
        why, superseded = await vouch(self.api.get_object, self.check, items, self.name)
        if why is None:
            self.superseded = None
            return True
        if not superseded:
            self.refused = why
        elif must_publish_again(self.me, (writer.name for writer in self.check.superseded_by)):
            self.publish_again(why)
        elif self.superseded is None:
            self.superseded = why
            log.info("waiting for the published topology to be written again (%s)", why)
            self.superseded_then()
        return False


def _last(reflector: Reflector) -> str:
    return f" (last API error: {reflector.last_error})" if reflector.last_error else ""


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


def owner_of(me: RawPod) -> dict[str, Any] | None:
    """The pod's controller (its ownerReference): it owns the Lease and the ConfigMaps, which go with it."""
    owners = [o for o in me.get("metadata", {}).get("ownerReferences", []) if o.get("controller")]
    return dict(owners[0]) if owners else None


def with_placement(me: RawPod, published: RawPod) -> RawPod:
    """The own pod as read at start (its env is the user's), with the node and IP the leader saw later: an init
    started before its pod was bound (the demo, tests) read it without them."""
    spec, status = me.get("spec", {}), me.get("status", {})
    if spec.get("nodeName") and status.get("podIP"):
        return me
    return {**me, "spec": {**spec, "nodeName": spec.get("nodeName") or published.get("spec", {}).get("nodeName", "")},
            "status": status if status.get("podIP") else published.get("status", {})}


def peak_rss_mb() -> str:
    """This process's own peak RSS (VmHWM): rusage would include the parent's memory at fork."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return f"{int(line.split()[1]) / 1024:.0f}"
    except OSError:
        pass
    return "?"
