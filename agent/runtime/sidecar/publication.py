"""A large job's publication from one sidecar's side: whether there is one to follow, the Lease its leader and
standbys contend for (election.py), and, in the pod that holds it, the writes that keep the publication equal to
the pods (publishing.JournalWriter). Small jobs have none of this: their sidecars follow the pods.

The leader's init published the topology (from 256 training pods): then only the leader reads the pods, the
others follow the publication; a standby also contends for the Lease and lists the pods once the Lease looks
abandoned (election.py). A standby taking over reads back what is published before it plans (``prepare``), then
publishes what changed in the pods it holds (``publish``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agent.core.plan.layout import Plan
from agent.core.pods.pod import object_name
from agent.core.publication.blocks import BlockMaker
from agent.core.publication.journal import (
    PublishedState,
    journal_name,
    journal_of,
    rows_options,
    state_from,
    summary_name,
)
from agent.core.publication.lease import Timing
from agent.core.publication.provenance import Writer, WriterCheck, writer_of
from agent.core.publication.published import SELECT_LABEL, select_value
from agent.core.publication.view_choice import why_full_view
from agent.errors import ApiError, ApiForbidden, InputError
from agent.k8s.async_client import AsyncApi
from agent.k8s.retrying import retried
from agent.runtime.nodes import NodeMap, own_domains
from agent.runtime.publication.election import Elector
from agent.runtime.publication.publishing import JournalWriter, ReadBack, vouch
from agent.runtime.sidecar.following import JournalFollower, Mode, Seed
from agent.runtime.tasks import race
from agent.runtime.views import (
    READING,
    PodView,
    full_view_line,
    journal_if_summary_gone,
    light_selectors,
    summary_gone,
)

log = logging.getLogger("topology_agent.sidecar")


@dataclass(frozen=True)
class Job:
    """Who this pod is in its job, as the publication names it."""

    namespace: str
    pod: str
    uid: str
    name: str  # the job's name (the ConfigMaps are <job>-topology)
    configmap: str
    owner: dict[str, Any] | None  # the pod's controller: owns the Lease and the ConfigMaps (garbage collection)


async def _own_domains(api: AsyncApi, view: PodView, options: Any, handed: list[str] | None
                       ) -> tuple[str, ...] | None:
    """This pod's Node's value per level (--topology-levels): as init handed them, else one GET of its own Node."""
    return tuple(handed) if handed is not None else await own_domains(api, view.me or {}, options)


class Publication:
    """The publication's roles in this sidecar: the journal follower, and the elector and writer of the leader
    and its standbys."""

    def __init__(self, api: AsyncApi, job: Job, follower: JournalFollower, elector: Elector) -> None:
        self.api, self.job, self.follower, self.elector = api, job, follower, elector
        self.writer: JournalWriter | None = None
        self.nodes: NodeMap | None = None  # the Nodes' labels a vouched copy carried (a standby starts from them)
        self.seed: Seed | None = None  # this pod's own publication: the pods it starts from instead of a LIST
        self.read_back: ReadBack | None = None  # the same read, for its first leadership's writer
        self.ssh = False  # the pod has the job's SSH material: what it publishes lists rank 0's hosts

    @classmethod
    async def find(cls, api: AsyncApi, job: Job, check: WriterCheck, view: PodView, *, options: Any, ssh: bool,
                   lease_seconds: int, make_follower: Callable[[], JournalFollower],
                   summary: dict[str, Any] | None = None, blocks: list[dict[str, Any]] | None = None,
                   domains: list[str] | None = None) -> tuple[Publication | None, Mode]:
        """Look for a publication (the API being away at start is waited out: it decides the mode for the pod's
        life; no RBAC for ConfigMaps means the pods). None and PODS when there is none to follow. ``summary``:
        the summary that placed this pod in its init (runtime/publication/handoff.py), followed from there without a
        LIST, with its ``blocks`` and its own Node's ``domains`` (--topology-levels: core/publication/blocks.py)."""
        # a large job's pod in its own view was handed its summary by its init (a small one's is not)
        why_full = why_full_view(options, large=summary is not None)
        light = why_full is None
        # with Node labels and no summary from init: its init said why already, or it leads (it holds every member)
        if why_full is not None and options.view != "full" and (options.levels is None or summary is not None):
            log.log(*full_view_line(options.view, why_full, READING))
        # its own view reads the summary alone, never the snapshot or the journal (unless the summary was deleted)
        collection = f"/api/v1/namespaces/{job.namespace}/configmaps"
        handed = _handed(summary, job, blocks or []) if light else None
        own = await _own_domains(api, view, options, domains if handed is not None else None) \
            if light and options.levels is not None else None
        if handed is not None:
            publication = cls(api, job, make_follower(), _elector(api, job, lease_seconds, named_leader=False))
            publication.ssh = ssh
            publication.follow_light(handed, own)
            return publication, Mode.FOLLOWER
        try:
            items, rv, light = await _looked(api, collection, job.configmap, light, own)
        except ApiForbidden as err:
            log.info("cannot look for a published topology (%s); following the pods", err)
            return None, Mode.PODS
        try:  # the rows as content keys (streamed): only whether they are there counts, and Nodes' labels; the
            # leader decodes its own rows once, below (``_own_rows``)
            journal = journal_of(items, job.configmap)
            leader = journal is not None and journal.leader == job.pod
            state = None if leader else \
                state_from(items, job.configmap, pods=False, compare_only=options.levels is None)[0]
        except InputError as err:
            log.warning("the published topology is not usable (%s); following the pods", err)
            return None, Mode.PODS
        if state is None and journal is None:
            return None, Mode.PODS
        standby = journal is not None and job.pod in journal.standby
        why, _ = await vouch(api.get_object, check, items, job.configmap)
        if why is not None and not (leader or standby):  # a follower uses the rows: their writer must be a member
            log.warning("the published topology is not used (%s); following the pods", why)
            return None, Mode.PODS
        # The leader watches the pods itself, and so does a standby whose copy is not vouched for: the copy only
        # names them (this pod's earlier incarnation, under another uid, may have written it: it rewrites it once
        # it leads). A standby follows a vouched copy as a follower does until the Lease looks abandoned.
        publication = cls(api, job, make_follower(), _elector(api, job, lease_seconds, named_leader=leader))
        publication.ssh = ssh
        await publication._start_from(state if why is None and (leader or standby) else None, leader,
                                      None if light else items, options)
        if leader or (standby and why is not None):
            return publication, Mode.CANDIDATE
        publication.follower.light = light
        publication.follower.summary.domains = own
        publication.follower.first_list = (items, rv)  # a follower starts from this LIST: no second one
        return publication, Mode.STANDBY if standby else Mode.FOLLOWER

    async def _start_from(self, vouched: PublishedState | None, leader: bool, items: list[Any] | None,
                          options: Any) -> None:
        """The Nodes' labels a ``vouched`` copy carried (with --topology-levels: none are published without), so that
        a standby need not read Nodes (a follower is given none: it plans with the labels its rows carry, and would
        hold every Node's twice; named a standby later, it reads the Nodes it lacks when it leads); the leader's own
        rows, its seed and read-back, with the labels of their Nodes as its init read them (``_own_rows``:
        ``items``, the publication listed already, or None)."""
        if vouched is not None and not vouched.compare_only:
            self.nodes = dict(vouched.node_labels())
        if leader:
            collection = f"/api/v1/namespaces/{self.job.namespace}/configmaps"
            self.seed, self.read_back, labels = await _own_rows(self.api, self.job, options, collection, items)
            if labels and options.levels is not None:  # the Nodes its init read: not read again
                self.nodes = labels

    def follow_light(self, first_list: tuple[list[dict[str, Any]], str], domains: tuple[str, ...] | None) -> None:
        """Follow the summary (and its block) from ``first_list``, what init handed over: no LIST of its own."""
        self.follower.light = True
        self.follower.summary.domains = domains
        self.follower.first_list = first_list

    def take_seed(self) -> Seed | None:
        seed, self.seed = self.seed, None
        return seed

    async def elect(self, on_leading: Callable[[bool], Awaitable[None]]) -> None:
        (await race(self.elector.run(on_leading), self._tend())).result()

    async def _tend(self) -> None:
        """While this pod publishes, once per lease duration: write again what was deleted (JournalWriter.tend)."""
        while True:
            await asyncio.sleep(self.elector.timing.duration)
            writer = self.writer
            if writer is not None and self.elector.leading:
                try:
                    await writer.tend()
                except (ApiError, InputError) as err:
                    log.info("cannot look at the published topology now (%s); looking again later", err)

    def lead(self, leading: bool, options: Any) -> None:
        """Leading from now on, or not: a new leader starts from what is published now, read back at its first
        publication."""
        self.writer = None
        if leading:
            job = self.job
            self.writer = JournalWriter(self.api, job.namespace, job.configmap, job=job.name, options=options,
                                        leader=job.pod, leader_uid=job.uid, owner=job.owner, ssh=self.ssh)

    def publishing(self, mode: Mode) -> JournalWriter | None:
        """The writer while this pod holds the Lease as a candidate: the one pod that publishes."""
        if self.writer is None or not self.elector.leading or mode != Mode.CANDIDATE:
            return None
        return self.writer

    async def prepare(self, mode: Mode) -> bool:
        """A new leader reads back what is published before it plans (``JournalWriter.prepare``); True when it
        did. A failure is left to ``publish``, which reads again and says why."""
        writer = self.publishing(mode)
        if writer is None or writer.publisher is not None:
            return False
        read, self.read_back = self.read_back, None
        with contextlib.suppress(ApiError, InputError):
            await writer.prepare(read)
        return True

    def seq(self) -> int | None:
        writer = self.writer
        return writer.publisher.state.seq if writer is not None and writer.publisher is not None else None

    async def publish(self, mode: Mode, view: PodView, nodes: NodeMap, standby: tuple[str, ...],
                      plan: Plan | None, pods_rv: str = "", blocks: BlockMaker | None = None) -> bool:
        """Publish what changed in the pods held (never the empty view before the first LIST: the caller
        publishes only a valid plan); True when a sequence was written. ``pods_rv``: the resourceVersion the pods
        held are current to (read with them, before any await); ``blocks``: the maker of ``plan``'s blocks."""
        writer = self.publishing(mode)
        if writer is None:
            return False
        touched = view.drain()
        try:
            if await writer.publish(view.pods, touched, nodes, standby, plan=plan, pods_rv=pods_rv, blocks=blocks):
                return True
            self.elector.leading = False
        except (ApiError, InputError) as err:
            log.warning("publishing failed (%s); trying again at the next change", err)
            writer.publisher = None
            view.renew_all()
        return False

    async def release(self) -> None:
        await self.elector.release()


def _elector(api: AsyncApi, job: Job, lease_seconds: int, *, named_leader: bool) -> Elector:
    """This pod's contender for the publisher Lease (it contends only once it leads or stands by)."""
    return Elector(api, job.namespace, job.configmap, job.pod, owner=job.owner, timing=Timing(lease_seconds),
                   named_leader=named_leader, uid=job.uid)


def _handed(summary: dict[str, Any] | None, job: Job, blocks: list[dict[str, Any]]) -> tuple[list[Any], str] | None:
    """Init's summary as a first LIST, when it is this job's and names this pod neither the publisher nor a
    standby: those list the publication themselves (the file is the trainer's to write too, and must never make a
    pod contend for the Lease). A summary that changed since comes with the watch from its resourceVersion."""
    if summary is None or object_name(summary) != summary_name(job.configmap):
        return None
    try:
        _, journal = state_from([summary], job.configmap, pods=False)
    except InputError:
        return None
    if journal is None or journal.leader == job.pod or job.pod in journal.standby:
        return None
    return [summary, *blocks], summary["metadata"]["resourceVersion"]


async def _looked(api: AsyncApi, collection: str, configmap: str, light: bool,
                  domains: tuple[str, ...] | None) -> tuple[list[Any], str, bool]:
    """The publication's objects as listed, and whether they are its summary alone (``light``, with its blocks for
    a pod of ``domains``): a summary that is gone while its journal is published is followed by the whole
    topology, as when it cannot serve this pod."""
    items, rv = await _listed(api, collection, configmap, light, domains)
    looked = await retried(lambda: journal_if_summary_gone(api, collection, configmap, items),
                           what="look for a published topology") if light else []
    gone = summary_gone(looked, configmap) if light else None
    if looked and gone is None:  # published between the two LISTs: the summary is there now
        items, rv = await _listed(api, collection, configmap, light, domains)
    if gone is not None:
        log.warning("%s", gone)
        light = False
        items, rv = await _listed(api, collection, configmap, light, domains)
    return items, rv, light


async def _listed(api: AsyncApi, collection: str, configmap: str, light: bool,
                  domains: tuple[str, ...] | None) -> tuple[list[Any], str]:
    """The summary (with its blocks: ``light_selectors``) in its own view, or the snapshot, journal and summary
    by their label."""
    label, field = light_selectors(configmap, domains) if light else \
        (f"{SELECT_LABEL}={select_value(configmap)}", "")
    return await retried(lambda: api.list_objects(collection, label_selector=label, field_selector=field),
                         what="look for a published topology")


async def _own_rows(api: AsyncApi, job: Job, options: Any, collection: str,
                    items: list[Any] | None) -> tuple[Seed | None, ReadBack | None, NodeMap]:
    """The pods as this very pod published them (its init, or its sidecar before a restart), with the pods'
    resourceVersion they are current to: its sidecar watches from there instead of listing every pod (at 16384
    pods of ~9.6 KB, 155 MiB). None (and a LIST) when the publication does not say where it stands, was cut with
    other options, or was written by anyone else (another pod, or this pod's name under another uid). The same
    streamed read is its publisher's read-back (rows kept as content keys): the snapshot is decoded once, never
    whole (at 16384 pods the whole document and both reads would be ~40 MB of the publisher's peak). With the
    pods, the labels of their Nodes as the rows carry them (``--topology-levels``): the sidecar does not read every
    Node again (16384 Nodes are ~160 pages, seconds in which the kubelet's writes pile up into one change too large
    for the journal). ``items``: the publication as listed already (None: list it)."""
    try:
        listed: list[Any] = items if items is not None else (await retried(lambda: api.list_objects(
            collection, label_selector=f"{SELECT_LABEL}={select_value(job.configmap)}"),
            what="read the publication"))[0]
        state, journal = state_from(listed, job.configmap, compare_only=True)
    except (ApiError, InputError) as err:
        log.info("listing the pods: the published topology cannot be started from (%s)", err)
        return None, None, {}
    header = next((i for i in listed if object_name(i) == journal_name(job.configmap)), None)
    if state is None or journal is None or header is None or writer_of(header) != Writer(job.pod, job.uid) or \
            not journal.pods_rv or journal.rows_options != rows_options(options):
        return None, None, {}
    pods, labels = state.hand_over_pods(), state.hand_over_node_labels()  # the view holds them; the writer, the keys
    return (pods, journal.pods_rv), (listed, state, journal), dict(labels)
