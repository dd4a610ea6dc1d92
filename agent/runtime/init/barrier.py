"""A rerun of init in its pod (an in-place restart): the run it continues from, and the restart barrier it waits
at until every member has restarted too (core/plan/restarts.py says when), by JobSet's protocol where the job
uses it (the JobSet watched by name), else by the pods' init restartCounts (the job's pods listed and watched,
each cut to its init containers)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from agent.core import Rendered
from agent.core.model import RawPod
from agent.core.plan.restarts import gate_after_agent, jobset_in_place, restarts_in_place, wanted_jobset_attempt
from agent.core.report.events import Occurrence
from agent.errors import ApiForbidden, GangTimeout
from agent.k8s.core import PAGE, pods_path
from agent.k8s.reflector import AsyncOps
from agent.runtime.restarts import JobSetAttempt, PodAttempts, Run, cut_page

if TYPE_CHECKING:
    from agent.runtime.init import Init, Source

log = logging.getLogger("topology_agent.init")


@dataclass
class Rerun:
    """This run of init in its pod: the run before it (an in-place restart), if any, and what it writes."""

    uid: str = ""  # the own pod's, once read
    previous: Run | None = None  # init's last completed run in this pod, if any
    generation: int = 1  # the generation this run writes: the one after the pod's last, on a rerun
    attempt: int | None = None  # the JobSet in-place restart attempt this run belongs to (JobSet's protocol)


class Barrier(NamedTuple):
    """Where the barrier is watched: the store that says it is down, its list and watch, and how to name it."""

    store: JobSetAttempt | PodAttempts
    ops: AsyncOps
    what: str
    look: str  # the command that shows it


async def restart_barrier(init: Init, me: RawPod, source: Source, rendered: Rendered) -> None:
    """Wait until every member has restarted too; ``GangTimeout`` at the deadline, naming who has not."""
    previous, jobset = init.rerun.previous, jobset_in_place(init.objects)
    assert previous is not None
    if jobset is not None and (gate := gate_after_agent(me)) is not None:
        # Waiting here would hold JobSet's agent, which the JobSet needs to mark the attempt current; it holds
        # the trainer itself until then, and this pod's attempt is the one after the last recorded.
        init.rerun.attempt = (previous.attempt if previous.attempt is not None else -1) + 1
        log.info("restart barrier: init container '%s' (JobSet's in-place restart agent) comes after this one "
                 "and starts the trainer once JobSet's attempt %d is current; the files are written now",
                 gate, init.rerun.attempt)
        return
    if jobset is not None:
        init.rerun.attempt = wanted_jobset_attempt(me, previous.attempt)
        barrier = _jobset_barrier(init, jobset, init.rerun.attempt)
    elif not restarts_in_place(me):
        log.info("restart barrier: none (no container of this pod has the restart rule RestartAllContainers: "
                 "its containers started again on their own, a new sandbox or a node restart, which restarts "
                 "no other member); generation %d now", init.rerun.generation)
        return
    else:
        barrier = _pods_barrier(init, source, rendered, previous.runs)
    if barrier.store.down():  # JobSet's agent held this init until the JobSet lifted its barrier
        log.info("restart barrier: %s", barrier.store.barrier().describe())
        return
    log.info("waiting at the restart barrier: every member at restart attempt %d (%s)",
             barrier.store.barrier().attempt,
             "JobSet's in-place restart" if jobset is not None else "the pods' init restartCounts")
    await _wait_at(init, barrier)


def _jobset_barrier(init: Init, jobset: Any, attempt: int) -> Barrier:
    """JobSet's protocol: the JobSet, watched by name, until ``attempt`` is its current one."""
    meta = jobset.get("metadata") or {}
    name, namespace = str(meta.get("name", "")), init.settings.namespace
    collection = f"/apis/{jobset.get('apiVersion') or 'jobset.x-k8s.io/v1alpha2'}/namespaces/" \
                 f"{meta.get('namespace') or namespace}/jobsets"
    field = f"metadata.name={name}"
    ops = init.calls.ops(lambda: init.api.list_objects(collection, field_selector=field),
                         lambda rv, timeout, idle: init.api.watch_objects(collection, rv, timeout=timeout,
                                                                          field_selector=field, idle=idle))
    return Barrier(JobSetAttempt(jobset, attempt), ops, f"JobSet {name}",
                   f"kubectl get jobset {name} -n {namespace} -o yaml")


def _pods_barrier(init: Init, source: Source, rendered: Rendered, runs: int) -> Barrier:
    """The pods' init restartCounts: the job's pods, listed and watched, each cut to its init containers."""
    topology, namespace = rendered.plan.topology, init.settings.namespace
    store = PodAttempts(frozenset(m.name for m in topology.members) if topology.whole is None else None, runs)
    collection = pods_path(namespace)
    ops = init.calls.ops(lambda: init.api.list_objects(collection, label_selector=source.selector, limit=PAGE,
                                                       keep=cut_page),
                         lambda rv, timeout, idle: init.api.watch_objects(collection, rv, timeout=timeout,
                                                                          label_selector=source.selector,
                                                                          idle=idle))
    return Barrier(store, ops, f"pods of {source.selector}",
                   f"kubectl get pods -n {namespace} -l {source.selector}")


async def _wait_at(init: Init, barrier: Barrier) -> None:
    """Watch until the barrier is down, saying where it stands (on the pod's Events, and in a line when that
    changed, at most one a second)."""
    store, clock = barrier.store, init.calls.clock
    init.events.stand(lambda: Occurrence("WaitingForRestart", f"generation {init.rerun.generation}: "
                                                              f"{store.barrier().describe()}"))
    said: list[Any] = [None, 0.0]  # the last line said, and when

    def down() -> bool:
        if store.down():
            return True
        line = store.barrier().describe() if clock() - said[1] >= 1.0 else said[0]
        if line != said[0]:
            log.info("restart barrier: %s", line)
            said[:] = [line, clock()]
        return False

    try:
        reflector = await init.calls.reflect(barrier.what, barrier.ops, store, down)
    except ApiForbidden as err:
        raise ApiForbidden(f"{err}; a rerun of init lists and watches the {barrier.what} at its restart barrier: "
                           "grant list and watch on them (manifests/rbac)", status=err.status) from err
    finally:
        init.events.stand(None)
    if not store.down():
        why = f"; last API error: {reflector.last_error}" if reflector.last_error else ""
        raise GangTimeout(f"timed out after {init.calls.elapsed():.1f} s (--timeout {init.settings.timeout:g}) at "
                          f"the restart barrier: {store.barrier().describe()}{why}; every member restarts in place "
                          f"(RestartAllContainers) before any trainer starts again; see {barrier.look}")
    log.info("restart barrier down: %s", store.barrier().describe())
