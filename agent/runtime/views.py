"""What the agent holds of the API, each fed by the one reflector (k8s/reflector.py), as client-go's Store with
its transform: a LIST replaces what a view holds, each watch event applies one change.

``PodView`` is the job's pods (init until the gang is complete, the sidecar for the pod's life);
``PublicationView`` and ``SummaryView`` are a large job's published ConfigMaps, whole or summarized. A view
keeps each object in the form its readers need and no more: a peer as the published rows carry it
(core/publication/published.Compactor: a fraction of the pod's memory), the own pod as the user wrote its containers.
Whoever must hear of each change as it is applied (init's gang tracker and planner, the sidecar's debounce) is a
watcher; what changed since the publisher last looked is a log it drains.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from agent.core.compact import marked_lost, same_but_version, sharing
from agent.core.model import Options, RawPod
from agent.core.plan.gang import Roster
from agent.core.plan.layout import Plan
from agent.core.pods.lost import node_state, why_node_lost
from agent.core.pods.pod import object_name, pod_ip, pod_name, slim_pod
from agent.core.pods.validation import split_pods
from agent.core.publication.blocks import BLOCK_KEY, block_digest, part_selector
from agent.core.publication.journal import (
    JOURNAL_KEY,
    Journal,
    PublishedState,
    journal_name,
    read_journal,
    state_from,
    summary_name,
)
from agent.core.publication.published import SELECT_LABEL, Compactor, select_value
from agent.core.publication.summary import SUMMARY_KEY, light_plan, read_summary
from agent.core.publication.view_choice import SMALL_JOB, choose_view
from agent.errors import ApiGone, InputError
from agent.k8s.core import WatchEvent

log = logging.getLogger("topology_agent.intake")


Refused = Callable[[Any, str], None]  # told of each pod left out: the object, and why (runtime/events.py)


def usable_pods(items: list[Any], roster: Roster | None = None, *, own: str | None = None,
                refused: Refused | None = None) -> list[RawPod]:
    """The pods among ``items`` that have a pod's shape and, once the job's object is read, are the job's own
    (core/plan/gang.Roster); each refused one is logged in one line and left out, so one broken or hostile object never
    stops the agent, nor stalls the other members. ``own``: this pod's name, never left out here (it is the one
    asking; init and the sidecar read it themselves). ``refused`` hears of each pod the roster leaves out (the
    pod's Events name it)."""
    usable, broken = split_pods(items)
    for line in broken:
        log.warning("ignoring a pod the API sent: %s", line)
    if roster is None:
        return usable  # type: ignore[return-value]
    members = []
    for pod in usable:
        why = None if pod.get("metadata", {}).get("name") == own else roster.refusal(pod)  # type: ignore[arg-type]
        if why is None:
            members.append(pod)
        else:
            log.warning("leaving out a pod that is not the job's: %s", why)
            if refused is not None:
                refused(pod, why)
    return members  # type: ignore[return-value]


class Watcher(Protocol):
    """Told of every change a view applies, as it applies it."""

    def reset(self, pods: Mapping[str, RawPod]) -> None: ...  # a LIST (or a snapshot): every pod at once

    def changed(self, name: str, pod: RawPod | None) -> None: ...  # one pod put (or removed: None)


class PodView:
    """The job's pods: each passed the intake (a pod's shape; once the job's object is read, one of its members:
    core/plan/gang.Roster) and is compacted; the own pod is kept as read (``whole_own``) or slimmed to the fields the
    core reads. ``stage`` is given each pod as it is kept (the leader's init stages its published rows while the
    pages arrive)."""

    def __init__(self, own: str, options: Options, *, roster: Roster | None = None, whole_own: bool = False,
                 me: RawPod | None = None, stage: Callable[[RawPod], None] | None = None,
                 refused: Refused | None = None, watchers: Sequence[Watcher] = ()) -> None:
        self.own, self.roster, self.whole_own = own, roster, whole_own
        self.me = me  # the own pod as read at start: its containers' env is the user's
        self.pods: dict[str, RawPod] = {}
        self.unaddressed: set[str] = set()  # pods without an IP yet (kept per change, not rescanned)
        self.listed = False  # every pod was held at once (a LIST, a snapshot): before that, nothing to place
        self.touched: set[str] = set()  # changed since the publisher last drained them
        self.unplanned: set[str] | None = set()  # changed since the last plan (None: every pod, after a LIST)
        self.watchers: list[Watcher] = list(watchers)
        self.stage = stage
        self.refused = refused  # told of each pod the intake leaves out (the pod's Events)
        self.compactor = Compactor(options)

    # --- collaborators known only after the view is made ------------------------------------------------------

    def know_me(self, me: RawPod) -> None:
        """The own pod, once read (the sidecar reads it after its view is made)."""
        self.me = me

    def know_roster(self, roster: Roster | None) -> None:
        """The job's members, once its object is read (None: it names none): from now on the intake keeps only them."""
        self.roster = roster

    def watch(self, watcher: Watcher, *, refused: Refused | None = None) -> None:
        """Tell ``watcher`` of every change from now on; ``refused``, if given, hears of each pod the intake
        leaves out from now on (a watcher made with the view it watches: init's gang, the pod's Events)."""
        self.watchers.append(watcher)
        if refused is not None:
            self.refused = refused

    def unwatch(self, watcher: Watcher) -> None:
        self.watchers.remove(watcher)

    def renew_all(self) -> None:
        """Every pod is the publisher's to write again at the next drain (a publication that failed)."""
        self.touched |= set(self.pods)

    def renew_placement(self, names: set[str]) -> None:
        """The pods ``names`` run on Nodes whose labels were just learned: the publisher writes them again, and
        the planner compares every pod (labels place pods anew)."""
        self.touched |= names
        self.unplanned = None

    @property
    def options(self) -> Options:
        return self.compactor.options

    def reset_options(self, options: Options) -> None:
        """The job's objects filled options the user left open (MPI roles, slots): peers are compacted for them."""
        if options != self.compactor.options:
            self.compactor = Compactor(options)

    # --- the transform ----------------------------------------------------------------------------------------

    def keep(self, pod: RawPod) -> RawPod:
        """A pod as this view holds it, from fresh strings: a kept string of the parsed page keeps the page's
        memory arenas alive (a 4096-pod job's full objects would hold 290 MB)."""
        name = pod_name(pod)
        if name == self.own:
            pod = pod if self.whole_own else json.loads(json.dumps(slim_pod(pod)))
        else:  # what it says as its version held did is held once (compact.sharing)
            pod = sharing(self.compactor.pod(pod), self.pods.get(name))
        if self.stage is not None:
            self.stage(pod)
        return pod

    def intake(self, page: list[Any]) -> list[RawPod]:
        """What is kept of each LIST page, before the next page is read: the peak is one page, not the LIST."""
        return [self.keep(p) for p in usable_pods(page, self.roster, own=self.own, refused=self.refused)]

    # --- the store ---------------------------------------------------------------------------------------------

    def replace(self, items: list[RawPod]) -> None:
        """A LIST's pods (each kept by ``intake``). The own pod, not listed yet (a cache behind the GET that read
        it), is a member anyway."""
        pods = {pod_name(p): p for p in items}
        if self.own not in pods and self.me is not None:
            pods[self.own] = self.me
        self.hold(pods)

    def apply(self, event: WatchEvent) -> None:
        if event.type == "BOOKMARK":
            return
        name = pod_name(event.object)  # type: ignore[arg-type]
        if event.type == "DELETED" or not usable_pods([event.object], self.roster, own=self.own,
                                                      refused=self.refused):
            self.remove(name)  # one bad object is left out: it never stops the job
        else:
            self.put(name, self.keep(event.object))  # type: ignore[arg-type]

    # --- changes, from the store or from the published rows (the journal follower) ----------------------------

    def hold(self, pods: dict[str, RawPod], *, own: bool = False) -> None:
        """Every pod at once. ``own``: the own pod as read at start in place of its published row. A pod that says
        nothing new keeps the object held (``same_but_version``): after a relist or a new snapshot the planner, the
        facts' memo and the files' member texts find every unchanged pod by identity, and the plan is carried
        over instead of laid out again beside the old one (a full-view pod's peak at 16384 pods)."""
        if own and self.me is not None and self.own in pods:
            pods[self.own] = slim_pod(self.me)
        held = self.pods
        if held:
            for name, pod in pods.items():
                old = held.get(name)
                if old is not None and old is not pod and same_but_version(old, pod):
                    pods[name] = old
        self.touched |= set(self.pods) | set(pods)
        self.unplanned = None
        self.pods = pods
        self.listed = True
        self.unaddressed = {name for name, pod in pods.items() if not pod_ip(pod) and name != self.own}
        for watcher in self.watchers:
            watcher.reset(pods)

    def forget(self) -> None:
        """Let go of every pod (a standby that stands down: the whole job's, ~50 MB at 16384 pods); the next
        LIST or snapshot holds them again."""
        self.pods, self.unaddressed, self.touched, self.unplanned = {}, set(), set(), set()
        self.listed = False

    def put(self, name: str, pod: RawPod, *, own: bool = False) -> None:
        """A pod as changed; one that says nothing new (the kubelet's Ready writes: conditions and container
        statuses, which no held form keeps) is no change: no evaluation, and the planner keeps its layout (a new
        object for the own pod would make it plan the whole job from scratch, ~0.5 s and a second plan's memory
        at 16384 pods)."""
        if own and name == self.own and self.me is not None:
            pod = slim_pod(self.me)
        held = self.pods.get(name)
        if held is not None and same_but_version(held, pod):
            return
        self.touched.add(name)
        if self.unplanned is not None:
            self.unplanned.add(name)
        self.pods[name] = pod
        if pod_ip(pod) or name == self.own:
            self.unaddressed.discard(name)
        else:
            self.unaddressed.add(name)
        for watcher in self.watchers:
            watcher.changed(name, pod)

    def remove(self, name: str) -> None:
        self.touched.add(name)
        if self.unplanned is not None:
            self.unplanned.add(name)
        self.pods.pop(name, None)
        self.unaddressed.discard(name)
        for watcher in self.watchers:
            watcher.changed(name, None)

    def mark_nodes(self, lost: Mapping[str, str]) -> list[str]:
        """The lost Nodes (each with why, core/pods/lost.py) as the sidecar's Node watch sees them now: each peer on one
        gets the agent's condition, each on a Node that is back loses it, from now on and on every pod kept later.
        Returns the pods that changed. The own pod is never marked (its conditions are not held: its own sidecar
        never leaves it out)."""
        self.compactor.lost_nodes = dict(lost)
        changed = []
        for name, pod in list(self.pods.items()):
            marked = marked_lost(pod, lost) if name != self.own else None
            if marked is not None:
                self.put(name, marked)  # type: ignore[arg-type]
                changed.append(name)
        return changed

    def stop_marking_nodes(self) -> None:
        """No Node is watched from now on: the pods kept later are not marked (those held keep their marks)."""
        self.compactor.lost_nodes = {}

    def take_unplanned(self) -> set[str] | None:
        """The pods changed since the last call (the planner's ``touched``); None: any (a LIST came between)."""
        unplanned, self.unplanned = self.unplanned, set()
        return unplanned

    def drain(self) -> set[str]:
        """The pods changed since the last drain (the publisher's journal entry)."""
        touched, self.touched = self.touched, set()
        return touched

    def placed(self, *, by_ip: bool) -> Mapping[str, RawPod]:
        """The pods that can be placed: with ``--address ip`` a pod joins once it has an address."""
        if by_ip and self.unaddressed:
            return {name: pod for name, pod in self.pods.items() if name not in self.unaddressed}
        return self.pods


class PublicationView:
    """A large job's publication (core/publication/journal.py): the snapshot brought forward by the journal. init holds
    it until its own pod is in it; a sidecar that follows the journal, for the pod's life. ``strict`` (the
    sidecar): a journal that moves past the snapshot held asks for the LIST again (``ApiGone``), and a LIST whose
    journal starts after its snapshot cannot be followed (``InputError``); init waits for the leader's newer
    snapshot instead. Each watcher is told the pods an entry changed (None: every pod, a new snapshot)."""

    def __init__(self, name: str, *, strict: bool = False) -> None:
        self.name, self.strict = name, strict
        self.state: PublishedState | None = None
        self.journal: Journal | None = None
        self.watchers: list[Callable[[set[str] | None], None]] = []

    def clear(self) -> None:
        self.state = self.journal = None

    def has(self, pod: str) -> bool:
        return self.state is not None and pod in self.state.pods

    @property
    def held(self) -> dict[str, RawPod] | None:
        """The pods of the state held (the objects its readers hold too), kept for the rows a new snapshot
        leaves as they were: a relist does not hold the job's pods twice."""
        return self.state.pods if self.state is not None else None

    def replace(self, items: list[Any]) -> None:
        self.state, self.journal = state_from(items, self.name, held=self.held)
        if self.state is None:
            if self.strict and self.journal is not None and any(object_name(i) == self.name for i in items):
                # Read in one LIST, the journal must reach back to the snapshot (the leader writes the snapshot
                # before the journal that needs it): one that starts after it was not written by the leader.
                raise InputError(f"the published journal starts after its snapshot (sequence {self.journal.base} "
                                 "and on): it cannot be followed")
            return
        self._tell(None)

    def apply(self, event: WatchEvent) -> None:
        if event.type not in ("ADDED", "MODIFIED"):
            return
        if object_name(event.object) == self.name:  # a new snapshot (init watches both by label)
            self.state = PublishedState.from_configmap(event.object, held=self.held)
            if self.state is not None and self.journal is not None and self.state.apply(self.journal) is None:
                self.journal = None  # older than this snapshot
            self._tell(None)
            return
        journal = read_journal(event.object)
        if journal is None:
            return
        self.journal = journal
        changed = self.state.apply(journal) if self.state is not None else None
        if changed is None:
            if self.strict:
                raise ApiGone(f"journal {journal_name(self.name)} starts after sequence "
                              f"{self.state.seq if self.state else 0}", status=410)
            self.state = None  # past this snapshot's reach: the leader's newer snapshot is on its way
            return
        self._tell(changed)

    def _tell(self, changed: set[str] | None) -> None:
        for watcher in self.watchers:
            watcher(changed)


NO_SUMMARY = "the leader published no summary (more runs of ranks than a summary holds, or an older agent)"


async def journal_if_summary_gone(api: Any, collection: str, configmap: str, items: list[Any]) -> list[Any]:
    """When a pod in its own view listed no summary: whether the journal is published, read with the objects a full
    view lists (by their label, as metadata only: a few hundred bytes each, whatever changes the journal holds) in
    one LIST, as stand-ins that carry only their names, so that ``summary_gone`` tells a deleted summary from one
    not published yet. The leader writes the summary before the journal: a summary listed here with the journal was
    only not written yet at the first LIST, not deleted; its data comes by the watch. Never used for their data, so
    never vouched for."""
    summary, journal = summary_name(configmap), journal_name(configmap)
    if any(object_name(item) == summary for item in items):
        return []
    found, _ = await api.list_objects(collection, label_selector=f"{SELECT_LABEL}={select_value(configmap)}",
                                      metadata_only=True)
    names = {object_name(item) for item in found}
    if journal not in names:
        return []
    return [{"metadata": {"name": name}} for name in (journal, summary) if name in names]


def summary_gone(items: list[Any], configmap: str) -> str | None:
    """Why a pod in its own view reads the whole topology: the journal is published and the summary is not (it
    was deleted; the leader's init writes the summary before the journal, so that no LIST at the job's start
    shows the journal alone). The leader's sidecar looks once per lease duration and writes a summary that is gone
    again (publishing.JournalWriter.tend)."""
    names = {object_name(item) for item in items if isinstance(item, dict)}
    summary, journal = summary_name(configmap), journal_name(configmap)
    if summary in names or journal not in names:
        return None
    return (f"configmap {summary} is gone while configmap {journal} is published (was it deleted?): reading the "
            f"whole topology instead; the leader's sidecar writes the summary again within its lease duration "
            f"(--lease-seconds, 15 s by default): if it does not, see the log of the leader pod's sidecar")


def light_selectors(configmap: str, domains: Sequence[str] | None) -> tuple[str, str]:
    """(label selector, field selector) of what a pod in its own view lists and watches: the summary by name, or
    with Node labels (``domains``: its own Node's values) the summary and its blocks by their keys
    (core/publication/blocks.py)."""
    if domains is None:
        return "", f"metadata.name={summary_name(configmap)}"
    return part_selector(configmap, domains), ""


class SummaryView:
    """A large job's pod in its own view (core/publication/summary.py): its plan from the summary ConfigMap, the one
    object it reads (a few KiB, not the snapshot, and not the journal's every change), and with Node labels its own
    Node's ``domains`` and, under the topology order, its block (core/publication/blocks.py), listed with the summary
    by label. ``unsummarized`` says why this pod must read the whole topology instead: the summary cannot serve it,
    or its files name every member (core/publication/view_choice.py, asked again at each summary: a pod that becomes
    node rank 0 may become the SSH launcher). A summary that does not place this pod (not a member in the leader's
    view yet, or its block not here yet) leaves the plan as it was."""

    def __init__(self, name: str, own: RawPod, options: Options, *, ssh: bool = False,
                 domains: tuple[str, ...] | None = None) -> None:
        self.configmap, self.name, self.own, self.options, self.ssh = name, summary_name(name), own, options, ssh
        self.domains = domains
        self.blocks: dict[str, tuple[str, dict[str, Any]]] = {}  # block name -> (digest, ConfigMap) as listed
        self.last: dict[str, Any] | None = None  # the summary ConfigMap as last read
        self.plan: Plan | None = None
        self.journal: Journal | None = None
        self.unsummarized: str | None = None
        self.gone: str | None = None  # the last LIST showed the journal but no summary (``summary_gone``)
        self.changed = False  # the last journal read changed this pod's plan
        self.placing: dict[str, Any] | None = None  # the summary ConfigMap the plan is from

    def replace(self, items: list[Any]) -> None:
        self.gone = summary_gone(items, self.configmap)
        self.blocks = {}
        for item in items:
            self._hold(item)
        for item in items:
            if object_name(item) == self.name:
                self._take(item)

    def apply(self, event: WatchEvent) -> None:
        if event.type not in ("ADDED", "MODIFIED"):
            return
        if object_name(event.object) == self.name:
            self._take(event.object)
        elif self._hold(event.object) and self.last is not None:
            self._take(self.last)

    def _hold(self, configmap: dict[str, Any]) -> bool:
        """A block of this pod's domains kept by the digest of its text; whether it was one."""
        name = object_name(configmap)
        if not name.startswith(f"{self.configmap}-block-"):
            return False
        text = (configmap.get("data") or {}).get(BLOCK_KEY)
        if isinstance(text, str):
            self.blocks[name] = (block_digest(text), configmap)
        return True

    @property
    def held_blocks(self) -> list[dict[str, Any]]:
        """The blocks held, as listed (the sidecar starts from init's)."""
        return [configmap for _, configmap in self.blocks.values()]

    def _take(self, configmap: dict[str, Any]) -> None:
        self.changed = False
        self.last = configmap
        data = configmap.get("data")
        if not isinstance(data, dict) or JOURNAL_KEY not in data:
            return  # nothing published yet
        self.journal = read_journal(configmap)
        text = data.get(SUMMARY_KEY)
        if text is None:
            self.unsummarized = NO_SUMMARY
            return
        try:
            summary = read_summary(text if isinstance(text, str) else "(not a string)")
            assert summary is not None
            plan = light_plan(summary, self.own, self.options, ssh=self.ssh, domains=self.domains,
                              blocks={digest: held["data"][BLOCK_KEY] for digest, held in self.blocks.values()})
        except InputError as err:
            self.unsummarized = str(err)
            return
        if plan is None:
            return
        why = choose_view(plan, self.options, ssh=self.ssh, published=True)
        if why is not None:
            self.unsummarized = why
            return
        before = self.plan
        self.changed = before is None or before.topology != plan.topology or before.master_port != plan.master_port \
            or before.published_ports != plan.published_ports
        self.plan, self.placing = plan, configmap


READING = "reading the whole topology"  # a follower that cannot, or need not, read the summary alone
HOLDING = "this pod's files hold the whole topology"  # a pod that holds every member and writes it


def full_view_line(view: str, why: str, then: str) -> tuple[int, str]:
    """How a pod says it writes every member (``then``: what it does about it): a warning when ``--view own`` was
    asked and cannot apply, a note when ``--view auto`` chose it for a large job's pod (or the summary cannot serve
    it), a debug line where nothing else was in question (``--view full``, a small job)."""
    if view == "own":
        return logging.WARNING, f"--view own not used: {why}; {then}"
    level = logging.DEBUG if why in ("--view full", SMALL_JOB) else logging.INFO
    return level, f"{then}: {why}"


class NodeView:
    """Which of the cluster's Nodes are lost, with why (core/pods/lost.py), as the sidecar that watches the pods needs
    it: nothing else of a Node is held (one is ~12 KB as the kubelet keeps it, most of it its images); a LIST gives
    the lost Nodes alone (runtime/nodes.list_lost_nodes). ``lost_changed`` is told the lost Nodes whenever that set
    changes (and at the first LIST): a Node's status written every few minutes changes nothing."""

    def __init__(self, lost_changed: Callable[[dict[str, str]], None]) -> None:
        self.lost: dict[str, str] = {}
        self.listed = False
        self.lost_changed = lost_changed

    def replace(self, items: list[Any]) -> None:
        first, self.listed = not self.listed, True
        self._tell(dict(items), always=first)  # the first LIST: the pods held are marked, the evaluation goes on

    def apply(self, event: WatchEvent) -> None:
        if event.type == "BOOKMARK":
            return
        state = node_state(event.object)
        if state is None:
            return
        # A Node deleted takes its pods with it (the pod garbage collector's DisruptionTarget): not lost here.
        why = None if event.type == "DELETED" else why_node_lost(state)
        if self.lost.get(state.name) != why:
            lost = {name: reason for name, reason in self.lost.items() if name != state.name}
            if why is not None:
                lost[state.name] = why
            self._tell(lost)

    def _tell(self, lost: dict[str, str], *, always: bool = False) -> None:
        if always or lost != self.lost:
            self.lost = lost
            self.lost_changed(lost)
