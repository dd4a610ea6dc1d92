"""``topology-agent status``, the pure part: a job's pods, its publication and its pods' generation Events -> one
row per member (role, rank, node rank, node, domain, address, generation seen, readiness) and one line per pod
left out with the reason; printed as kubectl prints (a table, or a stable JSON document).

Ranks come from the planner init uses (``topology.build_plan``, with the options the pods' own init container
was given): "who decides RANK" stays in one place, and a row shows what a pod's files say once the pods shown
are the gang. A pod that cannot be placed now is left out with the reason the agent itself gives: the roster's
refusal, a pod gone (terminating, finished), no IP yet with ``--address ip``. "Generation seen" is the
latest generation a pod's agent recorded on its Events (core/report/events.py ``GENERATION_LABEL``): no request per
change beyond the Events' own budget, at the price of an age (shown) and of being bounded by that budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent.core.escaping import pod_name_shown, printable
from agent.core.model import Options, RawPod
from agent.core.plan.gang import Roster, missing_line
from agent.core.plan.grouping import member_groups, parse_rule
from agent.core.plan.layout import NodeLabels, build_plan
from agent.core.plan.restarts import Restarts, restart_state
from agent.core.plan.spares import spare_lines
from agent.core.pods.lost import on_lost_nodes
from agent.core.pods.pod import pod_ip
from agent.core.pods.validation import DNS1123_LABEL, is_dns1123_subdomain
from agent.core.report.events import CONTROLLER, GENERATION_LABEL, GENERATION_REASONS
from agent.errors import InputError

SCHEMA = "topology-agent.io/v1"


def human_duration(seconds: float) -> str:
    """An age as kubectl prints one (apimachinery's pkg/util/duration HumanDuration)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


@dataclass(frozen=True)
class Seen:
    """The latest generation a pod's agent recorded, and when (epoch seconds)."""

    generation: int
    at: float


# The objects through which a job object owns its pods, each named by the ownerReference its controller sets
# (controller: true) on what it creates: group, kind -> resource. A pod is the job's when a chain of such
# references, each to an object read and found with that uid, ends at the job object's uid.
OWNED_THROUGH: dict[tuple[str, str], str] = {
    ("batch", "Job"): "jobs",  # JobSet's replicated Jobs (sigs.k8s.io/jobset pkg/controllers/jobset_controller.go),
    #                            an MPIJob's launcher (kubeflow/mpi-operator v2 pkg/controller/mpi_job_controller.go)
    ("apps", "StatefulSet"): "statefulsets",  # a LeaderWorkerSet's leader and worker StatefulSets
    #                                           (sigs.k8s.io/lws pkg/controllers/leaderworkerset_controller.go)
    ("", "Pod"): "pods",  # a LeaderWorkerSet group's leader pod owns its worker StatefulSet (lws pod_controller.go)
    ("jobset.x-k8s.io", "JobSet"): "jobsets",  # a TrainJob's JobSet (kubeflow/trainer pkg/runtime/framework/plugins)
}
CHAIN = 4  # links at most from a pod to its job: LWS -> StatefulSet -> leader Pod -> StatefulSet -> worker Pod


def owner_refs(meta: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    refs = meta.get("ownerReferences")
    return [r for r in refs if isinstance(r, Mapping)] if isinstance(refs, list) else []


def controller_path(meta: Mapping[str, Any], namespace: str) -> tuple[str, str] | None:
    """The controlling owner of an object (uid, API path) when it is of a kind of ``OWNED_THROUGH``, else None."""
    for ref in owner_refs(meta):
        if ref.get("controller") is not True:
            continue
        api_version, kind, name, uid = (ref.get(k) for k in ("apiVersion", "kind", "name", "uid"))
        if not all(isinstance(v, str) and v for v in (api_version, kind, name, uid)):
            return None
        group, _, version = str(api_version).rpartition("/")
        plural = OWNED_THROUGH.get((group, str(kind)))
        if plural is None or not is_dns1123_subdomain(str(name)) or not DNS1123_LABEL.fullmatch(version):
            return None
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        return str(uid), f"{prefix}/namespaces/{namespace}/{plural}/{name}"
    return None


def generations(events: Sequence[Mapping[str, Any]], members: Mapping[str, str], namespace: str) -> dict[str, Seen]:
    """The latest generation each member's agent recorded (by pod uid; ``members``: uid -> name of the pods the
    job owns), read only from Events its agent could have written (core/report/events.py ``Correlator.body``): by the
    agent (``reportingController``), from the pod itself (``reportingInstance`` its name, the Event named after
    it), about that very pod (``regarding``: a Pod of this namespace with the member's uid and name), of a reason
    that says a generation, labelled with a whole number. Any other Event with the label is someone else's."""
    seen: dict[str, Seen] = {}
    for event in events:
        regarding = event.get("regarding")
        meta = event.get("metadata")
        if not isinstance(regarding, Mapping) or not isinstance(meta, Mapping):
            continue
        uid, name = regarding.get("uid"), regarding.get("name")
        labels = meta.get("labels")
        raw = labels.get(GENERATION_LABEL) if isinstance(labels, Mapping) else None
        if not isinstance(uid, str) or uid not in members or name != members[uid] \
                or regarding.get("kind") != "Pod" or regarding.get("apiVersion") != "v1" \
                or regarding.get("namespace") != namespace or event.get("reportingController") != CONTROLLER \
                or event.get("reportingInstance") != name[:128] or event.get("reason") not in GENERATION_REASONS \
                or not str(meta.get("name", "")).startswith(f"{name}.") \
                or not isinstance(raw, str) or not raw.isascii() or not raw.isdigit() or len(raw) > 18:
            continue
        series = event.get("series")
        at = stamp((series.get("lastObservedTime") if isinstance(series, Mapping) else None)
                    or event.get("eventTime"))
        if at is None:
            continue
        found = Seen(int(raw), at)
        if uid not in seen or (found.generation, found.at) > (seen[uid].generation, seen[uid].at):
            seen[uid] = found
    return seen


def stamp(value: Any) -> float | None:
    """Epoch seconds of an RFC 3339 time (with or without fractions), or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class Row:
    name: str
    role: str
    first_rank: int | None  # None: not a training pod
    slots: int
    node_rank: int | None
    node: str
    domain: tuple[str, ...] | None  # the Node's value per level (None: levels not asked, or not known)
    address: str
    seen: Seen | None
    ready: str  # containers ready, of all, as kubectl shows it
    group: int | None = None  # --replica-groups: its replica group (the ranks are then the group's)


@dataclass(frozen=True)
class Left:
    name: str
    reason: str


@dataclass(frozen=True)
class Publication:
    """A large job's publication: the ConfigMaps, who publishes, who holds the Lease, who stands by."""

    configmap: str
    sequence: int
    publisher: str
    standbys: tuple[str, ...]
    holder: str | None  # the Lease's holder (None: no Lease read)
    renewed: float | None  # epoch seconds of its last renewal


@dataclass(frozen=True)
class HotSpares:
    """--world-size (core/plan/spares.py): the hot spares in the order they would be promoted, (promoted spare, node
    rank, the pod it replaced) for each seat held by a pod not born to it, and the lines that say both."""

    names: tuple[str, ...] = ()
    takeovers: tuple[tuple[str, int, str | None], ...] = ()
    lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobStatus:
    job: str
    kind: str  # "Volcano Job 'demo'"
    namespace: str
    rows: tuple[Row, ...]
    left: tuple[Left, ...]
    expected: int | None  # training pods the job's objects ask for
    world_size: int
    levels: tuple[str, ...] | None  # the topology levels' names, when asked
    publication: Publication | None = None
    problem: str | None = None  # why the pods make no plan now (the planner's line)
    missing: tuple[str, ...] = ()  # the members the job asks for that no pod of its own stands for ("worker 2")
    groups: bool = False  # --replica-groups: each row says its group
    restarts: Restarts | None = None  # in-place restarts: each pod's attempt, and the barrier (core/plan/restarts.py)
    spares: HotSpares = HotSpares()

    @property
    def training(self) -> int:
        return sum(1 for row in self.rows if row.first_rank is not None)


def _ready(pod: RawPod) -> str:
    raw: Any = pod
    statuses = (raw.get("status") or {}).get("containerStatuses") or []
    containers = (raw.get("spec") or {}).get("containers") or []
    ready = sum(1 for s in statuses if isinstance(s, dict) and s.get("ready"))
    return f"{ready}/{len(containers)}"


def _unplaced(pod: RawPod, options: Options) -> str | None:
    """Why a pod of the job cannot be placed now (None: it can)."""
    if options.address != "ip" or pod_ip(pod):
        return None
    node = (pod.get("spec") or {}).get("nodeName")
    return f"no IP yet (on node {node})" if node else "not scheduled (no node, no IP yet)"


def job_status(pods: Sequence[RawPod], *, job: str, kind: str, namespace: str, options: Options,
               roster: Roster | None, expected: int | None, seen: Mapping[str, Seen],
               nodes: NodeLabels | None = None, publication: Publication | None = None,
               objects: Sequence[Mapping[str, Any]] = (), lost_nodes: Mapping[str, str] | None = None) -> JobStatus:
    """The job's status from its pods (``seen``: by pod uid; ``objects``: the job's, as read); a pod on one of
    ``lost_nodes`` (each with why) is lost, as the sidecars that watch the Nodes see it (core/pods/lost.py)."""
    pods = on_lost_nodes(pods, lost_nodes or {})
    restarts = restart_state(pods, objects)
    return dataclasses.replace(_job_status(pods, job=job, kind=kind, namespace=namespace, options=options,
                                           roster=roster, expected=expected, seen=seen, nodes=nodes,
                                           publication=publication), restarts=restarts)


def _job_status(pods: Sequence[RawPod], *, job: str, kind: str, namespace: str, options: Options,
                roster: Roster | None, expected: int | None, seen: Mapping[str, Seen],
                nodes: NodeLabels | None = None, publication: Publication | None = None) -> JobStatus:
    left: list[Left] = []
    placeable: list[RawPod] = []
    by_name: dict[str, RawPod] = {}
    for pod in sorted(pods, key=lambda p: p.get("metadata", {}).get("name", "")):
        name = pod.get("metadata", {}).get("name", "?")
        by_name[name] = pod
        why = roster.refusal(pod) if roster is not None else None
        why = why or _unplaced(pod, options)
        if why is None:
            placeable.append(pod)
        else:
            left.append(Left(name, why))
    levels = tuple(level.name for level in options.levels) if options.levels is not None else None
    missing = _missing(pods, roster, options)
    empty = JobStatus(job, kind, namespace, (), tuple(left), expected, 0, levels, publication, missing=missing)
    if not placeable:
        return empty
    try:
        plan = build_plan(placeable, placeable[0]["metadata"]["name"], options, nodes=nodes)
    except InputError as err:
        return JobStatus(job, kind, namespace, (), tuple(left), expected, 0, levels, publication, str(err),
                         missing)
    topology = plan.topology
    left += [Left(gone.name, gone.reason) for gone in topology.excluded]
    groups: dict[str, tuple[int, int, int]] = {}
    if options.replica_groups is not None:
        try:
            groups = member_groups(plan, parse_rule(options.replica_groups, label=options.label("replica_groups")))
        except InputError as err:
            return JobStatus(job, kind, namespace, (), tuple(left), expected, 0, levels, publication, str(err),
                             missing)
    rows = []
    for member in topology.members:
        pod = by_name[member.name]
        uid = pod.get("metadata", {}).get("uid") or ""
        group, node_rank, first_rank = groups.get(member.name, (None, member.node_rank, member.first_rank))
        rows.append(Row(member.name, member.role, first_rank if member.training else None, member.slots,
                        node_rank, member.node, member.domains, member.address, seen.get(uid), _ready(pod), group))
    return JobStatus(job, kind, namespace, tuple(rows), tuple(sorted(left, key=lambda item: item.name)), expected,
                     topology.processes, levels, publication, missing=missing, groups=bool(groups),
                     spares=HotSpares(tuple(m.name for m in topology.spares), tuple(topology.takeovers),
                                      tuple(spare_lines(topology))))


def _missing(pods: Sequence[RawPod], roster: Roster | None, options: Options) -> tuple[str, ...]:
    """The training members the job's object asks for (role and index, as init's gang line names them) for which
    no pod of the job's own exists at all, placed or left out: a pod deleted and not (yet) replaced. Known only
    where the roster has the job's replica counts and the controller gives indices."""
    if roster is None or not roster.counts or not roster.controller.checks_index:
        return ()
    training = roster.controller.training_roles(options) or tuple(roster.counts)
    have: dict[str, set[int]] = {}
    for pod in pods:
        if roster.refusal(pod) is not None:
            continue  # not the job's own, or not one of its roles: stands for no member
        try:
            ident = roster.controller.identify(pod, options)
        except InputError:
            continue
        if ident.ordinal >= 0:
            have.setdefault(ident.role, set()).add(ident.ordinal)
    lines = (missing_line(role, roster.counts[role], have.get(role, set())) for role in training
             if role in roster.counts)
    return tuple(line for line in lines if line is not None)


# --- printing ---------------------------------------------------------------------------------------------------

def _rank(row: Row) -> str:
    if row.first_rank is None:
        return "-"
    return str(row.first_rank) if row.slots == 1 else f"{row.first_rank}-{row.first_rank + row.slots - 1}"


def _group(row: Row) -> str:
    return "-" if row.group is None else str(row.group)


def _seen(row: Row, now: float) -> str:
    return f"{row.seen.generation} ({human_duration(now - row.seen.at)})" if row.seen is not None else "<unknown>"


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns three spaces apart, as kubectl's printer (each cell escaped first: core/escaping.py)."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def table(status: JobStatus, *, now: float) -> str:
    """The table ``topology-agent status`` prints by default: every value escaped (core/escaping.py), and a
    publisher, Lease holder or standby that is no pod name shown as invalid."""
    expected = f" of {status.expected}" if status.expected is not None else ""
    world = (f"in {len({r.group for r in status.rows if r.group is not None})} replica groups, each its own world"
             if status.groups else f"world size {status.world_size}")
    lines = [f"{status.kind} in namespace {status.namespace}: {status.training}{expected} training pods placed, "
             f"{world}" + (f"; missing: {', '.join(status.missing)} (no pod)" if status.missing else "")]
    if status.problem:
        lines.append(f"no plan: {status.problem}")
    header = ["NAME", "ROLE", *(["GROUP"] if status.groups else []), "RANK", "NODE-RANK", "NODE",
              *(["DOMAIN"] if status.levels else []), "ADDRESS", "GENERATION", "READY"]
    cells = [header] + [
        [row.name, row.role, *([_group(row)] if status.groups else []), _rank(row),
         "-" if row.node_rank is None else str(row.node_rank), row.node or "<none>",
         *(["/".join(row.domain) if row.domain else "<unknown>"] if status.levels else []), row.address,
         _seen(row, now), row.ready] for row in status.rows]
    if status.rows:
        lines += _columns(cells)
    publication = status.publication
    if publication is not None:
        holder = "no Lease" if publication.holder is None else (
            f"Lease held by {pod_name_shown(publication.holder) if publication.holder else 'nobody'}"
            + (f", renewed {human_duration(now - publication.renewed)} ago" if publication.renewed else ""))
        lines += ["", f"PUBLISHED   configmap {publication.configmap}, sequence {publication.sequence}",
                  f"PUBLISHER   {pod_name_shown(publication.publisher) if publication.publisher else '<none>'} "
                  f"({holder})",
                  f"STANDBYS    {', '.join(pod_name_shown(name) for name in publication.standbys) or '<none>'}"]
    if status.restarts is not None:
        lines += ["", *_restart_lines(status.restarts)]
    if status.spares.lines:
        lines += ["", "SPARES", *status.spares.lines]
    if status.left:
        lines += ["", *_columns([["LEFT OUT", "REASON"]] + [[item.name, item.reason] for item in status.left])]
    return "\n".join(printable(line) for line in lines) + "\n"


def _restart_lines(restarts: Restarts) -> list[str]:
    """Each pod's in-place restart attempt and the barrier, after the members' table."""
    rule = "JobSet's in-place restart" + (f", current attempt {restarts.current}" if restarts.current is not None
                                          else ", no current attempt yet") if restarts.rule == "jobset" \
        else "the pods' agent init restartCounts"
    barrier = "BARRIER     " + (f"{', '.join(restarts.waiting)} wait(s) for "
                                f"{', '.join(restarts.behind) or 'the JobSet to mark the attempt current'}"
                                if restarts.at_barrier else "none (no pod waits)")
    return [f"RESTARTS    in place, by {rule}",
            *_columns([["POD", "ATTEMPT"]] + [[name, "-" if a is None else str(a)] for name, a in restarts.attempts]),
            barrier]


def document(status: JobStatus, *, now: float) -> dict[str, Any]:
    """The stable JSON document of ``status -o json`` (``SCHEMA``: its keys change only with a new version)."""
    publication = status.publication
    return {
        "apiVersion": SCHEMA, "kind": "JobStatus", "job": status.job, "owner": status.kind,
        "namespace": status.namespace, "expectedTrainingPods": status.expected,
        "trainingPods": status.training, "worldSize": status.world_size, "levels": list(status.levels or []) or None,
        "problem": status.problem,
        "members": [{"name": row.name, "role": row.role, "rank": row.first_rank, "slots": row.slots,
                     "nodeRank": row.node_rank, "node": row.node or None,
                     **({"replicaGroup": row.group} if status.groups else {}),
                     "domain": list(row.domain) if row.domain else None, "address": row.address,
                     "generation": row.seen.generation if row.seen else None,
                     "generationAge": round(now - row.seen.at, 3) if row.seen else None, "ready": row.ready}
                    for row in status.rows],
        "leftOut": [{"name": item.name, "reason": item.reason} for item in status.left],
        **({"spares": list(status.spares.names),
            "takeovers": [{"name": name, "nodeRank": rank, "replaced": replaced}
                          for name, rank, replaced in status.spares.takeovers]}
           if status.spares.lines else {}),
        "publication": None if publication is None else {
            "configmap": publication.configmap, "sequence": publication.sequence, "publisher": publication.publisher,
            "standbys": list(publication.standbys), "leaseHolder": publication.holder,
            "leaseRenewedAge": round(now - publication.renewed, 3) if publication.renewed else None},
        "restarts": None if status.restarts is None else {
            "rule": status.restarts.rule, "current": status.restarts.current,
            "attempts": dict(status.restarts.attempts), "atBarrier": status.restarts.at_barrier,
            "waiting": list(status.restarts.waiting), "behind": list(status.restarts.behind)},
    }
