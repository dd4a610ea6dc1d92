"""``topology-agent status JOB``, what it reads: the job's object (its kind looked for among the controllers' job
kinds, or the one ``--controller`` names), its pods (one LIST by the controller's label), the Events its pods'
agents labelled with a generation (one LIST), and for a large job its published journal and Lease (two GETs);
then core/report/status.py makes the rows. ``-w`` watches the pods, those Events and the journal, and reads the job
again after a change (at most once a second), printing only what differs.

The job is read as its agents read it (runtime/jobs.read_job, from one of its pods, with the options that pod's
init container was given): the roster a sidecar holds refuses the same pods (a new index is a scale-up, as there),
the planner init and the sidecar use gives the same ranks. Only pods the job object owns count (``Ownership``):
labels are anyone's to write, so a pod with the job's labels that sorts first cannot choose the options, the
owner or the ranks; the pod read from is the first owned one by name. A generation is read only from an Event its
pod's own agent could have written (core/report/status.py ``generations``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, TextIO, cast

from agent.core.controllers import CONTROLLERS, Controller
from agent.core.model import Options, RawPod
from agent.core.plan.gang import JobView, roster_of
from agent.core.publication.journal import journal_name, read_journal
from agent.core.publication.lease import read_record
from agent.core.publication.published import configmap_name
from agent.core.report.events import GENERATION_LABEL, JOB_LABEL, job_label
from agent.core.report.status import (
    CHAIN,
    JobStatus,
    Left,
    Publication,
    controller_path,
    document,
    generations,
    job_status,
    owner_refs,
    stamp,
    table,
)
from agent.errors import ApiForbidden, ApiNotFound, InputError
from agent.flags.status import StatusSettings, options_of
from agent.k8s.async_client import AsyncApi, AsyncClient
from agent.k8s.core import PAGE, pods_path
from agent.k8s.reflector import aclose
from agent.runtime.events import events_path
from agent.runtime.jobs import read_job
from agent.runtime.nodes import read_lost_nodes, read_nodes, wanted_nodes
from agent.runtime.publication.publishing import lease_path

SETTLE = 1.0  # -w: seconds between two readings of the job (a burst of changes is one reprint)


def _object_path(controller: Controller, namespace: str, name: str) -> str:
    kind = controller.job_kind
    assert kind is not None
    prefix = f"/apis/{kind.group}/{kind.version}" if kind.group else f"/api/{kind.version}"
    return f"{prefix}/namespaces/{namespace}/{kind.plural}/{name}"


async def find_job(api: AsyncApi, settings: StatusSettings) -> tuple[Controller, dict[str, Any]]:
    """The job object named JOB and its controller: the one ``--controller`` names, else every controller's job
    kind is looked for (a controller's kind outranks those it creates: a TrainJob's JobSet has its name)."""
    candidates = [CONTROLLERS[settings.controller]] if settings.controller else \
        [c for c in CONTROLLERS.values() if c.job_kind is not None]
    found: list[tuple[Controller, dict[str, Any]]] = []
    refused: list[str] = []
    for controller in candidates:
        try:
            found.append((controller, await api.get_object(_object_path(controller, settings.namespace,
                                                                        settings.job))))
        except ApiNotFound:
            continue  # no such object, or the kind is not installed
        except ApiForbidden:
            refused.append(controller.title)
    keys = {c.key for c, _ in found}
    found = [(c, obj) for c, obj in found if not any(c.key in CONTROLLERS[k].supersedes for k in keys)]
    if not found:
        also = f"; not allowed to read {', '.join(refused)}" if refused else ""
        raise InputError(f"no job '{settings.job}' in namespace '{settings.namespace}' (looked for "
                         f"{', '.join(c.title for c in candidates)}{also}); check the name and -n, or pass "
                         "--controller")
    if len(found) > 1:
        raise InputError(f"several jobs are named '{settings.job}' in namespace '{settings.namespace}' "
                         f"({', '.join(c.title for c, _ in found)}); pass --controller "
                         f"({', '.join(c.key for c, _ in found)})")
    return found[0]


async def _events(api: AsyncApi, namespace: str, job: str) -> tuple[list[dict[str, Any]], str]:
    """The Events the job's pods' agents labelled with a generation, and the LIST's resourceVersion."""
    label = job_label(job)
    if label is None:
        return [], ""
    try:
        return await api.list_objects(events_path(namespace), label_selector=f"{JOB_LABEL}={label},"
                                                                            f"{GENERATION_LABEL}")
    except (ApiForbidden, ApiNotFound):
        return [], ""  # Events not readable here: every generation shows as unknown


class Ownership:
    """Which pods with the job's labels the job object owns: an ownerReference with its uid, or a chain of
    controlling references through the objects its controller creates (core/report/status.py ``OWNED_THROUGH``), each
    read once (metadata only) and found with the uid referred to. Labels are anyone's to write; the job
    object's uid is not. Verdicts are kept by uid for the command's life (``-w`` reads no object twice)."""

    def __init__(self, api: AsyncApi, namespace: str, job: Mapping[str, Any]) -> None:
        meta = job.get("metadata") or {}
        self.api, self.namespace = api, namespace
        self.uid = str(meta.get("uid") or "")
        self.label = f"{job.get('kind', '?')} '{meta.get('name', '?')}'"
        self.verdicts: dict[str, bool] = {}  # uid of an object between a pod and the job -> owned by the job
        self.unread: list[str] = []  # the objects that could not be read, for the line that says none is owned

    async def owns(self, meta: Mapping[str, Any], known: Mapping[str, Mapping[str, Any]], depth: int = 0) -> bool:
        """Whether the job owns the object of metadata ``meta`` (``known``: the pods listed, by uid)."""
        if self.uid and any(ref.get("uid") == self.uid for ref in owner_refs(meta)):
            return True
        link = controller_path(meta, self.namespace)
        if not self.uid or link is None or depth >= CHAIN:
            return False
        uid, path = link
        if uid not in self.verdicts:
            parent: Mapping[str, Any] | None = known.get(uid)
            if parent is None:
                try:
                    parent = await self.api.get_object(path, metadata_only=True)
                except (ApiNotFound, ApiForbidden) as err:
                    self.unread.append(f"{path} ({err.status})")
            parent_meta = (parent or {}).get("metadata") or {}
            self.verdicts[uid] = parent_meta.get("uid") == uid and await self.owns(parent_meta, known, depth + 1)
        return self.verdicts[uid]

    def stranger(self, pod: RawPod) -> Left:
        name = pod["metadata"]["name"]
        return Left(name, f"pod '{name}' has the labels of {self.label} but is not owned by it (no ownerReference "
                          f"leads to its uid {self.uid}); only the job's own pods are members")

    def none_owned(self, count: int) -> str:
        unread = f"; cannot read {', '.join(self.unread[:3])}" if self.unread else ""
        return (f"none of the {count} pods with the job's labels is owned by {self.label} (uid {self.uid}){unread}: "
                "they are no pods of this job (another object of that name made them, or someone else did); wait "
                "for its controller to create its pods, or check -n and --controller")


async def _publication(api: AsyncApi, namespace: str, job: str) -> Publication | None:
    """A large job's journal and Lease, if it has them."""
    name = configmap_name(job)
    try:
        journal = read_journal(await api.get_object(f"/api/v1/namespaces/{namespace}/configmaps/"
                                                    f"{journal_name(name)}"))
    except (ApiNotFound, ApiForbidden, InputError):
        return None
    if journal is None:
        return None
    holder: str | None
    renewed = None
    try:
        record = read_record(await api.get_object(lease_path(namespace, name)))
        holder, renewed = record.holder, stamp(record.renew_time)
    except (ApiNotFound, ApiForbidden):
        holder = None
    return Publication(name, journal.seq, journal.leader, journal.standby, holder, renewed)


def _expected(view: JobView) -> int | None:
    counts = view.controller.replica_counts(view.objects)
    roles = view.controller.training_roles(view.options) or tuple(counts)
    total = sum(counts[r] for r in roles if r in counts)
    return total or None


def _reader(owned: list[RawPod]) -> RawPod:
    """The pod whose options the job is read with: the first by name that runs the agent's init container (its
    options are the job's, as ``inject`` gives every pod the same), else the first; among owned pods only."""
    ordered = sorted(owned, key=lambda p: p["metadata"]["name"])
    return next((p for p in ordered if options_of(p) is not None), ordered[0])


async def _group(api: AsyncApi, settings: StatusSettings, owned: list[RawPod], kind: str, versions: dict[str, str],
                 ownership: Ownership) -> JobStatus:
    """One gang's status (a LeaderWorkerSet has one per group), read as its pods' agents read it."""
    me = _reader(owned)
    options = options_of(me) or Options()
    view = await read_job(api.get_object, me, options)
    if view.objects and ownership.uid not in {(o.get("metadata") or {}).get("uid") for o in view.objects}:
        raise InputError(f"pod '{me['metadata']['name']}' leads to objects other than {ownership.label} (uid "
                         f"{ownership.uid}); its labels or owner were changed")
    options = view.options
    job = view.controller.identify(me, options).job
    names = wanted_nodes(owned, options, {})
    nodes = await read_nodes(api, names, options) if names else None
    lost = await read_lost_nodes(api, sorted({(p.get("spec") or {}).get("nodeName") or "" for p in owned} - {""}))
    events, versions["events"] = await _events(api, settings.namespace, job)
    members = {str(p["metadata"].get("uid")): p["metadata"]["name"] for p in owned if p["metadata"].get("uid")}
    return job_status(owned, job=job, kind=kind, namespace=settings.namespace, options=options,
                      roster=roster_of(view, check_index=False), expected=_expected(view),
                      seen=generations(events, members, settings.namespace), nodes=nodes, lost_nodes=lost,
                      publication=await _publication(api, settings.namespace, job), objects=view.objects)


async def read_status(api: AsyncApi, settings: StatusSettings, controller: Controller,
                      obj: Mapping[str, Any], ownership: Ownership | None = None
                      ) -> tuple[list[JobStatus], dict[str, str]]:
    """Every gang of the job, and the resourceVersions of what was listed ("pods", "events": ``-w`` watches from
    them; Events may live in an etcd of their own, with versions of their own). Only pods the job object owns
    are read from and shown as members; the others are left out, each with why."""
    ownership = ownership or Ownership(api, settings.namespace, obj)
    kind = f"{controller.title} '{settings.job}'"
    pods, rv = await api.list_objects(pods_path(settings.namespace), label_selector=controller.pods_selector(
        settings.job), limit=PAGE)
    versions = {"pods": rv, "events": ""}
    if not pods:
        return [JobStatus(settings.job, kind, settings.namespace, (), (), None, 0, None,
                          problem="no pods yet")], versions
    known = {str(p["metadata"].get("uid")): p for p in pods if p.get("metadata", {}).get("uid")}
    groups: dict[str, tuple[list[RawPod], list[Left]]] = {}
    for pod in cast(list[RawPod], pods):
        owned, strangers = groups.setdefault(controller.job_of(pod) or "", ([], []))
        if await ownership.owns(pod["metadata"], known):
            owned.append(pod)
        else:
            strangers.append(ownership.stranger(pod))
    statuses = []
    for name, (members, strangers) in sorted(groups.items()):
        title = kind if len(groups) == 1 else f"{kind} ({name})"
        if not members:
            statuses.append(JobStatus(name, title, settings.namespace, (), tuple(strangers), None, 0, None,
                                      problem=ownership.none_owned(len(strangers))))
            continue
        try:
            status = await _group(api, settings, members, title, versions, ownership)
        except InputError as err:
            left = tuple(Left(p["metadata"]["name"], "its job cannot be read") for p in members)
            status = JobStatus(name, title, settings.namespace, (), left, None, 0, None, problem=str(err))
        statuses.append(dataclasses.replace(status, left=tuple(sorted((*status.left, *strangers),
                                                                      key=lambda item: item.name))))
    return statuses, versions


def render(statuses: list[JobStatus], settings: StatusSettings, *, now: float) -> str:
    if settings.output == "json":
        docs = [document(s, now=now) for s in statuses]
        whole = docs[0] if len(docs) == 1 else {"apiVersion": docs[0]["apiVersion"], "kind": "List", "items": docs}
        return json.dumps(whole, indent=None if settings.watch else 2, sort_keys=False) + "\n"
    return "\n".join(table(s, now=now) for s in statuses)


async def _changed(api: AsyncApi, settings: StatusSettings, controller: Controller,
                   versions: Mapping[str, str]) -> None:
    """Returns at the first change, after the readings of ``versions``, of the job's pods, its pods' generation
    Events or its journal (or when a watch ends: the server's timeout, a cut)."""
    pods = versions["pods"]
    watches: list[AsyncIterator[Any]] = [
        api.watch_objects(pods_path(settings.namespace), pods, timeout=300,
                          label_selector=controller.pods_selector(settings.job)),
        api.watch_objects(f"/api/v1/namespaces/{settings.namespace}/configmaps", pods, timeout=300,
                          field_selector=f"metadata.name={journal_name(configmap_name(settings.job))}")]
    label = job_label(settings.job)
    if label is not None and versions.get("events"):
        watches.append(api.watch_objects(events_path(settings.namespace), versions["events"], timeout=300,
                                         label_selector=f"{JOB_LABEL}={label},{GENERATION_LABEL}"))

    async def first(events: AsyncIterator[Any]) -> None:
        try:
            async for event in events:
                if event.type != "BOOKMARK":
                    return
        finally:
            await aclose(events)

    tasks = [asyncio.create_task(first(w)) for w in watches]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def show(api: AsyncApi, settings: StatusSettings, *, out: TextIO = sys.stdout,
               clock: Any = time.time) -> None:
    """Print the job's status once, or with ``watch`` again at each change until interrupted."""
    controller, obj = await find_job(api, settings)
    ownership = Ownership(api, settings.namespace, obj)
    last = ""
    while True:
        statuses, versions = await read_status(api, settings, controller, obj, ownership)
        text = render(statuses, settings, now=clock())
        if text != last:
            out.write(("\n" if last and settings.output == "table" else "") + text)
            out.flush()
            last = text
        if not settings.watch:
            return
        await _changed(api, settings, controller, versions)  # a watch that fails ends it: the job is read again
        await asyncio.sleep(SETTLE)


def run_status(settings: StatusSettings, *, user_agent: str) -> None:
    async def main() -> None:
        async with AsyncClient(settings.config, user_agent=user_agent) as api:
            await show(api, settings)

    asyncio.run(main())
