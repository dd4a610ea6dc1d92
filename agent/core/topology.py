"""Pods -> Topology. This module decides membership, NODE_RANK and RANK; nothing else does.

Rank order is an explicit sort key: the position of the pod's role in the training roles, then the
controller's index (JobSet: job-global-index, then completion index). Never creation time, list order or IP:
those differ between the pods' views of the same job, and two pods that disagree on ranks hang forever.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from agent.core.containers import pick_trainer_container, resolve_nproc
from agent.core.controllers import COORDINATOR, Controller, detect_controller, parse_selector, selector_matches
from agent.core.model import Excluded, Identity, Member, Options, RawPod, Topology
from agent.core.placement import node_domains, topology_order
from agent.core.validation import check_pod, dns_value, ip_value
from agent.errors import InputError


class Memo:
    """Per-pod results (identity, address, slots) remembered by (pod name, resourceVersion).

    A pod's facts depend only on the pod object and the options, and the API server changes resourceVersion
    whenever the object changes, so a long-lived caller (the sidecar) recomputes only the pods that changed.
    Entries of pods not seen in the last computation are dropped. Results are the same with or without it.
    """

    def __init__(self, options: Options) -> None:
        self.options = options
        self._old: dict[tuple[str, str, str], object] = {}
        self._new: dict[tuple[str, str, str], object] = {}
        self.texts: dict[Member, str] = {}  # each member's topology.json text (rendering.render_topology_json)

    def begin(self) -> None:
        self._old, self._new = {**self._old, **self._new}, {}

    def end(self) -> None:
        self._old, self._new = self._new, {}

    @staticmethod
    def _key(kind: str, pod: RawPod) -> tuple[str, str, str] | None:
        try:
            meta = pod["metadata"]
            name, rv = meta["name"], meta["resourceVersion"]
        except (KeyError, TypeError):
            return None  # no key to remember it by (and an odd pod: computing refuses it)
        if type(name) is not str or type(rv) is not str or not rv:
            return None
        return (kind, name, rv)

    def lookup(self, kind: str, pod: RawPod) -> tuple[tuple[str, str, str] | None, object]:
        """(key, remembered value or ``_MISSING``): the per-change hot path, without building a closure."""
        key = self._key(kind, pod)
        if key is None:
            return None, _MISSING
        value = self._new.get(key, _MISSING)
        if value is _MISSING:
            value = self._old.get(key, _MISSING)
            if value is not _MISSING:
                self._new[key] = value
        return key, value

    def store(self, key: tuple[str, str, str] | None, value: T) -> T:
        if key is not None:
            self._new[key] = value
        return value

    def get(self, kind: str, pod: RawPod, compute: Callable[[], T]) -> T:
        key, value = self.lookup(kind, pod)
        return value if value is not _MISSING else self.store(key, compute())  # type: ignore[return-value]


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


def pod_name(pod: RawPod) -> str:
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def pod_ip(pod: RawPod) -> str | None:
    """The pod's IP as the kubelet reported it (unchecked: ``_address`` checks it before it reaches a file)."""
    status = pod.get("status") or {}
    ips = [entry.get("ip") for entry in status.get("podIPs") or [] if entry.get("ip")]
    return status.get("podIP") or (ips[0] if ips else None)


T = TypeVar("T")
_SPEC_KEEP = ("hostname", "subdomain", "nodeName", "containers")
_CONTAINER_KEEP = ("name", "image", "command", "args", "env", "resources", "ports")
_META_KEEP = ("name", "namespace", "uid", "labels", "annotations", "deletionTimestamp", "ownerReferences",
              "resourceVersion")


def slim_pod(pod: RawPod) -> RawPod:
    """Only the fields the core reads: a long-lived watcher keeps 1/4 of the bytes (no managedFields, volumes,
    conditions, container statuses)."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    slim_spec: dict[str, object] = {k: spec[k] for k in _SPEC_KEEP[:3] if k in spec}  # type: ignore[literal-required]
    slim_spec["containers"] = [{k: c[k] for k in _CONTAINER_KEEP if k in c}  # type: ignore[literal-required]
                               for c in spec.get("containers", [])]
    slim: dict[str, Any] = {
        "metadata": {k: meta[k] for k in _META_KEEP if k in meta},  # type: ignore[literal-required]
        "spec": slim_spec,
        "status": {k: status[k] for k in ("phase", "podIP", "podIPs") if k in status},  # type: ignore
    }
    return slim  # type: ignore[return-value]


def why_not_member(pod: RawPod) -> str | None:
    """Terminating, Failed and Succeeded pods are gone for training purposes, whatever their labels say."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return "terminating (deletionTimestamp is set)"
    phase = pod.get("status", {}).get("phase")
    if phase in ("Failed", "Succeeded"):
        return f"phase {phase}"
    return None


def find_pod(pods: Sequence[RawPod], name: str) -> RawPod:
    if not pods:
        raise InputError(f"the pod list is empty, so pod '{name}' (--self / POD_NAME) is not in it; check the "
                         "namespace and label selector that listed it")
    for pod in pods:
        if pod_name(pod) == name:
            return check_pod(pod)  # type: ignore[return-value]
    raise InputError(f"pod '{name}' (--self / POD_NAME) is not in the pod list; check the name and namespace")


@dataclass(frozen=True)
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
    try:
        return compute(), None
    except InputError as err:
        return None, err


def _facts(pod: RawPod, controller: Controller, options: Options, pairs: dict[str, str] | None, *,
           checked: bool = False) -> _Facts:
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
    slots, slots_error = _attempt(lambda: resolve_nproc(pod, pick_trainer_container(pod, options.container), options))
    return _Facts(name=name, namespace=namespace, job=job, reason=reason, ident=ident, error=None,
                  has_ip=bool(pod_ip(pod)), place=place, place_error=place_error, slots=slots, slots_error=slots_error,
                  node=pod.get("spec", {}).get("nodeName") or "")


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
        for port in (container or {}).get("ports", []):
            if port.get("name") == "pytorchjob-port" and port.get("containerPort"):
                return int(port["containerPort"]), (
                    f"port 'pytorchjob-port' of container '{container.get('name')}' in pod '{pod_name(rank0)}'"
                    if container else "pytorchjob-port"
                )
    if controller.default_master_port is not None:
        return controller.default_master_port, f"{controller.title} convention {controller.default_master_port}"
    return 29500, "torchrun's default 29500"


def _host_name(pod: RawPod) -> str | None:
    spec = pod.get("spec", {})
    hostname, subdomain = spec.get("hostname"), spec.get("subdomain")
    return f"{hostname}.{subdomain}" if hostname and subdomain else None


def coordinator_of(pod: RawPod, controller: Controller) -> str | None:
    """JobSet >= v0.6.0 labels (and annotates) every pod with ``jobset.sigs.k8s.io/coordinator`` =
    ``<pod hostname>.<subdomain>`` of the pod its ``spec.coordinator`` names (CoordinatorEndpoint in
    pkg/controllers/jobset_controller.go)."""
    if controller.key not in ("jobset", "trainjob"):
        return None
    meta = pod.get("metadata", {})
    value = (meta.get("labels") or {}).get(COORDINATOR) or (meta.get("annotations") or {}).get(COORDINATOR)
    return value or None


def facts_of(pod: RawPod, controller: Controller, options: Options, pairs: dict[str, str] | None,
             memo: Memo | None, *, checked: bool = False) -> _Facts:
    """What one pod object says (identity, address, slots, or why it is not a member), once per resourceVersion.
    ``checked``: the caller already passed the pod through ``check_pod`` (init's intake does, for every event)."""
    if memo is None:
        return _facts(pod, controller, options, pairs, checked=checked)
    key, value = memo.lookup("facts", pod)
    if value is not _MISSING:
        return value  # type: ignore[return-value]
    return memo.store(key, _facts(pod, controller, options, pairs, checked=checked))


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

    def is_training(self, ident: Identity) -> bool:
        return ident.role in self.training_roles


def collect(pods: Sequence[RawPod], self_name: str, options: Options, *, memo: Memo | None = None) -> Collected:
    """Find the job's live pods and identify each; raise ``InputError`` on labels that make no job."""
    me = find_pod(pods, self_name)
    controller = detect_controller(me, options)
    me_id = controller.identify(me, options)
    namespace = me.get("metadata", {}).get("namespace", "default")
    pairs = parse_selector(options.selector) if options.selector else None
    job = options.selector if pairs is not None else me_id.job
    live: list[tuple[RawPod, Identity, _Facts]] = []
    excluded: list[Excluded] = []
    seen: dict[tuple[str, tuple[int, ...]], str] = {}
    names: set[str] = set()
    for pod in pods:
        facts = facts_of(pod, controller, options, pairs, memo)
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
    roles = options.roles if options.roles is not None else controller.default_roles
    present = {ident.role for _, ident, _ in live}
    training_roles = tuple(roles) if roles is not None else tuple(sorted(present))
    return Collected(me=me, controller=controller, me_id=me_id, live=tuple(live), excluded=tuple(excluded),
                     training_roles=training_roles, explicit_roles=roles is not None)


NodeLabels = Mapping[str, "Mapping[str, str] | None"]  # node name -> its labels (None: could not be read)


def build_plan(pods: Sequence[RawPod], self_name: str, options: Options, *, memo: Memo | None = None,
               nodes: NodeLabels | None = None) -> Plan:
    """Place every pod of ``self_name``'s job; raise ``InputError`` with one line when the pods say no job.
    ``nodes``: the labels of the Nodes the pods run on, read when ``options.levels`` asks for them."""
    if memo is not None:
        if memo.options != options:
            raise ValueError("a Memo serves one set of options")
        memo.begin()
    found = collect(pods, self_name, options, memo=memo)
    me, controller, me_id = found.me, found.controller, found.me_id
    namespace = me.get("metadata", {}).get("namespace", "default")
    excluded = list(found.excluded)
    live = list(found.live)
    training_roles = found.training_roles
    roles = training_roles if found.explicit_roles else None

    if options.roles is not None:
        present = {ident.role for _, ident, _ in live}
        missing = [r for r in options.roles if r not in present]
        if missing:
            have = ", ".join(sorted(present)) or "none"
            raise InputError(
                f"{options.label('roles')} names {', '.join(repr(r) for r in missing)}, but no live pod of "
                f"{controller.title} '{me_id.job}' has that role (roles present: {have}); fix the role names"
            )
    if self_name in {e.name for e in excluded}:
        reason = next(e.reason for e in excluded if e.name == self_name)
        raise InputError(f"pod '{self_name}' is not a member of its own job ({reason}); nothing to configure")

    coordinator = coordinator_of(me, controller)
    position = {role: i for i, role in enumerate(training_roles)}
    after_training = len(training_roles)

    def order(item: tuple[RawPod, Identity, _Facts]) -> tuple[int, int, str, tuple[int, ...]]:
        pod, ident, _ = item
        at = position.get(ident.role)
        if at is not None:
            # JobSet's spec.coordinator names the rank-0 endpoint; then the role order, then the controller's
            # index (without explicit roles, JobSet's global index alone orders every replicated job).
            first = 0 if coordinator is not None and _host_name(pod) == coordinator else 1
            return (first, at if roles is not None else 0, "", ident.index)
        return (2, after_training, ident.role, ident.index)

    if coordinator is None:  # the common case, without a call per pod (the sidecar sorts 4096 pods per change)
        keys = [(1, position[i.role] if roles is not None else 0, "", i.index) if i.role in position
                else (2, after_training, i.role, i.index) for _, i, _ in live]
    else:
        keys = [order(item) for item in live]
    live = [live[k] for k in sorted(range(len(live)), key=keys.__getitem__)]
    domains_of = _domain_reader(options, nodes)
    order_note = None
    if options.rank_order == "topology":
        live, order_note = _topology_first(live, position, domains_of)
    members: list[Member] = []
    slots_source: dict[str, str] = {}
    node_rank = 0
    first_rank = 0
    role_positions: dict[str, int] = {}
    by_ip = options.address == "ip"
    for pod, ident, facts in live:  # the sidecar's per-change cost at 4096 pods: positional, no repeated lookups
        role = ident.role
        training = role in position
        if not training and by_ip and not facts.has_ip and pod is not me:
            # A pod that does not train is not waited for; until it has an IP it is left out of host lists.
            excluded.append(Excluded(name=facts.name, reason="no IP yet (--address ip), not a training pod"))
            continue
        place = facts.place
        if place is None:
            raise facts.place_error or InputError(f"pod '{facts.name}': no address")
        seen_in_role = role_positions.get(role, 0)
        ordinal = ident.ordinal if ident.ordinal >= 0 else seen_in_role
        role_positions[role] = seen_in_role + 1
        running = pod is me or (pod.get("status") or {}).get("phase") == "Running"
        if training:
            if facts.slots is None:
                raise facts.slots_error or InputError(f"pod '{facts.name}': no process count")
            slots, source = facts.slots
            slots_source[facts.name] = source
            members.append(Member(facts.name, role, ident.index, ordinal, place[0], place[1], place[2], True, slots,
                                  node_rank, first_rank, running, facts.node, domains_of(facts.node)))
            node_rank += 1
            first_rank += slots
        else:
            members.append(Member(facts.name, role, ident.index, ordinal, place[0], place[1], place[2], False, 0,
                                  None, None, running, facts.node, domains_of(facts.node)))

    if len({m.address for m in members}) != len(members):
        _refuse_shared_address(members, options)
    rank0 = next((pod for pod, ident, _ in live if ident.role in training_roles), None)
    master_port, port_source = _master_port(rank0, controller, options)
    meta = me.get("metadata", {})
    owner_uid = None
    if controller.owner_is_job:
        owner_uid = next((o.get("uid") for o in meta.get("ownerReferences", []) if o.get("controller")), None)
    topology = Topology(
        controller=controller.key,
        namespace=namespace,
        job=me_id.job,
        job_uid=owner_uid,
        self_name=self_name,
        training_roles=training_roles,
        members=tuple(members),
        excluded=tuple(excluded),
        levels=options.levels or (),
        rank_order="index" if order_note is not None else options.rank_order,
        order_note=order_note,
    )
    if memo is not None:
        memo.end()
    return Plan(
        topology=topology,
        controller=controller,
        self_pod=me,
        master_port=master_port,
        master_port_source=port_source,
        slots_source=slots_source,
    )


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
            why = "is not scheduled yet" if not facts.node else f"runs on node '{facts.node}' whose labels are unknown"
            return live, f"pod '{facts.name}' {why}; ranks stay in index order"
        paths.append((*domains, facts.node))
    return [training[i] for i in topology_order(paths)] + live[count:], None


def _refuse_shared_address(members: list[Member], options: Options) -> None:
    """Two members under one address: every host list would name one host twice (DeepSpeed refuses such a
    hostfile, MPI starts two ranks' worth of processes on one pod). Pods with hostNetwork on one node share the
    node's IP."""
    seen: dict[str, str] = {}
    for member in members:
        if member.address in seen:
            fix = "use --address dns" if options.address == "ip" else "give each pod its own spec.hostname"
            raise InputError(f"pods '{seen[member.address]}' and '{member.name}' have the same address "
                             f"{member.address} (hostNetwork pods on one node share its IP); {fix}")
        seen[member.address] = member.name
