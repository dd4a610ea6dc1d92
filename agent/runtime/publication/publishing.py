"""Reading and writing a large job's published topology (see core/publication/published.py and
core/publication/journal.py).

The leader's init (the holder of the Lease ``<job>-topology``: core/publication/leading.py) creates the snapshot
``<job>-topology`` (sequence 1), the journal ``<job>-topology-journal`` and the summary ``<job>-topology-summary``;
from then on its sidecar keeps them current. A pod that holds every member makes one LIST in init (by label: the
snapshot, the journal and the summary together, from the watch cache), then watches the journal: ~27 B per pod of
the job once, ~2 KB per change. A pod in its own view lists and watches the summary alone, by name: a few KiB at
start, and one event per change of what the summary says (rank 0, the sizes, the runs), none while other pods' rows
move. Each reader GETs the pod that wrote them once (core/publication/provenance.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.core.model import Options, RawPod
from agent.core.plan.layout import NodeLabels, Plan
from agent.core.pods.pod import object_name
from agent.core.publication.blocks import BlockMaker, Made
from agent.core.publication.journal import (
    JOURNAL_KEY,
    PODS_RV_KEY,
    ROWS_KEY,
    Journal,
    PublishedState,
    Publisher,
    journal_body,
    journal_name,
    state_from,
    summary_name,
)
from agent.core.publication.provenance import Writer, WriterCheck, writer_of
from agent.core.publication.published import SELECT_LABEL, configmap_body, select_value
from agent.core.publication.summary import SUMMARY_KEY, summarize_with_blocks, summary_text
from agent.core.publication.view_choice import LARGE_JOB
from agent.errors import ApiConflict, ApiForbidden, ApiNotFound
from agent.k8s.retrying import retried
from agent.runtime.memory import release_memory
from agent.runtime.publication.block_writing import BlockWriter

if TYPE_CHECKING:  # the protocol's module imports aiohttp, which init does not load (k8s/blocking.py)
    from agent.k8s.async_client import AsyncApi

log = logging.getLogger("topology_agent.published")


def now_wall() -> str:
    """A Lease's MicroTime."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1e6) % 1_000_000:06d}Z"


def lease_path(namespace: str, name: str = "") -> str:
    collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    return f"{collection}/{name}" if name else collection


async def vouch(get: Callable[..., Awaitable[dict[str, Any]]], check: WriterCheck, items: list[Any],
                name: str) -> tuple[str | None, bool]:
    """Why the published objects among ``items`` must not be used (the first writer refused), or None; and
    whether that writer was only superseded (re-created: it publishes again). Each new writer pod is read once
    (core/publication/provenance.py), as metadata: its uid and labels are all the check reads (~1 KiB of a pod's ~9 KiB,
    in every pod of a large job)."""
    for writer, what in check.pending(items, name):
        if writer in check.superseded_by:  # still waiting for it to publish again: its pod was read already
            return check.superseded_by[writer], True
        path = check.path(writer)
        try:
            pod: Any = await get(path, metadata_only=True) if path is not None else None
        except ApiNotFound:
            pod = None
        except ApiForbidden as err:
            return f"configmap {what}: cannot read its writer pod '{writer.name}' ({err})", False
        why = check.judge(writer, pod, what)
        if why is not None:
            if check.superseded(writer, pod):
                check.superseded_by[writer] = why
                return why, True
            return why, False
    return None, False


def summary_data(publisher: Publisher, plan: Plan | None, options: Options, *, ssh: bool = False,
                 blocks: BlockMaker | None = None) -> tuple[dict[str, str], str, list[Made]]:
    """The summary ConfigMap's data: the journal's header with no changes and, unless the job asks every pod to
    read every member (``--view full``), the summary of a plan that can be summarized (core/publication/summary.py);
    what it says (``said``), which decides whether it is written again; and the blocks it names (under the
    topology order: core/publication/blocks.py, made by ``blocks``), written before it."""
    seq = str(publisher.state.seq)
    data = {**publisher.journal_data(), "base": seq, JOURNAL_KEY: "[]"}
    for key in (PODS_RV_KEY, ROWS_KEY):  # where the rows stand in the pods' history: the publisher's own
        data.pop(key, None)
    # with Node labels a job under LARGE_JOB training pods publishes only so that one pod reads the Nodes: its pods
    # write every member (view_choice.why_full_view), and no summary is made for them
    wanted = plan is not None and options.view != "full" and (
        options.levels is None or options.view == "own" or plan.topology.nnodes >= LARGE_JOB)
    summary, made = summarize_with_blocks(plan, seq=publisher.state.seq, options=options, ssh=ssh, blocks=blocks) \
        if plan is not None and wanted else (None, [])
    if summary is not None:
        data[SUMMARY_KEY] = summary_text(summary)
    return data, said(data), made


def said(data: Any) -> str:
    """What a summary ConfigMap's data says to a pod in its own view: all of it but the sequence. A new leader
    compares what it would write with what is published, so that the same summary is not sent to every such
    pod again."""
    data = data if isinstance(data, dict) else {}
    summary: Any = None
    with contextlib.suppress(TypeError, ValueError):
        summary = json.loads(data.get(SUMMARY_KEY, "null"))
    text = summary_text({**summary, "seq": 0}) if isinstance(summary, dict) else ""
    return json.dumps([data.get("leader"), data.get("leaderUid"), data.get("standby"), text])


def first_publisher(namespace: str, options: Options, *, job: str, leader: str, leader_uid: str) -> Publisher:
    """The publisher of a job's first publication (sequence 1), before anything is published."""
    return Publisher(PublishedState(job=job, namespace=namespace), options, leader=leader, leader_uid=leader_uid)


Retry = Callable[[Callable[[], Awaitable[Any]], str], Awaitable[Any]]


async def _retried(call: Callable[[], Awaitable[Any]], what: str) -> Any:
    return await retried(call, what=what)


async def publish_first(api: AsyncApi, namespace: str, name: str, pods: list[RawPod], options: Options, *, job: str,
                  leader: str, leader_uid: str, owner: dict[str, Any] | None, standby: tuple[str, ...] = (),
                  nodes: NodeLabels | None = None, plan: Plan | None = None,
                  publisher: Publisher | None = None, pods_rv: str = "", retry: Retry = _retried,
                  ssh: bool = False, blocks: BlockMaker | None = None) -> bool:
    """The leader's init: the snapshot, the journal (with the summary of ``plan``: core/publication/summary.py); the
    Lease is held already (runtime/publication/leading.py). False when the snapshot exists already (this init runs again
    after a restart, an earlier incarnation of a member or another leader wrote it, or someone else did): the leader's
    files still come from the pods it listed, never from that ConfigMap. ``publisher``: one made by
    ``first_publisher``, with the rows staged while the pods arrived. ``pods_rv``: the pods' resourceVersion
    ``pods`` are current to (the leader's sidecar watches from there), "" when a LIST from there would bring
    pods that ``pods`` left out. ``retry``: how a write is tried again (init's gives up at its deadline).
    ``ssh``: the job's pods have its SSH material (the summary lists rank 0's hosts: core/publication/summary.py).
    ``blocks``: the maker of ``plan``'s blocks (init's own view makes them with it too)."""
    publisher = publisher or first_publisher(namespace, options, job=job, leader=leader, leader_uid=leader_uid)
    publisher.standby = standby  # named from the start: the admission policy lets only them take over
    publisher.pods_rv = pods_rv
    publisher.change({p["metadata"]["name"]: p for p in pods}, [p["metadata"]["name"] for p in pods], nodes,
                     journal=False)
    seq = publisher.state.seq
    data = publisher.snapshot_packed()
    publisher.snapshot_written(seq)
    publisher.start_from_snapshot()
    collection = f"/api/v1/namespaces/{namespace}/configmaps"
    body = configmap_body(name, data, generation=seq, leader=leader, leader_uid=leader_uid, owner=owner,
                          standby=standby)
    try:
        await retry(lambda: api.create(collection, body), "publish topology")
    except ApiConflict:
        log.warning("configmap %s exists already (this init ran before, or another writer made it): not followed; "
                    "this pod's files come from the pods it listed, and the pod that wrote it publishes if it is one "
                    "of the job's", name)
        return False
    # The summary before the journal: a LIST that shows the journal and not the summary then means the summary
    # was deleted (views.summary_gone), never that a reader came between the two writes.
    summary, _, made = summary_data(publisher, plan, options, ssh=ssh, blocks=blocks)
    await BlockWriter(api, namespace, name, owner=owner).write(made)  # each before the summary that names it
    await _create_or_replace(api, collection, journal_body(name, summary, owner=owner, name=summary_name(name)),
                             retry)
    await _create_or_replace(api, collection, journal_body(name, publisher.journal_data(), owner=owner), retry)
    log.info("published the topology as configmap %s (%d bytes compressed, sequence %d) and its journal", name,
             len(data), seq)
    return True


async def existing_copy(api: AsyncApi, namespace: str, name: str, *,
                        summary_only: bool = False) -> dict[str, Any] | None:
    """One of a publication's objects as it is (the summary first: a few KiB, the snapshot last), for the pod it
    names as its writer; None when none is there."""
    collection = f"/api/v1/namespaces/{namespace}/configmaps"
    for each in (summary_name(name),) if summary_only else (summary_name(name), journal_name(name), name):
        try:
            return await api.get_object(f"{collection}/{each}")
        except ApiNotFound:
            continue
    return None


async def _create_or_replace(api: AsyncApi, collection: str, body: dict[str, Any], retry: Retry) -> None:
    """The journal or the summary, created; replaced when an init that stopped between the writes left one."""
    name = body["metadata"]["name"]
    try:
        await retry(lambda: api.create(collection, body), f"publish {name}")
    except ApiConflict:
        await retry(lambda: api.replace(f"{collection}/{name}", body), f"publish {name}")


# A publication as read back for its writer: the objects listed, their state (rows as content keys alone, no pods:
# ``compare_only``) and the journal.
ReadBack = tuple[list[dict[str, Any]], PublishedState | None, Journal | None]


@dataclass
class SummaryState:
    """The leader's summary: its data as last made in this leadership (``made``), and what the published one says
    (``said``: read back, then what this leader wrote)."""

    made: dict[str, str] | None = None
    said: str = ""


class JournalWriter:
    """The leader's side of the publication, in its sidecar: the journal after every change, the snapshot when it
    is due (core/publication/journal.py), the summary when what it says changes. Each write carries the resourceVersion
    this leader last wrote, so a deposed leader's late write fails (409) instead of overwriting its successor's.
    ``tend`` writes again any of the three that was deleted (a summary is otherwise written only when it says
    something new, and pods in their own view would read the whole topology until then)."""

    def __init__(self, api: AsyncApi, namespace: str, name: str, *, job: str, options: Options, leader: str,
                 leader_uid: str, owner: dict[str, Any] | None, ssh: bool = False) -> None:
        self.api, self.namespace, self.name, self.job = api, namespace, name, job
        self.options, self.owner = options, owner
        self.me = Writer(leader, leader_uid)  # this leader, as the objects it writes name it
        self.ssh = ssh  # the job's pods have its SSH material: the summary lists rank 0's hosts
        self.publisher: Publisher | None = None  # what this leader has published, and the journal
        self.written_rv: dict[str, str] = {}
        self.rewrite_snapshot = False  # the snapshot names another writer: rewrite it after the next journal
        self.again: set[str] | None = None  # read back, not published yet: every pod, and every row read
        self.summary = SummaryState()
        self.writing = asyncio.Lock()  # ``publish`` and ``tend`` write one at a time
        self.blocks = BlockWriter(api, namespace, name, owner=owner)  # the topology order's, and the last made

    @property
    def collection(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps"

    async def _start(self, read: ReadBack | None = None) -> set[str]:
        """Read what is published now: a new leader continues its sequence. The pods to publish again. ``read``:
        what this pod read of it already (its sidecar started from the rows it published), not read again."""
        if read is None:
            items, _ = await self.api.list_objects(self.collection,
                                                   label_selector=f"{SELECT_LABEL}={select_value(self.name)}")
            state, journal = state_from(items, self.name, pods=False, compare_only=True)
        else:
            items, state, journal = read
        self.written_rv = {i["metadata"]["name"]: i["metadata"].get("resourceVersion", "") for i in items}
        if state is None:  # nothing usable published: start a new sequence after the journal's
            state = PublishedState(job=self.job, namespace=self.namespace, seq=journal.seq if journal else 0,
                                   snapshot_seq=-1)
            journal = None
        self.publisher = Publisher(state, self.options, leader=self.me.name, leader_uid=self.me.uid,
                                   journal=journal.entries if journal else ())
        self.publisher.standby = journal.standby if journal is not None and journal.leader == self.me.name else ()
        summary = next((i for i in items if object_name(i) == summary_name(self.name)), None)
        self.summary.said = said(summary.get("data")) if summary is not None else ""
        self.summary.made = None
        snapshot = next((i for i in items if object_name(i) == self.name), None)
        # A snapshot another pod wrote (the leader before a takeover, or this pod's earlier incarnation) is
        # rewritten right after the first journal (what followers wait for), so that a reader that starts later
        # finds this pod as the writer of both, whatever became of the pod before (core/publication/provenance.py).
        self.rewrite_snapshot = snapshot is not None and writer_of(snapshot) != self.me
        return set(state.rows)  # every row is compared again: what changed while nobody published goes out

    async def prepare(self, read: ReadBack | None = None) -> None:
        """Read back what is published, once per leadership (``read``: read already). The sidecar calls it before
        it plans: the read-back's transient (~10 MB at 16384 pods) then comes before the plan's memory, not on top
        of it."""
        if self.publisher is None:
            self.again = await self._start(read)
            # The read-back's text and ConfigMap are freed, but glibc keeps them in the heap, where the objects
            # made next cannot reuse them (Python's small objects live in arenas of their own).
            release_memory()

    async def publish(self, pods: dict[str, RawPod], touched: set[str], nodes: NodeLabels,
                      standby: tuple[str, ...], plan: Plan | None = None, pods_rv: str = "",
                      blocks: BlockMaker | None = None) -> bool:
        """Put what changed where the followers read it (``plan``: the same pods' plan, summarized for
        ``--view own``); False when another pod changed the publication (this pod stops publishing).
        ``pods_rv``: the pods' resourceVersion ``pods`` are current to, taken with ``touched``; ``blocks``: the
        maker of the plans' blocks (the sidecar's own view makes the same plan's with it)."""
        await self.prepare()
        if self.again is not None:
            touched, self.again = touched | set(pods) | self.again, None
        publisher = self.publisher
        assert publisher is not None
        publisher.pods_rv = pods_rv  # said with the next journal written (a change of it alone writes none)
        entry = publisher.change(pods, touched, nodes)
        if entry is None and publisher.standby == standby and not self.rewrite_snapshot \
                and self.summary.made is not None:
            return True  # no row changed, so neither did the plan the summary is made of
        publisher.standby = standby
        self.summary.made, saying, self.blocks.made = summary_data(publisher, plan, self.options, ssh=self.ssh,
                                                                   blocks=blocks)
        if entry is None and saying == self.summary.said and not self.rewrite_snapshot:
            return True
        async with self.writing:
            return await self._written(publisher, self.summary.made, saying)

    async def _written(self, publisher: Publisher, summary: dict[str, str], saying: str) -> bool:
        """``publish``'s writes: the snapshot when due, the journal (a large change's parts one after another
        first), the summary when it says something new.
        The journal and the summary (after its blocks) are written at once: their readers are not the same pods
        (a pod in its own view reads the summary alone), and neither waits for the other's round trip."""
        try:
            if publisher.snapshot_due:
                await self._write_snapshot(publisher, self._write)
            for part in publisher.take_lead_in():  # a large change a part at a time, each applied by the followers
                await self._write(journal_name(self.name), journal_body(self.name, part, owner=self.owner))
            writes = [self._write(journal_name(self.name), journal_body(self.name, publisher.journal_data(),
                                                                        owner=self.owner))]
            if saying != self.summary.said:  # only when it says something new: every pod in its own view gets it
                writes.append(self._summary_written(summary, saying))
            failed = [out for out in await asyncio.gather(*writes, return_exceptions=True) if out is not None]
            if failed:
                raise failed[0]
            if self.rewrite_snapshot:
                await self._write_snapshot(publisher, self._write)
        except ApiConflict:
            log.warning("the published topology was changed by another pod; no longer publishing")
            self.publisher = None
            return False
        return True

    async def _summary_written(self, summary: dict[str, str], saying: str) -> None:
        """The blocks the summary names, then the summary."""
        await self.blocks.write(self.blocks.made)
        await self._write(summary_name(self.name), journal_body(self.name, summary, owner=self.owner,
                                                                name=summary_name(self.name)))
        self.summary.said = saying

    async def _write_snapshot(self, publisher: Publisher,
                              write: Callable[[str, dict[str, Any]], Awaitable[object]]) -> None:
        """The snapshot at the sequence published now, written by this pod."""
        seq = publisher.state.seq
        await write(self.name, configmap_body(self.name, publisher.snapshot_packed(), generation=seq,
                                              leader=self.me.name, leader_uid=self.me.uid, owner=self.owner,
                                              standby=publisher.standby))
        publisher.snapshot_written(seq)
        self.rewrite_snapshot = False

    async def tend(self) -> None:
        """Write again whichever of the snapshot, the summary and the journal is gone (a user's ``kubectl delete``,
        a cleanup script): each is otherwise written again only at its next change, and the summary only when
        what it says changes, which may be never while the job runs. One LIST of the three objects' metadata (no
        data: ~1.7 KiB from the sandbox, more with managedFields) per call; the sidecar calls it once per lease
        duration. Only creates: an object found meanwhile (a LIST from the API server's cache may lag a write) is
        left as it is."""
        publisher = self.publisher
        if publisher is None or self.summary.made is None:  # not published in this leadership: nothing to compare
            return
        items, _ = await self.api.list_objects(self.collection, metadata_only=True,
                                               label_selector=f"{SELECT_LABEL}={select_value(self.name)}")
        there = {object_name(item) for item in items}
        # the snapshot before the journal that needs it, the summary before the journal (views.summary_gone)
        gone = [name for name in (self.name, summary_name(self.name), journal_name(self.name)) if name not in there]
        async with self.writing:
            if self.publisher is not publisher or self.summary.made is None:  # read back again meanwhile
                return
            await self.blocks.tend()
            for name in gone:
                if name == self.name:
                    await self._write_snapshot(publisher, self._create)
                elif name == journal_name(self.name):
                    await self._create(name, journal_body(self.name, publisher.journal_data(), owner=self.owner))
                elif await self._create(name, journal_body(self.name, self.summary.made, owner=self.owner, name=name)):
                    self.summary.said = said(self.summary.made)

    async def _create(self, name: str, body: dict[str, Any]) -> bool:
        """``tend``'s write of an object that was gone; False when it is there after all."""
        try:
            written = await self.api.create(self.collection, body)
        except ApiConflict:
            return False
        self.written_rv[name] = written.get("metadata", {}).get("resourceVersion", "")
        seq = self.publisher.state.seq if self.publisher is not None else 0
        log.warning("configmap %s was gone (deleted?); wrote it again at sequence %d (the leader writes its "
                    "publication again within a lease duration: deleting it does not reset the job)", name, seq)
        return True

    async def _write(self, name: str, body: dict[str, Any]) -> None:
        """Overwrite the version this leader last saw (create it if it is gone); retried while the API is away."""
        async def attempt() -> None:
            rv = self.written_rv.get(name, "")
            if rv:
                body["metadata"]["resourceVersion"] = rv
                try:
                    written = await self.api.replace(f"{self.collection}/{name}", body)
                except ApiNotFound:
                    self.written_rv[name] = rv = ""
            if not rv:
                body["metadata"].pop("resourceVersion", None)
                written = await self.api.create(self.collection, body)
            self.written_rv[name] = written.get("metadata", {}).get("resourceVersion", "")

        seq = self.publisher.state.seq if self.publisher is not None else 0
        await retried(attempt, what=f"publishing sequence {seq}")
