"""``topology-agent status JOB``, what it reads: the job's object (its kind looked for among the controllers' job
kinds, or the one ``--controller`` names), its pods (one LIST by the controller's label), the Events its pods'
agents labelled with a generation (one LIST), and for a large job its published journal and Lease (two GETs);
then core/status.py makes the rows. ``-w`` watches the pods, those Events and the journal, and reads the job again
after a change (at most once a second), printing only what differs.

The job is read as its agents read it (runtime/jobs.read_job, from one of its pods, with the options that pod's
init container was given): the roster a sidecar holds refuses the same pods (a new index is a scale-up, as there),
the planner init and the sidecar use gives the same ranks.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import Any, TextIO

from agent.core.controllers import CONTROLLERS, Controller
from agent.core.events import GENERATION_LABEL, JOB_LABEL, job_label
from agent.core.gang import JobView, roster_of
from agent.core.journal import journal_name, read_journal
from agent.core.lease import read_record
from agent.core.model import Options, RawPod
from agent.core.published import configmap_name
from agent.core.status import JobStatus, Left, Publication, Seen, document, job_status, table
from agent.errors import ApiForbidden, ApiNotFound, InputError
from agent.flags.status import StatusSettings, options_of
from agent.k8s.async_client import AsyncApi, AsyncClient
from agent.k8s.core import PAGE, pods_path
from agent.k8s.reflector import aclose
from agent.runtime.events import events_path
from agent.runtime.jobs import read_job
from agent.runtime.nodes import read_nodes, wanted_nodes
from agent.runtime.publishing import lease_path

SETTLE = 1.0  # -w: seconds between two readings of the job (a burst of changes is one reprint)


def _stamp(value: Any) -> float | None:
    """Epoch seconds of an RFC 3339 time (with or without fractions), or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


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


async def _generations(api: AsyncApi, namespace: str, job: str) -> tuple[dict[str, Seen], str]:
    """The latest generation each pod's agent recorded (by pod uid), and the LIST's resourceVersion."""
    label = job_label(job)
    if label is None:
        return {}, ""
    try:
        items, rv = await api.list_objects(events_path(namespace), label_selector=f"{JOB_LABEL}={label},"
                                                                                  f"{GENERATION_LABEL}")
    except (ApiForbidden, ApiNotFound):
        return {}, ""  # Events not readable here: every generation shows as unknown
    seen: dict[str, Seen] = {}
    for event in items:
        uid = (event.get("regarding") or {}).get("uid")
        raw = ((event.get("metadata") or {}).get("labels") or {}).get(GENERATION_LABEL, "")
        at = _stamp((event.get("series") or {}).get("lastObservedTime") or event.get("eventTime"))
        if not isinstance(uid, str) or not raw.isdigit() or at is None:
            continue
        found = Seen(int(raw), at)
        if uid not in seen or (found.generation, found.at) > (seen[uid].generation, seen[uid].at):
            seen[uid] = found
    return seen, rv


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
        holder, renewed = record.holder, _stamp(record.renew_time)
    except (ApiNotFound, ApiForbidden):
        holder = None
    return Publication(name, journal.seq, journal.leader, journal.standby, holder, renewed)


def _expected(view: JobView) -> int | None:
    counts = view.controller.replica_counts(view.objects)
    roles = view.controller.training_roles(view.options) or tuple(counts)
    total = sum(counts[r] for r in roles if r in counts)
    return total or None


async def _group(api: AsyncApi, settings: StatusSettings, pods: list[RawPod], kind: str,
                 versions: dict[str, str]) -> JobStatus:
    """One gang's status (a LeaderWorkerSet has one per group), read as its pods' agents read it."""
    me = pods[0]
    options = options_of(me) or Options()
    view = await read_job(api.get_object, me, options)
    options = view.options
    job = view.controller.identify(me, options).job
    names = wanted_nodes(pods, options, {})
    nodes = await read_nodes(api, names, options) if names else None
    seen, versions["events"] = await _generations(api, settings.namespace, job)
    return job_status(pods, job=job, kind=kind, namespace=settings.namespace, options=options,
                      roster=roster_of(view, check_index=False), expected=_expected(view), seen=seen, nodes=nodes,
                      publication=await _publication(api, settings.namespace, job))


async def read_status(api: AsyncApi, settings: StatusSettings, controller: Controller,
                      obj: Mapping[str, Any]) -> tuple[list[JobStatus], dict[str, str]]:
    """Every gang of the job, and the resourceVersions of what was listed ("pods", "events": ``-w`` watches from
    them; Events may live in an etcd of their own, with versions of their own)."""
    kind = f"{controller.title} '{settings.job}'"
    pods, rv = await api.list_objects(pods_path(settings.namespace), label_selector=controller.pods_selector(
        settings.job), limit=PAGE)
    versions = {"pods": rv, "events": ""}
    if not pods:
        return [JobStatus(settings.job, kind, settings.namespace, (), (), None, 0, None,
                          problem="no pods yet")], versions
    groups: dict[str, list[RawPod]] = {}
    for pod in pods:
        groups.setdefault(controller.job_of(pod) or "", []).append(pod)  # type: ignore[arg-type]
    statuses = []
    for name, members in sorted(groups.items()):
        try:
            statuses.append(await _group(api, settings, members, kind if len(groups) == 1 else f"{kind} ({name})",
                                         versions))
        except InputError as err:
            left = tuple(Left(p["metadata"]["name"], "its job cannot be read") for p in members)
            statuses.append(JobStatus(name, kind, settings.namespace, (), left, None, 0, None, problem=str(err)))
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
    last = ""
    while True:
        statuses, versions = await read_status(api, settings, controller, obj)
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
