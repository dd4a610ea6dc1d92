"""What a sidecar follows, through the one reflector (reflector.py): the job's pods, or the published journal.

``PodsFollower`` lists and watches the pods (a small job, a large job's publisher and its standbys, and any
follower while the publication cannot be trusted). ``JournalFollower`` reads the published snapshot and watches
the journal (every other pod of a large job); it asks to switch when the leader names this pod a standby, or when
the publication stops: a journal that cannot be read (a sequence out of range, a forged document), or a Lease
held, past a grace, by a pod that is not the journal's publisher (a standby that takes over names itself in the
journal within seconds). A pods follower that took over from a stalled journal looks back every probe interval
and returns to the journal once it is sound again.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from agent.core.gang import Roster
from agent.core.journal import Journal, PublishedState, journal_name, read_journal, state_from
from agent.core.lease import read_record
from agent.core.model import Options, RawPod
from agent.core.provenance import WriterCheck
from agent.core.published import SELECT_LABEL, Compactor, select_value
from agent.core.summary import SUMMARY_KEY, light_plan, read_summary
from agent.core.topology import object_name, pod_name, slim_pod
from agent.errors import ApiError, ApiGone, ApiNotFound, InputError
from agent.k8s.async_client import AsyncApi
from agent.k8s.core import PAGE, WatchEvent
from agent.k8s.reflector import AsyncOps, Reflector, reflect
from agent.k8s.reflector import Settings as ReflectorSettings
from agent.runtime.intake import usable_pods
from agent.runtime.memory import freeze, release_memory
from agent.runtime.metrics import SidecarMetrics
from agent.runtime.publishing import lease_path, vouch_async
from agent.runtime.sidecar.membership import Membership

log = logging.getLogger("topology_agent.sidecar")
PROBE_EVERY = 300.0  # seconds between a follower's looks at the publisher's Lease (jittered by a quarter)


class Mode(enum.Enum):
    PODS = "pods"  # watch the pods (a small job, or a follower whose publisher stopped)
    CANDIDATE = "candidate"  # watch the pods and publish while holding the Lease (a large job's leader, standbys)
    FOLLOWER = "follower"  # watch the published journal


class Host(Protocol):
    """What a follower needs of its sidecar."""

    membership: Membership
    metrics: SidecarMetrics
    reflector: Reflector | None
    roster: Roster | None  # who may be a member (core/gang.Roster), once the job's object is read
    check: WriterCheck | None  # who may have written the publication (core/provenance.py)

    def clock(self) -> float: ...

    def mark_dirty(self, when: float) -> None: ...

    def attempted(self) -> None: ...

    def switch(self, mode: Mode, why: str) -> None: ...


async def follow(host: Host, what: str, settings: ReflectorSettings,
                 list_call: Callable[[], Awaitable[tuple[list[Any], str]]],
                 watch_call: Callable[[str, float, float], AsyncIterator[WatchEvent]],
                 on_list: Callable[[list[Any]], bool], on_event: Callable[[WatchEvent], bool]) -> None:
    """The sidecar's one list+watch, for the pod's life: a LIST or an event that changes membership marks the
    files dirty."""
    host.reflector = Reflector(what, settings, now=host.clock())
    watches = 0

    def watching(rv: str, timeout: float, idle: float) -> AsyncIterator[WatchEvent]:
        nonlocal watches
        watches += 1
        if watches > 1:
            host.metrics.watch_restarts.inc()
        return watch_call(rv, timeout, idle)

    await reflect(host.reflector, AsyncOps(list_call, watching, clock=host.clock, on_request=host.attempted),
                  _Following(host, on_list, on_event))


class _Following:
    def __init__(self, host: Host, on_list: Callable[[list[Any]], bool],
                 on_event: Callable[[WatchEvent], bool]) -> None:
        self.host, self._on_list, self._on_event = host, on_list, on_event
        self.lists = 0

    def on_list(self, items: list[Any]) -> None:
        self.lists += 1
        if self.lists > 1:
            self.host.metrics.relists.inc()
        if self._on_list(items):
            self.host.mark_dirty(self.host.clock())

    def on_event(self, event: WatchEvent) -> bool:
        self.host.metrics.events.labels(event.type).inc()
        if self._on_event(event):
            self.host.mark_dirty(self.host.clock())
        return False


class PodsFollower:
    def __init__(self, host: Host, api: AsyncApi, *, namespace: str, selector: str, compactor: Compactor,
                 settings: ReflectorSettings, journal: JournalFollower | None = None) -> None:
        self.host, self.api, self.namespace, self.selector = host, api, namespace, selector
        self.compactor, self.settings = compactor, settings
        self.journal = journal  # a follower's journal, stalled: looked at again every probe interval

    async def run(self) -> None:
        collection = f"/api/v1/namespaces/{self.namespace}/pods"
        following = follow(
            self.host, "pods", self.settings,
            lambda: self.api.list_objects(collection, label_selector=self.selector, limit=PAGE, keep=self._intake),
            lambda rv, timeout, idle: self.api.watch_objects(collection, rv, timeout=timeout,
                                                             label_selector=self.selector, idle=idle),
            self._on_list, self._on_event)
        if self.journal is None:
            await following
            return
        await _until_first(following, self.journal.recovered())

    def _keep(self, pod: RawPod) -> RawPod:
        """The own pod slimmed (its env is read); every peer compacted as followers see it (shared containers,
        ~1/3 of a 4096-pod publisher's memory). Both are fresh copies: a kept pod that shared strings with the
        parsed LIST page would keep the page's memory arenas alive."""
        if pod_name(pod) == self.host.membership.pod_name:
            return json.loads(json.dumps(slim_pod(pod)))  # type: ignore[no-any-return]
        return self.compactor.pod(pod)

    def _intake(self, items: list[dict[str, Any]]) -> list[RawPod]:
        """What the sidecar keeps of each LIST page, before the next page is read: the peak is one page, not
        the whole LIST (a 4096-pod publisher peaked at 200 MB)."""
        return [self._keep(p) for p in usable_pods(items, self.host.roster, own=self.host.membership.pod_name)]

    def _on_list(self, items: list[RawPod]) -> bool:
        self.host.membership.replace({p["metadata"]["name"]: p for p in items})
        freeze()
        release_memory()
        return True

    def _on_event(self, event: WatchEvent) -> bool:
        if event.type == "BOOKMARK":
            return False
        name = pod_name(event.object)  # type: ignore[arg-type]
        if event.type == "DELETED" or not usable_pods([event.object], self.host.roster,
                                                      own=self.host.membership.pod_name):  # one bad object: left out
            self.host.membership.remove(name)
        else:
            self.host.membership.put(name, self._keep(event.object))  # type: ignore[arg-type]
        return True


async def _until_first(*coroutines: Awaitable[None]) -> None:
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    for task in done:
        task.result()


class JournalFollower:
    def __init__(self, host: Host, api: AsyncApi, *, namespace: str, configmap: str, settings: ReflectorSettings,
                 first_list: tuple[list[dict[str, Any]], str] | None = None, probe_every: float = PROBE_EVERY,
                 grace: float = 30.0, options: Options | None = None) -> None:
        self.host, self.api, self.namespace, self.configmap = host, api, namespace, configmap
        self.settings, self.probe_every, self.grace = settings, probe_every, grace
        self.first_list = first_list  # a follower starts from the LIST that chose its mode: no second one
        self.published: PublishedState | None = None
        self.journal: Journal | None = None
        self.collection = f"/api/v1/namespaces/{namespace}/configmaps"
        self.selector = f"{SELECT_LABEL}={select_value(configmap)}"
        self.options = options or Options()
        self.light = False  # --view own: the journal's summary places this pod; the snapshot is never read

    @property
    def what(self) -> str:
        return f"configmap {journal_name(self.configmap)}"

    async def run(self) -> None:
        journal = f"metadata.name={journal_name(self.configmap)}"

        async def list_published() -> tuple[list[dict[str, Any]], str]:
            if self.first_list is not None:
                (items, rv), self.first_list = self.first_list, None
            elif self.light:
                items, rv = await self.api.list_objects(self.collection, field_selector=journal)
            else:
                items, rv = await self.api.list_objects(self.collection, label_selector=self.selector)
            why = await self._vouch(items)
            if why is not None:
                self.host.switch(Mode.PODS, f"the published topology is not used ({why})")
                return [], rv
            return items, rv

        async def watch_journal(rv: str, timeout: float, idle: float) -> AsyncIterator[WatchEvent]:
            """The journal's events, each new writer (a standby that took over) read once before its first
            event is used: a GET, where a relist would read the whole snapshot again in every follower."""
            async for event in self.api.watch_objects(self.collection, rv, timeout=timeout, field_selector=journal,
                                                      idle=idle):
                if event.type in ("ADDED", "MODIFIED"):
                    why = await self._vouch([event.object])
                    if why is not None:
                        self.host.switch(Mode.PODS, f"the published topology is not used ({why})")
                        return
                yield event

        await _until_first(
            follow(self.host, self.what, self.settings, list_published, watch_journal, self._on_list,
                   self._on_event),
            self._watch_publisher())

    async def _vouch(self, items: list[Any]) -> str | None:
        check = self.host.check
        return await vouch_async(self.api.get_object, check, items, self.configmap) if check is not None else None

    def _unusable(self, err: InputError) -> None:
        self.host.switch(Mode.PODS, f"the published topology cannot be used ({err})")

    def _summarized(self, configmap: Any) -> bool:
        """--view own: this pod's plan from the journal's summary (core/summary.py). A summary that cannot place
        this pod sends the follower back to the whole topology (a relist: the snapshot, then the journal)."""
        try:
            journal = read_journal(configmap)
        except InputError as err:
            self._unusable(err)
            return False
        if journal is None:
            return False
        self.journal = journal
        self._stand_by(journal.standby)
        data = configmap.get("data") or {}
        text = data.get(SUMMARY_KEY)
        membership = self.host.membership
        why = "the leader published no summary (more runs of ranks than a summary holds, or an older agent)"
        if isinstance(text, str) and membership.me is not None:
            try:
                summary = read_summary(text)
                assert summary is not None
                plan = light_plan(summary, membership.me, self.options)
            except InputError as err:
                why = str(err)
            else:
                if plan is None:  # not a member in the leader's view now: the last files stay, as with every pod
                    log.info("the summary at sequence %d does not place this pod; keeping its files", journal.seq)
                    return False
                changed = membership.light is None or membership.light.topology != plan.topology \
                    or membership.light.master_port != plan.master_port
                membership.light = plan
                return changed
        self.light = False
        membership.light = None
        log.warning("--view own not used: %s; reading the whole topology", why)
        raise ApiGone("reading the whole topology", status=410)

    def _on_list(self, items: list[dict[str, Any]]) -> bool:
        if self.light:
            return any([self._summarized(i) for i in items if object_name(i) == journal_name(self.configmap)])
        try:
            state, journal = state_from(items, self.configmap)
        except InputError as err:
            self._unusable(err)
            return False
        if state is None:
            if journal is not None and any(object_name(i) == self.configmap for i in items):
                # Read in one LIST, the journal must reach back to the snapshot (the leader writes the snapshot
                # before the journal that needs it): one that starts after it was not written by the leader.
                self.host.switch(Mode.PODS, f"the published journal starts after its snapshot (sequence "
                                            f"{journal.base} and on): it cannot be followed")
            return False
        self.published, self.journal = state, journal
        self.host.membership.replace(dict(state.pods), own=True)
        freeze()  # as after a LIST of pods: the collector's passes must not walk the whole job per change
        self._stand_by(journal.standby if journal else ())
        return True

    def _on_event(self, event: WatchEvent) -> bool:
        if event.type not in ("ADDED", "MODIFIED"):
            return False
        if self.light:
            return self._summarized(event.object)
        try:
            journal = read_journal(event.object)
            changed = self.published.apply(journal) if self.published is not None and journal is not None else None
        except InputError as err:
            self._unusable(err)
            return False
        if journal is None:
            return False
        self.journal = journal
        if changed is None:  # the journal moved past what this pod holds: read the snapshot again
            raise ApiGone(f"journal {journal_name(self.configmap)} starts after sequence "
                          f"{self.published.seq if self.published else 0}", status=410)
        assert self.published is not None
        membership = self.host.membership
        for name in changed:
            pod = self.published.pods.get(name)
            if pod is None:
                membership.remove(name)
            else:
                membership.put(name, pod, own=True)
        self._stand_by(journal.standby)
        return bool(changed)

    def _stand_by(self, standby: tuple[str, ...]) -> None:
        """Named a standby by the leader: watch the pods too, and contend for the Lease."""
        if self.host.membership.pod_name in standby:
            self.host.switch(Mode.CANDIDATE, "named a standby publisher")

    async def _lease_holder(self) -> str | None:
        """The Lease's holder, '' when nobody holds it, None when it cannot be read now."""
        try:
            return read_record(await self.api.get_object(lease_path(self.namespace, self.configmap))).holder
        except ApiNotFound:
            return ""  # no Lease: a leader without RBAC for Leases publishes without one
        except ApiError as err:
            log.info("cannot read lease %s (%s); looking again later", self.configmap, err)
            return None

    def _stalled(self, holder: str | None) -> str | None:
        leader = self.journal.leader if self.journal is not None else ""
        if holder and leader and holder != leader:
            return f"lease {self.configmap} is held by '{holder}', but the journal's publisher is '{leader}'"
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
                self.host.switch(Mode.PODS, f"the publisher stopped: {why}")
                return

    async def recovered(self) -> None:
        """Returns once the publication is sound again: a readable snapshot and journal whose publisher holds
        the Lease (looked at every probe interval)."""
        while True:
            await asyncio.sleep(self.probe_every * random.uniform(0.75, 1.25))
            try:
                items, rv = await self.api.list_objects(self.collection, label_selector=self.selector)
                state, journal = state_from(items, self.configmap, pods=False)
            except (ApiError, InputError) as err:
                log.info("the published topology is still not usable (%s)", err)
                continue
            if state is None or journal is None:
                continue
            why = await self._vouch(items)
            if why is not None:
                log.info("the published topology is still not usable (%s)", why)
                continue
            self.journal = journal
            if self._stalled(await self._lease_holder()) is None:
                self.first_list = (items, rv)
                self.host.switch(Mode.FOLLOWER, "the published topology is sound again")
                return
