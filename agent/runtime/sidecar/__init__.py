"""``topology-agent sidecar``: keep the files equal to the job's live membership, within a second.

The sidecar supervises its roles, one module each, run as root tasks (tasks.py):

* a follower (following.py) feeds a view (runtime/views.py) through the one reflector: the job's pods, or a
  large job's published journal, and reports each change to the sidecar's ``Changes``;
* after ``--debounce`` the evaluator (evaluating.py) renders the pods held with the same core as ``init``, and
  only when who-is-where changed are the files rewritten under a new generation and the trainer signalled;
* in a large job, the publication (publication.py): the Lease its leader and standbys contend for, and in the
  pod holding it the writes that keep the publication equal to the pods;
* beside the pods' follower, where RBAC lets it, the Nodes' (following.NodesFollower): a peer on a lost Node
  leaves the world (core/pods/lost.py); the publisher's rows carry that to the followers, who watch no Node.

``Mode`` says which follower runs; a follower asks to switch (a standby named, a stalled publication, a sound
one again). The last complete files always stay in place: while the API server is away, on SIGTERM, when the
pods make no valid topology, and when the files cannot be written. ``unready`` tells /readyz why.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.core.controllers import detect_controller
from agent.core.model import RawPod
from agent.core.plan.gang import roster_of
from agent.core.pods.pod import node_name, pod_ip, pod_name
from agent.core.publication.provenance import Writer, WriterCheck
from agent.core.publication.published import configmap_name
from agent.core.report.events import Occurrence, Ref
from agent.errors import AgentError, ApiForbidden, ApiNotFound, InputError
from agent.flags.sidecar import SidecarSettings
from agent.k8s.async_client import AsyncApi
from agent.k8s.reflector import Reflector
from agent.k8s.retrying import retried
from agent.runtime.claims import claimants, with_claims
from agent.runtime.events import AsyncSink, Refusals, TaskRecorder
from agent.runtime.jobs import read_job
from agent.runtime.memory import collector_paused, keep_freed_memory, release_memory
from agent.runtime.metrics import SidecarMetrics
from agent.runtime.nodes import NodeMap, read_nodes, wanted_nodes
from agent.runtime.publication.election import Standby
from agent.runtime.publication.handoff import read_handoff
from agent.runtime.restarts import record_generation
from agent.runtime.sidecar.evaluating import Evaluator
from agent.runtime.sidecar.following import JournalFollower, Mode, NodesFollower, PodsFollower
from agent.runtime.sidecar.publication import Job, Publication
from agent.runtime.tasks import race, run_tasks
from agent.runtime.views import NodeView, PodView

__all__ = ["Mode", "Sidecar", "SidecarSettings", "run_sidecar"]
log = logging.getLogger("topology_agent.sidecar")
SETTLE = 0.05  # seconds without a change before the files are rewritten (at most --debounce in all)
NODES_FIRST = 10.0  # seconds the pods' first evaluation waits for the Nodes' first LIST (a member lost meanwhile)


class Changes:
    """What the followers report (following.Sink): a change to write (the debounce counts them), a mode to switch
    to, and their progress (/healthz: a request lately; /readyz: the list+watch's last progress)."""

    def __init__(self, metrics: SidecarMetrics, clock: Callable[[], float]) -> None:
        self.metrics, self.clock = metrics, clock
        self.dirty = asyncio.Event()
        self.count_seen = 0  # changes seen: the debounce waits until they stop coming
        self.since: float | None = None  # the first change not written yet
        self.last = clock()  # when the last change came: the debounce waits until none came for SETTLE
        self.last_attempt = clock()
        self.reflector: Reflector | None = None
        self.mode = Mode.PODS  # which follower runs
        self.may_stand_by = False  # a publication exists: this pod may become a candidate
        self.switching = asyncio.Event()  # the mode changed: the running follower ends, the next one starts
        self.candidate = asyncio.Event()  # this pod contends for the Lease from now on
        self.moved = asyncio.Event()  # set when the mode changes (then replaced): whoever waits for a mode
        self.tell: Callable[[Occurrence], None] = lambda _: None  # the pod's Events (runtime/events.py)
        self.replaced: Callable[[], None] = lambda: None  # a LIST is about to replace the pods held

    def changed(self) -> None:
        self.last = self.clock()
        if self.since is None:
            self.since = self.last
        self.count_seen += 1
        self.dirty.set()

    def take(self) -> float:
        """When the changes about to be written began; from now on, new ones are the next write's."""
        since = self.since if self.since is not None else self.clock()
        self.dirty.clear()
        self.since = None
        return since

    def switch(self, mode: Mode, why: str, *, standing_down: bool = False) -> None:
        """``standing_down``: a candidate that never took the Lease goes back to being a standby (otherwise a
        candidate keeps the pods it listed)."""
        contends = mode in (Mode.CANDIDATE, Mode.STANDBY)
        if mode == self.mode or (contends and not self.may_stand_by) or (
                mode == Mode.STANDBY and self.mode == Mode.CANDIDATE and not standing_down):
            return
        log.log(logging.WARNING if mode == Mode.PODS else logging.INFO, "%s: %s from now on", why,
                "following the publication" if mode == Mode.FOLLOWER else "following the publication and "
                "contending for the Lease" if mode == Mode.STANDBY else "following the pods")
        if mode == Mode.PODS:
            self.tell(Occurrence("PublicationRefused", f"{why}: following the pods from now on"))
        same_follower = mode.reads_publication and self.mode.reads_publication
        self.mode = mode
        self.moved.set()
        self.moved = asyncio.Event()
        if contends:
            self.candidate.set()
        if not same_follower:  # a follower named a standby keeps its watch: it only contends from now on
            self.switching.set()

    def attempted(self) -> None:
        self.last_attempt = self.clock()

    def following(self, reflector: Reflector) -> None:
        self.reflector = reflector

    def replacing(self) -> None:
        self.replaced()

    def count(self, what: str) -> None:
        if what == "relist":
            self.metrics.relists.inc()
        elif what == "watch restart":
            self.metrics.watch_restarts.inc()
        else:
            self.metrics.events.labels(what).inc()


class _Listed(asyncio.Event):
    """A watcher of the pods' view (views.Watcher): set at each LIST of the pods."""

    def reset(self, pods: object) -> None:
        self.set()

    def changed(self, name: str, pod: object) -> None:
        return


class _NodesSink:
    """The Nodes' follower reports its requests (liveness) and nothing else: readiness and the metrics are the
    pods' or the publication's; what a Node changes reaches the pods through ``NodeView``."""

    def __init__(self, changes: Changes) -> None:
        self.changes = changes
        self.reflector: Reflector | None = None

    def changed(self) -> None:
        self.changes.changed()

    def switch(self, mode: Mode, why: str) -> None:
        self.changes.switch(mode, why)

    def attempted(self) -> None:
        self.changes.attempted()

    def following(self, reflector: Reflector) -> None:
        self.reflector = reflector

    def count(self, what: str) -> None:
        return

    def replacing(self) -> None:
        return


@dataclass
class _NodeWatch:
    """This pod's watch of the Nodes (``Sidecar.nodes_loop``): its view while it runs, why none may run, and how
    long the pods' first evaluation waits for it."""

    pods_listed: _Listed = field(default_factory=_Listed)  # set at each LIST of the pods: the Nodes are listed after
    view: NodeView | None = None  # the Nodes, while this pod watches them
    refused: str | None = None  # why this pod may not watch Nodes (said once; none watched from then)
    due: float | None = None  # the pods' evaluation waits until then for the Nodes' first LIST
    own_lost: bool = False  # this pod's own Node is lost, as the watch last saw it


class _Landed:
    """The pods changed since the sidecar last looked for Nodes it holds no labels of (None: every pod, after a
    LIST): told by the view as it applies each change (views.Watcher)."""

    def __init__(self) -> None:
        self.names: set[str] | None = None

    def reset(self, pods: Mapping[str, RawPod]) -> None:
        self.names = None

    def changed(self, name: str, pod: RawPod | None) -> None:
        if self.names is not None:
            self.names.add(name)

    def take(self) -> set[str] | None:
        names, self.names = self.names, set()
        return names


@dataclass
class _Learned:
    """What the sidecar read of the cluster beside the pods, each thing once."""

    nodes: NodeMap = field(default_factory=dict)  # labels of the Nodes the pods run on (when --topology-levels asks)
    claims_tried: set[tuple[str, str, str]] = field(default_factory=set)  # (pod, node, IP) the DRA claims were read for
    landed: _Landed = field(default_factory=_Landed)  # the pods changed since the Nodes were last looked for
    nodes_unread: set[str] = field(default_factory=set)  # Nodes wanted when the API was away: read at the next look


class _Memory:
    """Memory the sidecar hands back: what a burst freed, once it is over (a full gc costs a few ms: not per
    change), and the pods a standby that stood down lets go of once their follower has ended."""

    def __init__(self) -> None:
        self.trim: asyncio.TimerHandle | None = None
        self.forget = False  # a standby stood down: let go of the pods once their follower has ended

    def release_soon(self) -> None:
        if self.trim is not None:
            self.trim.cancel()
        self.trim = asyncio.get_running_loop().call_later(2.0, release_memory)


class Sidecar:
    def __init__(self, api: AsyncApi, settings: SidecarSettings, *, clock: Callable[[], float] = time.monotonic,
                 events: AsyncSink | None = None, keep_document: bool = True) -> None:
        self.api, self.settings, self.clock = api, settings, clock
        self.sink = events  # where the pod's Events go (their own client: runtime/events.py)
        self.recorder: TaskRecorder | None = None
        self.metrics = SidecarMetrics()
        self.changes = Changes(self.metrics, clock)
        self.node_watch = _NodeWatch()
        self.learned = _Learned()
        self.view = PodView(settings.pod_name, settings.options,
                            watchers=[self.node_watch.pods_listed, self.learned.landed])
        self.evaluator = Evaluator(settings, self.metrics, clock=clock, keep_document=keep_document)
        self.changes.replaced = lambda: self.evaluator.forget_pods()  # whichever evaluator runs then
        self.publication: Publication | None = None
        self.selector = ""
        self.memory = _Memory()
        # Notified after each evaluation (files written or not): whoever waits for a generation, a readiness or
        # the files a change makes awaits it (``wait_for``) instead of polling the files.
        self.evaluations = asyncio.Condition()

    @property
    def mode(self) -> Mode:
        return self.changes.mode

    @property
    def nodes(self) -> NodeMap:
        return self.learned.nodes

    @property
    def node_view(self) -> NodeView | None:
        return self.node_watch.view

    # --- what /healthz and /readyz say --------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """The loop is alive: it made a request lately (progress or not: a restart cannot bring the API back)."""
        return self.clock() - self.changes.last_attempt < self.settings.stuck_after

    def unready(self) -> str | None:
        """Why the files in place may not be the job's current membership (None: they are)."""
        if self.evaluator.problem is not None:
            return self.evaluator.problem
        reflector = self.changes.reflector
        if reflector is not None and reflector.stale_for(self.clock()) > self.settings.stale_after:
            why = f" ({reflector.last_error})" if reflector.last_error else ""
            return (f"no news of {reflector.what} from the API server for {reflector.stale_for(self.clock()):.0f} "
                    f"s{why}; the files may be out of date")
        if self.changes.since is not None:
            return "a change is waiting to be written"
        return None

    @property
    def ready(self) -> bool:
        return self.unready() is None

    @property
    def generation(self) -> int:
        return self.evaluator.generation

    @property
    def document(self) -> bytes | None:
        return self.evaluator.document

    # --- start ---------------------------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        reads = read_handoff(s.state_dir, s.pod_name)  # what init read: not read again (runtime/publication/handoff.py)
        me = reads.own_pod() or await self._own_pod()
        await self._read_job(me, reads.objects)
        s = self.settings
        controller = detect_controller(me, s.options)
        self.selector = controller.selector(me, s.options)
        self.view.know_me(me)
        self._start_events(me, controller.identify(me, s.options).job)
        owners = [o for o in me.get("metadata", {}).get("ownerReferences", []) if o.get("controller")]
        name = controller.identify(me, s.options).job
        job = Job(s.namespace, s.pod_name, me.get("metadata", {}).get("uid") or "", name, configmap_name(name),
                  dict(owners[0]) if owners else None)
        check = WriterCheck(controller, s.options, job.name, s.namespace, self.view.roster,
                            me=Writer(s.pod_name, job.uid), accepted=set(reads.writers))
        self.evaluator.load_previous()
        self.evaluator.recorded = lambda generation: record_generation(s.state_dir, job.uid, generation)
        self.publication, mode = await Publication.find(
            self.api, job, check, self.view, options=s.options, ssh=s.ssh is not None,
            lease_seconds=s.lease_seconds, make_follower=lambda: self._journal_follower(job, check),
            summary=reads.summary, blocks=reads.blocks, domains=reads.domains)
        release_memory()  # init's topology.json read back and the publication's LIST: freed before any pod is held
        self.changes.mode, self.changes.may_stand_by = mode, self.publication is not None
        self.evaluator.own.published = self.publication is not None
        if mode in (Mode.CANDIDATE, Mode.STANDBY):
            self.changes.candidate.set()
        if self.publication is not None and self.publication.nodes:  # held here from now on, not twice
            self.nodes.update(self.publication.nodes)
            self.publication.nodes = None
        what = f"configmap {self.publication.follower.watched_name()}" \
            if self.mode.reads_publication and self.publication is not None else f"pods with selector {self.selector}"
        log.info("following %s %s from generation %d (%s)", controller.title, what, self.generation,
                 self.mode.value)
        if s.signal is None:
            named = s.finder is not None and (s.finder.pid_file or s.finder.match)
            log.info("rewrites signal nobody (%s)", "--signal none" if named else
                     "no trainer named: --trainer-pid-file or --trainer-match names the process to signal")

    async def _own_pod(self) -> RawPod:
        s = self.settings
        try:
            return await retried(lambda: self.api.get_pod(s.namespace, s.pod_name),
                                 what="get own pod")
        except ApiNotFound as err:
            raise InputError(f"own pod '{s.pod_name}' not found in namespace '{s.namespace}'; set POD_NAME and "
                             "POD_NAMESPACE from the downward API") from err

    def _start_events(self, me: RawPod, job: str) -> None:
        """Record on this pod from now on: each new generation, each pod left out, a publication not used."""
        if self.sink is None:
            return
        s = self.settings
        recorder = self.recorder = TaskRecorder(self.sink, Ref(s.pod_name, s.namespace,
                                                               me.get("metadata", {}).get("uid") or ""), job=job)
        self.evaluator.tell = self.changes.tell = recorder.record
        refusals = Refusals(recorder, s.namespace)
        self.view.watch(refusals, refused=refusals.refused)

    def _journal_follower(self, job: Job, check: WriterCheck) -> JournalFollower:
        s = self.settings
        probe = {"probe_every": s.probe_every} if s.probe_every is not None else {}
        return JournalFollower(self.changes, self.api, self.view, namespace=s.namespace, configmap=job.configmap,
                               check=check, settings=s.reflecting, clock=self.clock, ssh=s.ssh is not None,
                               grace=2.0 * s.lease_seconds, **probe)

    async def _read_job(self, me: RawPod, read: Mapping[str, Mapping[str, Any]]) -> None:
        """What the job's objects say that the pods do not (MPI roles and slots), as init reads it (from the
        objects init read, ``read``, by path): the sidecar must place the pods as init did. Unreadable objects
        leave the options as given."""
        s = self.settings

        async def get(path: str) -> Mapping[str, Any]:
            if path in read:
                return read[path]
            return await retried(lambda: self.api.get_object(path), what=f"get {path}")

        try:
            view = await read_job(get, me, s.options)
        except (ApiNotFound, ApiForbidden) as err:
            log.warning("cannot read the job's owner (%s); the controller's defaults stand", err)
            return
        for note in view.notes:
            log.info("%s", note)
        self.view.know_roster(roster_of(view, check_index=False))  # a new index later is a scale-up
        if view.options != s.options:
            self.settings = dataclasses.replace(s, options=view.options)
            self.evaluator = Evaluator(self.settings, self.metrics, clock=self.clock,
                                       keep_document=self.evaluator.keep_document)
            self.view.reset_options(view.options)

    # --- the root tasks ------------------------------------------------------------------------------------

    async def watch_loop(self) -> None:
        """Run the follower of the current mode; start the next one when a follower asks to switch."""
        while True:
            self.changes.switching.clear()
            first = await race(self._follower().run(), self.changes.switching.wait())
            if not self.changes.switching.is_set():
                first.result()
                return
            if self.memory.forget:
                self._forget_pods()

    def _follower(self) -> PodsFollower | JournalFollower:
        publication = self.publication
        if self.mode.reads_publication and publication is not None:
            return publication.follower
        return PodsFollower(self.changes, self.api, self.view, namespace=self.settings.namespace,
                            selector=self.selector, settings=self.settings.reflecting, clock=self.clock,
                            journal=publication.follower if publication is not None and self.mode == Mode.PODS
                            else None, first_list=publication.take_seed() if publication is not None else None)

    async def nodes_loop(self) -> None:
        """Watch the Nodes while this pod watches the pods; a follower of the publication reads the lost members
        in the publisher's rows. A 403 (RBAC: the optional component is not applied) says this pod may not: said
        once, and no Node is read again."""
        watch = self.node_watch
        while watch.refused is None:
            if self.mode.reads_publication:
                watch.view = None
                await self.changes.moved.wait()
                continue
            if watch.view is None:  # from now on the pods' evaluation waits for the Nodes' first LIST
                watch.view, watch.due = NodeView(self._nodes_lost), None
            if not self.view.listed:  # the pods' LIST first: two LISTs' pages held at once raised the peak
                watch.pods_listed.clear()
                await race(watch.pods_listed.wait(), self.changes.moved.wait())
                continue
            view = watch.view
            follower = NodesFollower(_NodesSink(self.changes), self.api, view, settings=self.settings.reflecting,
                                     clock=self.clock)
            try:
                first = await race(follower.run(), self._reading_publication())
                first.result()
            except AgentError as err:  # transient errors are the reflector's: this one will not pass
                watch.refused = str(err)
                hint = "; apply the optional RBAC component manifests/rbac/nodes (get/list/watch on nodes)" \
                    if isinstance(err, ApiForbidden) else ""
                log.warning("cannot watch Nodes (%s): a member on a lost Node leaves the world only once the control "
                            "plane marks its pod%s", err, hint)
            finally:
                watch.view = None
                self.view.stop_marking_nodes()  # the publication's rows carry the marks from now on
                self.changes.changed()  # an evaluation that waited for the Nodes goes on
        await asyncio.Event().wait()

    async def _reading_publication(self) -> None:
        while not self.mode.reads_publication:
            await self.changes.moved.wait()

    def _nodes_lost(self, lost: dict[str, str]) -> None:
        """The lost Nodes changed (or were listed): the peers on them leave, those on Nodes back return."""
        if self.mode.reads_publication:
            return
        for name in self.view.mark_nodes(lost):
            node = node_name(self.view.pods[name])
            log.info("pod %s: %s", name, lost.get(node, f"node {node} back"))
        self._own_node_back(lost)
        self.changes.changed()

    def _own_node_back(self, lost: dict[str, str]) -> None:
        """This pod's own Node was lost and is back: the other members formed a world without it meanwhile, which
        its trainer (held in the old world's collective) cannot know from its files, the same membership as before.
        The next evaluation writes a new generation and signals it, so it joins the world they form now."""
        me = self.view.pods.get(self.settings.pod_name) or self.view.me
        node = node_name(me) if me is not None else ""
        was, self.node_watch.own_lost = self.node_watch.own_lost, bool(node) and node in lost
        if was and not self.node_watch.own_lost:
            log.info("this pod's node %s is back: a new generation, so that its trainer joins the world the other "
                     "members formed meanwhile", node)
            self.evaluator.in_place.key = None

    def _waits_for_nodes(self) -> bool:
        """The pods are not evaluated before the Nodes' first LIST (for at most NODES_FIRST): a new publisher
        would publish a member on a lost Node as back, and take it out again a moment later."""
        watch = self.node_watch
        if watch.view is None or watch.view.listed or self.mode.reads_publication:
            return False
        if watch.due is None:  # counted from the first evaluation the pods' LIST allows
            watch.due = self.clock() + NODES_FIRST
        left = watch.due - self.clock()
        if left <= 0:
            return False
        asyncio.get_running_loop().call_later(left, self.changes.changed)
        return True

    async def elect_loop(self) -> None:
        """The leader and its standbys contend for the Lease; followers never touch it. A standby lists the pods
        once the Lease looks abandoned, or once it holds it."""
        if self.publication is None:
            await asyncio.Event().wait()
            return
        await self.changes.candidate.wait()
        elector, follower = self.publication.elector, self.publication.follower
        why = f"the publisher's lease {elector.name} is free or was not renewed for a third of its duration"
        elector.standby = Standby(get_ready=lambda: self.changes.switch(Mode.CANDIDATE, why),
                                  rank=follower.standby_rank,
                                  ready=lambda: self.mode in (Mode.CANDIDATE, Mode.PODS) and self.view.listed,
                                  stand_down=self._stand_down)
        await self.publication.elect(self._on_leading)

    def _stand_down(self) -> None:
        """The publisher renewed the Lease for a whole duration after this standby got ready: a slow leader, not
        a gone one. The standby follows the publication again and lets go of every pod it listed."""
        assert self.publication is not None
        if self.mode != Mode.CANDIDATE or self.publication.elector.leading:
            return
        self.changes.switch(Mode.STANDBY, f"the publisher renews lease {self.publication.elector.name} again",
                            standing_down=True)
        self.memory.forget = True  # once the pods' follower has ended (watch_loop): no event of it comes after

    def _forget_pods(self) -> None:
        self.memory.forget = False
        self.view.forget()
        self.evaluator.forget_pods()
        self.memory.release_soon()

    async def _on_leading(self, leading: bool) -> None:
        self.metrics.leading.set(1 if leading else 0)
        assert self.publication is not None
        self.publication.lead(leading, self.settings.options)
        if leading:
            self.changes.switch(Mode.CANDIDATE, "took the publisher's lease")  # publishes from its own LIST
            self.changes.changed()

    async def release(self) -> None:
        if self.publication is not None:
            await self.publication.release()

    async def evaluate_loop(self) -> None:
        while True:
            await self.changes.dirty.wait()
            if self.gathers:
                await self._settle()
            else:
                await asyncio.sleep(0)  # take the events already buffered in the same pass
            since = self.changes.take()
            light = self._light()
            if not self.view.listed and light is None:
                continue  # the Lease came before the first LIST: an empty view is no topology; the LIST marks again
            if light is None and self._waits_for_nodes():
                continue  # the Nodes' LIST (or NODES_FIRST) marks again
            await self._written(since, light)
            async with self.evaluations:
                self.evaluations.notify_all()

    async def _written(self, since: float, light: Any) -> None:
        """One evaluation: the Nodes of new pods, a new leader's read-back, the files, the publication."""
        publication = self.publication
        if not self.mode.reads_publication:
            await self._learn_nodes()
        read_back = await publication.prepare(self.mode) if publication is not None else False
        before = self.generation, publication.seq() if publication is not None else None
        pods = None if light is not None else self.view.placed(by_ip=self.settings.options.address == "ip")
        touched = self.view.take_unplanned() if pods is not None else None
        if pods is not None and await self._learn_claims(pods, touched):
            touched = None
        with collector_paused():
            retry = self.evaluator.evaluate(since, pods=pods, light=light, nodes=self._nodes(), note=self._note(),
                                            touched=touched)
        if retry is not None:  # the files could not be written: the same change again, later
            asyncio.get_running_loop().call_later(retry, self.changes.changed)
        if publication is not None and self.evaluator.valid and await publication.publish(
                self.mode, self.view, self.nodes, self.evaluator.standby_now, self.evaluator.plan,
                pods_rv=self.changes.reflector.rv if self.changes.reflector is not None else "",
                blocks=self.evaluator.own.blocks):
            self.metrics.published.inc()
        if read_back or (self.generation, publication.seq() if publication is not None else None) != before:
            self.memory.release_soon()  # once the burst is over, hand the freed memory back

    def _light(self) -> Any:
        """--view own: this pod's plan from the published summary, while the summary is followed."""
        if self.mode.reads_publication and self.publication is not None:
            return self.publication.follower.plan
        return None

    def _nodes(self) -> Any:
        publication = self.publication
        published = publication.follower.published.state if publication is not None else None
        if self.mode.reads_publication and published is not None and self.settings.options.levels is not None:
            return published.node_labels()
        return self.nodes

    def _note(self) -> str:
        reflector, publication = self.changes.reflector, self.publication
        seq = publication.follower.seq if publication is not None and self.mode.reads_publication else 0
        return f"rv={reflector.rv if reflector else ''} seq={seq}"

    async def _learn_nodes(self) -> None:
        """Read the labels of Nodes that pods landed on since the last change (each node once): the pods changed
        since the last look are looked at (every pod after a LIST), not every pod at each change."""
        pods, landed = self.view.pods, self.learned.landed.take()
        changed = pods.values() if landed is None else [pods[n] for n in landed if n in pods]
        names = sorted({*wanted_nodes(changed, self.settings.options, self.nodes),
                        *(n for n in self.learned.nodes_unread if n not in self.nodes)})
        self.learned.nodes_unread = set()
        if not names:
            return
        learned = await read_nodes(self.api, names, self.settings.options)
        if not learned:  # the API is away: try again shortly, the files keep index order meanwhile
            self.learned.nodes_unread = set(names)
            asyncio.get_running_loop().call_later(2.0, self.changes.changed)
            return
        self.nodes.update(learned)
        self.view.renew_placement({name for name, pod in self.view.pods.items() if node_name(pod) in learned})

    async def _learn_claims(self, pods: Mapping[str, RawPod], touched: set[str] | None) -> bool:
        """Read the DRA claims again when a pod changed since the last plan takes claims and comes with a node and
        address not seen for it (a new pod, scheduled, or a replacement: a new claim; runtime/claims.py); True:
        the options changed, every pod is planned again."""
        s = self.settings
        changed = pods.values() if touched is None else [pods[n] for n in touched if n in pods]
        fresh = []
        for pod in claimants(changed, s.options):
            key = (pod_name(pod), node_name(pod), pod_ip(pod) or "")
            if key not in self.learned.claims_tried:
                self.learned.claims_tried.add(key)
                fresh.append(pod)
        if not fresh:
            return False
        options = await with_claims(self.api, s.namespace, fresh, s.options,
                                    retry=lambda call, what: retried(call, what=what))
        if options.processes.claims == s.options.processes.claims:
            return False
        self.settings = dataclasses.replace(s, options=options)
        self.evaluator.use_options(self.settings)
        self.view.reset_options(options)
        return True

    @property
    def gathers(self) -> bool:
        """Whether to wait for a burst to end before rewriting (``--debounce``). Not while following the journal:
        each entry is a burst the publisher has gathered already, so waiting again would only add SETTLE to every
        follower's event-to-file."""
        return self.settings.debounce > 0 and not self.mode.reads_publication

    async def _settle(self) -> None:
        """Wait until the changes stop for SETTLE seconds, and never longer than --debounce: a lone change is
        written after SETTLE, a burst (a job scaling, a node draining) is still one generation and one signal.
        The quiet counts from the last change, not from this call: a change that came while the evaluation
        before ran (or wrote the publication) has waited already, and waits only the rest of SETTLE."""
        started = self.clock()
        settle = min(SETTLE, self.settings.debounce)
        while True:
            left = settle - (self.clock() - self.changes.last)
            if left <= 0:
                return
            seen = self.changes.count_seen
            await asyncio.sleep(left)
            if self.changes.count_seen == seen or self.clock() - started + settle > self.settings.debounce:
                return


async def run_sidecar(api: AsyncApi, settings: SidecarSettings, *, stop: asyncio.Event,
                      health_port: int | None = None, health_host: str = "0.0.0.0", health_label: str = "",
                      health_topology: bool = False, events: AsyncSink | None = None,
                      on_ready: Callable[[Sidecar, int | None], None] | None = None) -> Sidecar:
    from agent.runtime.health import serve_health, start_health

    keep_freed_memory()
    # topology.json as planned is held only to be served (/topology): 4.5 MB at 16384 pods
    sidecar = Sidecar(api, settings, events=events, keep_document=health_port is not None and health_topology)
    health = None
    bound: int | None = None
    if health_port is not None:
        health, bound = await start_health(sidecar, health_host, health_port,
                                           label=health_label or f"health port {health_port}",
                                           topology=health_topology)
    try:
        # SIGTERM must work while the API server is away at start too (start retries forever).
        first = await race(sidecar.start(), stop.wait())
        if stop.is_set():
            log.info("stopped before the first list; no files written by this sidecar")
            if health is not None:
                await health.close()
            return sidecar
        first.result()
    except BaseException:
        if health is not None:
            await health.close()
        raise
    tasks: dict[str, Awaitable[None]] = {"watch": sidecar.watch_loop(), "evaluate": sidecar.evaluate_loop(),
                                         "elect": sidecar.elect_loop(), "nodes": sidecar.nodes_loop()}
    if health is not None:
        tasks["health"] = serve_health(health)
    if sidecar.recorder is not None:
        tasks["events"] = sidecar.recorder.run()
    if on_ready is not None:
        async def announce() -> None:
            on_ready(sidecar, bound)
            await asyncio.Event().wait()
        tasks["announce"] = announce()
    try:
        await run_tasks(tasks, stop)
    finally:
        await sidecar.release()
    log.info("stopping at generation %d; the files stay in place", sidecar.generation)
    return sidecar
