"""init's wait for a gang of pods (a small job, or the leader of a large one): the job's pods listed, then
watched until every member is there, laid out as they arrive so that the plan is one change away at the end."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from agent.core import Memo, Rendered, render_plan
from agent.core.model import RawPod
from agent.core.plan.gang import Expectation, GangStatus, GangTracker
from agent.core.plan.planner import Planner
from agent.core.publication.blocks import BlockMaker
from agent.core.publication.journal import Publisher
from agent.core.publication.leading import standbys
from agent.core.publication.summary import own_view
from agent.core.publication.view_choice import why_full_view
from agent.core.report.events import Occurrence, waiting_note
from agent.errors import GangTimeout, InputError
from agent.k8s.core import PAGE, WatchEvent, pods_path
from agent.k8s.reflector import aclose
from agent.runtime.init.publication import give_way, owner_of
from agent.runtime.nodes import read_nodes, wanted_nodes
from agent.runtime.publication.publishing import first_publisher, publish_first
from agent.runtime.views import HOLDING, PodView, full_view_line

if TYPE_CHECKING:
    from agent.runtime.init import Init, InitSettings, Source

log = logging.getLogger("topology_agent.init")

LINGER = 0.1  # seconds: while many pods are awaited and events come densely, let them pile up between reads
BLOCKED = 0.001  # a read that took longer than this waited for the network


class Gang:
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


async def wait_for_gang(init: Init, me: RawPod, source: Source, expected: Expectation,
                        publisher: Publisher | None) -> tuple[PodView, Gang]:
    """List the job's pods, then watch until the gang is complete; ``GangTimeout`` naming what is missing at
    the deadline. Each event costs O(1) (``GangTracker``)."""
    s = init.settings
    view = PodView(s.pod_name, s.options, roster=init.roster, whole_own=True, me=me,
                   stage=publisher.stage if publisher is not None else None)  # the leader's rows, as they come
    gang = Gang(view, s, expected, init.memo, init.events.lock())
    view.watch(gang, refused=gang.refuse)
    init.events.stand(gang.waiting)
    collection = pods_path(s.namespace)
    ops = init.calls.ops(lambda: init.api.list_objects(collection, label_selector=source.selector, limit=PAGE,
                                                       keep=view.intake),
                         lambda rv, timeout, idle: _paced(init, gang, init.api.watch_objects(
                             collection, rv, timeout=timeout, label_selector=source.selector, idle=idle)))
    reflector = await init.calls.reflect(f"pods of {source.selector}", ops, view, gang.ready)
    init.events.stand(None)
    if gang.tracker is None:
        raise GangTimeout(f"timed out after {init.calls.elapsed():.1f} s (--timeout {s.timeout:g}): the API server "
                          f"kept failing ({reflector.last_error}); check the API server and the pod's network")
    if not gang.ready():
        why = f"; last API error: {reflector.last_error}" if reflector.last_error else ""
        raise GangTimeout(_timeout_message(init, gang.tracker.status(), source.selector) + why)
    gang.rv = reflector.rv
    return view, gang


async def _paced(init: Init, gang: Gang, events: AsyncIterator[WatchEvent]) -> AsyncIterator[WatchEvent]:
    """Pods arriving densely while many are still awaited are read in batches: each read that waits is a
    wakeup, and on a VM a wakeup costs more than the event's parsing (every pod of a 4096-pod job late: 2.3 s
    of CPU against 0.7 s with none). The last 1 % are read as they come; before them a pod is read at most
    LINGER late."""
    read_from = init.calls.clock()
    try:
        async for event in events:
            waited = init.calls.clock() - read_from
            yield event
            if BLOCKED < waited < LINGER and gang.dense():
                init.calls.sleep(LINGER)
            read_from = init.calls.clock()
    finally:
        await aclose(events)


def _timeout_message(init: Init, current: GangStatus, selector: str) -> str:
    s = init.settings
    return (f"timed out after {init.calls.elapsed():.1f} s (--timeout {s.timeout:g}) waiting for the gang: "
            f"{current.describe()}; see "
            f"kubectl get pods -n {s.namespace} -l {selector} (unscheduled pods? quota? wrong --expect?)")


async def from_pods(init: Init, me: RawPod, source: Source, expected: Expectation) -> Rendered:
    """A small job, or the leader of a large one: the pods, waited for; the leader publishes them first."""
    s = init.settings
    uid = me.get("metadata", {}).get("uid") or ""
    publisher = first_publisher(s.namespace, s.options, job=source.me.job, leader=s.pod_name,
                                leader_uid=uid) if init.part.leading else None
    view, gang = await wait_for_gang(init, me, source, expected, publisher)
    init.held.pods, init.held.planner, init.held.publisher = view, gang.planner, publisher
    assert gang.tracker is not None
    status = gang.tracker.status()
    log.info("gang complete: %s", status.describe())
    if status.present > status.expected and s.expect is not None:
        log.warning("--expect %d, but %d training pods are present: the files name all of them; give --expect "
                    "the job's size, or delete the pods that are not the job's", status.expected, status.present)
    names = wanted_nodes(view.pods.values(), s.options, {})
    nodes = await init.calls.retried(lambda: read_nodes(init.api, names, s.options, transient=True),
                                     "read nodes") if names else None
    planner = gang.planner
    if await init.read_claims(view.pods.values()):  # the wait's plan counted no DRA devices: plan again
        s = init.settings
        planner = init.held.planner = Planner(s.options, s.pod_name, checked=True, memo=init.memo)
    plan = planner.plan(view.pods, nodes=nodes)  # the layout the wait carried over, or from scratch
    log.debug("plan: %d changes followed during the wait, %s", planner.followed,
              "carried over" if planner.incremental else "made from scratch")
    # The leader publishes first (a valid plan): every other pod of the job is waiting for it. Its own files
    # come from the pods it has just listed, whether or not its snapshot was created: a `<job>-topology` that
    # exists already is never followed by the pod that leads: whoever wrote it first is not trusted for that.
    blocks = BlockMaker()  # the plan's blocks, made once for the summary and for this pod's own view
    if publisher is not None and not await publish_first(
            init.api, s.namespace, source.configmap, list(view.pods.values()), s.options, job=source.me.job,
            leader=s.pod_name, leader_uid=uid, owner=owner_of(me),
            standby=standbys((m.name for m in plan.topology.training), s.pod_name), nodes=nodes, plan=plan,
            publisher=publisher, retry=init.calls.retried,
            # a pod left out here (an index past the replicas) may be a member to the sidecar, whose roster
            # lets the job grow: it lists the pods then
            pods_rv="" if gang.refused else gang.rv, ssh=init.ssh is not None, blocks=blocks):
        await give_way(init, me, source)
    own, why = own_view(plan, s.options, ssh=init.ssh is not None, published=source.kind == "published",
                        blocks=blocks)
    said = init.part.followed and why == why_full_view(s.options, large=source.large)  # a follower said it already
    if why and not said:
        log.log(*full_view_line(s.options.view, why, HOLDING))
    return render_plan(own or plan, s.options, generation=init.rerun.generation, files_dir=str(s.out_dir.absolute()))
