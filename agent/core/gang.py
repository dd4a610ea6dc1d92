"""How many training pods the job should have, and whether the pods seen so far form the whole gang.

The expected count comes from ``--expect``, else from the owner object (read through the API by the shell;
interpreted here): Volcano task replicas, PyTorchJob replica specs, JobSet replicated jobs (replicas x
parallelism), an Indexed Job's parallelism, a LeaderWorkerSet group's size annotation. Per-role counts, where
the owner gives them, let a timeout name exactly which role and index never appeared.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.core import controllers as c
from agent.core.controllers import Controller, detect_controller, parse_selector
from agent.core.model import Options, RawPod, is_whole_number
from agent.core.topology import Memo, Sizes, collect, facts_of, pod_ip
from agent.errors import InputError


@dataclass(frozen=True)
class Expectation:
    total: int
    per_role: dict[str, int] | None
    source: str


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
        parts = [f"{self.present} of {self.expected} training pods present"]
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


def owner_path(controller: Controller, pod: RawPod) -> str | None:
    """API path of the object that says how big the job is; None when the pod itself says (LWS)."""
    meta = pod.get("metadata", {})
    namespace = meta.get("namespace", "default")
    labels = meta.get("labels", {}) or {}
    if controller.key in ("jobset", "trainjob"):
        return f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets/{labels[c.JOBSET_NAME]}"
    if controller.key == "mpijob":  # the launcher's owner is a batch Job; the job name label names the MPIJob
        return f"/apis/kubeflow.org/v2beta1/namespaces/{namespace}/mpijobs/{labels[c.PYTORCHJOB_JOB]}"
    wanted = {"volcano": ("batch.volcano.sh/", "Job", "jobs"), "pytorchjob": ("kubeflow.org/", "PyTorchJob",
                                                                              "pytorchjobs"),
              "indexed-job": ("batch/", "Job", "jobs")}.get(controller.key)
    if wanted is None:
        return None
    for ref in meta.get("ownerReferences", []):
        if ref.get("kind") == wanted[1] and ref.get("apiVersion", "").startswith(wanted[0]):
            return f"/apis/{ref['apiVersion']}/namespaces/{namespace}/{wanted[2]}/{ref['name']}"
    return None


def _replicas(value: Any, default: int = 1) -> int:
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        return default


def expectation_from_pod(controller: Controller, pod: RawPod) -> Expectation | None:
    if controller.key != "lws":
        return None
    annotations = pod.get("metadata", {}).get("annotations", {}) or {}
    raw = annotations.get(c.LWS_SIZE)
    if raw is None or not is_whole_number(raw):
        return None
    size = int(raw)
    return Expectation(total=size, per_role={"leader": 1, "worker": size - 1}, source=f"annotation {c.LWS_SIZE}")


def expectation_from_owner(controller: Controller, owner: dict[str, Any], training_roles: Sequence[str] | None,
                           options: Options) -> Expectation:
    """Interpret the owner object fetched from ``owner_path``."""
    spec = owner.get("spec", {}) or {}
    name = owner.get("metadata", {}).get("name", "?")
    kind = owner.get("kind", controller.title)
    counts: dict[str, int] = {}
    if controller.key == "volcano":
        counts = {t.get("name", ""): _replicas(t.get("replicas")) for t in spec.get("tasks", [])}
    elif controller.key == "pytorchjob":
        counts = {k.lower(): _replicas(v.get("replicas")) for k, v in (spec.get("pytorchReplicaSpecs") or {}).items()}
    elif controller.key == "mpijob":
        counts = {k.lower(): _replicas(v.get("replicas")) for k, v in (spec.get("mpiReplicaSpecs") or {}).items()}
    elif controller.key in ("jobset", "trainjob"):
        for rjob in spec.get("replicatedJobs", []):
            job_spec = rjob.get("template", {}).get("spec", {}) or {}
            parallelism = _replicas(job_spec.get("parallelism"))
            completions = _replicas(job_spec.get("completions"), parallelism)
            counts[rjob.get("name", "")] = _replicas(rjob.get("replicas")) * min(parallelism, completions)
    elif controller.key == "indexed-job":
        parallelism = _replicas(spec.get("parallelism"))
        completions = _replicas(spec.get("completions"), parallelism)
        counts = {"worker": min(parallelism, completions)}
    if options.roles is not None and counts:
        unknown = [r for r in options.roles if r not in counts]
        if unknown:
            raise InputError(
                f"{options.label('roles')} names {', '.join(repr(r) for r in unknown)}, but {kind} '{name}' has no "
                f"such role (roles present: {', '.join(sorted(counts))}); fix the role names"
            )
    roles = list(training_roles) if training_roles is not None else list(counts)
    per_role = {role: counts[role] for role in roles if role in counts}
    if not per_role:
        raise InputError(f"{kind} '{name}' lists no training roles ({', '.join(roles)}); check --roles, or pass "
                         "--expect N")
    total = sum(per_role.values())
    policy = spec.get("elasticPolicy") if controller.key == "pytorchjob" else None
    if options.elastic is None and isinstance(policy, dict) and isinstance(policy.get("minReplicas"), int):
        low = max(1, policy["minReplicas"])  # the operator's elastic job: wait for its minimum, as torchrun does
        return Expectation(total=low, per_role=None,
                           source=f"elasticPolicy.minReplicas {low} of {kind} '{name}' (asks for {total})")
    if options.elastic is not None:
        return Expectation(total=options.elastic[0], per_role=None,
                           source=f"--elastic minimum {options.elastic[0]} ({kind} '{name}' asks for {total})")
    return Expectation(total=total, per_role=per_role, source=f"{kind} '{name}' replicas")


def options_from_owner(controller: Controller, owner: dict[str, Any], options: Options) -> tuple[Options, list[str]]:
    """What the job object says that its pods do not, for the options the user left open. MPIJob:
    ``runLauncherAsWorker`` makes the launcher a node (first, as the operator's hostfile lists it) and
    ``slotsPerWorker`` is the slots of every host (newConfigMap, pkg/controller/mpi_job_controller.go)."""
    if controller.key != "mpijob":
        return options, []
    spec = owner.get("spec", {}) or {}
    notes = []
    if options.roles is None and spec.get("runLauncherAsWorker") is True:
        options = dataclasses.replace(options, roles=("launcher", "worker"))
        notes.append("MPIJob runLauncherAsWorker: the launcher is node rank 0")
    slots = spec.get("slotsPerWorker")
    if options.nproc_per_node is None and isinstance(slots, int) and not isinstance(slots, bool) \
            and 1 <= slots <= 1_000_000:
        options = dataclasses.replace(options, nproc_per_node=slots)
        notes.append(f"MPIJob slotsPerWorker: {slots} slots per host")
    return options, notes


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
        for role, count in expected.per_role.items():
            present = have.get(role, set())
            if len(present) < count:
                lacking = [str(i) for i in range(count) if i not in present][: count - len(present)]
                shown = ", ".join(lacking[:SHOWN]) + (" ..." if len(lacking) > SHOWN else "")
                missing.append(f"{role} {shown}" if lacking else f"{role} x{count - len(present)}")
    elif len(training) < expected.total:
        missing.append(f"{expected.total - len(training)} pod(s)")
    ready = len(training) >= expected.total and not missing and not without_ip and not unscheduled
    return GangStatus(ready=ready, present=len(training), expected=expected.total, missing=tuple(missing),
                      without_ip=without_ip, unscheduled=unscheduled)


class GangTracker:
    """``gang_status`` kept current one pod at a time, for init's wait: an event costs O(1), not O(job size).

    In a real cluster every pod of a large job is "late" (pods start over seconds to minutes), and each watch
    event used to recompute the whole job: init at 4096 pods with every pod late spent minutes of CPU. Each pod's
    facts are computed once per resourceVersion (through ``memo``, which the final render then reuses) and
    folded into per-role counts; ``status()`` reads the counts. It answers what ``gang_status`` answers over the
    same pods (a property test checks), raising the same ``InputError`` for a pod that cannot be identified or
    two pods that claim one index.
    """

    def __init__(self, me: RawPod, self_name: str, options: Options, expected: Expectation, *,
                 memo: Memo | None = None, checked: bool = False) -> None:
        self.options, self.expected, self.memo, self.self_name = options, expected, memo, self_name
        self.checked = checked  # pods given to put() have passed check_pod already (init's intake)
        self.controller = detect_controller(me, options)
        self.me_id = self.controller.identify(me, options)
        self.namespace = me.get("metadata", {}).get("namespace", "default")
        self.pairs = parse_selector(options.selector) if options.selector else None
        self.job = options.selector if self.pairs is not None else self.me_id.job
        roles = options.roles if options.roles is not None else self.controller.default_roles
        self.roles = tuple(roles) if roles is not None else None  # None: every role trains (JobSet)
        # name -> role, index, ordinal, has IP, has a node
        self.members: dict[str, tuple[str, tuple[int, ...], int, bool, bool]] = {}
        self.errors: dict[str, InputError] = {}
        self.claims: dict[tuple[str, tuple[int, ...]], list[str]] = {}
        self.ordinals: dict[str, Counter[int]] = {}
        self.distinct: Counter[str] = Counter()  # per role: ordinals held by at least one pod
        self.unordered: Counter[str] = Counter()
        self.training = 0
        self.without_ip: set[str] = set()
        self.unscheduled: set[str] = set()
        self.clashes = 0  # (role, index) keys claimed by two pods or more
        self.sizes: Sizes = {}  # process counts per container object (init's compact pods share them)

    def _trains(self, role: str) -> bool:
        return self.roles is None or role in self.roles

    def put(self, pod: RawPod) -> None:
        """A pod as the API reports it now (added or modified)."""
        name = pod.get("metadata", {}).get("name", "")
        self.remove(name)
        if len(self.sizes) > 64:  # pods that do not share container objects: nothing to remember
            self.sizes.clear()
        facts = facts_of(pod, self.controller, self.options, self.pairs, self.memo, checked=self.checked,
                         sizes=self.sizes)
        is_me = name == self.self_name
        if facts.namespace != self.namespace or (facts.job != self.job and not is_me) or facts.reason:
            return
        ident = facts.ident  # the own pod too: init follows its updates like any other pod's
        if ident is None:
            self.errors[name] = facts.error or InputError(f"pod '{name}': cannot be identified")
            return
        self.members[name] = (ident.role, ident.index, ident.ordinal, facts.has_ip, bool(facts.node))
        claimants = self.claims.setdefault((ident.role, ident.index), [])
        claimants.append(name)
        self.clashes += len(claimants) == 2
        self._count(name, +1)

    def remove(self, name: str) -> None:
        """A pod that is gone (deleted, or about to be put again)."""
        self.errors.pop(name, None)
        entry = self.members.get(name)
        if entry is None:
            return
        self._count(name, -1)
        del self.members[name]
        claimants = self.claims[(entry[0], entry[1])]
        claimants.remove(name)
        self.clashes -= len(claimants) == 1
        if not claimants:
            del self.claims[(entry[0], entry[1])]

    def _count(self, name: str, sign: int) -> None:
        role, _, ordinal, has_ip, has_node = self.members[name]
        training = self._trains(role)
        if training:
            self.training += sign
            if ordinal >= 0:
                held = self.ordinals.setdefault(role, Counter())
                held[ordinal] += sign
                if held[ordinal] == (1 if sign > 0 else 0):
                    self.distinct[role] += sign
            else:
                self.unordered[role] += sign
        waits = training or name == self.self_name
        if waits and self.options.address == "ip" and not has_ip:
            (self.without_ip.add if sign > 0 else self.without_ip.discard)(name)
        if training and self.options.rank_order == "topology" and not has_node:
            (self.unscheduled.add if sign > 0 else self.unscheduled.discard)(name)

    def pending(self) -> int:
        """Training pods still awaited (absent, without an IP, unscheduled): an upper bound, in O(1)."""
        return max(0, self.expected.total - self.training) + len(self.without_ip) + len(self.unscheduled)

    def ready(self) -> bool:
        """``status().ready`` in O(roles): what init asks after every event (the full status, with the indices
        still missing, is for the log and the timeout message)."""
        if self.errors or self.clashes:
            self.status()  # raises the error gang_status raises
        if self.training < self.expected.total or self.without_ip or self.unscheduled:
            return False
        per_role = self.expected.per_role or {}
        return all(self.distinct[role] + self.unordered[role] >= count for role, count in per_role.items()) \
            and self.status().ready  # the exact answer, once, when the counts say complete

    def status(self) -> GangStatus:
        if self.errors:
            raise self.errors[min(self.errors)]
        clash = next((names for names in self.claims.values() if len(names) > 1), None)
        if clash is not None:
            role, index = self.members[clash[0]][:2]
            raise InputError(f"pods '{clash[0]}' and '{clash[1]}' both claim role '{role}' index "
                             f"{', '.join(map(str, index))}; delete the stale pod or fix its index label")
        expected = self.expected
        missing: list[str] = []
        if expected.per_role:
            for role, count in expected.per_role.items():
                present = {i for i, n in self.ordinals.get(role, Counter()).items() if n > 0}
                present |= set(range(self.unordered.get(role, 0)))
                if len(present) < count:
                    lacking = [str(i) for i in range(count) if i not in present][: count - len(present)]
                    shown = ", ".join(lacking[:SHOWN]) + (" ..." if len(lacking) > SHOWN else "")
                    missing.append(f"{role} {shown}" if lacking else f"{role} x{count - len(present)}")
        elif self.training < expected.total:
            missing.append(f"{expected.total - self.training} pod(s)")
        without_ip = tuple(sorted(self.without_ip))
        unscheduled = tuple(sorted(self.unscheduled))
        ready = self.training >= expected.total and not missing and not without_ip and not unscheduled
        return GangStatus(ready=ready, present=self.training, expected=expected.total, missing=tuple(missing),
                          without_ip=without_ip, unscheduled=unscheduled)
