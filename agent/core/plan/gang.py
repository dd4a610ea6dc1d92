"""How many training pods the job should have, and whether the pods seen so far form the whole gang.

The expected count comes from ``--expect``, else from the job's objects (read through the API by the shell, and
interpreted by the controller: controllers/), else from the pod (a LeaderWorkerSet group's size annotation).
Per-role counts, where the owner gives them, let a timeout name exactly which role and index never appeared.
Roles the controller creates only once this pod's role is Ready are not waited for.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.core.controllers import Controller, Objects, detect_controller
from agent.core.model import Options, RawPod
from agent.core.plan.facts import Memo, PodFacts, Sizes, facts_of
from agent.core.plan.layout import Scope, claim_clash, collect
from agent.core.pods.pod import pod_ip
from agent.errors import InputError


@dataclass(frozen=True)
class Expectation:
    total: int
    per_role: dict[str, int] | None
    source: str
    # Roles this pod does not wait for: the controller creates their pods only once this pod's role is Ready
    # (JobSet dependsOn, MPIJob launcherCreationPolicy), so waiting for them would deadlock the job.
    deferred: tuple[str, ...] = ()


SHOWN = 8  # names a status line shows before it says how many more


@dataclass(frozen=True)
class GangStatus:
    ready: bool
    present: int
    expected: int
    missing: tuple[str, ...]
    without_ip: tuple[str, ...]
    unscheduled: tuple[str, ...] = ()  # --rank-order topology: training pods without a node yet

    def describe(self) -> str:
        parts = [f"{self.present} of {self.expected} training pods present" if self.present <= self.expected else
                 f"{self.present} training pods present ({self.expected} expected: every present pod is a member)"]
        if self.missing:
            parts.append(f"missing: {', '.join(self.missing)}")
        if len(self.without_ip) > SHOWN:  # one line per watch: 4096 names would be 70 KB
            parts.append(f"{len(self.without_ip)} pods without IP: {', '.join(self.without_ip[:SHOWN])} ...")
        elif self.without_ip:
            parts.append(f"without IP: {', '.join(self.without_ip)}")
        if self.unscheduled:
            shown = ", ".join(self.unscheduled[:SHOWN]) + (" ..." if len(self.unscheduled) > SHOWN else "")
            parts.append(f"{len(self.unscheduled)} not scheduled yet (--rank-order topology needs the node): {shown}")
        return "; ".join(parts)


@dataclass(frozen=True)
class JobView:
    """The job as its objects describe it: the controller (a TrainJob's JobSet is the TrainJob's), the options
    with what the objects filled in, the objects as read (the owner first), and a line per decision."""

    controller: Controller
    options: Options
    objects: tuple[Mapping[str, Any], ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Roster:
    """Who may be a member, by the job's own object, read once: a pod with the job's labels is a
    member only if the job owns it (where the controller owns its pods directly: the ownerReference carries the
    job's uid), its role is one of the job's by exact name, and, while init forms the gang, its index is within
    the role's replicas (not for elastic jobs, whose size moves). Labels alone are anyone's to write in the
    namespace; the uid is not. JobSet, TrainJob and LeaderWorkerSet own their pods through Jobs and StatefulSets:
    there only the role is checked. The generic selector promises nothing beyond its labels (docs/security.md)."""

    controller: Controller
    options: Options
    owner: str  # "Volcano Job 'demo'", for the log line
    owner_uid: str | None
    counts: Mapping[str, int]
    check_index: bool = True  # init's gang: the object and the pods describe one moment. The sidecar follows
    # scale changes: a pod its job owns with a new index is a scale-up, which the object read at start cannot know.

    def refusal(self, pod: RawPod) -> str | None:
        """Why ``pod`` is not a member (one line naming the pod and the fix), or None."""
        meta = pod.get("metadata", {})
        name = meta.get("name", "?")
        try:
            ident = self.controller.identify(pod, self.options)
        except InputError as err:
            return str(err)
        if self.owner_uid and self.controller.owns_directly(ident):
            refs = meta.get("ownerReferences") or []
            if not any(isinstance(r, Mapping) and r.get("uid") == self.owner_uid for r in refs):
                return (f"pod '{name}' has the labels of {self.owner} but is not owned by it (no ownerReference "
                        f"with its uid {self.owner_uid}); only the job's own pods are members")
        if not self.counts:
            return None
        if ident.role not in self.counts:
            return (f"pod '{name}': role '{ident.role}' is not one of {self.owner}'s "
                    f"({', '.join(sorted(self.counts))}); role names must match exactly")
        if self.check_index and self.controller.checks_index and self.options.elastic is None \
                and ident.ordinal >= self.counts[ident.role]:
            return (f"pod '{name}': index {ident.ordinal} of role '{ident.role}' is beyond {self.owner}'s "
                    f"{self.counts[ident.role]} replicas")
        return None


def roster_of(view: JobView, *, check_index: bool = True) -> Roster | None:
    """The roster the job's objects make, or None when the owner was not read (nothing to check against)."""
    if not view.objects:
        return None
    owner = view.objects[0]
    meta = owner.get("metadata") or {}
    uid = meta.get("uid") if isinstance(meta.get("uid"), str) and meta.get("uid") else None
    label = f"{owner.get('kind', view.controller.title)} '{meta.get('name', '?')}'"
    return Roster(view.controller, view.options, label, uid, view.controller.replica_counts(view.objects),
                  check_index=check_index)


JobReads = Generator[str, "Mapping[str, Any] | None", JobView]


def job_reads(me: RawPod, options: Options) -> JobReads:
    """The job's objects to read, one API path at a time: the shell sends back each object (None when it cannot
    be read, which ends the reading), and gets the ``JobView`` as the generator's value. The same steps for
    init and the sidecar, so both decide the same roles and slots."""
    controller = detect_controller(me, options)
    objects: list[Mapping[str, Any]] = []
    path = controller.owner_path(me)
    while path is not None:
        obj = yield path
        if obj is None:
            break
        objects.append(obj)
        path = controller.next_read(objects)
    found = controller.owner_options(objects, options)
    options = found.options
    controller = detect_controller(me, options)
    counts = controller.replica_counts(objects)
    if options.roles is not None and counts:
        unknown = [r for r in options.roles if r not in counts]
        if unknown:
            kind, name = objects[0].get("kind", controller.title), objects[0].get("metadata", {}).get("name", "?")
            raise InputError(
                f"{options.label('roles')} names {', '.join(repr(r) for r in unknown)}, but {kind} '{name}' has no "
                f"such role (roles present: {', '.join(sorted(counts))}); fix the role names")
        options = dataclasses.replace(options, roles_checked=True)
    options = with_first_size(controller, objects, with_implied_frameworks(controller, objects, options))
    return JobView(controller, options, tuple(objects), found.notes)


def with_first_size(controller: Controller, objects: Objects, options: Options) -> Options:
    """``options`` with how many training pods the job starts with, as its objects say: the elastic minimum, else
    the training roles' replicas (the pods init waits for). The first membership keeps the controller's XGBoost
    tracker port (core/files/frameworks/xgboost.py); init and the sidecar read the same objects, so they agree. Only for
    a job that selects XGBoost: any other job's options are left as they were."""
    chosen = options.frameworks
    if not objects or chosen.first is not None or ("xgboost" not in chosen.names
                                                   and "xgboost" not in dict(chosen.implied)):
        return options
    owner = objects[0]
    where = f"{owner.get('kind', controller.title)} '{(owner.get('metadata') or {}).get('name', '?')}'"
    low = options.elastic[0] if options.elastic is not None else controller.elastic_minimum(objects)
    if low is not None:
        first = (low, f"the elastic minimum of {where}")
    else:
        counts = controller.replica_counts(objects)
        roles = [r for r in controller.training_roles(options) or tuple(counts) if r in counts]
        total = sum(counts[r] for r in roles)
        if not total:
            return options
        first = (total, f"the replicas of {', '.join(roles)} in {where}")
    return dataclasses.replace(options, frameworks=dataclasses.replace(options.frameworks, first=first))


def with_implied_frameworks(controller: Controller, objects: Objects, options: Options) -> Options:
    """``options`` with the frameworks the job's objects imply (``Controller.frameworks``), each with why, and
    what the objects say of them (``Controller.framework_args``: role names, ports)."""
    implied = controller.frameworks(objects)
    if not implied or not objects:
        return options
    said = objects[-1]  # the object read last says it: the job itself, or a TrainJob's runtime
    why = f"{said.get('kind', controller.title)} '{(said.get('metadata') or {}).get('name', '?')}'"
    chosen = options.frameworks
    known = dict(chosen.implied)
    added = tuple((name, why) for name in implied if name not in known)
    args = controller.framework_args(objects)
    roles = tuple((name, a.roles) for name, a in args.items() if a.roles and chosen.role_map(name) is None)
    ports = tuple((name, a.port, a.source) for name, a in args.items()
                  if a.port is not None and chosen.job_port(name) is None)
    containers = tuple((name, a.container) for name, a in args.items()
                       if a.container is not None and chosen.container(name) is None)
    if not added and not roles and not ports and not containers:
        return options
    frameworks = dataclasses.replace(chosen, implied=chosen.implied + added, roles=chosen.roles + roles,
                                     job_ports=chosen.job_ports + ports, containers=chosen.containers + containers)
    return dataclasses.replace(options, frameworks=frameworks)


def expectation_from_pod(controller: Controller, pod: RawPod) -> Expectation | None:
    """The job's size as the pod itself states it (a LeaderWorkerSet annotates its size), or None."""
    found = controller.size_from_pod(pod)
    if found is None:
        return None
    sizes, source = found
    return Expectation(total=sum(sizes.values()), per_role=sizes, source=source)


def deferred_roles(waits: dict[str, frozenset[str]], role: str) -> tuple[str, ...]:
    """The roles that wait, directly or through others, for ``role`` to be Ready."""
    deferred: set[str] = set()
    frontier = {role}
    while frontier:
        frontier = {r for r, needs in waits.items() if needs & frontier and r not in deferred and r != role}
        deferred |= frontier
    return tuple(sorted(deferred))


def expectation_from_job(controller: Controller, objects: Objects, training_roles: Sequence[str] | None,
                         options: Options, *, role: str) -> Expectation:
    """What the job's objects (read from ``controller.owner_path`` on) say ``role``'s pod must wait for."""
    owner = objects[0] if objects else {}
    name = owner.get("metadata", {}).get("name", "?")
    kind = owner.get("kind", controller.title)
    counts = controller.replica_counts(objects)
    roles = list(training_roles) if training_roles is not None else list(counts)
    deferred = deferred_roles(controller.waits_for(objects), role)
    per_role = {r: counts[r] for r in roles if r in counts and r not in deferred}
    if not per_role:
        raise InputError(f"{kind} '{name}' lists no training roles ({', '.join(roles)}); check --roles, or pass "
                         "--expect N")
    total = sum(per_role.values())
    later = f"; not waiting for {', '.join(deferred)}, created once {role} is Ready" if deferred else ""
    low = controller.elastic_minimum(objects)
    if options.elastic is None and low is not None:
        return Expectation(total=low, per_role=None, deferred=deferred,
                           source=f"elasticPolicy.minReplicas {low} of {kind} '{name}' (asks for {total}){later}")
    if options.elastic is not None:
        return Expectation(total=options.elastic[0], per_role=None, deferred=deferred,
                           source=f"--elastic minimum {options.elastic[0]} ({kind} '{name}' asks for {total}){later}")
    return Expectation(total=total, per_role=per_role, source=f"{kind} '{name}' replicas{later}", deferred=deferred)


def gang_status(pods: Sequence[RawPod], self_name: str, options: Options, expected: Expectation, *,
                memo: Memo | None = None) -> GangStatus:
    found = collect(pods, self_name, options, memo=memo)
    training = [(pod, ident) for pod, ident, _ in found.live if found.is_training(ident)]
    waiting = [pod for pod, _ in training]
    if not found.is_training(found.me_id):
        waiting.append(found.me)  # a pod that does not train still needs its own address
    without_ip = tuple(sorted(pod.get("metadata", {}).get("name", "?") for pod in waiting
                              if options.address == "ip" and not pod_ip(pod)))
    unscheduled = tuple(sorted(pod.get("metadata", {}).get("name", "?") for pod, _ in training
                               if options.rank_order == "topology" and not (pod.get("spec") or {}).get("nodeName")))
    missing: list[str] = []
    if expected.per_role:
        have: dict[str, set[int]] = {}
        for _, ident in training:
            have.setdefault(ident.role, set()).add(ident.ordinal if ident.ordinal >= 0 else len(have.get(
                ident.role, ())))
        missing = [line for role, count in expected.per_role.items()
                   if (line := missing_line(role, count, have.get(role, set()))) is not None]
    elif len(training) < expected.total:
        missing.append(f"{expected.total - len(training)} pod(s)")
    ready = len(training) >= expected.total and not missing and not without_ip and not unscheduled
    return GangStatus(ready=ready, present=len(training), expected=expected.total, missing=tuple(missing),
                      without_ip=without_ip, unscheduled=unscheduled)


def missing_line(role: str, count: int, present: set[int]) -> str | None:
    """What a role lacks of its ``count`` pods, given the ordinals present (None: nothing); a few indices shown:
    ``worker 2, 3``, as init's gang line and ``status`` say it."""
    if len(present) >= count:
        return None
    lacking = [str(i) for i in range(count) if i not in present][: count - len(present)]
    shown = ", ".join(lacking[:SHOWN]) + (" ..." if len(lacking) > SHOWN else "")
    return f"{role} {shown}" if lacking else f"{role} x{count - len(present)}"


class _Presence:
    """The training pods present, per role, kept one pod at a time: how many pods hold each ordinal, how many
    ordinals are held, and the pods whose controller gives no ordinal (JobSet's, counted as 0, 1, ...)."""

    __slots__ = ("distinct", "ordinals", "training", "unordered")

    def __init__(self) -> None:
        self.ordinals: dict[str, Counter[int]] = {}
        self.distinct: Counter[str] = Counter()  # per role: ordinals held by at least one pod
        self.unordered: Counter[str] = Counter()
        self.training = 0

    def count(self, role: str, ordinal: int, sign: int) -> None:
        """A training pod of ``role`` in (+1) or out (-1)."""
        self.training += sign
        if ordinal >= 0:
            held = self.ordinals.setdefault(role, Counter())
            held[ordinal] += sign
            if held[ordinal] == (1 if sign > 0 else 0):
                self.distinct[role] += sign
        else:
            self.unordered[role] += sign

    def complete(self, per_role: Mapping[str, int]) -> bool:
        """Every role has as many ordinals held as it asks for, in O(roles)."""
        return all(self.distinct[role] + self.unordered[role] >= count for role, count in per_role.items())

    def held(self, role: str) -> set[int]:
        """The ordinals of ``role`` present (0, 1, ... for those without one)."""
        present = {i for i, n in self.ordinals.get(role, Counter()).items() if n > 0}
        return present | set(range(self.unordered.get(role, 0)))


class GangTracker:
    """``gang_status`` kept current one pod at a time, for init's wait: an event costs O(1), not O(job size).

    In a real cluster every pod of a large job is "late" (pods start over seconds to minutes): recomputing the
    whole job at each watch event would cost init at 4096 pods minutes of CPU. Each pod's
    facts are computed once per resourceVersion (through ``memo``, which the final render then reuses) and
    folded into per-role counts; ``status()`` reads the counts. It answers what ``gang_status`` answers over the
    same pods (a property test checks), raising the same ``InputError`` for a pod that cannot be identified or
    two pods that claim one index. (The planner's layout, which init follows beside it, gives up on such pods
    until a plan is made from scratch, and is not kept under Node labels: the tracker must answer in any case.)
    """

    def __init__(self, me: RawPod, self_name: str, options: Options, expected: Expectation, *,
                 memo: Memo | None = None, checked: bool = False) -> None:
        self.options, self.expected, self.memo, self.self_name = options, expected, memo, self_name
        self.checked = checked  # pods given to put() have passed check_pod already (init's intake)
        self.scope = Scope.of(me, options)
        # name -> the pod's facts (the memo's own object: a tuple of its fields cost ~200 bytes a pod)
        self.members: dict[str, PodFacts] = {}
        self.errors: dict[str, InputError] = {}
        self.claims: dict[tuple[str, tuple[int, ...]], str] = {}  # (role, index) -> the first pod to claim it
        self.clashes: dict[tuple[str, tuple[int, ...]], list[str]] = {}  # claimed by two pods or more: all of them
        self.presence = _Presence()
        self.without_ip: set[str] = set()
        self.unscheduled: set[str] = set()
        self.sizes: Sizes = {}  # process counts per container object (init's compact pods share them)
        # Pods of a role the controller decides by its pods that say they do not train (as ``collect`` drops
        # their role), where neither the user nor the job's objects named the roles.
        self.not_training: set[str] = set()

    def _trains(self, role: str, name: str = "") -> bool:
        roles = self.scope.roles  # None: every role trains (JobSet)
        return (roles is None or role in roles) and name not in self.not_training

    def put(self, pod: RawPod) -> None:
        """A pod as the API reports it now (added or modified)."""
        name = pod.get("metadata", {}).get("name", "")
        self.remove(name)
        if len(self.sizes) > 64:  # pods that do not share container objects: nothing to remember
            self.sizes.clear()
        scope = self.scope
        facts = facts_of(pod, scope.controller, self.options, scope.pairs, self.memo, checked=self.checked,
                         sizes=self.sizes)
        if not scope.holds(facts, me=name == self.self_name) or facts.reason:
            return
        ident = facts.ident  # the own pod too: init follows its updates like any other pod's
        if ident is None:
            self.errors[name] = facts.error or InputError(f"pod '{name}': cannot be identified")
            return
        if self.options.roles is None and ident.role in scope.controller.roles_by_pod \
                and not scope.controller.trains_by_pod(pod, ident.role):
            self.not_training.add(name)
        self.members[name] = facts
        claim = (ident.role, ident.index)
        first = self.claims.setdefault(claim, name)
        if first != name:
            self.clashes.setdefault(claim, [first]).append(name)
        self._count(name, +1)

    def remove(self, name: str) -> None:
        """A pod that is gone (deleted, or about to be put again)."""
        self.errors.pop(name, None)
        entry = self.members.get(name)
        if entry is None:
            return
        self._count(name, -1)
        del self.members[name]
        self.not_training.discard(name)
        claim = (entry.ident.role, entry.ident.index)  # type: ignore[union-attr]  # members are identified
        claimants = self.clashes.get(claim)
        if claimants is None:
            del self.claims[claim]
            return
        claimants.remove(name)
        self.claims[claim] = claimants[0]
        if len(claimants) == 1:
            del self.clashes[claim]

    def _count(self, name: str, sign: int) -> None:
        facts = self.members[name]
        role, ordinal = facts.ident.role, facts.ident.ordinal  # type: ignore[union-attr]  # members are identified
        has_ip, has_node = facts.has_ip, bool(facts.node)
        training = self._trains(role, name)
        if training:
            self.presence.count(role, ordinal, sign)
        waits = training or name == self.self_name
        if waits and self.options.address == "ip" and not has_ip:
            (self.without_ip.add if sign > 0 else self.without_ip.discard)(name)
        if training and self.options.rank_order == "topology" and not has_node:
            (self.unscheduled.add if sign > 0 else self.unscheduled.discard)(name)

    def unplaced(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The pods the gang waits for that are present: those not on a node yet, and those on one without an IP
        yet (what the pod's Events say of them; the tracker's own flags, O(pods awaited))."""
        waiting = self.without_ip | self.unscheduled
        unscheduled = tuple(sorted(n for n in waiting if n in self.members and not self.members[n].node))
        return unscheduled, tuple(sorted(n for n in self.without_ip if n not in unscheduled))

    def pending(self) -> int:
        """Training pods still awaited (absent, without an IP, unscheduled): an upper bound, in O(1)."""
        return max(0, self.expected.total - self.presence.training) + len(self.without_ip) + len(self.unscheduled)

    def ready(self) -> bool:
        """``status().ready`` in O(roles): what init asks after every event (the full status, with the indices
        still missing, is for the log and the timeout message)."""
        if self.errors or self.clashes:
            self.status()  # raises the error gang_status raises
        if self.presence.training < self.expected.total or self.without_ip or self.unscheduled:
            return False
        return self.presence.complete(self.expected.per_role or {}) \
            and self.status().ready  # the exact answer, once, when the counts say complete

    def status(self) -> GangStatus:
        if self.errors:
            raise self.errors[min(self.errors)]
        clash = next(iter(self.clashes.items()), None)
        if clash is not None:
            (role, index), names = clash
            raise claim_clash(role, index, names[0], names[1])
        expected, training = self.expected, self.presence.training
        missing: list[str] = []
        if expected.per_role:
            missing = [line for role, count in expected.per_role.items()
                       if (line := missing_line(role, count, self.presence.held(role))) is not None]
        elif training < expected.total:
            missing.append(f"{expected.total - training} pod(s)")
        without_ip = tuple(sorted(self.without_ip))
        unscheduled = tuple(sorted(self.unscheduled))
        ready = training >= expected.total and not missing and not without_ip and not unscheduled
        return GangStatus(ready=ready, present=training, expected=expected.total, missing=tuple(missing),
                          without_ip=without_ip, unscheduled=unscheduled)
