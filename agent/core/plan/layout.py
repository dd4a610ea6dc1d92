"""Pods -> Plan, from scratch: the reference the incremental planner (planner.py) is held to. This module decides
the job's members and gives each its NODE_RANK and RANK along the rank order, which rank.py states (``RankRule``:
JobSet's coordinator first, then the position of the pod's role in the training roles, then the controller's
index; under torchrun's c10d rendezvous the address torch numbers its nodes by). Never creation time or list
order: those differ between the pods' views of the same job, and two pods that disagree on ranks hang forever.
``_place_each`` is the one loop that gives NODE_RANK and RANK along the order (``_carry`` shifts the members a
change left standing, for the planner); ``--rank-order topology`` reorders the training pods by their Nodes'
domains (rank.py's ``topology_order``).

What one pod says of itself (identity, address, slots, gone or not) is facts.py's, reading a pod object
pods/pod.py's, Node labels pods/placement.py's: none of them relates one pod to another.
"""
from __future__ import annotations

import bisect
import collections
import itertools
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from agent.core.controllers import TORCHRUN_MASTER_PORT, Controller, detect_controller, parse_selector
from agent.core.injected import controller_entries
from agent.core.model import ROLE, Excluded, Identity, Member, Options, RawPod, Topology
from agent.core.plan.facts import Memo, Place, PodFacts, Sizes, facts_of
from agent.core.plan.grouping import LIGHTHOUSE_ROLE, ReplicaGroups
from agent.core.plan.rank import RankRule, SortKey, topology_order
from agent.core.plan.spares import Seating, seat
from agent.core.pods.containers import pick_trainer_container, user_env
from agent.core.pods.placement import node_domains
from agent.core.pods.pod import find_pod, pod_name, pod_phase
from agent.errors import InputError


@dataclass(frozen=True)
class Plan:
    """A topology plus the facts the renderers and ``explain`` need about how it was reached."""

    topology: Topology
    controller: Controller
    self_pod: RawPod
    master_port: int
    master_port_source: str
    slots_source: dict[str, str]
    rank0_pod: RawPod | None = None  # node rank 0's pod, whose container ports name the frameworks' ports
    # The job's pods by name, as planned (the planner's own map, which its next change updates: read it while
    # rendering this plan): a framework finds the pod of a member whose container names its port (a TF role's,
    # the Ray head's). Empty for an own view's plan. What was read, not what was decided: plans compare without it.
    pods: Mapping[str, RawPod] = field(default_factory=dict, compare=False, repr=False)
    # --view own: the frameworks' ports as the leader published them (core/publication/summary.py); None for a whole
    # plan
    published_ports: Mapping[str, tuple[int, str]] | None = None
    # Under the c10d order, the training member first in the controller's order: the rendezvous endpoint's host
    # (``rendezvous_host``). None: node rank 0 is.
    first_by_index: Member | None = None
    # --replica-groups: the job's groups (core/plan/grouping.py); the topology is then this pod's group's world
    groups: ReplicaGroups | None = None

    @property
    def rendezvous_host(self) -> Member:
        """The training member whose address is torchrun's rendezvous endpoint: node rank 0, but under the c10d
        order the first in the controller's order. Every torchrun of a job must meet at one
        endpoint while it runs, and a pod that joins with a lower address becomes c10d's rank 0: an endpoint
        that followed it would send the new pod to a store of its own."""
        return self.first_by_index or self.topology.training[0]


def _master_port(rank0: RawPod | None, controller: Controller, options: Options) -> tuple[int, str]:
    if options.ports.master is not None:
        return options.ports.master, "--master-port"
    if rank0 is not None:
        container = pick_trainer_container(rank0, options.processes.container)
        found = controller.master_port((container or {}).get("ports", [])) if container else None
        if found is not None and container is not None:
            return found[0], f"{found[1]} of container '{container.get('name')}' in pod '{pod_name(rank0)}'"
    if options.ports.job_master is not None:
        return options.ports.job_master
    port = controller.default_master_port
    if port == TORCHRUN_MASTER_PORT and "default_master_port" not in vars(type(controller)):
        return port, f"torchrun's default {port}"
    return port, f"{controller.title} convention {port}"


@dataclass(frozen=True)
class Scope:
    """Which pods are this pod's job, from its own labels: its controller and identity, its namespace (pods of
    other namespaces are not its job's), the job (the selector itself with --selector) and the roles that train
    (None: every role present). ``collect``, the planner and init's gang tracker ask it alike."""

    controller: Controller
    me_id: Identity
    namespace: str
    job: str
    pairs: dict[str, str] | None  # --selector parsed
    roles: tuple[str, ...] | None

    @classmethod
    def of(cls, me: RawPod, options: Options) -> Scope:
        controller = detect_controller(me, options)
        me_id = controller.identify(me, options)
        pairs = parse_selector(options.choice.selector) if options.choice.selector else None
        job = options.choice.selector if pairs is not None and options.choice.selector is not None else me_id.job
        return cls(controller=controller, me_id=me_id, namespace=me.get("metadata", {}).get("namespace", "default"),
                   job=job, pairs=pairs, roles=controller.training_roles(options))

    def holds(self, facts: PodFacts, *, me: bool = False) -> bool:
        """Whether the pod these facts describe is one of the job's (this pod is, whatever its labels say now)."""
        return facts.namespace == self.namespace and (me or facts.job == self.job)


def claim_clash(role: str, index: tuple[int, ...], first: str, second: str) -> InputError:
    """Two pods claim one place in the rank order: nobody can tell which is the stale one."""
    return InputError(f"pods '{first}' and '{second}' both claim role '{role}' index {', '.join(map(str, index))}; "
                      "delete the stale pod or fix its index label")


class Live(NamedTuple):
    """A live pod of the job, identified: its pod, where its controller places it, and what the plan reads of it."""

    pod: RawPod
    ident: Identity
    facts: PodFacts


@dataclass(frozen=True)
class Collected:
    """The live pods of one job with their identities, before addresses and ranks are given."""

    me: RawPod
    scope: Scope
    live: tuple[Live, ...]
    excluded: tuple[Excluded, ...]
    training_roles: tuple[str, ...]
    explicit_roles: bool  # the training roles are the user's or the controller's, in rank order (else every role)

    @property
    def controller(self) -> Controller:
        return self.scope.controller

    @property
    def me_id(self) -> Identity:
        return self.scope.me_id

    def is_training(self, ident: Identity) -> bool:
        return ident.role in self.training_roles


def collect(pods: Sequence[RawPod], self_name: str, options: Options, *, memo: Memo | None = None,
            checked: bool = False) -> Collected:
    """Find the job's live pods and identify each; raise ``InputError`` on labels that make no job.
    ``checked``: every pod has passed ``check_pod`` already (read from the API through the intake, or from the
    published rows): not checked again (10 us a pod, 40 ms of a follower's init at 4096 pods)."""
    me = find_pod(pods, self_name)
    scope = Scope.of(me, options)
    controller, pairs = scope.controller, scope.pairs
    live: list[Live] = []
    excluded: list[Excluded] = []
    seen: dict[tuple[str, tuple[int, ...]], str] = {}
    names: set[str] = set()
    sizes: Sizes = {}
    for pod in pods:
        facts = facts_of(pod, controller, options, pairs, memo, checked=checked, sizes=sizes)
        if not scope.holds(facts, me=pod is me):
            continue  # pods of other jobs or namespaces are not my concern
        name = facts.name
        if name in names:
            raise InputError(f"pod '{name}' appears twice in the pod list; pass each pod once")
        names.add(name)
        if facts.reason:
            excluded.append(Excluded(name=name, reason=facts.reason))
            continue
        if pod is me:
            ident = scope.me_id
        elif facts.ident is None:
            raise facts.error or InputError(f"pod '{name}': cannot be identified")
        else:
            ident = facts.ident
        key = (ident.role, ident.index)
        if key in seen:
            raise claim_clash(ident.role, ident.index, seen[key], name)
        seen[key] = name
        live.append(Live(pod, ident, facts))
    present = {ident.role for _, ident, _ in live}
    training_roles = tuple(scope.roles) if scope.roles is not None \
        else tuple(sorted(training_by_default(present, options)))
    if controller.roles_by_pod and options.roles is None:
        training_roles = shown_roles(controller, training_roles, ((p, i.role) for p, i, _ in live))
    return Collected(me=me, scope=scope, live=tuple(live), excluded=tuple(excluded), training_roles=training_roles,
                     explicit_roles=scope.roles is not None)


def training_by_default(present: Iterable[str], options: Options) -> set[str]:
    """The training roles where neither the user nor the job's objects name them: every role present, but for
    torchft's lighthouse in a job of replica groups (core/plan/grouping.py)."""
    roles = set(present)
    if options.replica_groups is not None:
        roles.discard(LIGHTHOUSE_ROLE)
    return roles


def shown_roles(controller: Controller, roles: tuple[str, ...], pods: Iterable[tuple[RawPod, str]]) -> tuple[str, ...]:
    """``roles`` without those whose pods say they do not train (``Controller.roles_by_pod``: Trainer's launcher
    with a container not named 'node'), where neither the user nor the job's objects named the roles."""
    dropped = {role for pod, role in pods
               if role in controller.roles_by_pod and not controller.trains_by_pod(pod, role)}
    return tuple(r for r in roles if r not in dropped) if dropped else roles


NodeLabels = Mapping[str, "Mapping[str, str] | None"]  # node name -> its labels (None: could not be read)


def build_plan(pods: Sequence[RawPod], self_name: str, options: Options, *, memo: Memo | None = None,
               nodes: NodeLabels | None = None, checked: bool = False) -> Plan:
    """Place every pod of ``self_name``'s job; raise ``InputError`` with one line when the pods say no job.
    ``nodes``: the labels of the Nodes the pods run on, read when ``options.levels`` asks for them;
    ``checked``: the pods passed ``check_pod`` already (this pod itself is checked in any case)."""
    return _plan_of(_lay_out(pods, self_name, options, memo, nodes, checked), options)


# --- the rank order ----------------------------------------------------------------------------------------

_ELASTIC_RANGE = re.compile(r"([0-9]{1,7}):([0-9]{1,7})")


def elastic_range(nnodes: str) -> tuple[int, int] | None:
    """MIN:MAX of torchrun's ``--nnodes`` (``PET_NNODES``) when it makes the job elastic, else None."""
    found = _ELASTIC_RANGE.fullmatch(nnodes)
    if found is None or int(found.group(1)) > int(found.group(2)):
        return None
    return int(found.group(1)), int(found.group(2))


def injected_values(pod: RawPod, controller: Controller, options: Options) -> dict[str, str]:
    """Variables the controller wrote into the pod's trainer container (the last entry of a name wins, as in a
    container's environment; a ``valueFrom`` is "(valueFrom)")."""
    container = pick_trainer_container(pod, options.processes.container)
    env = (container or {}).get("env", [])
    return {env[i].get("name", ""): ("(valueFrom)" if "valueFrom" in env[i] else str(env[i].get("value", "")))
            for i in sorted(controller_entries(controller.key, env))}


def c10d_rendezvous(pod: RawPod, controller: Controller, options: Options) -> bool:
    """Whether torchrun meets its peers through the c10d rendezvous, which numbers the pods itself (``RankRule``'s
    ``by_address``): the rendezvous torch.env gives torchrun, c10d for an elastic job (``--elastic``, or
    ``PET_NNODES=MIN:MAX`` as the controller wrote it), unless the user set ``PET_RDZV_BACKEND`` in the trainer
    container, whose value is then torchrun's. Every pod of a job reads the same template: all agree."""
    user = user_env(pick_trainer_container(pod, options.processes.container), controller=controller.key)
    backend = user.get("PET_RDZV_BACKEND")
    if backend is not None:
        return backend.value == "c10d"
    return options.elastic is not None or \
        elastic_range(injected_values(pod, controller, options).get("PET_NNODES", "")) is not None


# --- the layout: the live pods in rank order, placed ----------------------------------------------------------

LEFT_OUT = "no IP yet (--address ip), not a training pod"
C10D_ORDER_NOTE = ("torchrun's c10d rendezvous numbers the pods by their addresses (PET_LOCAL_ADDR) and ignores "
                   "NODE_RANK: ranks follow the addresses, as torch gives them")
_NAME_OF = operator.attrgetter("name")
_UNPLACED = Place("", None, None)
_IDENT, _ORDINAL = operator.attrgetter("ident"), operator.attrgetter("ordinal")
_LIVE_NAME = operator.attrgetter("facts.name")
_FIELDS = tuple(map(operator.itemgetter, range(len(Member._fields))))
_ORDINAL_AT, _NODE_RANK_AT, _RANK_AT = map(Member._fields.index, ("ordinal", "node_rank", "first_rank"))


class _FromScratch(Exception):
    """A change a kept layout cannot take: only a layout from scratch can say what follows (or refuse)."""


class _Rows:
    """The live pods in rank order side by side with their sort keys and their members (None for a pod left out of
    the members: one that does not train, without an IP under --address ip), and where each pod stands."""

    __slots__ = ("at", "key_of", "keys", "live", "placed")

    def __init__(self, live: list[Live], keys: list[SortKey], *, by_position: bool) -> None:
        self.live, self.keys = live, keys
        self.placed: list[Member | None] = [None] * len(live)
        self.key_of = {f.name: key for (_, _, f), key in zip(live, keys, strict=True)}  # live pod name -> its key
        # name -> position in live, for the topology order, where the keys are not sorted
        self.at = {f.name: i for i, (_, _, f) in enumerate(live)} if by_position else None

    def find(self, name: str) -> int:
        """The position of live pod ``name``."""
        return self.at[name] if self.at is not None else bisect.bisect_left(self.keys, self.key_of[name])

    def insert(self, at: int, live: Live, key: SortKey) -> None:
        self.live.insert(at, live)
        self.keys.insert(at, key)
        self.placed.insert(at, None)
        self.key_of[live.facts.name] = key
        if self.at is not None:  # the topology order's positions: those from ``at`` on move down one
            self.at.update(zip(map(_LIVE_NAME, self.live[at:]), itertools.count(at)))

    def pop(self, at: int, name: str) -> tuple[Live, Member | None]:
        live = self.live.pop(at)
        del self.keys[at]
        del self.key_of[name]
        if self.at is not None:  # the topology order's positions: those after it move up one
            del self.at[name]
            self.at.update(zip(map(_LIVE_NAME, self.live[at:]), itertools.count(at)))
        return live, self.placed.pop(at)


class _Census:
    """Who is live: the pod that holds each (role, index), the live pods per role, how many of them train
    (the first ``training`` rows), and how many take their ordinal from their place in their role (JobSet's):
    while none does, the members' ordinals never move and the planner counts no role."""

    __slots__ = ("claims", "derived", "role_count", "training")

    def __init__(self, live: Iterable[Live], position: Mapping[str, int]) -> None:
        # role -> index -> the pod that holds it: keyed by the identity's own index, not a (role, index) pair made
        # per pod (~1 MB of pairs held at 16384 pods)
        self.claims: dict[str, dict[tuple[int, ...], str]] = {}
        self.role_count: dict[str, int] = {}
        self.training = self.derived = 0
        for _, ident, facts in live:
            self._held(ident.role)[ident.index] = facts.name
            self.role_count[ident.role] = self.role_count.get(ident.role, 0) + 1
            self.training += ident.role in position
            self.derived += ident.ordinal < 0

    def _held(self, role: str) -> dict[tuple[int, ...], str]:
        held = self.claims.get(role)
        if held is None:
            held = self.claims[role] = {}
        return held

    def enter(self, ident: Identity, name: str, *, trains: bool) -> bool:
        """Count a pod in; False (and nothing counted) when another pod holds its role and index."""
        held = self._held(ident.role)
        if ident.index in held:
            return False
        held[ident.index] = name
        self.role_count[ident.role] = self.role_count.get(ident.role, 0) + 1
        self.training += trains
        self.derived += ident.ordinal < 0
        return True

    def leave(self, ident: Identity, *, trains: bool) -> None:
        held = self.claims.get(ident.role)
        if held is not None:
            held.pop(ident.index, None)
            if not held:  # as a census counted afresh holds it: no role without a pod
                del self.claims[ident.role]
        self.role_count[ident.role] -= 1
        self.training -= trains
        self.derived -= ident.ordinal < 0


class _Tally:
    """What ``_plan_of`` hands the topology without a pass over the members: members per address, how many
    addresses more than one member holds (hostNetwork pods on one node), training members per process count."""

    __slots__ = ("addresses", "shared", "sizes")

    def __init__(self) -> None:
        self.addresses: dict[str, int] = {}
        self.shared = 0
        self.sizes: dict[int, int] = {}

    def count(self, member: Member, step: int) -> None:
        """Count a member in (+1) or out (-1)."""
        held = self.addresses.get(member.address, 0)
        self.addresses[member.address] = held + step
        if step > 0 and held == 1:
            self.shared += 1
        elif step < 0 and held == 2:
            self.shared -= 1
        if member.training:
            self.sizes[member.slots] = self.sizes.get(member.slots, 0) + step


@dataclass
class _Layout:
    """The live pods in rank order with their members: what a plan is made of, kept by ``Planner`` between
    changes."""

    pods: dict[str, RawPod]  # the input by name: the planner finds what changed by object identity
    found: Collected  # this pod, its scope and roles (not its pods: ``rows`` holds them as they are)
    rule: RankRule
    rows: _Rows
    census: _Census
    nodes: dict[str, Mapping[str, str] | None] | None  # the Node labels the domains came from
    provisional: bool = False  # Planner.follow: a training pod still without its IP holds its rank, unaddressed
    order_note: str | None = None  # why the topology order asked for was not applied
    tally: _Tally = field(default_factory=_Tally)
    dropped: dict[str, Excluded] = field(default_factory=dict)  # pods of the job that are not members
    left_out: set[str] = field(default_factory=set)  # live pods without a member (see ``_Rows``)
    unplaced: set[str] = field(default_factory=set)  # provisional: pods placed without an address yet
    slots_source: dict[str, str] = field(default_factory=dict)  # training pod -> the rule that gave its slots

    def leave(self, at: int, name: str) -> None:
        """Live pod ``name``, at ``at``, leaves the rows (gone, no longer a member, or to arrive at another key)."""
        (_, ident, _), old = self.rows.pop(at, name)
        if old is not None:
            self.tally.count(old, -1)
        self.census.leave(ident, trains=ident.role in self.rule.position)
        self.left_out.discard(name)
        self.unplaced.discard(name)
        self.slots_source.pop(name, None)

    def arrive(self, live: Live, key: SortKey, at: int | None = None) -> int:
        """``live`` enters the rows at ``at`` (by default its key's place, in index order), not placed yet;
        returns where."""
        _, ident, facts = live
        if not self.census.enter(ident, facts.name, trains=ident.role in self.rule.position):
            raise _FromScratch  # two pods claim one index: planning from scratch names them
        if at is None:
            at = bisect.bisect_left(self.rows.keys, key)
        self.rows.insert(at, live, key)
        return at


def _lay_out(pods: Sequence[RawPod], self_name: str, options: Options, memo: Memo | None,
             nodes: NodeLabels | None, checked: bool = False, *, provisional: bool = False) -> _Layout:
    if memo is not None:
        if memo.options != options:
            raise ValueError("a Memo serves one set of options")
        memo.begin()
    found = collect(pods, self_name, options, memo=memo, checked=checked)
    rule = RankRule(position={role: i for i, role in enumerate(found.training_roles)}, explicit=found.explicit_roles,
                    coordinator=found.controller.coordinator(found.me),
                    by_address=c10d_rendezvous(found.me, found.controller, options))
    census = _Census(found.live, rule.position)
    _check_roles(found, census.role_count, options)
    if self_name in {e.name for e in found.excluded}:
        reason = next(e.reason for e in found.excluded if e.name == self_name)
        raise InputError(f"pod '{self_name}' is not a member of its own job ({reason}); nothing to configure")
    key = rule.key
    keys = [key(p, i, f) for p, i, f in found.live]
    order = sorted(range(len(keys)), key=keys.__getitem__)
    domains_of = _domain_reader(options, nodes)
    order_note = None
    if options.rank_order == "topology" and rule.by_address:
        order_note = C10D_ORDER_NOTE
    elif options.rank_order == "topology":
        moved, order_note = _topology_first([found.live[k] for k in order], rule.position, domains_of)
        order = [order[k] for k in moved]
    layout = _Layout(
        # Without the pods it found: a kept layout held each pod's first version after the pod changed (init's
        # wait at 16384 pods: ~1 KB per event, 15-20 MB by the last IP; the sidecar's planner alike).
        pods={pod_name(p): p for p in pods}, found=replace(found, live=(), excluded=()), rule=rule,
        rows=_Rows([found.live[k] for k in order], [keys[k] for k in order],
                   by_position=options.rank_order == "topology" and not rule.by_address),
        census=census, nodes=dict(nodes) if nodes is not None and options.levels is not None else None,
        provisional=provisional, order_note=order_note, dropped={e.name: e for e in found.excluded})
    _place(layout, 0, len(order), options, domains_of)
    if memo is not None:
        memo.end()
    return layout


def _counters_at(layout: _Layout, start: int) -> tuple[int, int, dict[str, int]]:
    """(node rank, first rank, pods seen per role) at ``start``, from the members before it."""
    if start == 0:
        return 0, 0, {}
    placed = layout.rows.placed
    node_rank = min(start, layout.census.training)
    last = placed[node_rank - 1] if node_rank else None
    first_rank = last.first_rank + last.slots if last is not None and last.first_rank is not None else 0
    if not layout.census.derived:
        return node_rank, first_rank, {}  # every ordinal is the identity's: the counts per role decide none
    return node_rank, first_rank, dict(collections.Counter(map(ROLE, filter(None, placed[:start]))))


# (node rank, first rank, members seen per role) where placing starts; the counts per role start empty while no
# ordinal is derived from them (_Census.derived)
Counters = tuple[int, int, dict[str, int]]
DomainsOf = Callable[[str], "tuple[str, ...] | None"]


def _place(layout: _Layout, start: int, stop: int, options: Options, domains_of: DomainsOf, *,
           counters: Counters | None = None, marks: Sequence[int] | None = None) -> None:
    """Give ``live[start:stop]`` their members: NODE_RANK, RANK and ordinals along the rank order.
    ``counters`` at ``start``, by default counted from the members before it. ``marks``: the positions (sorted,
    in start:stop) to place from their pods' facts, None for all; every other position holds a member placed from
    the facts its pod still has, with no member arrived or gone between it and the previous mark (``_carry``)."""
    counters = counters if counters is not None else _counters_at(layout, start)
    if marks is None:
        _place_each(layout, start, stop, options, domains_of, counters)
        return

    def place_each(low: int, high: int, at_low: Counters) -> Counters:
        return _place_each(layout, low, high, options, domains_of, at_low)

    at = start
    for mark in (*marks, stop):
        counters = _carry(layout, at, mark, counters, place_each)
        if mark < stop:
            counters = place_each(mark, mark + 1, counters)
        at = mark + 1


def _place_each(layout: _Layout, start: int, stop: int, options: Options, domains_of: DomainsOf,
                counters: Counters) -> Counters:
    """The one loop that decides NODE_RANK, RANK and ordinals, member by member from the pods' facts; returns the
    counters at ``stop``."""
    live, placed, me = layout.rows.live, layout.rows.placed, layout.found.me
    position, left_out, slots_source = layout.rule.position, layout.left_out, layout.slots_source
    unplaced, provisional, tally = layout.unplaced, layout.provisional, layout.tally.count
    node_rank, first_rank, seen = counters
    by_ip = options.address == "ip"
    for at in range(start, stop):  # the sidecar's cost per join at 4096 pods: positional, no repeated lookups
        pod, ident, facts = live[at]
        role = ident.role
        training = role in position
        old = placed[at]
        if old is not None:
            tally(old, -1)
        if not training and by_ip and not facts.has_ip and pod is not me:
            # A pod that does not train is not waited for; until it has an IP it is left out of host lists.
            left_out.add(facts.name)
            placed[at] = None
            continue
        left_out.discard(facts.name)
        place = facts.place
        if place is None:
            if not (provisional and training and by_ip and not facts.has_ip):
                raise facts.place_error or InputError(f"pod '{facts.name}': no address")
            place = _UNPLACED  # its IP is on its way (init's wait); it keeps its rank meanwhile
            unplaced.add(facts.name)
        elif unplaced:
            unplaced.discard(facts.name)
        in_role = seen.get(role, 0)
        ordinal = ident.ordinal if ident.ordinal >= 0 else in_role
        seen[role] = in_role + 1
        running = pod is me or pod_phase(pod) == "Running"
        if training:
            if facts.slots is None:
                raise facts.slots_error or InputError(f"pod '{facts.name}': no process count")
            slots, source = facts.slots
            slots_source[facts.name] = source
            member = Member(facts.name, role, ident.index, ordinal, place.address, place.dns_name, place.ip, True,
                            slots, node_rank, first_rank, running, facts.node, domains_of(facts.node))
            node_rank += 1
            first_rank += slots
        else:
            member = Member(facts.name, role, ident.index, ordinal, place.address, place.dns_name, place.ip, False, 0,
                            None, None, running, facts.node, domains_of(facts.node))
        placed[at] = member
        tally(member, 1)
    return node_rank, first_rank, seen


def _role_or_none(member: Member | None) -> str | None:
    return None if member is None else member.role


def _carry(layout: _Layout, start: int, stop: int, counters: Counters,
           place_each: Callable[[int, int, Counters], Counters]) -> Counters:
    """Carry over the members of ``live[start:stop]``, each placed from the facts its pod still has, with no member
    arrived or gone between them: only the members before them changed, so their node ranks, first ranks and the
    ordinals their role counts moved by one amount each, the same for every member of a role here. Each run of one
    role is shifted by that amount as a whole, in C-level passes, or kept when nothing moved (the tail after a
    leave and a join). The address, process count and training of each stay, so the tally does too."""
    placed = layout.rows.placed
    members = placed[start:stop]
    at = start
    role_of: Callable[[Any], Any] = ROLE if None not in members else _role_or_none
    for role, run in itertools.groupby(members, role_of):
        group = list(run)
        end = at + len(group)
        shifted = _shift(layout, at, group, counters) if role is not None else None  # type: ignore[arg-type]
        # left out (they stay so: their pods' facts stand), or ordinals of both kinds: member by member
        counters = shifted if shifted is not None else place_each(at, end, counters)
        at = end
    return counters


def _shift(layout: _Layout, at: int, run: list[Member], counters: Counters) -> Counters | None:
    """``_carry`` for one run of members of one role at ``at``; None when some take their ordinal from their
    identity and others from their place in the role (no controller mixes them; placed member by member)."""
    node_rank, first_rank, seen = counters
    first, last = run[0], run[-1]
    derived = layout.census.derived
    ordinals = list(map(_ORDINAL, map(_IDENT, layout.rows.live[at:at + len(run)]))) if derived else [0]
    in_role = seen.get(first.role, 0)
    if min(ordinals) >= 0:
        by_ordinal = 0  # the identity's: it stands
    elif max(ordinals) < 0:
        by_ordinal = in_role - first.ordinal  # the place in the role: moved as the role's count before the run
    else:
        return None
    by_node = by_rank = 0
    if first.training and first.node_rank is not None and first.first_rank is not None:
        by_node, by_rank = node_rank - first.node_rank, first_rank - first.first_rank
        node_rank, first_rank = (last.node_rank or 0) + by_node + 1, (last.first_rank or 0) + by_rank + last.slots
    if by_node or by_rank or by_ordinal:
        # Column by column (zip(*run) would make an iterator per member for the collector to scan), then each
        # member built at C level: one new object per member.
        columns: list[Iterable[Any]] = [map(field_of, run) for field_of in _FIELDS]
        for field_at, by in ((_ORDINAL_AT, by_ordinal), (_NODE_RANK_AT, by_node), (_RANK_AT, by_rank)):
            if by:
                columns[field_at] = map(operator.add, columns[field_at], itertools.repeat(by))
        layout.rows.placed[at:at + len(run)] = map(tuple.__new__, itertools.repeat(Member), zip(*columns, strict=True))
    seen[first.role] = in_role + len(run)
    return node_rank, first_rank, seen


def _check_roles(found: Collected, role_count: dict[str, int], options: Options) -> None:
    if options.roles is not None and not options.roles_checked:
        missing = [r for r in options.roles if not role_count.get(r)]
        if missing:
            present = sorted(r for r, n in role_count.items() if n)
            raise InputError(
                f"{options.label('roles')} names {', '.join(repr(r) for r in missing)}, but no live pod of "
                f"{found.controller.title} '{found.me_id.job}' has that role (roles present: "
                f"{', '.join(present) or 'none'}); fix the role names"
            )


def _plan_of(layout: _Layout, options: Options) -> Plan:
    found = layout.found
    controller, me_id = found.controller, found.me_id
    placed = layout.rows.placed
    members: tuple[Member, ...] = tuple(m for m in placed if m is not None) if layout.left_out \
        else tuple(placed)  # type: ignore[arg-type]
    rank0 = layout.rows.live[0].pod if layout.census.training else None
    master_port, port_source = _master_port(rank0, controller, options)
    me = found.me
    owner_uid = None
    if controller.owner_is_job:
        owner_uid = next((o.get("uid") for o in me.get("metadata", {}).get("ownerReferences", [])
                          if o.get("controller")), None)
    excluded = [*layout.dropped.values(), *(Excluded(name=n, reason=LEFT_OUT) for n in layout.left_out)]
    rule = layout.rule
    seating = seat_spares(layout, options, members) if options.world_size is not None else None
    if seating is not None:
        members = (*seating.members, *members[layout.census.training:])
        rank0 = layout.pods.get(seating.members[0].name) if seating.members else None
        master_port, port_source = _master_port(rank0, controller, options)
    first_by_index = None
    if rule.by_address and layout.census.training:
        by_index = replace(rule, by_address=False).key
        live = layout.rows.live
        first_by_index = placed[min(range(layout.census.training), key=lambda at: by_index(*live[at]))]
    topology = Topology(
        controller=controller.key,
        namespace=found.scope.namespace,
        job=me_id.job,
        job_uid=owner_uid,
        self_name=pod_name(me),
        training_roles=found.training_roles,
        members=members,
        excluded=tuple(sorted(excluded, key=_NAME_OF)),  # by name: every pod lists them alike
        levels=options.levels or (),
        rank_order="c10d" if rule.by_address else "index" if layout.order_note is not None else options.rank_order,
        order_note=layout.order_note,
        world_size=options.world_size,
        spares=seating.spares if seating is not None else (),
        takeovers=seating.takeovers if seating is not None else (),
    )
    if seating is None:  # seated members are not the rows' order: their views are computed from them
        _remember_views(layout, topology)
    return Plan(topology=topology, controller=controller, self_pod=me, master_port=master_port,
                master_port_source=port_source, slots_source=dict(layout.slots_source), rank0_pod=rank0,
                pods=layout.pods, first_by_index=first_by_index)


def seat_spares(layout: _Layout, options: Options, members: Sequence[Member]) -> Seating:
    """``--world-size``: the training members laid on the world's seats, the rest hot spares (spares.py has the
    rule). The seats follow the index order, with the indices missing among the live training pods put back as
    empty places (each role's last index from ``Controller.index_base`` to its highest present), named after
    the pod of that index where one is still listed (marked lost, terminating, failed)."""
    rule, count, controller = layout.rule, layout.census.training, layout.found.controller
    if rule.by_address or layout.rows.at is not None:
        raise InputError(f"{options.label('world_size')} keeps a static world in index order; it cannot be "
                         "combined with torchrun's c10d rendezvous (--elastic, PET_NNODES=MIN:MAX) or "
                         "--rank-order topology; drop one of them")
    live, keys = layout.rows.live[:count], layout.rows.keys[:count]
    present: dict[tuple[str, tuple[int, ...]], set[int]] = {}
    for _, ident, _ in live:
        present.setdefault((ident.role, ident.index[:-1]), set()).add(ident.index[-1])
    holes: dict[Any, str | None] = {}
    for (role, prefix), lasts in present.items():
        for last in range(controller.index_base(role), max(lasts)):
            if last not in lasts:
                holes[rule.key_of(role, (*prefix, last))] = None
    for name in sorted(layout.dropped):  # the pods still listed that were born to an empty seat
        pod = layout.pods.get(name)
        if pod is None:
            continue
        try:
            ident = controller.identify(pod, options)
        except InputError:
            continue
        if ident.role in rule.position:
            key = rule.key_of(ident.role, ident.index)
            if key in holes and holes[key] is None:
                holes[key] = name
    created = [facts.created for _, _, facts in live]
    return seat(members[:count], keys, created, holes, options.world_size or 0)


def _remember_views(layout: _Layout, topology: Topology) -> None:
    """What the layout already knows about the members, so the renderers make no pass over them to find it
    (each pass over 4096 members costs 0.3-0.7 ms, most of it cache misses)."""
    members, count, rows, rule = topology.members, layout.census.training, layout.rows, layout.rule
    last = members[count - 1] if count else None
    known: dict[str, Any] = {
        "training": members[:count],  # training members first, never left out
        "processes": last.first_rank + last.slots if last is not None and last.first_rank is not None else 0,
        "slot_sizes": frozenset(k for k, n in layout.tally.sizes.items() if n),
    }
    if not layout.tally.shared:
        known["repeated_hosts"] = ()  # every address is one member's: no pass over the members to find repeats
    me = topology.self_name
    at = rows.find(me)
    if (at < count or not layout.left_out) and at < len(members) and members[at].name == me:
        known["me"] = members[at]
    left: dict[str, int] = {}
    for name in layout.left_out:
        role = rule.untrained_role(rows.key_of[name])  # a pod left out does not train
        left[role] = left.get(role, 0) + 1
    present = {r for r, n in layout.census.role_count.items() if n > left.get(r, 0)}
    ordered = [r for r in topology.training_roles if r in present]
    known["roles"] = roles = (*ordered, *sorted(present - set(ordered)))
    if not layout.left_out and rows.at is None and rule.roles_are_blocks:
        by_role = {}
        for role in roles:  # explicit roles in index order: each role is one block of the rank order
            low, high = rule.role_block(role)
            by_role[role] = members[bisect.bisect_left(rows.keys, low):bisect.bisect_left(rows.keys, high)]
        known["_by_role"] = by_role
    topology.remember(**known)


def _domain_reader(options: Options, nodes: NodeLabels | None) -> Callable[[str], tuple[str, ...] | None]:
    """node name -> its domains, computed once per node (a node holds several pods) and once per labels object
    (the Nodes of one rack share one: runtime/nodes.py, the publication's label sets), one tuple per distinct
    domains: the members of one rack hold the same tuple, not one per node each."""
    levels = options.levels
    if levels is None:
        return lambda _node: None
    known: dict[str, tuple[str, ...] | None] = {}
    # by id, with the labels object itself held: no other object can take that id while the reader lives
    by_labels: dict[int, tuple[Mapping[str, str], tuple[str, ...] | None]] = {}
    distinct: dict[tuple[str, ...], tuple[str, ...]] = {}

    def domains_of(node: str) -> tuple[str, ...] | None:
        if node not in known:
            labels = nodes.get(node) if node and nodes else None
            seen = by_labels.get(id(labels)) if labels is not None else None
            if labels is None:
                known[node] = None
            elif seen is not None:
                known[node] = seen[1]
            else:
                domains = node_domains(node, labels, levels)
                known[node] = domains if domains is None else distinct.setdefault(domains, domains)
                by_labels[id(labels)] = (labels, known[node])
        return known[node]
    return domains_of


def _topology_first(live: list[Live], position: dict[str, int], domains_of: Callable[[str], tuple[str, ...] | None]
                    ) -> tuple[list[int], str | None]:
    """``--rank-order topology``: the order of ``live`` (in index order, the training pods first) with the training
    pods reordered by their domains; every pod computes this from the same pods and Node labels, so all agree.
    Index order, and the reason, when any training pod's domains are unknown: a partial order would differ between
    pods that know more or less."""
    count = sum(1 for _, ident, _ in live if ident.role in position)
    paths = []
    for _, _, facts in live[:count]:
        domains = domains_of(facts.node)
        if domains is None:
            # From the pod's facts alone (not its phase): the planner keeps a layout while a pod's facts stand.
            why = f"runs on node '{facts.node}' whose labels are unknown" if facts.node else \
                "has no spec.nodeName (not scheduled yet, or listed without it)"
            return list(range(len(live))), f"pod '{facts.name}' {why}; ranks stay in index order"
        paths.append((*domains, facts.node))
    return [*topology_order(paths), *range(count, len(live))], None
