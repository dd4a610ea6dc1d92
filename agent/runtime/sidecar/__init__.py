"""``topology-agent sidecar``: keep the files equal to the job's live membership, within a second.

The sidecar is its roles, one module each, run as root tasks:

* a follower (following.py): the pods, or a large job's published journal, through the one reflector;
* the evaluator (evaluating.py): after ``--debounce``, the same core as ``init`` renders the pods held, and only
  when who-is-where changed are the files rewritten under a new generation and the trainer signalled;
* the publisher (publishing.py ``JournalWriter``), in the pod holding the Lease of a large job (election.py).

``Mode`` says which follower runs; a follower asks to switch (a standby named, a stalled publication, a sound
one again). The last complete files always stay in place: while the API server is away, on SIGTERM, when the
pods make no valid topology, and when the files cannot be written. ``status`` tells /healthz and /readyz why.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.core import Options
from agent.core.controllers import detect_controller
from agent.core.gang import Roster, roster_of
from agent.core.journal import journal_name, state_from
from agent.core.lease import Timing
from agent.core.model import RawPod
from agent.core.provenance import Writer, WriterCheck
from agent.core.published import SELECT_LABEL, Compactor, configmap_name, select_value
from agent.core.summary import why_full_view
from agent.errors import ApiError, ApiForbidden, ApiNotFound, InputError
from agent.k8s.async_client import AsyncApi
from agent.k8s.reflector import Reflector
from agent.k8s.reflector import Settings as ReflectorSettings
from agent.k8s.retrying import retried
from agent.runtime.election import Elector
from agent.runtime.jobs import read_job_async
from agent.runtime.memory import keep_freed_memory, release_memory
from agent.runtime.metrics import SidecarMetrics
from agent.runtime.nodes import read_nodes_async, wanted_nodes
from agent.runtime.publishing import JournalWriter, vouch_async
from agent.runtime.sidecar.evaluating import Evaluator
from agent.runtime.sidecar.following import JournalFollower, Mode, PodsFollower
from agent.runtime.sidecar.membership import Membership
from agent.runtime.signalling import TrainerFinder

__all__ = ["Mode", "Sidecar", "SidecarSettings", "run_sidecar"]
log = logging.getLogger("topology_agent.sidecar")
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
    probe_every: float | None = None  # a follower's looks at the publisher (None: following.PROBE_EVERY)

    @property
    def stale_after(self) -> float:
        """No progress from the API server for this long: not ready (twice the inactivity deadline)."""
        return 2 * self.reflecting.idle


class Sidecar:
    def __init__(self, api: AsyncApi, settings: SidecarSettings, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.settings = settings
        self.clock = clock
        self.metrics = SidecarMetrics()
        self.membership = Membership(settings.pod_name)
        self.evaluator = Evaluator(settings, self.membership, self.metrics, clock=clock)
        self.mode = Mode.PODS
        self.mode_changed = asyncio.Event()
        self.dirty = asyncio.Event()
        self.changes = 0  # membership-relevant events seen: the debounce waits until they stop coming
        self.dirty_since: float | None = None
        self.last_attempt = clock()  # the loop's last request: liveness (/healthz)
        self.reflector: Reflector | None = None  # the current list+watch: progress (/readyz)
        self.roster: Roster | None = None  # who may be a member (core/gang.Roster), once the job's object is read
        self.check: WriterCheck | None = None  # who may have written the publication (core/provenance.py)
        self.selector = ""
        self.configmap = ""
        self.me_job = ""
        self.owner: dict[str, Any] | None = None
        self.me_uid = ""
        self.compactor = Compactor(settings.options)
        self.journal: JournalFollower | None = None  # a large job's publication, as this pod follows it
        self.writer: JournalWriter | None = None  # the leader's writes
        self.elector: Elector | None = None
        self.candidate = asyncio.Event()
        self.fallback: str | None = None  # why a follower follows the pods instead of the journal
        self._trim: asyncio.TimerHandle | None = None

    # --- what /healthz and /readyz say --------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """The loop is alive: it made a request lately (progress or not: a restart cannot bring the API back)."""
        return self.clock() - self.last_attempt < self.settings.stuck_after

    def unready(self) -> str | None:
        """Why the files in place may not be the job's current membership (None: they are)."""
        if not self.evaluator.evaluated:
            return "the first evaluation has not run yet"
        if self.evaluator.problem is not None:
            return self.evaluator.problem
        if self.reflector is not None and self.reflector.stale_for(self.clock()) > self.settings.stale_after:
            why = f" ({self.reflector.last_error})" if self.reflector.last_error else ""
            return (f"no news of {self.reflector.what} from the API server for "
                    f"{self.reflector.stale_for(self.clock()):.0f} s{why}; the files may be out of date")
        if self.dirty_since is not None:
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

    # --- the followers' side ---------------------------------------------------------------------------------

    def mark_dirty(self, when: float) -> None:
        if self.dirty_since is None:
            self.dirty_since = when
        self.changes += 1
        self.dirty.set()

    def attempted(self) -> None:
        self.last_attempt = self.clock()

    def switch(self, mode: Mode, why: str) -> None:
        """A follower asks for another mode (the watch loop starts that follower)."""
        if mode == self.mode:
            return
        if mode == Mode.CANDIDATE and self.elector is None:
            return
        level = logging.WARNING if mode == Mode.PODS else logging.INFO
        log.log(level, "%s: following %s from now on", why,
                "the published journal" if mode == Mode.FOLLOWER else "the pods")
        self.fallback = why if mode == Mode.PODS else None
        self.mode = mode
        if mode == Mode.CANDIDATE:
            self.candidate.set()
        self.mode_changed.set()

    # --- start ---------------------------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        try:
            me: RawPod = await retried(lambda: self.api.get_pod(s.namespace, s.pod_name),  # type: ignore
                                       what="get own pod")
        except ApiNotFound as err:
            raise InputError(f"own pod '{s.pod_name}' not found in namespace '{s.namespace}'; set POD_NAME and "
                             "POD_NAMESPACE from the downward API") from err
        await self._read_job(me)
        s = self.settings
        controller = detect_controller(me, s.options)
        self.selector = controller.selector(me, s.options)
        self.membership.me = me
        self.me_uid = me.get("metadata", {}).get("uid") or ""
        owners = [o for o in me.get("metadata", {}).get("ownerReferences", []) if o.get("controller")]
        self.owner = dict(owners[0]) if owners else None
        self.me_job = controller.identify(me, s.options).job
        self.check = WriterCheck(controller, s.options, self.me_job, s.namespace, self.roster,
                                 me=Writer(s.pod_name, self.me_uid))
        self.configmap = configmap_name(self.me_job)
        self.evaluator.load_previous()
        await self._choose_mode()
        what = f"configmap {journal_name(self.configmap)}" if self.mode == Mode.FOLLOWER \
            else f"pods with selector {self.selector}"
        log.info("following %s %s from generation %d (%s)", controller.title, what, self.generation,
                 self.mode.value)
        finder = s.finder
        if s.signal is None:
            log.info("rewrites signal nobody (%s)", "--signal none" if finder.pid_file or finder.match else
                     "no trainer named: --trainer-pid-file or --trainer-match names the process to signal")

    async def _read_job(self, me: RawPod) -> None:
        """What the job's objects say that the pods do not (MPI roles and slots), as init reads it: the sidecar
        must place the pods as init did. Unreadable objects leave the options as given."""
        s = self.settings
        try:
            view = await read_job_async(lambda path: retried(lambda: self.api.get_object(path), what=f"get {path}"),
                                        me, s.options)
        except (ApiNotFound, ApiForbidden) as err:
            log.warning("cannot read the job's owner (%s); the controller's defaults stand", err)
            return
        for note in view.notes:
            log.info("%s", note)
        self.roster = roster_of(view, check_index=False)  # a new index later is a scale-up
        if view.options != s.options:
            self.settings = dataclasses.replace(s, options=view.options)
            self.evaluator = Evaluator(self.settings, self.membership, self.metrics, clock=self.clock)
            self.compactor = Compactor(view.options)

    async def _choose_mode(self) -> None:
        """The leader's init published the topology (large jobs): then only the leader and its standbys read the
        pods, the others follow the journal. The API being away at start is waited out (it decides the mode for
        the pod's life); no RBAC for ConfigMaps means the pods."""
        collection = f"/api/v1/namespaces/{self.settings.namespace}/configmaps"
        why_full = why_full_view(self.settings.options, ssh=self.settings.ssh is not None)
        light = self.settings.options.view == "own" and why_full is None
        if self.settings.options.view == "own" and why_full is not None:
            log.warning("--view own not used: %s; reading the whole topology", why_full)
        # --view own reads the journal alone (its summary), never the snapshot
        field = f"metadata.name={journal_name(self.configmap)}" if light else ""
        label = "" if light else f"{SELECT_LABEL}={select_value(self.configmap)}"
        try:
            items, rv = await retried(lambda: self.api.list_objects(collection, label_selector=label,
                                                                    field_selector=field),
                                      what="look for a published topology")
        except ApiForbidden as err:
            log.info("cannot look for a published topology (%s); following the pods", err)
            return
        try:
            state, journal = state_from(items, self.configmap, pods=False)
        except InputError as err:
            log.warning("the published topology is not usable (%s); following the pods", err)
            return
        if state is None and journal is None:
            return
        me = self.settings.pod_name
        candidate = journal is not None and (journal.leader == me or me in journal.standby)
        assert self.check is not None
        why = await vouch_async(self.api.get_object, self.check, items, self.configmap)
        if why is not None and not candidate:  # a follower uses the rows: their writer must be a member
            log.warning("the published topology is not used (%s); following the pods", why)
            return
        # A candidate watches the pods itself; the copy only names it (this pod's earlier incarnation, under
        # another uid, may have written it: it rewrites it once it leads). Labels come only from a vouched copy.
        if state is not None and why is None:
            self.membership.nodes.update(state.node_labels())  # a standby need not read the Nodes the leader read
        self.elector = Elector(self.api, self.settings.namespace, self.configmap, me, owner=self.owner,
                               timing=Timing(self.settings.lease_seconds),
                               named_leader=journal is not None and journal.leader == me)
        probe = {"probe_every": self.settings.probe_every} if self.settings.probe_every is not None else {}
        self.journal = JournalFollower(self, self.api, namespace=self.settings.namespace, configmap=self.configmap,
                                       settings=self.settings.reflecting, grace=2.0 * self.settings.lease_seconds,
                                       options=self.settings.options, **probe)  # type: ignore[arg-type]
        if candidate:
            self.mode = Mode.CANDIDATE
            self.candidate.set()
        else:
            self.mode = Mode.FOLLOWER
            self.journal.light = light
            self.journal.first_list = (items, rv)  # a follower starts from this LIST: no second one

    # --- the root tasks ------------------------------------------------------------------------------------

    async def watch_loop(self) -> None:
        """Run the follower of the current mode; start the next one when a follower asks to switch."""
        while True:
            self.mode_changed = asyncio.Event()
            following = asyncio.ensure_future(self._follower().run())
            switching = asyncio.ensure_future(self.mode_changed.wait())
            done, _ = await asyncio.wait([following, switching], return_when=asyncio.FIRST_COMPLETED)
            for task in (following, switching):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if following in done and switching not in done:
                following.result()
                return

    def _follower(self) -> PodsFollower | JournalFollower:
        if self.mode == Mode.FOLLOWER and self.journal is not None:
            return self.journal
        return PodsFollower(self, self.api, namespace=self.settings.namespace, selector=self.selector,
                            compactor=self.compactor, settings=self.settings.reflecting,
                            journal=self.journal if self.mode == Mode.PODS else None)

    async def elect_loop(self) -> None:
        """The leader and its standbys contend for the Lease; followers never touch it."""
        if self.elector is None:
            await asyncio.Event().wait()
            return
        await self.candidate.wait()
        await self.elector.run(self._on_leading)

    async def _on_leading(self, leading: bool) -> None:
        self.metrics.leading.set(1 if leading else 0)
        self.writer = None  # a new leader starts from what is published now, read at its first publication
        if leading:
            self.writer = JournalWriter(self.api, self.settings.namespace, self.configmap, job=self.me_job,
                                        options=self.settings.options, leader=self.settings.pod_name,
                                        leader_uid=self.me_uid,
                                        owner=self.owner)
            self.mark_dirty(self.clock())

    async def release(self) -> None:
        if self.elector is not None:
            await self.elector.release()

    async def evaluate_loop(self) -> None:
        while True:
            await self.dirty.wait()
            if self.gathers:
                await self._settle()
            else:
                await asyncio.sleep(0)  # take the events already buffered in the same pass
            since = self.dirty_since if self.dirty_since is not None else self.clock()
            self.dirty.clear()
            self.dirty_since = None
            if not self.membership.listed and self.membership.light is None:
                continue  # the Lease came before the first LIST: an empty view is no topology; the LIST marks again
            if self.mode != Mode.FOLLOWER:
                await self._learn_nodes()
            read_back = await self._prepare_publishing()
            before = self.generation, self._published_seq()
            retry = self.evaluator.evaluate(since, nodes=self._nodes(), note=self._note())
            if retry is not None:  # the files could not be written: the same change again, later
                asyncio.get_running_loop().call_later(retry, lambda: self.mark_dirty(self.clock()))
            await self._publish()
            if read_back or (self.generation, self._published_seq()) != before:
                # Once the burst is over, hand the freed memory back (a full gc costs a few ms: not per change).
                # A leader with --view own publishes changes that leave its own files as they were.
                if self._trim is not None:
                    self._trim.cancel()
                self._trim = asyncio.get_running_loop().call_later(2.0, release_memory)

    def _published_seq(self) -> int | None:
        writer = self.writer
        return writer.publisher.state.seq if writer is not None and writer.publisher is not None else None

    def _nodes(self) -> Any:
        published = self.journal.published if self.journal is not None else None
        if self.mode == Mode.FOLLOWER and published is not None and self.settings.options.levels is not None:
            return published.node_labels()
        return self.membership.nodes

    def _note(self) -> str:
        published = self.journal.published if self.journal is not None else None
        journal = self.journal.journal if self.journal is not None else None
        seq = published.seq if published else journal.seq if self.membership.light and journal else 0
        return f"rv={self.reflector.rv if self.reflector else ''} seq={seq}"

    def _publishing(self) -> JournalWriter | None:
        """The writer while this pod holds the Lease as a candidate: the one pod that publishes."""
        writer, elector = self.writer, self.elector
        if writer is None or elector is None or not elector.leading or self.mode != Mode.CANDIDATE:
            return None
        return writer

    async def _prepare_publishing(self) -> bool:
        """A new leader reads back what is published before it plans (``JournalWriter.prepare``); True when it
        did. A failure is left to ``_publish``, which reads again and says why."""
        writer = self._publishing()
        if writer is None or writer.publisher is not None:
            return False
        with contextlib.suppress(ApiError, InputError):
            await writer.prepare()
        return True

    async def _publish(self) -> None:
        """Publish only what makes a valid topology (never the empty view before the first LIST)."""
        writer, elector = self._publishing(), self.elector
        if writer is None or elector is None or not self.evaluator.valid:
            return
        membership = self.membership
        try:
            touched, membership.touched = membership.touched, set()
            if await writer.publish(membership.pods, touched, membership.nodes, self.evaluator.standby_now,
                                    plan=self.evaluator.plan):
                self.metrics.published.inc()
            else:
                elector.leading = False
        except (ApiError, InputError) as err:
            log.warning("publishing failed (%s); trying again at the next change", err)
            writer.publisher = None
            membership.touched |= set(membership.pods)

    async def _learn_nodes(self) -> None:
        """Read the labels of Nodes that pods landed on since the last change (each node once)."""
        membership = self.membership
        names = wanted_nodes(membership.pods.values(), self.settings.options, membership.nodes)
        if not names:
            return
        learned = await read_nodes_async(self.api, names, self.settings.options)
        if not learned:  # the API is away: try again shortly, the files keep index order meanwhile
            asyncio.get_running_loop().call_later(2.0, lambda: self.mark_dirty(self.clock()))
            return
        membership.nodes.update(learned)
        membership.touched |= {name for name, pod in membership.pods.items()
                               if pod.get("spec", {}).get("nodeName") in learned}

    @property
    def gathers(self) -> bool:
        """Whether to wait for a burst to end before rewriting (``--debounce``). Not while following the journal:
        each entry is a burst the publisher has gathered already, so waiting again only added SETTLE to every
        follower's event-to-file (issue 24: 50 of the 282 ms p99 at 16384 pods)."""
        return self.settings.debounce > 0 and self.mode != Mode.FOLLOWER

    async def _settle(self) -> None:
        """Wait until the changes stop for SETTLE seconds, and never longer than --debounce: a lone change is
        written after SETTLE, a burst (a job scaling, a node draining) is still one generation and one signal."""
        started = self.clock()
        settle = min(SETTLE, self.settings.debounce)
        while True:
            seen = self.changes
            await asyncio.sleep(settle)
            if self.changes == seen or self.clock() - started + settle > self.settings.debounce:
                return


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


async def run_sidecar(api: AsyncApi, settings: SidecarSettings, *, stop: asyncio.Event,
                      health_port: int | None = None, health_host: str = "0.0.0.0", health_label: str = "",
                      health_topology: bool = False,
                      on_ready: Callable[[Sidecar, int | None], None] | None = None) -> Sidecar:
    from agent.runtime.health import serve_health, start_health

    keep_freed_memory()
    sidecar = Sidecar(api, settings)
    sidecar.evaluator.keep_document = health_port is not None and health_topology
    runner = None
    bound: int | None = None
    if health_port is not None:
        runner, bound = await start_health(sidecar, health_host, health_port,
                                           label=health_label or f"health port {health_port}",
                                           topology=health_topology)
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
