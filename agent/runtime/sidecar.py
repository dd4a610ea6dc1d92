"""``topology-agent sidecar``: keep the files equal to the job's live membership, within a second.

One LIST, then one WATCH from its resourceVersion for the pod's life: BOOKMARKs keep the resourceVersion
fresh, a 410 relists, errors reconnect with jittered backoff, nothing polls. A membership change (a pod joins,
leaves, terminates, gets or changes its IP) marks the state dirty; after ``--debounce`` the same core as
``init`` recomputes the topology, and only when who-is-where changed are the files rewritten under a new,
strictly increasing generation (``generation`` written last) and the trainer signalled. The last complete
files always stay in place: while the API server is away, on SIGTERM, and when the current pods make no
valid topology.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import gc
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.core import NodeLabels, Options, Rendered, Renderer
from agent.core.controllers import detect_controller
from agent.core.journal import STANDBYS, PublishedState, Publisher, journal_body, journal_name, read_journal, state_from
from agent.core.lease import Timing
from agent.core.model import RawPod
from agent.core.published import SELECT_LABEL, Compactor, configmap_body, configmap_name, pack, select_value
from agent.core.rendering import membership_key_of_document
from agent.core.topology import pod_ip, pod_name, slim_pod
from agent.core.variables import warnings_for
from agent.errors import ApiConflict, ApiError, ApiForbidden, ApiGone, ApiNotFound, ApiUnavailable, InputError
from agent.k8s.async_client import AsyncClient
from agent.k8s.core import WatchEvent
from agent.k8s.reflector import AsyncOps, Reflector, reflect
from agent.k8s.reflector import Settings as ReflectorSettings
from agent.k8s.retrying import Backoff
from agent.runtime.election import Elector
from agent.runtime.intake import usable_pods
from agent.runtime.jobs import read_job_async
from agent.runtime.metrics import SidecarMetrics
from agent.runtime.nodes import NodeMap, read_nodes_async, wanted_nodes
from agent.runtime.output import write_generation
from agent.runtime.signalling import TrainerFinder, signal_trainer

log = logging.getLogger("topology_agent.sidecar")


def release_memory() -> None:
    """Give the LIST's transient megabytes back to the OS: the sidecar's RSS is paid in every pod of the job.

    Python frees the parsed objects, but glibc keeps the freed heap until asked (malloc_trim)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
SETTLE = 0.05  # seconds without a change before the files are rewritten (at most --debounce in all)


@dataclass
class SidecarSettings:
    namespace: str
    pod_name: str
    options: Options
    out_dir: Path
    debounce: float = 1.0
    signal: Any = None  # signal.Signals | None
    finder: TrainerFinder = field(default_factory=TrainerFinder)
    stuck_after: float = 600.0
    reflecting: ReflectorSettings = field(default_factory=ReflectorSettings)
    lease_seconds: int = 15  # the publisher Lease's duration (large jobs only)
    ssh: Any = None  # SshSettings: known_hosts and ssh_config follow the members


class Sidecar:
    def __init__(self, api: AsyncClient, settings: SidecarSettings, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.settings = settings
        self.clock = clock
        self.metrics = SidecarMetrics()
        self.pods: dict[str, RawPod] = {}
        self.generation = 0
        self.last_key: tuple[tuple[object, ...], ...] | None = None
        self.document: bytes | None = None  # topology.json as written, served by /topology
        self.dirty = asyncio.Event()
        self.changes = 0  # membership-relevant events seen: the debounce waits until they stop coming
        self.dirty_since: float | None = None
        self.evaluated = False
        self.valid = False
        self.last_attempt = clock()  # the loop's last request: liveness (/healthz)
        self.reflector: Reflector | None = None  # the current list+watch: progress, staleness (/readyz)
        self.selector = ""
        # pods: watch the pods (a small job); candidate: watch the pods and publish while holding the Lease (the
        # leader and its standbys); follower: watch the published journal
        self.mode = "pods"
        self.configmap = ""
        self.me_job = ""
        self.me: RawPod | None = None
        self.owner: dict[str, Any] | None = None
        # Kept between changes; every pod held passed the intake or the published rows' check.
        self.renderer = Renderer(settings.options, settings.pod_name, checked=True)
        self.compactor = Compactor(settings.options)
        self.published: PublishedState | None = None  # follower: what the leader published
        self.publisher: Publisher | None = None  # leader: what it has published, and the journal
        self.written_rv: dict[str, str] = {}  # leader: resourceVersion of each object it wrote (a stale leader's
        #                                        write then fails with 409 instead of overwriting a newer one)
        self.touched: set[str] = set()  # pods changed since the last publication
        self.standby_now: tuple[str, ...] = ()  # node ranks 1.. in the last evaluation: the leader names them
        self.elector: Elector | None = None
        self.candidate = asyncio.Event()
        self.switch = asyncio.Event()
        self.first_list: tuple[list[dict[str, Any]], str] | None = None
        self.unaddressed: set[str] = set()  # pods without an IP yet (kept per event, not rescanned per change)
        self._trim: asyncio.TimerHandle | None = None
        self.nodes: NodeMap = {}  # labels of the Nodes the pods run on (read when --topology-levels asks)

    # --- state -------------------------------------------------------------------------------------------

    def load_previous(self) -> None:
        """Continue from init's (or a previous sidecar's) generation: same membership -> no rewrite."""
        path = self.settings.out_dir / "topology.json"
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        self.generation = int(document.get("generation", 0))
        self.last_key = membership_key_of_document(document)
        self.document = path.read_bytes()
        self.metrics.generation.set(self.generation)

    def mark_dirty(self, when: float) -> None:
        if self.dirty_since is None:
            self.dirty_since = when
        self.changes += 1
        self.dirty.set()

    def apply(self, event_type: str, obj: RawPod) -> None:
        name = pod_name(obj)
        self.touched.add(name)
        if event_type != "DELETED" and not usable_pods([obj]):
            event_type = "DELETED"  # one hostile or broken object must not stop the sidecar
        if event_type == "DELETED":
            self.pods.pop(name, None)
            self.unaddressed.discard(name)
        else:
            self.pods[name] = self._keep(obj)
            self._track_address(name, obj)

    def _track_address(self, name: str, pod: RawPod) -> None:
        if pod_ip(pod) or name == self.settings.pod_name:
            self.unaddressed.discard(name)
        else:
            self.unaddressed.add(name)

    @property
    def ready(self) -> bool:
        return self.evaluated and self.valid and self.dirty_since is None

    @property
    def healthy(self) -> bool:
        return self.clock() - self.last_attempt < self.settings.stuck_after

    # --- loops ---------------------------------------------------------------------------------------------

    async def _get(self, call: Callable[[], Awaitable[dict[str, Any]]], what: str) -> dict[str, Any]:
        """A GET retried while the API server is unavailable (the sidecar has no deadline: it waits)."""
        backoff = Backoff()
        while True:
            try:
                return await call()
            except ApiUnavailable as err:
                delay = backoff.next_delay(err.retry_after)
                log.info("%s failed (%s); retry %d in %.1f s", what, err, backoff.attempt, delay)
                await asyncio.sleep(delay)

    async def start(self) -> None:
        s = self.settings
        try:
            me: RawPod = await self._get(lambda: self.api.get_pod(s.namespace, s.pod_name),  # type: ignore
                                         "get own pod")
        except ApiNotFound as err:
            raise InputError(f"own pod '{s.pod_name}' not found in namespace '{s.namespace}'; set POD_NAME and "
                             "POD_NAMESPACE from the downward API") from err
        await self._read_job(me)
        s = self.settings
        controller = detect_controller(me, s.options)
        self.selector = controller.selector(me, s.options)
        self.me = me
        owners = [o for o in me.get("metadata", {}).get("ownerReferences", []) if o.get("controller")]
        self.owner = dict(owners[0]) if owners else None
        self.me_job = controller.identify(me, s.options).job
        self.configmap = configmap_name(self.me_job)
        self.load_previous()
        await self._choose_mode()
        what = f"configmap {journal_name(self.configmap)}" if self.mode == "follower" \
            else f"pods with selector {self.selector}"
        log.info("following %s %s from generation %d (%s)", controller.title, what, self.generation, self.mode)
        finder = s.finder
        if s.signal is None:
            log.info("rewrites signal nobody (%s)", "--signal none" if finder.pid_file or finder.match else
                     "no trainer named: --trainer-pid-file or --trainer-match names the process to signal")

    async def _read_job(self, me: RawPod) -> None:
        """What the job's objects say that the pods do not (MPI roles and slots), as init reads it: the sidecar
        must place the pods as init did. Unreadable objects leave the options as given."""
        s = self.settings
        try:
            view = await read_job_async(lambda path: self._get(lambda: self.api.get_object(path), f"get {path}"),
                                        me, s.options)
        except (ApiNotFound, ApiForbidden) as err:
            log.warning("cannot read the job's owner (%s); the controller's defaults stand", err)
            return
        for note in view.notes:
            log.info("%s", note)
        if view.options != s.options:
            self.settings = dataclasses.replace(s, options=view.options)
            self.renderer = Renderer(view.options, s.pod_name, checked=True)
            self.compactor = Compactor(view.options)

    @property
    def _published_selector(self) -> str:
        return f"{SELECT_LABEL}={select_value(self.configmap)}"

    async def _choose_mode(self) -> None:
        """The leader's init published the topology (large jobs): then only the leader and its standbys read the
        pods, the others follow the journal."""
        try:
            items, rv = await self.api.list_objects(self._cm_collection, label_selector=self._published_selector)
        except (ApiUnavailable, ApiForbidden) as err:
            log.info("cannot look for a published topology (%s); following the pods", err)
            return
        try:
            state, journal = state_from(items, self.configmap, pods=False)
        except InputError as err:
            log.warning("the published topology is not usable (%s); following the pods", err)
            return
        if state is None and journal is None:
            return
        if state is not None:
            self.nodes.update(state.node_labels())  # a standby need not read the Nodes the leader read
        me = self.settings.pod_name
        self.elector = Elector(self.api, self.settings.namespace, self.configmap, me, owner=self.owner,
                               timing=Timing(self.settings.lease_seconds),
                               named_leader=journal is not None and journal.leader == me)
        if journal is not None and (journal.leader == me or me in journal.standby):
            self.mode = "candidate"
            self.candidate.set()
        else:
            self.mode = "follower"
            self.first_list = (items, rv)  # a follower starts from this LIST: no second one (~100 KiB x N pods)

    @property
    def _cm_collection(self) -> str:
        return f"/api/v1/namespaces/{self.settings.namespace}/configmaps"

    def _own(self, pods: dict[str, RawPod]) -> dict[str, RawPod]:
        if self.me is not None and self.settings.pod_name in pods:
            pods[self.settings.pod_name] = slim_pod(self.me)  # own pod in full: the user's env is read from it
        return pods

    def _on_published(self, items: list[dict[str, Any]]) -> bool:
        try:
            state, journal = state_from(items, self.configmap)
        except InputError as err:  # broken or forged: keep the last good files
            log.warning("ignoring the published topology: %s", err)
            return False
        if state is None:
            return False
        self.published = state
        self.pods = self._own(dict(state.pods))
        gc.collect()
        gc.freeze()  # as after a LIST of pods: the collector's passes must not walk the whole job per change
        self.unaddressed = set()
        for name, pod in self.pods.items():
            self._track_address(name, pod)
        self._maybe_stand_by(journal.standby if journal else ())
        return True

    def _on_journal_event(self, event: WatchEvent) -> bool:
        if event.type not in ("ADDED", "MODIFIED"):
            return False
        try:
            journal = read_journal(event.object)
            changed = self.published.apply(journal) if self.published is not None and journal is not None else None
        except InputError as err:
            log.warning("ignoring the published journal: %s", err)
            return False
        if journal is None:
            return False
        if changed is None:  # the journal moved past what this pod holds: read the snapshot again
            raise ApiGone(f"journal {journal_name(self.configmap)} starts after sequence "
                          f"{self.published.seq if self.published else 0}", status=410)
        assert self.published is not None
        for name in changed:
            pod = self.published.pods.get(name)
            if pod is None:
                self.pods.pop(name, None)
                self.unaddressed.discard(name)
            else:
                self.pods[name] = slim_pod(self.me) if name == self.settings.pod_name and self.me else pod
                self._track_address(name, pod)
        self._maybe_stand_by(journal.standby)
        return bool(changed)

    def _maybe_stand_by(self, standby: tuple[str, ...]) -> None:
        """Named a standby by the leader: watch the pods too, and contend for the Lease."""
        if self.mode == "follower" and self.settings.pod_name in standby and self.elector is not None:
            log.info("named a standby publisher; following the pods from now on")
            self.mode = "candidate"
            self.published = None
            self.candidate.set()
            self.switch.set()

    async def watch_loop(self) -> None:
        """Follow the pods (pods and candidate modes) or the published journal (follower mode); a follower that
        the leader names a standby switches to the pods."""
        while True:
            self.switch = asyncio.Event()
            reflecting = asyncio.ensure_future(self._reflect_mode())
            switching = asyncio.ensure_future(self.switch.wait())
            done, _ = await asyncio.wait([reflecting, switching], return_when=asyncio.FIRST_COMPLETED)
            for task in (reflecting, switching):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if reflecting in done:
                reflecting.result()
                return

    async def _reflect_mode(self) -> None:
        if self.mode == "follower":
            journal = f"metadata.name={journal_name(self.configmap)}"

            async def list_published() -> tuple[list[dict[str, Any]], str]:
                if self.first_list is not None:
                    first, self.first_list = self.first_list, None
                    return first
                return await self.api.list_objects(self._cm_collection, label_selector=self._published_selector)

            await self._reflect(
                list_published,
                lambda rv, timeout, idle: self.api.watch_objects(self._cm_collection, rv, timeout=timeout,
                                                                 field_selector=journal, idle=idle),
                self._on_published, self._on_journal_event, what=f"configmap {journal_name(self.configmap)}")
        else:
            s = self.settings
            await self._reflect(
                lambda: self.api.list_pods(s.namespace, self.selector,  # type: ignore[arg-type,return-value]
                                           keep=self._intake),
                lambda rv, timeout, idle: self.api.watch_pods(s.namespace, self.selector, rv, timeout=timeout,
                                                              idle=idle),
                self._on_pods, self._on_pod_event, what="pods")

    def _keep(self, pod: RawPod) -> RawPod:
        """The own pod slimmed (its env is read); every peer compacted as followers see it (shared containers,
        ~1/3 of a 4096-pod publisher's memory). Both are fresh copies: a kept pod that shared strings with the
        parsed LIST page would keep the page's memory arenas alive."""
        if pod_name(pod) == self.settings.pod_name:
            return json.loads(json.dumps(slim_pod(pod)))  # type: ignore[no-any-return]
        return self.compactor.pod(pod)

    def _intake(self, items: list[dict[str, Any]]) -> list[RawPod]:
        """What the sidecar keeps of each LIST page, before the next page is read: the peak is one page, not
        the whole LIST (a 4096-pod publisher peaked at 200 MB)."""
        return [self._keep(p) for p in usable_pods(items)]

    def _on_pods(self, items: list[dict[str, Any]]) -> bool:
        self.touched |= set(self.pods)
        self.pods = {p["metadata"]["name"]: p for p in items}  # type: ignore[misc]  # pods kept by _intake
        # The pods live until the next relist and hold no cycles: keep the cyclic collector off them, so a
        # collection during a change does not walk every pod of the job (refcounting still frees them).
        gc.collect()
        gc.freeze()
        self.touched |= set(self.pods)
        self.unaddressed = set()
        for name, pod in self.pods.items():
            self._track_address(name, pod)
        release_memory()
        return True

    def _on_pod_event(self, event: WatchEvent) -> bool:
        if event.type == "BOOKMARK":
            return False
        self.apply(event.type, event.object)  # type: ignore[arg-type]
        return True

    async def _reflect(self, list_call: Callable[[], Awaitable[tuple[list[dict[str, Any]], str]]],
                       watch_call: Callable[[str, float, float], AsyncIterator[WatchEvent]],
                       on_list: Callable[[list[dict[str, Any]]], bool], on_event: Callable[[WatchEvent], bool], *,
                       what: str) -> None:
        """List, then watch from its resourceVersion for the pod's life: the reflector (reflector.py) resumes,
        relists on 410, backs off, and drops a watch that shows no progress."""
        self.reflector = Reflector(what, self.settings.reflecting, now=self.clock())
        ops = AsyncOps(list_call, watch_call, clock=self.clock, on_request=self._attempted)
        await reflect(self.reflector, ops, _Following(self, on_list, on_event))

    def _attempted(self) -> None:
        self.last_attempt = self.clock()

    async def elect_loop(self) -> None:
        """The leader and its standbys contend for the Lease; followers never touch it."""
        if self.elector is None:
            await asyncio.Event().wait()
            return
        await self.candidate.wait()
        await self.elector.run(self._on_leading)

    async def _on_leading(self, leading: bool) -> None:
        self.metrics.leading.set(1 if leading else 0)
        self.publisher = None  # a new leader starts from what is published now, read at its first publication
        if leading:
            self.mark_dirty(self.clock())

    async def release(self) -> None:
        if self.elector is not None:
            await self.elector.release()

    async def publish(self) -> None:
        """Leader: put what changed where the followers read it (the journal; the snapshot when it is due)."""
        if self.publisher is None:
            items, _ = await self.api.list_objects(self._cm_collection, label_selector=self._published_selector)
            state, journal = state_from(items, self.configmap, pods=False)
            self.written_rv = {i["metadata"]["name"]: i["metadata"].get("resourceVersion", "") for i in items}
            if state is None:  # nothing usable published: start a new sequence after the journal's
                state = PublishedState(job=self.me_job, namespace=self.settings.namespace,
                                       seq=journal.seq if journal else 0, snapshot_seq=-1)
                journal = None
            self.publisher = Publisher(state, self.settings.options, leader=self.settings.pod_name,
                                       journal=journal.entries if journal else ())
            self.publisher.standby = journal.standby if journal else ()
            self.touched |= set(self.pods) | set(state.rows)
            if journal is None or journal.leader != self.settings.pod_name:
                self.publisher.standby = ()  # write the journal once at least: it names the new leader
        publisher = self.publisher
        entry = publisher.change(self.pods, self.touched, self.nodes)
        self.touched = set()
        if entry is None and publisher.standby == self.standby_now:
            return
        publisher.standby = self.standby_now
        try:
            if publisher.snapshot_due:
                seq = publisher.state.seq
                body = configmap_body(self.configmap, pack(publisher.snapshot_document()), generation=seq,
                                      leader=self.settings.pod_name, owner=self.owner, standby=publisher.standby)
                await self._write(self.configmap, body)
                publisher.snapshot_written(seq)
            journal_cm = journal_name(self.configmap)
            await self._write(journal_cm, journal_body(self.configmap, publisher.journal_data(), owner=self.owner))
        except ApiConflict:
            log.warning("the published topology was changed by another pod; no longer publishing")
            self.publisher = None
            if self.elector is not None:
                self.elector.leading = False
            return
        self.metrics.published.inc()

    async def _write(self, name: str, body: dict[str, Any]) -> None:
        """Overwrite the version this leader last saw (create it if it is gone); retried while the API is away."""
        backoff = Backoff()
        while True:
            rv = self.written_rv.get(name, "")
            try:
                if rv:
                    body["metadata"]["resourceVersion"] = rv
                    written = await self.api.replace(f"{self._cm_collection}/{name}", body)
                else:
                    body["metadata"].pop("resourceVersion", None)
                    written = await self.api.create(self._cm_collection, body)
                self.written_rv[name] = written.get("metadata", {}).get("resourceVersion", "")
                return
            except ApiNotFound:
                self.written_rv[name] = ""
            except ApiUnavailable as err:
                delay = backoff.next_delay(err.retry_after)
                log.info("publishing sequence %d failed (%s); retry %d in %.1f s",
                         self.publisher.state.seq if self.publisher else 0, err, backoff.attempt, delay)
                await asyncio.sleep(delay)

    async def evaluate_loop(self) -> None:
        while True:
            await self.dirty.wait()
            if self.settings.debounce > 0:
                await self._settle()
            else:
                await asyncio.sleep(0)  # take the events already buffered in the same pass
            since = self.dirty_since if self.dirty_since is not None else self.clock()
            self.dirty.clear()
            self.dirty_since = None
            if self.mode != "follower":
                await self._learn_nodes()
            written = self.evaluate(since)
            # Publish only what makes a valid topology (never the empty view before the first LIST).
            if self.valid and self.elector is not None and self.elector.leading and self.mode == "candidate":
                try:
                    await self.publish()
                except (ApiError, InputError) as err:
                    log.warning("publishing failed (%s); trying again at the next change", err)
                    self.publisher = None
                    self.touched |= set(self.pods)
            if written:
                # Once the burst is over, hand the freed memory back (a full gc costs a few ms: not per change).
                if self._trim is not None:
                    self._trim.cancel()
                self._trim = asyncio.get_running_loop().call_later(2.0, release_memory)

    async def _learn_nodes(self) -> None:
        """Read the labels of Nodes that pods landed on since the last change (each node once)."""
        names = wanted_nodes(self.pods.values(), self.settings.options, self.nodes)
        if not names:
            return
        learned = await read_nodes_async(self.api, names, self.settings.options)
        if not learned:  # the API is away: try again shortly, the files keep index order meanwhile
            asyncio.get_running_loop().call_later(2.0, lambda: self.mark_dirty(self.clock()))
            return
        self.nodes.update(learned)
        self.touched |= {name for name, pod in self.pods.items() if pod.get("spec", {}).get("nodeName") in learned}

    async def _settle(self) -> None:
        """Wait until the changes stop for SETTLE seconds, and never longer than --debounce: a lone change is
        written after SETTLE (it used to wait the whole --debounce, 1 s by default), a burst (a job scaling, a
        node draining) is still one generation and one signal."""
        started = self.clock()
        settle = min(SETTLE, self.settings.debounce)
        while True:
            seen = self.changes
            await asyncio.sleep(settle)
            if self.changes == seen or self.clock() - started + settle > self.settings.debounce:
                return

    # --- one evaluation -------------------------------------------------------------------------------------

    def evaluate(self, since: float) -> bool:
        """Recompute; rewrite and signal only if membership changed. Returns whether files were written."""
        s = self.settings
        self.evaluated = True
        pods = self.pods
        if s.options.address == "ip" and self.unaddressed:  # a pod joins once it has an address
            pods = {name: pod for name, pod in pods.items() if name not in self.unaddressed}
        try:
            nodes: NodeLabels = self.nodes
            if self.mode == "follower" and self.published is not None and s.options.levels is not None:
                nodes = self.published.node_labels()
            rendered: Rendered = self.renderer.render(pods, generation=self.generation + 1,
                                                      files_dir=str(s.out_dir.absolute()), nodes=nodes)
        except InputError as err:
            self.valid = False
            log.warning("current pods make no valid topology (%s); keeping generation %d", err, self.generation)
            return False
        self.valid = True
        self.standby_now = tuple(m.name for m in rendered.plan.topology.training[1:1 + STANDBYS])
        key = self.renderer.membership_key(rendered)
        if key == self.last_key:
            return False
        self.generation += 1
        write_generation(s.out_dir, rendered, s.options, s.ssh, ssh_membership_only=True)
        written = self.clock()
        self.last_key = key
        self.document = rendered.files["topology.json"]
        self.metrics.rewrites.inc()
        self.metrics.generation.set(self.generation)
        self.metrics.latency.observe(max(0.0, written - since))
        topo = rendered.plan.topology
        log.info("generation %d written: %d training pods, world size %d (rv=%s seq=%d files_at=%.6f)",
                 self.generation, len(topo.training), topo.world_size, self.reflector.rv if self.reflector else "",
                 self.published.seq if self.published is not None else 0, written)
        for warning in warnings_for(rendered.plan, rendered.variables):
            log.warning("%s", warning)
        result = signal_trainer(s.finder, s.signal)
        self.metrics.signals.labels(result).inc()
        if result == "sent":
            log.info("trainer signalled for generation %d (signal_at=%.6f)", self.generation, self.clock())
        return True


class _Following:
    """The sidecar's side of the reflector: a LIST or an event that changes membership marks the files dirty."""

    def __init__(self, sidecar: Sidecar, on_list: Callable[[list[dict[str, Any]]], bool],
                 on_event: Callable[[WatchEvent], bool]) -> None:
        self.sidecar, self._on_list, self._on_event = sidecar, on_list, on_event
        self.lists = 0

    def on_list(self, items: list[dict[str, Any]]) -> None:
        self.lists += 1
        if self.lists > 1:
            self.sidecar.metrics.relists.inc()
        if self._on_list(items):
            self.sidecar.mark_dirty(self.sidecar.clock())

    def on_event(self, event: WatchEvent) -> bool:
        self.sidecar.metrics.events.labels(event.type).inc()
        if self._on_event(event):
            self.sidecar.mark_dirty(self.sidecar.clock())
        return False


async def run_tasks(tasks: dict[str, Awaitable[None]], stop: asyncio.Event) -> None:
    """Run root tasks until one ends or ``stop`` is set; cancel the rest; re-raise the first failure."""
    running = {asyncio.ensure_future(coro): name for name, coro in tasks.items()}
    stopper = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait([*running, stopper], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in [*running, stopper]:
            task.cancel()
        for task in [*running, stopper]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    for task in done:
        if task is not stopper and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


async def run_sidecar(api: AsyncClient, settings: SidecarSettings, *, stop: asyncio.Event,
                      health_port: int | None = None, health_host: str = "0.0.0.0", health_label: str = "",
                      on_ready: Callable[[Sidecar, int | None], None] | None = None) -> Sidecar:
    from agent.runtime.health import serve_health, start_health

    sidecar = Sidecar(api, settings)
    runner = None
    bound: int | None = None
    if health_port is not None:
        runner, bound = await start_health(sidecar, health_host, health_port,
                                           label=health_label or f"health port {health_port}")
    try:
        # SIGTERM must work while the API server is away at start too (start retries forever).
        starting = asyncio.ensure_future(sidecar.start())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            log.info("stopped before the first list; no files written by this sidecar")
            if runner is not None:
                await runner.cleanup()
            return sidecar
        starting.result()
    except BaseException:
        if runner is not None:
            await runner.cleanup()
        raise
    tasks: dict[str, Awaitable[None]] = {"watch": sidecar.watch_loop(), "evaluate": sidecar.evaluate_loop(),
                                         "elect": sidecar.elect_loop()}
    if runner is not None:
        tasks["health"] = serve_health(runner)
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
