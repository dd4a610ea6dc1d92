"""Pods -> Topology. This module decides membership, NODE_RANK and RANK; nothing else does.

Rank order is an explicit sort key: the position of the pod's role in the training roles, then the
controller's index (JobSet: job-global-index, then completion index). Never creation time, list order or IP:
those differ between the pods' views of the same job, and two pods that disagree on ranks hang forever.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from agent.core.containers import pick_trainer_container, resolve_nproc
from agent.core.controllers import TORCHRUN_MASTER_PORT, Controller, detect_controller, parse_selector, selector_matches
from agent.core.model import Excluded, Identity, Member, Options, RawPod, Topology
from agent.core.placement import node_domains, topology_order
from agent.core.pods import find_pod, host_name, pod_ip, pod_name
from agent.core.pods import object_name as object_name  # re-exported: runtime.publishing, core.provenance
from agent.core.pods import slim_pod as slim_pod  # re-exported: runtime.sidecar (following, membership)
from agent.core.validation import check_pod, dns_value, ip_value
from agent.errors import InputError


class Memo:
    """Per-pod results (identity, address, slots) remembered by (pod name, resourceVersion).

    A pod's facts depend only on the pod object and the options, and the API server changes resourceVersion
    whenever the object changes, so a long-lived caller (the sidecar) recomputes only the pods that changed.
    One version per pod is held: a pod's new version replaces its old one (init's wait sees every pod of a
    large job twice, without and with its IP). Entries of pods not seen in the last computation are dropped.
    Results are the same with or without it.
    """

    def __init__(self, options: Options) -> None:
        self.options = options
        self._old: dict[tuple[str, str], tuple[str, object]] = {}  # (kind, name) -> (resourceVersion, result)
        self._new: dict[tuple[str, str], tuple[str, object]] = {}

    def begin(self) -> None:
        self._old, self._new = {**self._old, **self._new}, {}

    def end(self) -> None:
        self._old, self._new = self._new, {}

    @staticmethod
    def _key(kind: str, pod: RawPod) -> tuple[tuple[str, str], str] | None:
        try:
            meta = pod["metadata"]
            name, rv = meta["name"], meta["resourceVersion"]
        except (KeyError, TypeError):
            return None  # no key to remember it by (and an odd pod: computing refuses it)
        if type(name) is not str or type(rv) is not str or not rv:
            return None
        return (kind, name), rv

    def lookup(self, kind: str, pod: RawPod) -> tuple[tuple[tuple[str, str], str] | None, object]:
        """(key, remembered value or ``_MISSING``): the per-change hot path, without building a closure."""
        key = self._key(kind, pod)
        if key is None:
            return None, _MISSING
        slot, rv = key
        held = self._new.get(slot)
        if held is not None and held[0] == rv:
            return key, held[1]
        held = self._old.get(slot)
        if held is not None and held[0] == rv:
            self._new[slot] = held
            return key, held[1]
        return key, _MISSING

    def store(self, key: tuple[tuple[str, str], str] | None, value: T) -> T:
        if key is not None:
            self._new[key[0]] = (key[1], value)
            self._old.pop(key[0], None)  # the pod's earlier version is not asked for again: let it go now
        return value


_MISSING = object()


@dataclass(frozen=True)
class Plan:
    """A topology plus the facts the renderers and ``explain`` need about how it was reached."""

    topology: Topology
    controller: Controller
    self_pod: RawPod
    master_port: int
    master_port_source: str
    slots_source: dict[str, str]


T = TypeVar("T")


def why_not_member(pod: RawPod) -> str | None:
    """Terminating, Failed and Succeeded pods are gone for training purposes, whatever their labels say."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return "terminating (deletionTimestamp is set)"
    phase = pod.get("status", {}).get("phase")
    if phase in ("Failed", "Succeeded"):
        return f"phase {phase}"
    return None


@dataclass(frozen=True, slots=True)
class _Facts:
    """What one pod object says, independent of the other pods (memoised per resourceVersion)."""

    name: str
    namespace: str
    job: str | None
    reason: str | None
    ident: Identity | None
    error: InputError | None
    has_ip: bool = False
    place: tuple[str, str | None, str | None] | None = None  # address, DNS name, IP
    place_error: InputError | None = None
    slots: tuple[int, str] | None = None  # processes, the rule that decided
    slots_error: InputError | None = None
    node: str = ""  # spec.nodeName


def _attempt(compute: Callable[[], T]) -> tuple[T | None, InputError | None]:
    """The result, or the error to raise later, without its traceback: a kept traceback holds its frames and
    their locals (the pod among them), ~1 KB per pod for every pod still without an IP."""
    try:
        return compute(), None
    except InputError as err:
        return None, err.with_traceback(None)


Sizes = dict[int, tuple[object, tuple[int, str]]]  # id(container) -> (the container, its process count)


def _facts(pod: RawPod, controller: Controller, options: Options, pairs: dict[str, str] | None, *,
           checked: bool = False, sizes: Sizes | None = None) -> _Facts:
    if not checked:
        check_pod(pod)
    meta = pod.get("metadata", {})
    namespace = meta.get("namespace", "default")
    matched = pairs is None or selector_matches(pod, pairs)
    job = controller.job_of(pod) if pairs is None else (options.selector if matched else None)
    reason = why_not_member(pod)
    name = meta.get("name", "")
    if job is None or reason is not None:
        return _Facts(name=name, namespace=namespace, job=job, reason=reason, ident=None, error=None)
    ident, error = _attempt(lambda: controller.identify(pod, options))
    if ident is None:
        return _Facts(name=name, namespace=namespace, job=job, reason=reason, ident=None, error=error)
    place, place_error = _attempt(lambda: _address(pod, ident, controller, namespace, options))
    slots, slots_error = _attempt(lambda: _slots(pod, options, sizes))
    return _Facts(name=name, namespace=namespace, job=job, reason=reason, ident=ident, error=None,
                  has_ip=bool(pod_ip(pod)), place=place, place_error=place_error, slots=slots, slots_error=slots_error,
                  node=pod.get("spec", {}).get("nodeName") or "")


def _slots(pod: RawPod, options: Options, sizes: Sizes | None) -> tuple[int, str]:
    """The pod's process count; ``sizes`` remembers it per container object for one pass (the pods a follower
    builds from the published rows share one container object per shape: 4096 pods, a handful of shapes).
    The count depends on the container alone (the pod's name is only in the messages, and a refusal is not
    remembered). The entry holds the container, so its id is not reused while the entry lives."""
    container = pick_trainer_container(pod, options.container)
    if sizes is None or container is None:
        return resolve_nproc(pod, container, options)
    known = sizes.get(id(container))
    if known is None:
        known = sizes[id(container)] = (container, resolve_nproc(pod, container, options))
    return known[1]


def _address(pod: RawPod, ident: Identity, controller: Controller, namespace: str,
             options: Options) -> tuple[str, str | None, str | None]:
    name = pod_name(pod)
    raw_ip = pod_ip(pod)
    ip = ip_value(pod, raw_ip) if raw_ip else None  # type: ignore[arg-type]
    dns = controller.dns_name(pod, ident, namespace, options.cluster_domain)
    if dns is not None:
        dns = dns_value(pod, dns, field="spec.hostname/spec.subdomain or the job's labels")  # type: ignore[arg-type]
    if options.address == "ip":
        if not ip:
            raise InputError(
                f"pod '{name}': status.podIP is empty and --address ip needs it; wait until the pod is "
                "scheduled (init does), or use --address dns"
            )
        return ip, dns, ip
    if not dns:
        raise InputError(
            f"pod '{name}': no DNS name (spec.hostname/spec.subdomain unset and {controller.title} gives none); "
            "set spec.subdomain to a headless Service, or use --address ip"
        )
    return dns, dns, ip


def _master_port(rank0: RawPod | None, controller: Controller, options: Options) -> tuple[int, str]:
    if options.master_port is not None:
        return options.master_port, "--master-port"
    if rank0 is not None:
        container = pick_trainer_container(rank0, options.container)
        found = controller.master_port((container or {}).get("ports", [])) if container else None
        if found is not None and container is not None:
            return found[0], f"{found[1]} of container '{container.get('name')}' in pod '{pod_name(rank0)}'"
    port = controller.default_master_port
    if port == TORCHRUN_MASTER_PORT and "default_master_port" not in vars(type(controller)):
        return port, f"torchrun's default {port}"
    return port, f"{controller.title} convention {port}"


def facts_of(pod: RawPod, controller: Controller, options: Options, pairs: dict[str, str] | None,
             memo: Memo | None, *, checked: bool = False, sizes: Sizes | None = None) -> _Facts:
    """What one pod object says (identity, address, slots, or why it is not a member), once per resourceVersion.
    ``checked``: the caller already passed the pod through ``check_pod`` (init's intake does, for every event)."""
    if memo is None:
        return _facts(pod, controller, options, pairs, checked=checked, sizes=sizes)
    key, value = memo.lookup("facts", pod)
    if value is not _MISSING:
        return value  # type: ignore[return-value]
    return memo.store(key, _facts(pod, controller, options, pairs, checked=checked, sizes=sizes))


@dataclass(frozen=True)
class Collected:
    """The live pods of one job with their identities, before addresses and ranks are given."""

    me: RawPod
    controller: Controller
    me_id: Identity
    live: tuple[tuple[RawPod, Identity, _Facts], ...]
    excluded: tuple[Excluded, ...]
    training_roles: tuple[str, ...]
    explicit_roles: bool
    namespace: str  # this pod's: pods of other namespaces are not its job's
    job: str  # the job the pods are matched against (the selector itself with --selector)
    pairs: dict[str, str] | None  # --selector parsed

    def is_training(self, ident: Identity) -> bool:
        return ident.role in self.training_roles


def collect(pods: Sequence[RawPod], self_name: str, options: Options, *, memo: Memo | None = None,
            checked: bool = False) -> Collected:
    """Find the job's live pods and identify each; raise ``InputError`` on labels that make no job.
    ``checked``: every pod has passed ``check_pod`` already (read from the API through the intake, or from the
    published rows): not checked again (10 us a pod, 40 ms of a follower's init at 4096 pods)."""
    me = find_pod(pods, self_name)
    controller = detect_controller(me, options)
    me_id = controller.identify(me, options)
    namespace = me.get("metadata", {}).get("namespace", "default")
    pairs = parse_selector(options.selector) if options.selector else None
    job = options.selector if pairs is not None and options.selector is not None else me_id.job
    live: list[tuple[RawPod, Identity, _Facts]] = []
    excluded: list[Excluded] = []
    seen: dict[tuple[str, tuple[int, ...]], str] = {}
    names: set[str] = set()
    sizes: Sizes = {}
    for pod in pods:
        facts = facts_of(pod, controller, options, pairs, memo, checked=checked, sizes=sizes)
        if facts.namespace != namespace or (facts.job != job and pod is not me):
            continue  # pods of other jobs or namespaces are not my concern
        name = facts.name
        if name in names:
            raise InputError(f"pod '{name}' appears twice in the pod list; pass each pod once")
        names.add(name)
        if facts.reason:
            excluded.append(Excluded(name=name, reason=facts.reason))
            continue
        if pod is me:
            ident = me_id
        elif facts.ident is None:
            raise facts.error or InputError(f"pod '{name}': cannot be identified")
        else:
            ident = facts.ident
        key = (ident.role, ident.index)
        if key in seen:
            where = ", ".join(map(str, ident.index))
            raise InputError(
                f"pods '{seen[key]}' and '{name}' both claim role '{ident.role}' index {where}; "
                "delete the stale pod or fix its index label"
            )
        seen[key] = name
        live.append((pod, ident, facts))
    roles = controller.training_roles(options)
    present = {ident.role for _, ident, _ in live}
    training_roles = tuple(roles) if roles is not None else tuple(sorted(present))
    return Collected(me=me, controller=controller, me_id=me_id, live=tuple(live), excluded=tuple(excluded),
                     training_roles=training_roles, explicit_roles=roles is not None, namespace=namespace, job=job,
                     pairs=pairs)


NodeLabels = Mapping[str, "Mapping[str, str] | None"]  # node name -> its labels (None: could not be read)


def build_plan(pods: Sequence[RawPod], self_name: str, options: Options, *, memo: Memo | None = None,
               nodes: NodeLabels | None = None, checked: bool = False) -> Plan:
    """Place every pod of ``self_name``'s job; raise ``InputError`` with one line when the pods say no job.
    ``nodes``: the labels of the Nodes the pods run on, read when ``options.levels`` asks for them;
    ``checked``: the pods passed ``check_pod`` already (this pod itself is checked in any case)."""
    return _plan_of(_lay_out(pods, self_name, options, memo, nodes, checked), options)


LEFT_OUT = "no IP yet (--address ip), not a training pod"
SortKey = tuple[int, int, str, tuple[int, ...], str]
Live = tuple[RawPod, Identity, _Facts]


@dataclass
class _Layout:
    """The live pods in rank order with their members: what a plan is made of, kept by ``Planner`` between
    changes. ``live``, ``keys`` and ``placed`` are parallel; ``placed`` is None for a pod left out of the
    members (a non-training pod without an IP under --address ip)."""

    pods: dict[str, RawPod]  # the input by name: the planner finds what changed by object identity
    found: Collected  # this pod, its controller, job and roles (not its pods: ``live`` holds them as they are)
    position: dict[str, int]  # training role -> its place in the rank order
    coordinator: str | None
    live: list[Live]
    keys: list[SortKey]
    placed: list[Member | None]
    key_of: dict[str, SortKey]  # live pod name -> its sort key
    dropped: dict[str, Excluded]  # pods of the job that are not members (terminating, finished)
    left_out: set[str]
    claims: dict[tuple[str, tuple[int, ...]], str]  # (role, index) -> the pod that holds it
    role_count: dict[str, int]
    training: int  # live[:training] are the training pods
    slots_source: dict[str, str]
    order_note: str | None
    nodes: dict[str, Mapping[str, str] | None] | None  # the Node labels the domains came from
    provisional: bool = False  # Planner.follow: a training pod still without its IP holds its rank, unaddressed
    unplaced: set[str] = field(default_factory=set)  # those pods (a plan is made only once there are none)
    at: dict[str, int] | None = None  # name -> position in live (topology order, where keys are not sorted)
    addresses: dict[str, int] = field(default_factory=dict)  # members per address
    shared: int = 0  # addresses held by more than one member (hostNetwork pods on one node)
    sizes: dict[int, int] = field(default_factory=dict)  # training members per process count

    def tally(self, member: Member, step: int) -> None:
        """Count a member in (+1) or out (-1) of the views kept for ``_plan_of``."""
        held = self.addresses.get(member.address, 0)
        self.addresses[member.address] = held + step
        if step > 0 and held == 1:
            self.shared += 1
        elif step < 0 and held == 2:
            self.shared -= 1
        if member.training:
            self.sizes[member.slots] = self.sizes.get(member.slots, 0) + step


def _sort_key(pod: RawPod, ident: Identity, name: str, position: dict[str, int], roles: bool,
              coordinator: str | None) -> SortKey:
    """The rank order: JobSet's coordinator first, then the training roles in their order, then the controller's
    index (without explicit roles, JobSet's global index alone orders every replicated job); the pods that do not
    train after them by role and index. The name only breaks ties no controller makes."""
    at = position.get(ident.role)
    if at is None:
        return (2, len(position), ident.role, ident.index, name)
    first = 0 if coordinator is not None and host_name(pod) == coordinator else 1
    return (first, at if roles else 0, "", ident.index, name)


def _lay_out(pods: Sequence[RawPod], self_name: str, options: Options, memo: Memo | None,
             nodes: NodeLabels | None, checked: bool = False, *, provisional: bool = False) -> _Layout:
    if memo is not None:
        if memo.options != options:
            raise ValueError("a Memo serves one set of options")
        memo.begin()
    found = collect(pods, self_name, options, memo=memo, checked=checked)
    me, controller = found.me, found.controller
    training_roles = found.training_roles
    role_count: dict[str, int] = {}
    for _, ident, _ in found.live:
        role_count[ident.role] = role_count.get(ident.role, 0) + 1
    _check_roles(found, role_count, options)
    if self_name in {e.name for e in found.excluded}:
        reason = next(e.reason for e in found.excluded if e.name == self_name)
        raise InputError(f"pod '{self_name}' is not a member of its own job ({reason}); nothing to configure")
    coordinator = controller.coordinator(me)
    position = {role: i for i, role in enumerate(training_roles)}
    keys = [_sort_key(p, i, f.name, position, found.explicit_roles, coordinator) for p, i, f in found.live]
    order = sorted(range(len(keys)), key=keys.__getitem__)
    live = [found.live[k] for k in order]
    layout = _Layout(
        # Without the pods it found: a kept layout held each pod's first version after the pod changed (init's
        # wait at 16384 pods: ~1 KB per event, 15-20 MB by the last IP; the sidecar's planner alike).
        pods={pod_name(p): p for p in pods}, found=replace(found, live=(), excluded=()), position=position,
        coordinator=coordinator, live=live,
        keys=[keys[k] for k in order],
        placed=[None] * len(live), key_of={}, dropped={e.name: e for e in found.excluded}, left_out=set(),
        claims={(i.role, i.index): f.name for _, i, f in live}, role_count=role_count,
        training=sum(1 for _, i, _ in live if i.role in position), slots_source={}, order_note=None,
        nodes=dict(nodes) if nodes is not None and options.levels is not None else None, provisional=provisional)
    layout.key_of = {f.name: key for (_, _, f), key in zip(live, layout.keys, strict=True)}
    domains_of = _domain_reader(options, nodes)
    if options.rank_order == "topology":
        layout.live, layout.order_note = _topology_first(live, position, domains_of)
        layout.keys = [layout.key_of[f.name] for _, _, f in layout.live]
        layout.at = {f.name: i for i, (_, _, f) in enumerate(layout.live)}
    _place(layout, 0, len(layout.live), options, domains_of)
    if memo is not None:
        memo.end()
    return layout


def _place(layout: _Layout, start: int, stop: int, options: Options,
           domains_of: Callable[[str], tuple[str, ...] | None], *,
           counters: tuple[int, int, dict[str, int]] | None = None) -> None:
    """Give ``live[start:stop]`` their members: the one loop that decides NODE_RANK, RANK and ordinals.
    ``counters`` (node rank, first rank, pods seen per role) at ``start``; by default counted from the members
    before it."""
    live, placed, me = layout.live, layout.placed, layout.found.me
    position, left_out, slots_source = layout.position, layout.left_out, layout.slots_source
    unplaced, provisional = layout.unplaced, layout.provisional
    if counters is not None:
        node_rank, first_rank, seen = counters
    elif start == 0:
        node_rank, first_rank, seen = 0, 0, {}
    else:
        node_rank = min(start, layout.training)
        last = placed[node_rank - 1] if node_rank else None
        first_rank = last.first_rank + last.slots if last is not None and last.first_rank is not None else 0
        seen = {}
        for member in placed[:start]:
            if member is not None:
                seen[member.role] = seen.get(member.role, 0) + 1
    by_ip = options.address == "ip"
    for at in range(start, stop):  # the sidecar's cost per join at 4096 pods: positional, no repeated lookups
        pod, ident, facts = live[at]
        role = ident.role
        training = role in position
        old = placed[at]
        if old is not None:
            layout.tally(old, -1)
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
        running = pod is me or (pod.get("status") or {}).get("phase") == "Running"
        if training:
            if facts.slots is None:
                raise facts.slots_error or InputError(f"pod '{facts.name}': no process count")
            slots, source = facts.slots
            slots_source[facts.name] = source
            member = Member(facts.name, role, ident.index, ordinal, place[0], place[1], place[2], True, slots,
                            node_rank, first_rank, running, facts.node, domains_of(facts.node))
            node_rank += 1
            first_rank += slots
        else:
            member = Member(facts.name, role, ident.index, ordinal, place[0], place[1], place[2], False, 0,
                            None, None, running, facts.node, domains_of(facts.node))
        placed[at] = member
        layout.tally(member, 1)


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
    placed = layout.placed
    members: tuple[Member, ...] = tuple(m for m in placed if m is not None) if layout.left_out \
        else tuple(placed)  # type: ignore[arg-type]
    rank0 = layout.live[0][0] if layout.training else None
    master_port, port_source = _master_port(rank0, controller, options)
    me = found.me
    owner_uid = None
    if controller.owner_is_job:
        owner_uid = next((o.get("uid") for o in me.get("metadata", {}).get("ownerReferences", [])
                          if o.get("controller")), None)
    excluded = [*layout.dropped.values(), *(Excluded(name=n, reason=LEFT_OUT) for n in layout.left_out)]
    topology = Topology(
        controller=controller.key,
        namespace=found.namespace,
        job=me_id.job,
        job_uid=owner_uid,
        self_name=pod_name(me),
        training_roles=found.training_roles,
        members=members,
        excluded=tuple(sorted(excluded, key=_NAME_OF)),  # by name: every pod lists them alike
        levels=options.levels or (),
        rank_order="index" if layout.order_note is not None else options.rank_order,
        order_note=layout.order_note,
    )
    _remember_views(layout, topology)
    return Plan(topology=topology, controller=controller, self_pod=me, master_port=master_port,
                master_port_source=port_source, slots_source=dict(layout.slots_source))


def _remember_views(layout: _Layout, topology: Topology) -> None:
    """What the layout already knows about the members, so the renderers make no pass over them to find it
    (each pass over 4096 members costs 0.3-0.7 ms, most of it cache misses)."""
    members, count = topology.members, layout.training
    last = members[count - 1] if count else None
    known: dict[str, Any] = {
        "training": members[:count],  # training members first, never left out
        "world_size": last.first_rank + last.slots if last is not None and last.first_rank is not None else 0,
        "slot_sizes": frozenset(k for k, n in layout.sizes.items() if n),
    }
    if not layout.shared:
        known["repeated_hosts"] = ()  # every address is one member's: no pass over the members to find repeats
    me = topology.self_name
    at = layout.at[me] if layout.at is not None else bisect.bisect_left(layout.keys, layout.key_of[me])
    if (at < count or not layout.left_out) and at < len(members) and members[at].name == me:
        known["me"] = members[at]
    left: dict[str, int] = {}
    for name in layout.left_out:
        role = layout.key_of[name][2]  # a pod left out does not train: its key holds its role
        left[role] = left.get(role, 0) + 1
    present = {r for r, n in layout.role_count.items() if n > left.get(r, 0)}
    ordered = [r for r in topology.training_roles if r in present]
    known["roles"] = roles = (*ordered, *sorted(present - set(ordered)))
    if not layout.left_out and layout.at is None and layout.found.explicit_roles and layout.coordinator is None:
        keys, after, by_role = layout.keys, len(layout.position), {}
        for role in roles:  # explicit roles in index order: each role is one block of the rank order
            block = layout.position.get(role)
            low, high = ((1, block), (1, block + 1)) if block is not None else \
                ((2, after, role), (2, after, role + "\0"))
            by_role[role] = members[bisect.bisect_left(keys, low):bisect.bisect_left(keys, high)]
        known["_by_role"] = by_role
    topology.remember(**known)


_NAME_OF = operator.attrgetter("name")
_UNKNOWN = object()
_UNPLACED: tuple[str, str | None, str | None] = ("", None, None)
FOLLOW_SCRATCH = 16  # Planner.follow: a layout from scratch at most once per len(pods) / this many calls


class Planner:
    """``build_plan`` for a caller that lives through many changes (the sidecar, init's wait): the layout is kept,
    and a change of k pods costs O(k log N) of Python plus list moves, not the O(N) pass over every pod (34 ms
    per change at 4096 pods). A pod that moves in the rank order re-places the pods after it. Anything rarer
    (this pod itself, the roles present, Node labels, a topology-order move, any error) is planned from
    scratch, so the result is always ``build_plan``'s over the same pods (a property test checks that after
    every change). ``memo``: share the facts another reader of the same pods computed (init's gang tracker)."""

    def __init__(self, options: Options, self_name: str, *, checked: bool = False, memo: Memo | None = None) -> None:
        self.options = options
        self.self_name = self_name
        self.checked = checked  # every pod given has passed check_pod (the sidecar's intake checks each)
        self.memo = memo if memo is not None else Memo(options)
        self._layout: _Layout | None = None
        self._plan: Plan | None = None  # the plan of the layout as it is (None after follow)
        self._since_scratch: int | None = None  # follow(): calls since its last layout from scratch (None: none)
        self.incremental = 0  # plans made from the previous layout (the rest were made from scratch)
        self.followed = 0  # follow() calls that carried the layout over (the rest dropped it or made one)

    def plan(self, pods: Mapping[str, RawPod], *, nodes: NodeLabels | None = None) -> Plan:
        """The plan of ``pods`` (each compared with the last call's, by identity)."""
        layout = self._layout
        if layout is not None:
            try:
                step = self._advance(layout, pods, nodes, None)
                plan = None if step is None or layout.unplaced else self._plan_after(layout, step)
            except InputError:
                plan = None
            if plan is not None:
                self._plan = plan
                self.incremental += 1
                return plan
        self._layout = self._plan = None
        layout = _lay_out(list(pods.values()), self.self_name, self.options, self.memo, nodes, self.checked)
        plan = _plan_of(layout, self.options)
        self._layout, self._plan = layout, plan
        return plan

    def follow(self, pods: Mapping[str, RawPod], touched: Iterable[str] | None = None) -> None:
        """Keep the layout current while the pods gather, so that the plan, once the gang is complete, is one
        change away (16384 pods: ~90 ms of planning from scratch after the last IP). No plan is made: a training
        pod still without its IP holds its rank without an address, and a refusal waits for ``plan``. Where
        the layout cannot be carried over, one is made from scratch at most once per ``len(pods) //
        FOLLOW_SCRATCH`` calls, so the wait costs O(1) per call, amortised, whatever the pods say. With Node
        labels (``--topology-levels``) the plan needs the Nodes, read after the wait: nothing is followed."""
        self._plan = None
        if self.options.levels is not None or self.options.rank_order == "topology":
            self._layout = None  # the changes are not carried over: the next plan is made from scratch
            return
        since = self._since_scratch
        if since is not None:
            self._since_scratch = since = since + 1
        layout = self._layout
        if layout is not None:
            try:
                if self._advance(layout, pods, None, touched) is not None:
                    self.followed += 1
                    return
            except InputError:
                pass
            self._layout = None
        if since is not None and since * FOLLOW_SCRATCH < len(pods):
            return  # laid out from scratch too recently: the next layout waits (plan() makes one in any case)
        self._since_scratch = 0
        try:
            self._layout = _lay_out(list(pods.values()), self.self_name, self.options, self.memo, None,
                                    self.checked, provisional=True)
        except InputError:
            self._layout = None  # plan() says why, if it still holds once the gang is complete

    def _plan_after(self, layout: _Layout, step: str) -> Plan:
        last = self._plan
        if step == "same" and last is not None:
            return last
        plan = _plan_of(layout, self.options)
        starts = last.topology.__dict__.get("run_starts", _UNKNOWN) if last is not None else _UNKNOWN
        if step == "in place" and starts is not _UNKNOWN:
            # The members kept their roles, indices and process counts (in place: same key, identity and
            # slots), so the runs are the last plan's: no pass over every member (core/summary.py).
            plan.topology.remember(run_starts=starts)
        return plan

    def _advance(self, layout: _Layout, pods: Mapping[str, RawPod], nodes: NodeLabels | None,
                 touched: Iterable[str] | None) -> str | None:
        """Carry the layout over to ``pods``: "same" (nothing changed), "in place" (no member arrived, left
        or moved) or "moved"; None when only planning from scratch can say (the layout is then unusable)."""
        options = self.options
        if layout.nodes is not None and (nodes is None or layout.nodes != nodes):
            return None
        before = layout.pods
        if touched is None:
            changed = list(itertools.compress(pods.keys(), map(operator.is_not, map(before.get, pods.keys()),
                                                               pods.values())))  # C-level: no Python loop per pod
            gone = list(before.keys() - pods.keys())
        else:
            changed, gone = [], []
            for name in dict.fromkeys(touched):
                pod = pods.get(name)
                if pod is None:
                    if name in before:
                        gone.append(name)
                elif before.get(name) is not pod:
                    changed.append(name)
        if not changed and not gone:
            return "same"
        if self.self_name in gone or self.self_name in changed or len(changed) + len(gone) > 64:
            return None  # this pod itself, or a burst: from scratch (the same cost as one pass)
        found = layout.found
        topology_order = layout.at is not None
        domains_of = _domain_reader(options, nodes)
        arriving: list[tuple[Live, SortKey]] = []
        lowest = len(layout.live)
        in_place: list[int] = []
        moved = False  # a member arrived or left: the runs of ranks may differ (Topology.run_starts)
        for name in [*changed, *gone]:
            pod = pods.get(name)
            new: Live | None = None
            layout.dropped.pop(name, None)
            if pod is not None:
                facts = facts_of(pod, found.controller, options, found.pairs, self.memo, checked=self.checked)
                if facts.namespace == found.namespace and facts.job == found.job:
                    if facts.reason:
                        layout.dropped[name] = Excluded(name=name, reason=facts.reason)
                    elif facts.ident is None:
                        return None  # planning from scratch says why
                    else:
                        new = (pod, facts.ident, facts)
            old_key = layout.key_of.get(name)
            if old_key is None:
                if new is not None:
                    arriving.append((new, self._key(layout, new)))
                continue
            at = layout.at[name] if layout.at is not None else bisect.bisect_left(layout.keys, old_key)
            if new is not None:
                key = self._key(layout, new)
                _, old_ident, old_facts = layout.live[at]
                if key == old_key and new[1] == old_ident and self._same_place(layout, old_facts, new[2]):
                    layout.live[at] = new
                    in_place.append(at)
                    continue
            if topology_order:
                return None
            self._leave(layout, at, name)
            moved = True
            lowest = min(lowest, at)
            if new is not None:
                arriving.append((new, self._key(layout, new)))
        for new, key in arriving:
            if topology_order:
                return None
            placed_at = self._arrive(layout, new, key)
            if placed_at is None:
                return None
            lowest = min(lowest, placed_at)
        _check_roles(found, layout.role_count, options)
        if not found.explicit_roles and {r for r, n in layout.role_count.items() if n} != set(found.training_roles):
            return None
        if touched is None:
            layout.pods = dict(pods)
        else:  # the layout's own copy, one entry per change: a copy of 16384 pods per event was most of a change
            for name in changed:
                layout.pods[name] = pods[name]
            for name in gone:
                del layout.pods[name]
        for at in in_place:
            if at < lowest:
                self._replace(layout, at, domains_of)
        if lowest < len(layout.live):
            _place(layout, lowest, len(layout.live), options, domains_of)
        return "moved" if moved or arriving else "in place"

    def _key(self, layout: _Layout, live: Live) -> SortKey:
        pod, ident, facts = live
        return _sort_key(pod, ident, facts.name, layout.position, layout.found.explicit_roles, layout.coordinator)

    def _same_place(self, layout: _Layout, old: _Facts, new: _Facts) -> bool:
        """Can the pod keep its member's position and ranks: same slots, still in or out of the host lists (a
        training pod is never left out: its new IP is its member's new address, in place)."""
        if old.slots != new.slots:
            return False
        if layout.at is not None and old.node != new.node:
            return False  # topology order follows the nodes
        if self.options.address == "ip" and old.has_ip != new.has_ip:
            return new.ident is not None and new.ident.role in layout.position
        return True

    def _leave(self, layout: _Layout, at: int, name: str) -> None:
        _, ident, _ = layout.live.pop(at)
        del layout.keys[at]
        old = layout.placed.pop(at)
        if old is not None:
            layout.tally(old, -1)
        del layout.key_of[name]
        layout.claims.pop((ident.role, ident.index), None)
        layout.role_count[ident.role] -= 1
        if ident.role in layout.position:
            layout.training -= 1
        layout.left_out.discard(name)
        layout.unplaced.discard(name)
        layout.slots_source.pop(name, None)

    def _arrive(self, layout: _Layout, live: Live, key: SortKey) -> int | None:
        _, ident, facts = live
        claim = (ident.role, ident.index)
        if claim in layout.claims:
            return None  # two pods claim one index: planning from scratch names them
        at = bisect.bisect_left(layout.keys, key)
        layout.live.insert(at, live)
        layout.keys.insert(at, key)
        layout.placed.insert(at, None)
        layout.key_of[facts.name] = key
        layout.claims[claim] = facts.name
        layout.role_count[ident.role] = layout.role_count.get(ident.role, 0) + 1
        if ident.role in layout.position:
            layout.training += 1
        return at

    def _replace(self, layout: _Layout, at: int, domains_of: Callable[[str], tuple[str, ...] | None]) -> None:
        """The member at ``at`` from its pod's new facts, with the ranks and ordinal it had."""
        old = layout.placed[at]
        if old is None:
            return  # left out before and after
        _, ident, _ = layout.live[at]
        seen = {old.role: old.ordinal if ident.ordinal < 0 else 0}
        counters = (old.node_rank or 0, old.first_rank or 0, seen)
        _place(layout, at, at + 1, self.options, domains_of, counters=counters)


def _domain_reader(options: Options, nodes: NodeLabels | None) -> Callable[[str], tuple[str, ...] | None]:
    """node name -> its domains, computed once per node (a node holds several pods)."""
    levels = options.levels
    if levels is None:
        return lambda _node: None
    known: dict[str, tuple[str, ...] | None] = {}

    def domains_of(node: str) -> tuple[str, ...] | None:
        if node not in known:
            known[node] = node_domains(node, nodes.get(node), levels) if node and nodes else None
        return known[node]
    return domains_of


def _topology_first(live: list[tuple[RawPod, Identity, _Facts]], position: dict[str, int],
                    domains_of: Callable[[str], tuple[str, ...] | None]
                    ) -> tuple[list[tuple[RawPod, Identity, _Facts]], str | None]:
    """``--rank-order topology``: the training pods (first in ``live``) reordered by their domains; every pod
    computes this from the same pods and Node labels, so all agree. Index order, and the reason, when any
    training pod's domains are unknown: a partial order would differ between pods that know more or less."""
    count = sum(1 for _, ident, _ in live if ident.role in position)
    training = live[:count]
    paths = []
    for _, _, facts in training:
        domains = domains_of(facts.node)
        if domains is None:
            # From the pod's facts alone (not its phase): the planner keeps a layout while a pod's facts stand.
            why = f"runs on node '{facts.node}' whose labels are unknown" if facts.node else \
                "has no spec.nodeName (not scheduled yet, or listed without it)"
            return live, f"pod '{facts.name}' {why}; ranks stay in index order"
        paths.append((*domains, facts.node))
    return [training[i] for i in topology_order(paths)] + live[count:], None
