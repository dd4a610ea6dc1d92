"""A large job's publication, from init: who leads (the Lease, core/publication/leading.py), the guard that may
take the lead over while it waits, and the followers' reads of the publication (its summary for a pod's own view,
else the snapshot and the journal), each object's writer vouched for before it is used."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from agent.core import Rendered, render_plan, render_pod
from agent.core.model import RawPod
from agent.core.publication.journal import PublishedState
from agent.core.publication.leading import must_publish_again
from agent.core.publication.lease import Record, Timing
from agent.core.publication.provenance import Writer, WriterCheck, writer_of
from agent.core.publication.published import SELECT_LABEL, select_value
from agent.core.publication.view_choice import why_full_view
from agent.core.report.events import Occurrence
from agent.errors import ApiError, ApiForbidden, ApiNotFound, GangTimeout
from agent.k8s.blocking import Blocking
from agent.k8s.core import WatchEvent
from agent.k8s.reflector import AsyncOps, Reflector, aclose
from agent.runtime.nodes import own_domains
from agent.runtime.publication.leading import InitLease
from agent.runtime.publication.publishing import existing_copy, vouch
from agent.runtime.views import (
    READING,
    PublicationView,
    SummaryView,
    full_view_line,
    journal_if_summary_gone,
    light_selectors,
)

if TYPE_CHECKING:  # the protocol's module imports aiohttp, which init does not load
    from agent.k8s.async_client import AsyncApi
    from agent.runtime.init import Init, Source

log = logging.getLogger("topology_agent.init")


async def elect(init: Init, me: RawPod, source: Source) -> bool:
    """Whether this init leads a large job's publication (core/publication/leading.py): a training pod's init looks
    at the Lease once (a guard again while it waits); a pod that does not train follows, and looks at nothing."""
    if not source.training:
        return False
    s = init.settings
    check = writer_check(init, me, source)

    async def judge(record: Record) -> str | None:
        """The holder pod, read once as metadata: accepted, it is the writer of what this pod reads."""
        writer = Writer(record.holder, record.holder_uid)
        path = check.path(writer)
        if path is None:
            return f"{record.holder[:80]!r} is not a pod name"
        try:
            pod: Any = await init.calls.retried(lambda: init.api.get_object(path, metadata_only=True),
                                                f"get pod {record.holder}")
        except ApiNotFound:
            pod = None
        except ApiForbidden:
            return None  # cannot tell: the Lease is followed
        uid = record.holder_uid or (pod or {}).get("metadata", {}).get("uid") or ""
        return check.vet(Writer(record.holder, uid), pod)

    lease = InitLease(init.api, s.namespace, source.configmap, s.pod_name, owner=owner_of(me),
                      timing=Timing(s.lease_seconds), clock=init.calls.clock,
                      blocking=init.api.client if isinstance(init.api, Blocking) else None,
                      uid=me.get("metadata", {}).get("uid") or "", judge=judge)
    try:
        leads = await lease.claim(init.calls.retried)
    except ApiForbidden as err:
        log.warning("cannot read or write lease %s (%s); %s, without leader failover (grant leases: "
                    "manifests/rbac)", source.configmap, err,
                    "this pod, rank 0, publishes" if source.rank_zero else "the pod of rank 0 publishes")
        return source.rank_zero
    init.part.lease = lease
    return leads and await lead_now(init, me, source)


async def lead_now(init: Init, me: RawPod, source: Source) -> bool:
    """This init holds the Lease (it took it first, or a guard took it over): it leads, renewing the Lease,
    unless a copy a pod of this job wrote is there, whose writer must publish again (``give_way``: this init
    then waits for it as a follower does)."""
    assert init.part.lease is not None
    if await give_way(init, me, source, first=True):
        return False
    init.part.lease.keep()
    return True


async def give_way(init: Init, me: RawPod, source: Source, *, first: bool = False) -> bool:
    """A publication is there already, written by a pod of this job (its earlier incarnation, or a leader that
    took the Lease meanwhile): only that pod may write over it, so it gets the Lease, and True. ``first``:
    before this leader lists the pods, the summary alone is looked for (one GET, a 404 at a job's first
    start); after its snapshot create found one, any of the three. A copy this pod wrote is its own to
    continue; one no member wrote is left to the readers, who refuse it."""
    lease = init.part.lease
    if lease is None or not lease.holding:
        return False
    try:
        copy = await existing_copy(init.api, init.settings.namespace, source.configmap, summary_only=first)
        writer = writer_of(copy) if copy is not None else None
        if copy is None or writer is None or writer.name in ("", init.settings.pod_name):
            return False
        why, superseded = await vouch(init.api.get_object, writer_check(init, me, source), [copy],
                                      source.configmap)
    except ApiError as err:
        log.info("cannot tell who wrote configmap %s (%s); keeping lease %s", source.configmap, err, lease.name)
        return False
    if why is not None and not superseded:
        return False
    await lease.hand_to(writer.name)
    return True


def writer_check(init: Init, me: RawPod, source: Source) -> WriterCheck:
    """Who may have written what this pod reads (core/publication/provenance.py): one check for init's life, so a
    writer read once (the Lease's holder, say) is not read again."""
    s = init.settings
    if init.part.check is None:
        init.part.check = WriterCheck(source.controller, s.options, source.me.job, s.namespace, init.roster,
                                      me=Writer(s.pod_name, me.get("metadata", {}).get("uid") or ""))
    return init.part.check


async def follow(init: Init, me: RawPod, source: Source) -> Rendered | None:
    """A follower of a large job: its plan from the summary (its own view) or its pods from the snapshot;
    None when the publication cannot be used (said in one line: the caller reads the pods instead), or when
    this pod leads from now on (``leading``: a guard took the Lease over, or the copy is this pod's own)."""
    s = init.settings
    init.part.followed = True
    if init.ssh is not None:  # its keys and certificate are made once the wait is over: import their code now
        import agent.ssh.material  # noqa: F401  (~30 ms on the start-up path of every pod of an SSH job)
    check = writer_check(init, me, source)
    init.reads.writers = check.accepted  # the writers vouched for: the sidecar need not read them again
    why_full = why_full_view(s.options, large=source.large)
    files_dir = str(s.out_dir.absolute())
    if why_full is not None and s.options.view != "full":
        log.log(*full_view_line(s.options.view, why_full, READING))
    elif why_full is None:
        plan = await _summary(init, me, source, check)
        if plan is not None:
            return render_plan(plan, s.options, generation=init.rerun.generation, files_dir=files_dir)
    if init.part.leading:
        return None
    published = await _published(init, source, check)
    if published is None:
        return None
    init.held.published = published
    mine = with_placement(me, published.pods[s.pod_name])
    pods = [mine if name == s.pod_name else pod for name, pod in published.pods.items()]
    if await init.read_claims(pods):
        s = init.settings
    return render_pod(pods, s.pod_name, s.options, generation=init.rerun.generation, memo=init.memo,
                      files_dir=files_dir,
                      nodes=published.node_labels(), checked=True)  # the published rows were checked


async def _published(init: Init, source: Source, check: WriterCheck) -> PublishedState | None:
    """The published state once it includes this pod; ``GangTimeout`` at the deadline. One LIST by label reads
    the snapshot and the journal together; while this pod is not in them yet, a WATCH with the same label
    brings the publisher's writes in order (a snapshot always before the journal that needs it)."""
    s, name = init.settings, source.configmap
    view, gate = PublicationView(name), _gate(init, check, name)
    gate.superseded_then = view.clear
    log.info("waiting for %s to publish configmap %s", _publisher(init), name)
    init.events.stand(_publication_wait(init, name))
    ops = _vouched_ops(init, gate, label=f"{SELECT_LABEL}={select_value(name)}")
    reflector = await init.calls.reflect(f"configmap {name}", ops, view,
                                         lambda: init.part.leading or gate.refused is not None or view.has(s.pod_name))
    init.events.stand(None)
    if init.part.leading:
        return None
    if gate.refused is not None:
        log.warning("the published topology is not used (%s); reading the pods instead", gate.refused)
        init.events.tell(Occurrence("PublicationRefused", f"the published topology {name} is not used "
                                                          f"({gate.refused}); reading the pods instead"))
        return None
    if not view.has(s.pod_name):
        raise GangTimeout(f"timed out waiting for the job's publisher to publish configmap {name} (with pod "
                          f"'{s.pod_name}'){_last(reflector)}; {_look_at(init)}; "
                          f"kubectl get configmap {name} -n {s.namespace}")
    assert view.state is not None
    log.info("read the published topology %s: sequence %d, %d pods", name, view.state.seq, len(view.state.pods))
    return view.state


async def _summary(init: Init, me: RawPod, source: Source, check: WriterCheck) -> Any:
    """This pod's own view: its plan from the published summary once it places this pod; None (said in one
    line) when it cannot be used, or its files name every member (``--view auto``), or it is gone while the
    journal is published (deleted: ``summary_gone``), or this pod leads from now on. Only the summary is
    listed and watched, by name (a few KiB, not the snapshot); when it is not there, the journal's metadata
    says whether it was deleted."""
    s = init.settings
    domains = await own_domains(init.api, me, s.options)  # its Node's labels: its block of the order (blocks.py)
    view = SummaryView(source.configmap, me, s.options, ssh=init.ssh is not None, domains=domains)
    label, field = light_selectors(source.configmap, domains)
    gate = _gate(init, check, source.configmap)
    journal = view.name
    log.info("waiting for %s to publish its summary in configmap %s (--view %s)", _publisher(init), journal,
             s.options.view)
    init.events.stand(_publication_wait(init, journal))
    reflector = await init.calls.reflect(
        f"configmap {journal}", _vouched_ops(init, gate, label=label, field=field, summary_of=source.configmap),
        view,
        lambda: init.part.leading or gate.refused is not None or view.unsummarized is not None or
        view.plan is not None or view.gone is not None)
    init.events.stand(None)
    if init.part.leading:
        return None
    if gate.refused is None and view.unsummarized is None and view.plan is None and view.gone is None:
        raise GangTimeout(f"timed out waiting for the job's publisher to publish configmap {journal} placing "
                          f"pod '{s.pod_name}'{_last(reflector)}; {_look_at(init)}; "
                          f"kubectl get configmap {journal} -n {s.namespace}")
    if gate.refused is not None:
        log.warning("the published summary is not used (%s)", gate.refused)
    elif view.gone is not None and view.plan is None:
        log.warning("%s", view.gone)
    elif view.plan is None:
        log.log(*full_view_line(s.options.view, view.unsummarized or "", READING))
    else:
        init.reads.summary = view.placing  # its sidecar watches it from here, without a LIST of its own
        init.reads.blocks, init.reads.domains = view.held_blocks, list(domains) if domains is not None else None
    return view.plan


def _gate(init: Init, check: WriterCheck, name: str) -> Vouched:
    gate = Vouched(init.api, check, name, me=init.settings.pod_name)
    gate.publish_again = lambda why: _publish_again(init, why)
    return gate


def _publish_again(init: Init, why: str) -> None:
    """The copy found is this pod's earlier incarnation's: no other pod may write over it
    (core/publication/leading.py)."""
    log.warning("this pod publishes the topology again: %s", why)
    init.part.leading = True


def _vouched_ops(init: Init, gate: Vouched, *, label: str = "", field: str = "",
                 summary_of: str = "") -> AsyncOps:
    """The published ConfigMaps' list and watch, each object's writer vouched for before a view sees it
    (``summary_of``: a LIST of that publication's summary says whether its journal is there when the summary
    is not: ``journal_if_summary_gone``). A guard looks at the Lease before each watch, and its watches end
    every few seconds so that it does (``guarding``)."""
    collection = f"/api/v1/namespaces/{init.settings.namespace}/configmaps"
    guard = guarding(init)

    async def listed() -> tuple[list[Any], str]:
        items, rv = await init.api.list_objects(collection, label_selector=label, field_selector=field)
        admitted = items if await gate.admits(items) else []
        if summary_of:
            admitted = admitted + await journal_if_summary_gone(init.api, collection, summary_of, items)
        return admitted, rv

    async def watched(rv: str, timeout: float, idle: float) -> AsyncIterator[WatchEvent]:
        if guard is not None:
            if await guard.guard() and init.part.pod is not None and init.part.source is not None:
                init.part.leading = await lead_now(init, init.part.pod, init.part.source)
            if init.part.leading:
                return
            timeout = min(timeout, guard.timing.renew_every)
        events = init.api.watch_objects(collection, rv, timeout=timeout, label_selector=label,
                                        field_selector=field, idle=idle)
        try:
            async for event in events:
                if event.type not in ("ADDED", "MODIFIED") or await gate.admits([event.object]):
                    yield event
                elif gate.refused is not None or init.part.leading:
                    return
        finally:
            await aclose(events)

    return init.calls.ops(listed, watched)


def guarding(init: Init) -> InitLease | None:
    """The Lease this init guards while it waits (core/publication/leading.is_guard), if it does."""
    part = init.part
    return part.lease if part.lease is not None and part.source is not None and part.source.guard else None


def _publisher(init: Init) -> str:
    """Who this pod waits for, in its log line and Event."""
    lease, source = init.part.lease, init.part.source
    name = source.configmap if source is not None else "?"
    if lease is None and source is not None and source.training:
        return "the job's publisher (the pod of rank 0: the Lease cannot be read)"
    if lease is None or not lease.holder:
        return f"the job's publisher (the holder of lease {name})"
    return f"the job's publisher, pod {lease.holder} (the holder of lease {name})"


def _look_at(init: Init) -> str:
    source = init.part.source
    if init.part.lease is None and source is not None and source.training:
        return "is the pod of rank 0 running its init container?"
    name = source.configmap if source is not None else "?"
    return f"is the pod that holds lease {name} running its init container? kubectl get lease {name} -n " \
           f"{init.settings.namespace}"


def _publication_wait(init: Init, name: str) -> Callable[[], Occurrence]:
    occurrence = Occurrence("WaitingForPublication", f"waiting for {_publisher(init)} to publish configmap "
                                                     f"{name} with this pod")
    return lambda: occurrence


class Vouched:
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

