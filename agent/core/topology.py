"""Pods -> Topology. This module decides membership, NODE_RANK and RANK; nothing else does.

Rank order is an explicit sort key: the position of the pod's role in the training roles, then the
controller's index (JobSet: job-global-index, then completion index). Never creation time, list order or IP:
those differ between the pods' views of the same job, and two pods that disagree on ranks hang forever.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent.core.containers import pick_trainer_container, resolve_nproc
from agent.core.controllers import Controller, detect_controller, parse_selector, selector_matches
from agent.core.model import Excluded, Identity, Member, Options, RawPod, Topology
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


def pod_name(pod: RawPod) -> str:
    return pod.get("metadata", {}).get("name", "")


def pod_ip(pod: RawPod) -> str | None:
    status = pod.get("status", {})
    ips = [entry.get("ip") for entry in status.get("podIPs", []) if entry.get("ip")]
    return status.get("podIP") or (ips[0] if ips else None)


def why_not_member(pod: RawPod) -> str | None:
    """Terminating, Failed and Succeeded pods are gone for training purposes, whatever their labels say."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return "terminating (deletionTimestamp is set)"
    phase = pod.get("status", {}).get("phase")
    if phase in ("Failed", "Succeeded"):
        return f"phase {phase}"
    return None


def find_pod(pods: Sequence[RawPod], name: str) -> RawPod:
    for pod in pods:
        if pod_name(pod) == name:
            return pod
    raise InputError(f"pod '{name}' (--self / POD_NAME) is not in the pod list; check the name and namespace")


def _job_pods(pods: Sequence[RawPod], me: RawPod, me_id: Identity, controller: Controller,
              options: Options) -> list[RawPod]:
    """The pods of my job in my namespace; pods of other jobs or controllers are not my concern."""
    namespace = me.get("metadata", {}).get("namespace", "default")
    pairs = parse_selector(options.selector) if options.selector else None
    mine: list[RawPod] = []
    for pod in pods:
        if pod.get("metadata", {}).get("namespace", "default") != namespace:
            continue
        if pairs is not None:
            if pod is me or selector_matches(pod, pairs):
                mine.append(pod)
            continue
        if pod is me or controller.job_of(pod) == me_id.job:
            mine.append(pod)
    return mine


def _address(pod: RawPod, ident: Identity, controller: Controller, namespace: str,
             options: Options) -> tuple[str, str | None, str | None]:
    name = pod_name(pod)
    ip = pod_ip(pod)
    dns = controller.dns_name(pod, ident, namespace, options.cluster_domain)
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


@dataclass(frozen=True)
class Collected:
    """The live pods of one job with their identities, before addresses and ranks are given."""

    me: RawPod
    controller: Controller
    me_id: Identity
    live: tuple[tuple[RawPod, Identity], ...]
    excluded: tuple[Excluded, ...]
    training_roles: tuple[str, ...]
    explicit_roles: bool

    def is_training(self, ident: Identity) -> bool:
        return ident.role in self.training_roles


def collect(pods: Sequence[RawPod], self_name: str, options: Options) -> Collected:
    """Find the job's live pods and identify each; raise ``InputError`` on labels that make no job."""
    me = find_pod(pods, self_name)
    controller = detect_controller(me, options)
    me_id = controller.identify(me, options)
    live: list[tuple[RawPod, Identity]] = []
    excluded: list[Excluded] = []
    seen: dict[tuple[str, tuple[int, ...]], str] = {}
    names: set[str] = set()
    for pod in _job_pods(pods, me, me_id, controller, options):
        name = pod_name(pod)
        if name in names:
            raise InputError(f"pod '{name}' appears twice in the pod list; pass each pod once")
        names.add(name)
        reason = why_not_member(pod)
        if reason:
            excluded.append(Excluded(name=name, reason=reason))
            continue
        ident = me_id if pod is me else controller.identify(pod, options)
        key = (ident.role, ident.index)
        if key in seen:
            where = ", ".join(map(str, ident.index))
            raise InputError(
                f"pods '{seen[key]}' and '{name}' both claim role '{ident.role}' index {where}; "
                "delete the stale pod or fix its index label"
            )
        seen[key] = name
        live.append((pod, ident))
    roles = options.roles if options.roles is not None else controller.default_roles
    present = {ident.role for _, ident in live}
    training_roles = tuple(roles) if roles is not None else tuple(sorted(present))
    return Collected(me=me, controller=controller, me_id=me_id, live=tuple(live), excluded=tuple(excluded),
                     training_roles=training_roles, explicit_roles=roles is not None)


def build_plan(pods: Sequence[RawPod], self_name: str, options: Options) -> Plan:
    """Place every pod of ``self_name``'s job; raise ``InputError`` with one line when the pods say no job."""
    found = collect(pods, self_name, options)
    me, controller, me_id = found.me, found.controller, found.me_id
    namespace = me.get("metadata", {}).get("namespace", "default")
    excluded = list(found.excluded)
    live = list(found.live)
    training_roles = found.training_roles
    roles = training_roles if found.explicit_roles else None

    if self_name in {e.name for e in excluded}:
        reason = next(e.reason for e in excluded if e.name == self_name)
        raise InputError(f"pod '{self_name}' is not a member of its own job ({reason}); nothing to configure")

    def order(item: tuple[RawPod, Identity]) -> tuple[int, str, tuple[int, ...]]:
        ident = item[1]
        if ident.role in training_roles:
            # Without explicit roles (JobSet: every replicated job) the controller's global index alone orders.
            return (training_roles.index(ident.role) if roles is not None else 0, "", ident.index)
        return (len(training_roles), ident.role, ident.index)

    live.sort(key=order)
    members: list[Member] = []
    slots_source: dict[str, str] = {}
    node_rank = 0
    first_rank = 0
    role_positions: dict[str, int] = {}
    for pod, ident in live:
        training = ident.role in training_roles
        if not training and options.address == "ip" and not pod_ip(pod) and pod is not me:
            # A pod that does not train is not waited for; until it has an IP it is left out of host lists.
            excluded.append(Excluded(name=pod_name(pod), reason="no IP yet (--address ip), not a training pod"))
            continue
        address, dns, ip = _address(pod, ident, controller, namespace, options)
        ordinal = ident.ordinal if ident.ordinal >= 0 else role_positions.get(ident.role, 0)
        role_positions[ident.role] = role_positions.get(ident.role, 0) + 1
        if training:
            container = pick_trainer_container(pod, options.container)
            slots, source = resolve_nproc(pod, container, options)
            slots_source[pod_name(pod)] = source
            members.append(Member(
                name=pod_name(pod), role=ident.role, index=ident.index, ordinal=ordinal, address=address,
                dns_name=dns, ip=ip, training=True, slots=slots, node_rank=node_rank, first_rank=first_rank,
            ))
            node_rank += 1
            first_rank += slots
        else:
            members.append(Member(
                name=pod_name(pod), role=ident.role, index=ident.index, ordinal=ordinal, address=address,
                dns_name=dns, ip=ip, training=False, slots=0,
            ))

    rank0 = next((pod for pod, ident in live if ident.role in training_roles), None)
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
    )
    return Plan(
        topology=topology,
        controller=controller,
        self_pod=me,
        master_port=master_port,
        master_port_source=port_source,
        slots_source=slots_source,
    )
