"""What one pod object says of itself, whatever the other pods say: whether it is gone, its job, its identity
(by its controller's rules), the address its peers reach it by and its process count; or the error to raise if
it is used. Computed once per pod version (``Memo``): the sidecar and init's wait see each pod many times.

Nothing here relates one pod to another: the rank order and the members are layout.py's.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from agent.core.controllers import Controller, selector_matches
from agent.core.model import Identity, Options, RawPod
from agent.core.pods.claims import has_claims
from agent.core.pods.containers import pick_trainer_container, resolve_nproc
from agent.core.pods.lost import node_lost_of, why_lost
from agent.core.pods.pod import life_of, pod_ip, pod_name, version_of
from agent.core.pods.validation import check_pod, dns_value, ip_value
from agent.errors import InputError


class Memo:
    """Each pod's facts remembered by pod name, for the resourceVersion they carry (``PodFacts.version``).

    A pod's facts depend only on the pod object and the options, and the API server changes resourceVersion
    whenever the object changes, so a long-lived caller (the sidecar) recomputes only the pods that changed.
    One version per pod is held: a pod's new version replaces its old one (init's wait sees every pod of a
    large job twice, without and with its IP). Entries of pods not seen in the last computation are dropped.
    Results are the same with or without it. Keyed by the name alone, with the version in the facts: a key and
    a value tuple per pod would cost ~2 MB at 16384 pods.
    """

    def __init__(self, options: Options) -> None:
        self.options = options
        self._old: dict[str, PodFacts] = {}
        self._new: dict[str, PodFacts] = {}

    def begin(self) -> None:
        self._old, self._new = {**self._old, **self._new}, {}

    def end(self) -> None:
        self._old, self._new = self._new, {}

    @staticmethod
    def key(pod: RawPod) -> tuple[str, str] | None:
        """(name, resourceVersion), or None: nothing to remember the pod by (and an odd pod: computing refuses it).
        A pod the agent marked for its lost Node (lost.py) has the same resourceVersion and other facts: the
        version then says why too."""
        key = version_of(pod)
        if key is None:
            return None
        node = node_lost_of(life_of(pod).conditions)  # a condition the agent gives the pod: the same version
        return key if node is None else (key[0], f"{key[1]} {node}")

    def lookup(self, key: tuple[str, str]) -> PodFacts | None:
        """The facts remembered for this version of the pod: the per-change hot path."""
        name, rv = key
        held = self._new.get(name)
        if held is not None and held.version == rv:
            return held
        held = self._old.get(name)
        if held is not None and held.version == rv:
            self._new[name] = held
            return held
        return None

    def store(self, facts: PodFacts) -> PodFacts:
        """``facts`` of a pod's new version, sharing what they say as its earlier version's did (``shared``)."""
        earlier = self._old.pop(facts.name, None) or self._new.get(facts.name)  # not asked for again: let go
        if earlier is not None:
            facts = shared(facts, earlier)
        self._new[facts.name] = facts
        return facts




def why_not_member(pod: RawPod) -> str | None:
    """Terminating, Failed and Succeeded pods are gone for training purposes, whatever their labels say; so is a
    pod whose conditions say it is lost (lost.py: marked for disruption, or its node lost)."""
    life = life_of(pod)
    if life.deleted:
        return "terminating (deletionTimestamp is set)"
    if life.phase in ("Failed", "Succeeded"):
        return f"phase {life.phase}"
    return why_lost(life.conditions)


class Place(NamedTuple):
    """Where a pod's peers reach it: its address (its DNS name or its IP, as --address says), its DNS name and its
    IP (either None where the pod has none)."""

    address: str
    dns_name: str | None
    ip: str | None


class PodFacts(NamedTuple):
    """What one pod object says, independent of the other pods (memoised per resourceVersion). A NamedTuple, not
    a frozen dataclass: a pod read from scratch makes one, and at 16384 pods the NamedTuples are made in about a
    third of the time (tens of ms of a full-view pod's ~0.5 s from the snapshot to its files)."""

    name: str
    namespace: str
    job: str | None
    reason: str | None
    ident: Identity | None
    error: InputError | None
    has_ip: bool = False
    place: Place | None = None  # None: place_error says why
    place_error: InputError | None = None
    slots: tuple[int, str] | None = None  # processes, the rule that decided
    slots_error: InputError | None = None
    node: str = ""  # spec.nodeName
    version: str = ""  # the resourceVersion they were read from (Memo)
    created: str = ""  # metadata.creationTimestamp: a pod made again after a hot spare took its seat (spares.py)


# The parts of a pod's facts its next version usually repeats: the kubelet's writes change its phase, its
# readiness, its IP, and rarely who it is or where its peers reach it.
_REPEATED = tuple(PodFacts._fields.index(part) for part in ("namespace", "job", "ident", "place", "slots", "node",
                                                            "created"))


def shared(facts: PodFacts, earlier: PodFacts) -> PodFacts:
    """``facts`` with each part equal to ``earlier``'s taken from ``earlier``. The facts of a pod that holds every
    member live for the pod's life, and the plan keeps the objects of the version it was laid out from (its sort
    keys, its members): without this each version the kubelet writes would hold its own copy of the identity,
    the address and the process count's rule beside them."""
    parts: list[Any] | None = None
    for at in _REPEATED:
        new, old = facts[at], earlier[at]
        if new is not old and new == old:
            if parts is None:
                parts = list(facts)
            parts[at] = old
    return facts if parts is None else type(facts)._make(parts)


Sizes = dict[tuple[int, ...], tuple[object, tuple[int, str]]]  # ids of a pod's containers -> (them, the count)


def _facts(pod: RawPod, controller: Controller, options: Options, pairs: dict[str, str] | None, *,
           checked: bool = False, sizes: Sizes | None = None, version: str = "") -> PodFacts:
    if not checked:
        check_pod(pod)
    meta = pod.get("metadata", {})
    namespace = meta.get("namespace", "default")
    matched = pairs is None or selector_matches(pod, pairs)
    job = controller.job_of(pod) if pairs is None else (options.choice.selector if matched else None)
    reason = why_not_member(pod)
    name = meta.get("name", "")
    if job is None or reason is not None:
        return PodFacts(name=name, namespace=namespace, job=job, reason=reason, ident=None, error=None,
                        version=version)
    # Each step's error is kept to raise later, without its traceback: a kept traceback holds its frames and their
    # locals (the pod among them), ~1 KB per pod for every pod still without an IP.
    try:
        ident = controller.identify(pod, options)
    except InputError as err:
        return PodFacts(name=name, namespace=namespace, job=job, reason=reason, ident=None,
                        error=err.with_traceback(None), version=version)
    place: Place | None = None
    slots: tuple[int, str] | None = None
    place_error = slots_error = None
    try:
        place = _address(pod, ident, controller, namespace, options)
    except InputError as err:
        place_error = err.with_traceback(None)
    try:
        slots = _slots(pod, options, sizes)
    except InputError as err:
        slots_error = err.with_traceback(None)
    return PodFacts(name, namespace, job, reason, ident, None, bool(pod_ip(pod)), place, place_error, slots,
                    slots_error, pod.get("spec", {}).get("nodeName") or "", version,
                    str(meta.get("creationTimestamp") or ""))


def _slots(pod: RawPod, options: Options, sizes: Sizes | None) -> tuple[int, str]:
    """The pod's process count; ``sizes`` remembers it per list of container objects for one pass (the pods a
    follower builds from the published rows share one container object per shape: 16384 pods, a handful of
    shapes), so that neither the trainer container is picked nor its count resolved again. Both depend on the
    containers alone (the pod's name is only in the messages, and a refusal is not remembered). The entry holds
    the containers, so their ids are not reused while it lives. A container that takes DRA claims is counted per
    pod once the claims are read: its devices are the pod's own claims'."""
    containers = pod.get("spec", {}).get("containers") or ()
    processes = options.processes
    if sizes is None or (processes.claims is not None and any(map(has_claims, containers))):
        return resolve_nproc(pod, pick_trainer_container(pod, processes.container), options)
    key = tuple(map(id, containers))
    known = sizes.get(key)
    if known is None:
        known = sizes[key] = (tuple(containers), resolve_nproc(pod, pick_trainer_container(pod, processes.container),
                                                                 options))
    return known[1]


def _address(pod: RawPod, ident: Identity, controller: Controller, namespace: str, options: Options) -> Place:
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
        return Place(ip, dns, ip)
    if not dns:
        raise InputError(
            f"pod '{name}': no DNS name (spec.hostname/spec.subdomain unset and {controller.title} gives none); "
            "set spec.subdomain to a headless Service, or use --address ip"
        )
    return Place(dns, dns, ip)


def facts_of(pod: RawPod, controller: Controller, options: Options, pairs: dict[str, str] | None,
             memo: Memo | None, *, checked: bool = False, sizes: Sizes | None = None) -> PodFacts:
    """What one pod object says (identity, address, slots, or why it is not a member), once per resourceVersion.
    ``checked``: the caller already passed the pod through ``check_pod`` (init's intake does, for every event)."""
    if memo is None or (key := memo.key(pod)) is None:
        return _facts(pod, controller, options, pairs, checked=checked, sizes=sizes)
    held = memo.lookup(key)
    if held is not None:
        return held
    return memo.store(_facts(pod, controller, options, pairs, checked=checked, sizes=sizes, version=key[1]))
