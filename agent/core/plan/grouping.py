"""Replica groups: a job's training pods split into groups, each its own world.

torchft, HSDP and TPU multi-slice jobs run several replica groups side by side: each group is a complete torch
world (its own TCPStore on its own first pod, its own WORLD_SIZE and RANK), and the groups meet only through a
coordinator outside every world (torchft's lighthouse, JAX's megascale coordinator). When a pod of one group is
lost, only that group re-forms; the others keep stepping. So each pod is told its group's world, not the job's,
and a change in another group is no change of its world: its files stay and its trainer is not signalled.

``--replica-groups RULE`` names where a pod's group is read (``GROUP_RULES``: one row per controller that numbers
its pods' groups, with the upstream file it was read from, or ``label:KEY``). The pods of a role named
``lighthouse`` are torchft's lighthouse: never a training role, and ``TORCHFT_LIGHTHOUSE`` names the first of
them. ``regroup`` turns the job's plan into this pod's group's plan; the renderers write it as any plan, plus the
variables of ``group_variables`` and the groups in topology.json (``ReplicaGroups.document``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from agent.core.controllers.base import meta
from agent.core.model import Member, Options, RawPod, bracketed, is_whole_number
from agent.core.pods.containers import pick_trainer_container
from agent.core.pods.validation import is_label_key
from agent.errors import InputError

if TYPE_CHECKING:  # the planner imports this module (the lighthouse's role name)
    from agent.core.plan.layout import Plan


class GroupRule(NamedTuple):
    """Where a pod's replica group is read: ``key``, a label (or annotation) holding the group's number;
    ``count``, one holding how many groups the job's object asks for (None: the groups present say it)."""

    name: str
    key: str
    count: str | None  # type: ignore[assignment]  # shadows tuple.count: the label reads best
    source: str


GROUP_RULES: dict[str, GroupRule] = {rule.name: rule for rule in (
    GroupRule("jobset-job", "jobset.sigs.k8s.io/job-index", "jobset.sigs.k8s.io/replicatedjob-replicas",
              "kubernetes-sigs/jobset v0.12.0 pkg/constants/constants.go (JobIndexKey, ReplicatedJobReplicas): "
              "each Job of a replicated job is a group, on every pod as label and annotation"),
    GroupRule("volcano-partition", "volcano.sh/partition-id", None,
              "volcano-sh/volcano v1.16 pkg/controllers/job (TaskPartitionID): a task's pod index divided by "
              "its partitionPolicy's partitionSize, as a pod label"),
)}
LABEL_RULE = "label:"
LIGHTHOUSE_ROLE = "lighthouse"
# torchft's lighthouse listens on [::]:29510 unless --bind says otherwise (src/bin/lighthouse.rs), and its
# launcher's TORCHFT_LIGHTHOUSE default is http://localhost:29510 (torchft/torchx.py, 0.2.0).
LIGHTHOUSE_PORT = 29510
LIGHTHOUSE_PORT_NAME = "lighthouse"


def parse_rule(raw: str, *, label: str = "--replica-groups") -> GroupRule:
    """The rule a setting names; one line naming the choices otherwise."""
    value = raw.strip()
    if value in GROUP_RULES:
        return GROUP_RULES[value]
    if value.startswith(LABEL_RULE):
        key = value[len(LABEL_RULE):].strip()
        if is_label_key(key):
            return GroupRule(value, key, None, f"{label} {value}")
    shown = value if len(value) <= 80 else value[:77] + "..."
    raise InputError(f"{label} '{shown}' must be one of: {', '.join(GROUP_RULES)}, or label:KEY (a label key whose "
                     "value is each pod's group number)")


@dataclass(frozen=True)
class ReplicaGroup:
    id: int
    members: tuple[str, ...]  # the training pods' names, in the group's rank order
    master: str  # the address of the group's first pod: its MASTER_ADDR and rendezvous host


@dataclass(frozen=True)
class ReplicaGroups:
    """The job's groups, as one pod sees them. ``own``: this pod's group (None: it does not train);
    ``lighthouse``: torchft's lighthouse URL (None: no pod of role lighthouse), and where it came from."""

    rule: GroupRule
    groups: tuple[ReplicaGroup, ...]
    count: int
    count_source: str
    own: int | None
    lighthouse: tuple[str, str] | None

    def document(self) -> dict[str, Any]:
        """topology.json's ``replicaGroups``: every group of the job, as of this pod's generation."""
        return {"rule": self.rule.name, "label": self.rule.key, "group": self.own, "count": self.count,
                "lighthouse": self.lighthouse[0] if self.lighthouse else None,
                "groups": [{"id": g.id, "masterAddr": g.master, "members": list(g.members)} for g in self.groups]}

    def key(self) -> tuple[object, ...]:
        """What this pod's files say of the groups besides its own world's members: part of the membership key,
        so that a lighthouse moved or a count changed is a new generation, and nothing else of another group is."""
        return ("replicaGroups", self.own, self.count, self.lighthouse[0] if self.lighthouse else None)


def key_of_document(document: Mapping[str, Any] | None) -> tuple[object, ...] | None:
    """``ReplicaGroups.key`` read back from topology.json's ``replicaGroups`` (None: the file has none)."""
    if not isinstance(document, Mapping):
        return None
    return ("replicaGroups", document.get("group"), document.get("count"), document.get("lighthouse"))


def _number(pod: RawPod, key: str) -> str | None:
    _, labels, annotations = meta(pod)
    return labels.get(key) if key in labels else annotations.get(key)


def group_of(pod: RawPod, rule: GroupRule) -> int:
    """The pod's group number; one line naming the pod and the label otherwise."""
    raw = _number(pod, rule.key)
    if raw is None or not is_whole_number(raw) or len(raw.strip()) > 7:
        what = "does not carry it" if raw is None else f"has '{raw[:20]}', not a whole number"
        raise InputError(f"pod '{meta(pod)[0]}': --replica-groups {rule.name} reads the group from label "
                         f"{rule.key}, and the pod {what}; label each training pod with its group's number, or "
                         "choose another rule")
    return int(raw)


def _declared(pod: RawPod, rule: GroupRule) -> int:
    """The group count the pod's count label states (0: none, or not a whole number)."""
    raw = _number(pod, rule.count) if rule.count is not None else None
    return int(raw) if raw is not None and is_whole_number(raw) and len(raw.strip()) <= 7 else 0


class GroupMemo:
    """Each pod's group number and stated count, kept while the caller holds the same pod object: the sidecar's
    pods between changes, of which one or a few change at a time (reading two labels of 4096 pods per change was
    ~30 ms). The pod is held with its entry, so an entry is never taken for another object."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[RawPod, int, int]] = {}

    def read(self, name: str, pod: RawPod, rule: GroupRule) -> tuple[int, int]:
        held = self._held.get(name)
        if held is not None and held[0] is pod:
            return held[1], held[2]
        group, declared = group_of(pod, rule), _declared(pod, rule)
        self._held[name] = (pod, group, declared)
        return group, declared

    def keep_only(self, names: Sequence[str]) -> None:
        """Let go of pods that left (once they are many: a pass over the job)."""
        if len(self._held) > 2 * len(names) + 64:
            wanted = set(names)
            self._held = {name: entry for name, entry in self._held.items() if name in wanted}


def groups_of(training: Sequence[Member], pods: Mapping[str, RawPod], rule: GroupRule,
              memo: GroupMemo | None = None) -> tuple[dict[str, int], int, str]:
    """Each training member's group, and how many groups the job has, with where that was read: the count
    label's largest value, else (or when more are present) the highest group number plus one. Not the groups
    present alone: a group whose every pod is lost still counts, so the other groups' files do not change."""
    memo = memo if memo is not None else GroupMemo()
    names = [m.name for m in training]
    read = [memo.read(name, pods[name], rule) for name in names]
    memo.keep_only(names)
    found = {name: group for name, (group, _) in zip(names, read, strict=True)}
    present = max(found.values(), default=-1) + 1
    declared = max((count for _, count in read), default=0)
    if rule.count is not None and declared >= present:
        return found, declared, f"label {rule.count}"
    return found, present, f"the highest group number ({rule.key}) plus one"


def _lighthouse(members: Sequence[Member], pods: Mapping[str, RawPod], options: Options) -> tuple[str, str] | None:
    for member in members:
        if member.role != LIGHTHOUSE_ROLE or member.training:
            continue
        port, where = LIGHTHOUSE_PORT, f"torchft's default port {LIGHTHOUSE_PORT}"
        pod = pods.get(member.name)
        container = pick_trainer_container(pod, options.processes.container) if pod is not None else None
        for declared in (container or {}).get("ports", []):
            if declared.get("name") == LIGHTHOUSE_PORT_NAME and isinstance(declared.get("containerPort"), int):
                port, where = declared["containerPort"], f"its port named '{LIGHTHOUSE_PORT_NAME}'"
                break
        return (f"http://{bracketed(member.address)}:{port}",
                f"pod '{member.name}' of role '{LIGHTHOUSE_ROLE}' (torchft's lighthouse), {where}")
    return None


def _renumbered(members: Sequence[Member]) -> list[Member]:
    """A group's training members with their ranks counted from 0 within the group, in the job's rank order."""
    out, rank = [], 0
    for node_rank, member in enumerate(members):
        out.append(member._replace(node_rank=node_rank, first_rank=rank))
        rank += member.slots
    return out


def regroup(plan: Plan, options: Options, rule: GroupRule, memo: GroupMemo | None = None) -> Plan:
    """The plan of this pod's group: its training members ranked within the group, then every member that does
    not train (the lighthouse among them). A pod that does not train keeps the job's plan. Either carries the
    job's groups (``Plan.groups``)."""
    topology = plan.topology
    if topology.whole is not None:
        raise InputError("--replica-groups reads every member's labels, so it cannot go with --view own; "
                         "use --view auto or full")
    training = topology.training
    found, count, count_source = groups_of(training, plan.pods, rule, memo)
    by_group: dict[int, list[Member]] = {}
    for member in training:
        by_group.setdefault(found[member.name], []).append(member)
    me = topology.me
    own = found.get(me.name) if me.training else None
    groups = ReplicaGroups(
        rule=rule, count=count, count_source=count_source, own=own,
        groups=tuple(ReplicaGroup(gid, tuple(m.name for m in members), members[0].address)
                     for gid, members in sorted(by_group.items())),
        lighthouse=_lighthouse(topology.members, plan.pods, options))
    if own is None:
        return replace(plan, groups=groups)
    mine = _renumbered(by_group[own])
    others = topology.members[len(training):]
    position = {role: at for at, role in enumerate(topology.training_roles)}
    first = None
    if plan.first_by_index is not None:  # c10d: the group's rendezvous stays on its first pod in index order
        first = min(mine, key=lambda m: (position.get(m.role, len(position)), m.index, m.ordinal))
    return replace(plan, topology=replace(topology, members=(*mine, *others)), groups=groups,
                   rank0_pod=plan.pods.get(mine[0].name, plan.rank0_pod), first_by_index=first)


def group_variables(plan: Plan, options: Options) -> list[tuple[str, str, str]]:
    """(name, value, why) of the group's variables, as torchft and JAX multi-slice read them."""
    groups = plan.groups
    assert groups is not None
    rule = groups.rule
    out: list[tuple[str, str, str]] = []
    if groups.own is not None:
        out.append(("REPLICA_GROUP_ID", str(groups.own), f"this pod's replica group: label {rule.key} "
                    f"(--replica-groups {rule.name}); MASTER_ADDR, WORLD_SIZE and RANK are the group's"))
    out.append(("NUM_REPLICA_GROUPS", str(groups.count), f"replica groups of the job: {groups.count_source}"))
    if groups.lighthouse is not None:
        out.append(("TORCHFT_LIGHTHOUSE", *groups.lighthouse))
    jax = "jax" in options.frameworks.names or any(key == "jax" for key, _ in options.frameworks.implied)
    if jax and groups.own is not None and groups.groups:
        # JAX multi-slice (XLA megascale): each group a slice, the first pod of the lowest slice coordinating.
        first = groups.groups[0]
        out += [("MEGASCALE_COORDINATOR_ADDRESS", first.master,
                 f"address of the first pod of replica group {first.id}, pod '{first.members[0]}'"),
                ("MEGASCALE_NUM_SLICES", str(groups.count), "= NUM_REPLICA_GROUPS (jax: each group a slice)"),
                ("MEGASCALE_SLICE_ID", str(groups.own), "= REPLICA_GROUP_ID (jax: each group a slice)")]
    return out


def member_groups(plan: Plan, rule: GroupRule) -> dict[str, tuple[int, int, int]]:
    """Each training member's (group, node rank in its group, first rank in its group): what ``status`` shows."""
    training = plan.topology.training
    found, _, _ = groups_of(training, plan.pods, rule)
    by_group: dict[int, list[Member]] = {}
    for member in training:
        by_group.setdefault(found[member.name], []).append(member)
    return {m.name: (gid, m.node_rank, m.first_rank)  # type: ignore[misc]
            for gid, members in by_group.items() for m in _renumbered(members)}
