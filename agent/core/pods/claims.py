"""The accelerators that Dynamic Resource Allocation (DRA, resource.k8s.io/v1) gives a pod's trainer container.

A pod asks for devices through ``spec.resourceClaims`` (each a name and a ``resourceClaimName`` or a
``resourceClaimTemplateName``) and each container takes some of them through ``resources.claims`` (a pod claim's
name, and optionally one of its requests). A claim made from a template is named in ``status.resourceClaimStatuses``
and carries the pod as its controlling owner and the pod claim's name in the annotation
``resource.kubernetes.io/pod-claim-name``; the scheduler writes the devices it chose to the claim's
``status.allocation.devices.results`` (request, driver, pool, device) before the pod is bound, so a pod whose init
runs has its devices allocated. Before allocation only the request says how many: ``exactly.count`` with
allocationMode ExactCount (1 when unset); allocationMode All means as many as the node has, known only after
allocation.

The shell reads the claims (init and the sidecar through the API, render and explain from ``--claims``) and passes
them in as ``Claims``; this module only reads them. A peer held compact (core/compact.py) has neither
``spec.resourceClaims`` nor its status: its claims are found by their owner and annotation, which is why the
index is kept by (pod, pod claim); of a replaced pod's old and new claim, the one not being deleted and newest.
Which drivers are accelerators is the table in core/pods/accelerators.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from agent.core.pods.accelerators import dra_class, dra_driver

if TYPE_CHECKING:
    from agent.core.model import RawContainer, RawPod

POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"  # k8s.io/api resource/v1 PodResourceClaimAnnotation
CLAIM, TEMPLATE = "ResourceClaim", "ResourceClaimTemplate"


@dataclass(frozen=True)
class Ask:
    """One request of a claim's spec: its DeviceClass per alternative (``exactly``: one; ``firstAvailable``: one
    per subrequest) and how many devices each asks for (None: allocationMode All, or a mode this agent does not
    know: the count is known only after allocation)."""

    name: str
    classes: tuple[str, ...]
    counts: tuple[int | None, ...]


@dataclass(frozen=True)
class Claim:
    """A ResourceClaim as far as the process count needs it. ``devices``: (request, driver) per allocated device;
    None while it is not allocated."""

    name: str
    owner: str  # the Pod that controls it (claims made from a template), else ""
    pod_claim: str  # its pod claim's name (the annotation), else ""
    devices: tuple[tuple[str, str], ...] | None
    asks: tuple[Ask, ...]
    created: str = ""  # creationTimestamp (RFC 3339 UTC: ordered as text)
    deleting: bool = False  # deletionTimestamp set: its pod is gone, the garbage collector is at it

    @property
    def rank(self) -> tuple[bool, str]:
        """Which of two claims of one pod claim and owner name is the live pod's: not being deleted, newest."""
        return not self.deleting, self.created


@dataclass(frozen=True)
class Claims:
    """The claims and templates of a namespace as the shell read them; ``note`` says why none could be read (the
    count then falls back, and says so)."""

    claims: tuple[Claim, ...] = ()
    templates: tuple[tuple[str, tuple[Ask, ...]], ...] = ()
    note: str = ""
    _by_name: dict[str, Claim] = field(default_factory=dict, compare=False, repr=False, hash=False)
    _by_owner: dict[tuple[str, str], Claim] = field(default_factory=dict, compare=False, repr=False, hash=False)

    def __post_init__(self) -> None:
        for claim in self.claims:
            self._by_name[claim.name] = claim
            key = (claim.owner, claim.pod_claim)
            # A pod re-created under its name (a replaced Volcano or JobSet pod) has a new claim, and the old one
            # may be there still
            if claim.owner and claim.pod_claim and (key not in self._by_owner
                                                    or claim.rank >= self._by_owner[key].rank):
                self._by_owner[key] = claim

    def named(self, name: str) -> Claim | None:
        return self._by_name.get(name)

    def owned(self, pod: str, pod_claim: str) -> Claim | None:
        return self._by_owner.get((pod, pod_claim))

    def template(self, name: str) -> tuple[Ask, ...] | None:
        return dict(self.templates).get(name)


def _dicts(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _count(exact: Mapping[str, Any]) -> int | None:
    mode = exact.get("allocationMode") or "ExactCount"
    if mode != "ExactCount":
        return None
    count = exact.get("count", 1)
    return count if type(count) is int and count >= 1 else None


def _asks(spec: Any) -> tuple[Ask, ...]:
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    asks = []
    for request in _dicts(devices.get("requests") if isinstance(devices, Mapping) else None):
        exact = request.get("exactly")
        alternatives = [exact] if isinstance(exact, Mapping) else _dicts(request.get("firstAvailable"))
        if not alternatives and "deviceClassName" in request:  # the v1beta1 shape, fields on the request itself
            alternatives = [request]
        asks.append(Ask(_text(request.get("name")), tuple(_text(a.get("deviceClassName")) for a in alternatives),
                        tuple(_count(a) for a in alternatives)))
    return tuple(asks)


def _claim(item: Mapping[str, Any]) -> Claim:
    meta = _map(item.get("metadata"))
    owner = next((_text(o.get("name")) for o in _dicts(meta.get("ownerReferences"))
                  if o.get("kind") == "Pod" and o.get("controller")), "")
    notes = _map(meta.get("annotations"))
    allocation = _map(item.get("status")).get("allocation")
    devices = None
    if isinstance(allocation, Mapping):
        results = _dicts(_map(allocation.get("devices")).get("results"))
        devices = tuple((_text(r.get("request")), _text(r.get("driver"))) for r in results)
    return Claim(_text(meta.get("name")), owner, _text(notes.get(POD_CLAIM_ANNOTATION)), devices,
                 _asks(item.get("spec")), _text(meta.get("creationTimestamp")), bool(meta.get("deletionTimestamp")))


def read_claims(items: Iterable[Any], *, kind: str = CLAIM, note: str = "") -> Claims:
    """``Claims`` from the items of a list: ResourceClaims and ResourceClaimTemplates (an item's ``kind``, else
    ``kind``: an API LIST's items carry none). Fields of other shapes are read as absent."""
    claims, templates = [], []
    for item in items:
        if not isinstance(item, Mapping):
            continue
        what = item.get("kind") or kind
        if what == CLAIM:
            claims.append(_claim(item))
        elif what == TEMPLATE:
            templates.append((_text(_map(item.get("metadata")).get("name")),
                              _asks(_map(item.get("spec")).get("spec"))))
    return Claims(tuple(claims), tuple(templates), note)


def has_claims(container: RawContainer | None) -> bool:
    """Whether the container takes devices from DRA claims (``resources.claims``)."""
    resources = (container or {}).get("resources")
    return isinstance(resources, Mapping) and bool(_dicts(resources.get("claims")))


class DraCount(NamedTuple):
    """The accelerators a container's claims give (None: not known; the count falls back) and what said so."""

    accelerators: int | None
    text: str


def _entry(entries: Any, name: str) -> Mapping[str, Any]:
    return next((e for e in _dicts(entries) if e.get("name") == name), {})


def _wanted(request: str, wanted: str) -> bool:
    """A result's request is the container's (``request/subrequest`` belongs to ``request``), or all are."""
    return not wanted or request == wanted or request.startswith(wanted + "/")


def _tally(drivers: Iterable[str]) -> tuple[int, list[str], list[str]]:
    """(accelerators, the accelerators said, the rest said): each driver with how many it gave."""
    counted: dict[str, int] = {}
    for driver in drivers:
        counted[driver] = counted.get(driver, 0) + 1
    total, said, rest = 0, [], []
    for driver, n in counted.items():
        row = dra_driver(driver)
        if row is not None and row.accelerator:
            total += n
            said.append(f"{n} x {driver} ({row.family})")
        elif row is not None:
            rest.append(f"left out {n} x {driver} ({row.family}: no accelerator)")
        else:
            rest.append(f"not counted {n} x {driver or '?'} (not a known DRA accelerator driver: set "
                        "--nproc-per-node if it is)")
    return total, said, rest


def _allocated(claim: Claim, wanted: str, where: str) -> tuple[int, str]:
    assert claim.devices is not None
    total, said, rest = _tally(d for r, d in claim.devices if _wanted(r, wanted))
    return total, f"{where}: allocated {', '.join(said) or 'no accelerator'}" + "".join(f"; {r}" for r in rest)


def _asked(asks: tuple[Ask, ...], wanted: str, where: str) -> tuple[int | None, str]:
    """Before allocation: the accelerators the requests ask for, or None where the count waits for allocation."""
    total, said, rest = 0, [], []
    for ask in asks:
        if wanted and ask.name != wanted:
            continue
        rows = [dra_class(c) for c in ask.classes]
        if not rows:
            continue
        if all(row is not None and not row.accelerator for row in rows):
            rest.append(f"left out request '{ask.name}' ({', '.join(ask.classes)}: no accelerator)")
            continue
        if any(row is None for row in rows):
            unknown = ", ".join(c for c, row in zip(ask.classes, rows, strict=True) if row is None)
            rest.append(f"not counted request '{ask.name}' (DeviceClass {unknown}: not a known DRA accelerator "
                        "class: set --nproc-per-node if it is)")
            continue
        if len(set(ask.counts)) != 1 or ask.counts[0] is None:
            why = "allocationMode All" if len(ask.counts) == 1 else "firstAvailable with unlike counts"
            return None, (f"{where}: request '{ask.name}' asks for {why}: how many devices is known only after "
                          "allocation")
        family = rows[0].family if rows[0] is not None else ""
        total += ask.counts[0]
        said.append(f"{ask.counts[0]} x {ask.classes[0]} ({family}) in request '{ask.name}' (exactly.count)")
    return total, f"{where}: asks for {', '.join(said) or 'no accelerator'}" + "".join(f"; {r}" for r in rest)


def dra_devices(pod: RawPod, container: RawContainer | None, claims: Claims | None) -> DraCount | None:
    """The accelerators the container's claims give, or None when it takes no claim. Per claim: the allocated
    devices whose driver is an accelerator (``resources.claims[].request``: only that request's), else the
    template's or the claim's requests (``exactly.count``); a claim not found, or an ``All`` request before
    allocation, is not known, said in ``text``: with no accelerator known, the count is None (unknown)."""
    resources = (container or {}).get("resources")
    entries = _dicts(resources.get("claims")) if isinstance(resources, Mapping) else []
    if not entries:
        return None
    meta = pod.get("metadata", {})
    spec, status = pod.get("spec", {}), pod.get("status", {})
    pod_name = meta.get("name", "?")
    if claims is None:
        names = ", ".join(repr(_text(e.get("name"))) for e in entries)
        return DraCount(None, f"claim(s) {names} not read (render/explain: pass --claims, the output of "
                              "kubectl get resourceclaims,resourceclaimtemplates -o json)")
    total, texts, unknown = 0, [], False
    for entry in entries:
        pod_claim, wanted = _text(entry.get("name")), _text(entry.get("request"))
        asked = f"pod claim '{pod_claim}'" + (f" request '{wanted}'" if wanted else "")
        by_status = _entry(status.get("resourceClaimStatuses"), pod_claim)
        by_spec = _entry(spec.get("resourceClaims"), pod_claim)
        name = _text(by_status.get("resourceClaimName")) or _text(by_spec.get("resourceClaimName"))
        claim = claims.named(name) if name else claims.owned(pod_name, pod_claim)
        template = _text(by_spec.get("resourceClaimTemplateName"))
        asks = claims.template(template) if template else None
        count: int | None
        if claim is not None and claim.devices is not None:
            count, text = _allocated(claim, wanted, f"ResourceClaim '{claim.name}' ({asked})")
        elif claim is not None:
            count, text = _asked(claim.asks, wanted, f"ResourceClaim '{claim.name}' ({asked}, not allocated yet)")
        elif asks is not None:
            count, text = _asked(asks, wanted, f"ResourceClaimTemplate '{template}' ({asked}, no claim made yet)")
        else:
            which = f"ResourceClaim '{name}'" if name else f"the ResourceClaim of {asked}"
            why = claims.note or "not among the claims read"
            count, text = None, f"{which} not read ({why})"
        texts.append(text)
        if count is None:
            unknown = True
        else:
            total += count
    # The accelerators known count even when another claim's are not (each is named in the text): a pod's GPUs
    # are not dropped for the CPU limit because a claim beside them cannot be read.
    return DraCount(total if total or not unknown else None, "; ".join(texts))
