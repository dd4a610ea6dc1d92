"""What a sidecar follows, through the one reflector (k8s/reflector.py), each a view (runtime/views.py) with its
list and watch calls and the rule that ends it: the job's pods, or the published journal.

``PodsFollower`` lists and watches the pods (a small job, a large job's publisher and a standby about to take
over, and any follower while the publication cannot be trusted). ``JournalFollower`` reads the published
snapshot and watches the journal (every other pod of a large job, its standbys included), or in its own view the
summary ConfigMap alone; it asks to switch when the leader names this pod a standby, or when the publication
stops: a journal that cannot be read (a sequence out of range, a forged document), or a Lease held, past a grace,
by a pod that is not the journal's publisher (a standby that takes over names itself in the journal within
seconds). A pods follower that took over from a stalled journal looks back every probe interval and returns to
the journal once it is sound again.

Followers report to a ``Sink``: a change to write, a mode to switch to, and their progress. They hold nothing of
the sidecar.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from agent.core.escaping import pod_name_shown
from agent.core.plan.layout import Plan
from agent.core.publication.journal import Journal, journal_name, state_from, summary_name
from agent.core.publication.lease import read_record
from agent.core.publication.provenance import WriterCheck
from agent.core.publication.published import SELECT_LABEL, select_value
from agent.errors import ApiError, ApiGone, ApiNotFound, InputError
from agent.k8s.async_client import AsyncApi
from agent.k8s.core import PAGE, WatchEvent, pods_path
from agent.k8s.reflector import AsyncOps, Reflector, Store, aclose, reflect
from agent.k8s.reflector import Settings as ReflectorSettings
from agent.runtime.memory import freeze, release_memory
from agent.runtime.nodes import list_lost_nodes
from agent.runtime.publication.publishing import lease_path, vouch
from agent.runtime.tasks import race
from agent.runtime.views import (
    READING,
    NodeView,
    PodView,
    PublicationView,
    SummaryView,
    full_view_line,
    light_selectors,
)

log = logging.getLogger("topology_agent.sidecar")
Seed = tuple[dict[str, Any], str]  # the publisher's own published pods (compact) and their pods resourceVersion
PROBE_EVERY = 300.0  # seconds between a follower's looks at the publisher's Lease (jittered by a quarter)


class Mode(enum.Enum):
    PODS = "pods"  # watch the pods (a small job, or a follower whose publisher stopped)
    CANDIDATE = "candidate"  # watch the pods and publish while holding the Lease (the leader, a standby taking over)
    STANDBY = "standby"  # follow the publication as a follower does, and contend for the Lease
    FOLLOWER = "follower"  # follow the publication: the summary (its own view) or the snapshot and journal

    @property
    def reads_publication(self) -> bool:
        return self in (Mode.FOLLOWER, Mode.STANDBY)


class Sink(Protocol):
    """Where followers report."""

    def changed(self) -> None: ...  # the membership changed: the files may have to be written

    def switch(self, mode: Mode, why: str) -> None: ...  # another follower should run

    def attempted(self) -> None: ...  # a request starts (liveness: the loop is alive)

    def following(self, reflector: Reflector) -> None: ...  # the list+watch now run (readiness: its progress)

    def count(self, what: str) -> None: ...  # "relist", "watch restart", or an event's type (metrics)

    def replacing(self) -> None: ...  # a LIST is about to replace every pod held: what is derived from them can go


async def follow(sink: Sink, what: str, settings: ReflectorSettings, clock: Callable[[], float],
                 list_call: Callable[[], Awaitable[tuple[list[Any], str]]],
                 watch_call: Callable[[str, float, float], AsyncIterator[WatchEvent]], store: Store) -> None:
    """The sidecar's one list+watch into ``store``, for the pod's life."""
    reflector = Reflector(what, settings, now=clock())
    sink.following(reflector)
    calls = {"list": 0, "watch": 0}

    def requested(kind: str) -> None:
        sink.attempted()
        calls[kind] += 1
        if calls[kind] > 1:
            sink.count("relist" if kind == "list" else "watch restart")

    ops = AsyncOps(list_call, watch_call, clock=clock, on_request=requested, on_event=lambda e: sink.count(e.type))
    await reflect(reflector, ops, store)


class _Told:
    """The pods' watcher in a follower: every change may be one to write; after a LIST the collector stops
    walking the pods held (they hold no cycles), and the freed page memory goes back to the OS."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def reset(self, pods: object) -> None:
        freeze()
        release_memory()
        self.sink.changed()

    def changed(self, name: str, pod: object) -> None:
        self.sink.changed()


class PodsFollower:
    def __init__(self, sink: Sink, api: AsyncApi, view: PodView, *, namespace: str, selector: str,
                 settings: ReflectorSettings, clock: Callable[[], float],
                 journal: JournalFollower | None = None, first_list: Seed | None = None) -> None:
        self.sink, self.api, self.view, self.namespace, self.selector = sink, api, view, namespace, selector
        self.settings, self.clock = settings, clock
        self.journal = journal  # a follower's journal, stalled: looked at again every probe interval
        self.first_list = first_list  # the publisher's own rows and where they stand: its first LIST

    async def _listed(self, collection: str) -> tuple[list[Any], str]:
        """The pods: the publisher's own rows the first time (its init's, or its own before a restart; the watch
        from their resourceVersion brings what changed since, or a 410 and a LIST), then a LIST."""
        if self.first_list is not None:
            (rows, rv), self.first_list = self.first_list, None
            me = self.view.me
            items = [pod for name, pod in rows.items() if name != self.view.own]
            if me is not None:
                items.append(self.view.keep(me))
            log.info("starting from the %d pods published at pods resourceVersion %s, not a LIST", len(items), rv)
            return items, rv
        return await self.api.list_objects(collection, label_selector=self.selector, limit=PAGE,
                                           keep=self.view.intake)

    async def run(self) -> None:
        collection = pods_path(self.namespace)
        told = _Told(self.sink)
        self.view.watch(told)
        try:
            following = follow(
                self.sink, "pods", self.settings, self.clock, lambda: self._listed(collection),
                lambda rv, timeout, idle: self.api.watch_objects(collection, rv, timeout=timeout,
                                                                 label_selector=self.selector, idle=idle),
                self.view)
            first = await race(following, self.journal.recovered()) if self.journal is not None \
                else await race(following)
            first.result()
        finally:
            self.view.unwatch(told)


NODES = "/api/v1/nodes"


class NodesFollower:
    """The cluster's Nodes into a ``NodeView``, beside the pods (the pods' follower of a small job, a large job's
    publisher, a standby taking over): the lost Nodes listed (``nodes.list_lost_nodes``: a Status cell per Node,
    and the Nodes not Ready read whole), then one watch. Every Node, not the job's: a field selector takes one
    name, and a watch per Node would be one per member. The sink hears of its requests only; what the Nodes
    change reaches the sidecar through the view."""

    def __init__(self, sink: Sink, api: AsyncApi, view: NodeView, *, settings: ReflectorSettings,
                 clock: Callable[[], float]) -> None:
        self.sink, self.api, self.view, self.settings, self.clock = sink, api, view, settings, clock

    async def run(self) -> None:
        await follow(self.sink, "nodes", self.settings, self.clock,
                     lambda: list_lost_nodes(self.api),
                     lambda rv, timeout, idle: self.api.watch_objects(NODES, rv, timeout=timeout, idle=idle),
                     self.view)


class JournalFollower:
    """A large job's publication as a follower reads it: the rows go into ``pods`` (the own pod as read at
    start), or with ``light`` the summary places this pod (``plan``)."""

    def __init__(self, sink: Sink, api: AsyncApi, pods: PodView, *, namespace: str, configmap: str,
                 check: WriterCheck | None, settings: ReflectorSettings, clock: Callable[[], float],
                 grace: float = 30.0, probe_every: float = PROBE_EVERY, ssh: bool = False) -> None:
        self.sink, self.api, self.pods, self.namespace, self.configmap = sink, api, pods, namespace, configmap
        self.check, self.settings, self.clock, self.grace, self.probe_every = check, settings, clock, grace, probe_every
        self.published = PublicationView(configmap, strict=True)
        self.published.watchers.append(self._rows)
        self.summary = SummaryView(configmap, pods.me or {}, pods.options, ssh=ssh)
        self.light = False  # its own view: the summary places this pod; the snapshot and journal are never read
        self.first_list: tuple[list[dict[str, Any]], str] | None = None  # the LIST that chose the mode: reused

    @property
    def collection(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps"

    @property
    def plan(self) -> Plan | None:
        """This pod's plan from the summary, while the summary is what is followed."""
        return self.summary.plan if self.light else None

    @property
    def seq(self) -> int:
        state = self.published.state
        journal = self.summary.journal if self.light else self.published.journal
        return state.seq if state is not None and not self.light else journal.seq if journal else 0

    def _rows(self, changed: set[str] | None) -> None:
        """The publication changed: its rows into the pods held, and who stands by."""
        state = self.published.state
        assert state is not None
        if changed is None:
            self.pods.hold(dict(state.pods), own=True)
            held, own = self.pods.pods, self.pods.own
            for name in state.pods:  # the objects the view kept (unchanged pods): one copy of each, not two
                if name != own and name in held:
                    state.pods[name] = held[name]
            freeze()  # as after a LIST of pods: the collector's passes must not walk the whole job per change,
            release_memory()  # and the heap the snapshot's text was decoded in goes back before the plan is made
        else:
            for name in changed:
                pod = state.pods.get(name)
                if pod is None:
                    self.pods.remove(name)
                else:
                    self.pods.put(name, pod, own=True)
        self.pods.drain()  # nothing is published from here: no set of every pod's name kept for a publisher
        if changed is None or changed:
            self.sink.changed()

    def watched_name(self) -> str:
        """The summary ConfigMap in its own view, else the journal (the snapshot is read by the LIST)."""
        return summary_name(self.configmap) if self.light else journal_name(self.configmap)

    async def run(self) -> None:
        selector = f"{SELECT_LABEL}={select_value(self.configmap)}"

        async def listed() -> tuple[list[dict[str, Any]], str]:
            if self.first_list is not None:
                (items, rv), self.first_list = self.first_list, None
            elif self.light:
                label, field = light_selectors(self.configmap, self.summary.domains)
                items, rv = await self.api.list_objects(self.collection, label_selector=label, field_selector=field)
            else:
                items, rv = await self.api.list_objects(self.collection, label_selector=selector)
            if not await self._vouched(items):
                return [], rv
            return items, rv

        async def watched(rv: str, timeout: float, idle: float) -> AsyncIterator[WatchEvent]:
            """The journal's (or the summary's) events, each new writer (a standby that took over) read once before
            its first event is used: a GET, where a relist would read the whole snapshot again in every follower."""
            label, field = light_selectors(self.configmap, self.summary.domains) if self.light else \
                ("", f"metadata.name={self.watched_name()}")
            events = self.api.watch_objects(self.collection, rv, timeout=timeout, label_selector=label,
                                            field_selector=field, idle=idle)
            try:
                async for event in events:
                    if event.type in ("ADDED", "MODIFIED") and not await self._vouched([event.object]):
                        return
                    yield event
            finally:
                await aclose(events)

        what = f"configmap {self.watched_name()}"
        try:
            first = await race(follow(self.sink, what, self.settings, self.clock, listed, watched, _Journal(self)),
                               self._watch_publisher())
            first.result()
        except InputError as err:
            self.sink.switch(Mode.PODS, f"the published topology cannot be used ({err})")

    async def _vouched(self, items: list[Any]) -> bool:
        if self.check is None:
            return True
        why, _ = await vouch(self.api.get_object, self.check, items, self.configmap)
        if why is not None:
            self.sink.switch(Mode.PODS, f"the published topology is not used ({why})")
        return why is None

    def standby_rank(self) -> int:
        """This pod's place among the standbys the publication names (0: the first, or not named)."""
        journal = self.published.journal or self.summary.journal
        standby = journal.standby if journal is not None else ()
        return standby.index(self.pods.own) if self.pods.own in standby else 0

    def stand_by(self, standby: tuple[str, ...]) -> None:
        """Named a standby by the leader: contend for the Lease (the pods are listed once it looks abandoned)."""
        if self.pods.own in standby:
            self.sink.switch(Mode.STANDBY, "named a standby publisher")

    async def _lease_holder(self) -> str | None:
        """The Lease's holder, '' when nobody holds it, None when it cannot be read now."""
        try:
            return read_record(await self.api.get_object(lease_path(self.namespace, self.configmap))).holder
        except ApiNotFound:
            return ""  # no Lease: a leader without RBAC for Leases publishes without one
        except ApiError as err:
            log.info("cannot read lease %s (%s); looking again later", self.configmap, err)
            return None

    def _stalled(self, holder: str | None, journal: Journal | None = None) -> str | None:
        journal = journal or self.published.journal or self.summary.journal
        leader = journal.leader if journal is not None else ""
        if holder and leader and holder != leader:
            return (f"lease {self.configmap} is held by '{pod_name_shown(holder)}', but the journal's publisher is "
                    f"'{pod_name_shown(leader)}'")
        return None

    async def _watch_publisher(self) -> None:
        """Every probe interval: is the Lease held by the pod the journal names its publisher? A holder that is
        another pod past ``grace`` means nobody publishes (the holder is not a member, or lost its role)."""
        while True:
            await asyncio.sleep(self.probe_every * random.uniform(0.75, 1.25))
            why = self._stalled(await self._lease_holder())
            if why is None:
                continue
            await asyncio.sleep(self.grace)  # a standby that takes over names itself in the journal meanwhile
            why = self._stalled(await self._lease_holder())
            if why is not None:
                self.sink.switch(Mode.PODS, f"the publisher stopped: {why}")
                return

    async def recovered(self) -> None:
        """Returns once the publication is sound again: a readable snapshot and journal whose publisher holds
        the Lease (looked at every probe interval)."""
        selector = f"{SELECT_LABEL}={select_value(self.configmap)}"
        while True:
            await asyncio.sleep(self.probe_every * random.uniform(0.75, 1.25))
            try:
                items, rv = await self.api.list_objects(self.collection, label_selector=selector)
                state, journal = state_from(items, self.configmap, pods=False)
            except (ApiError, InputError) as err:
                log.info("the published topology is still not usable (%s)", err)
                continue
            if state is None or journal is None:
                continue
            why = (await vouch(self.api.get_object, self.check, items, self.configmap))[0] if self.check else None
            if why is not None:
                log.info("the published topology is still not usable (%s)", why)
                continue
            if self._stalled(await self._lease_holder(), journal) is None:
                if not self.light or self.summary.domains is None:  # its blocks are not among these: it lists
                    self.first_list = (items, rv)
                self.sink.switch(Mode.FOLLOWER, "the published topology is sound again")
                return


class _Journal:
    """The store a journal follower gives the reflector: the publication's view, or with ``light`` the summary's
    (a summary that cannot place this pod sends the follower back to the whole topology: a relist, the snapshot,
    then the journal); then who stands by."""

    def __init__(self, follower: JournalFollower) -> None:
        self.follower = follower

    def replace(self, items: list[Any]) -> None:
        if not self.follower.light and self.follower.published.state is not None:
            # A snapshot read again (the journal moved past the one held, a 410): the last plan's layout and texts
            # are let go before it is decoded, not held beside it, at the price of one plan and one encoding of the
            # texts from scratch (at 16384 pods ~4 MB of a full-view pod's peak: bench/fullview_bench.py --relist).
            self.follower.sink.replacing()
        (self.follower.summary if self.follower.light else self.follower.published).replace(items)
        self._took()

    def apply(self, event: WatchEvent) -> None:
        if event.type in ("ADDED", "MODIFIED"):
            (self.follower.summary if self.follower.light else self.follower.published).apply(event)
            self._took()

    def _took(self) -> None:
        follower = self.follower
        if not follower.light:
            journal = follower.published.journal
            follower.stand_by(journal.standby if journal is not None else ())
            return
        summary = follower.summary
        if summary.journal is not None:
            follower.stand_by(summary.journal.standby)
        if summary.unsummarized is not None:
            follower.light = False
            log.log(*full_view_line(follower.pods.options.view, summary.unsummarized, READING))
            raise ApiGone("reading the whole topology", status=410)
        if summary.changed:
            follower.sink.changed()
        elif summary.journal is not None and summary.plan is None:
            log.info("the summary at sequence %d does not place this pod; keeping its files", summary.journal.seq)
