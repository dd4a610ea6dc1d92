"""The two forms of a pod and the one interface the core reads both through.

A pod is either the dict the API server sent (slimmed by ``pods.slim_pod``) or a ``CompactPod``: a peer held as
its published row's fields. Only this module knows which: the readers below (``name_of``, ``ip_of``, ``meta_of``,
``version_of``, ``life_of``, ``same_but_version``, ``quick_check``) answer for either form, each on the fast
path for the compact one, and the rest of the core asks them, never a pod's type.

A pod that holds every member (the publisher, its standbys, a launcher, a pod whose files name every member) holds
16384 of them for its life. As nested dicts each costs ~1.3 KB (four dicts and a list, ~800 bytes of them
structure); held in slots it is ~0.6 KB, the strings it must keep and the labels. The core reads a pod through
``get``/``[]`` of "metadata", "spec" and "status": each read builds that section as the dict ``_pod_of`` would
(what equality, JSON and every reader see), so nothing reading it can tell the difference but ``type``; the
sections are built once per pod version in practice, since the facts are memoised per resourceVersion.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from agent.core.pods.lost import conditions_of, node_lost_of, with_node_lost

_KEYS = ("metadata", "spec", "status")
_Pod = TypeVar("_Pod", bound=Mapping[str, Any])
_NONE: dict[str, Any] = {}


def conditions_section(conditions: list[list[str]]) -> list[dict[str, str]]:
    """A row's conditions ([type, status, reason]) as ``status.conditions`` says them (an empty reason: none)."""
    return [{"type": kind, "status": status, **({"reason": reason} if reason else {})}
            for kind, status, reason in conditions]


class CompactPod(Mapping[str, Any]):
    """One peer: read-only (no reader writes into a pod; the view replaces a pod with its next version)."""

    __slots__ = ("annotations", "conditions", "containers", "created", "deleted", "hostname", "ip", "labels", "name",
                 "namespace", "node", "phase", "subdomain", "version")

    def __init__(self, name: str, namespace: str, version: str, labels: dict[str, str],
                 annotations: dict[str, str], containers: list[dict[str, Any]], *, hostname: str = "",
                 subdomain: str = "", node: str = "", phase: str = "", ip: str = "", deleted: str = "",
                 conditions: list[list[str]] | None = None, created: str = "") -> None:
        self.name, self.namespace, self.version, self.labels = name, namespace, version, labels
        self.annotations = annotations or None  # the empty ones not held: ~64 bytes a pod
        self.containers = containers  # one list per container shape, shared by the pods of that shape
        self.hostname, self.subdomain, self.node = hostname, subdomain, node
        self.phase, self.ip, self.deleted = phase, ip, deleted
        self.conditions = conditions or None  # [type, status, reason] of those that say the pod is lost (lost.py)
        self.created = created  # creationTimestamp: hot spares tell a pod made again from the one it replaced

    def metadata(self) -> dict[str, Any]:
        meta = {"name": self.name, "namespace": self.namespace, "labels": self.labels,
                "annotations": self.annotations if self.annotations is not None else {}}
        if self.version:
            meta["resourceVersion"] = self.version
        if self.deleted:
            meta["deletionTimestamp"] = self.deleted
        if self.created:
            meta["creationTimestamp"] = self.created
        return meta

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": self.containers}
        if self.hostname:
            spec["hostname"] = self.hostname
        if self.subdomain:
            spec["subdomain"] = self.subdomain
        if self.node:
            spec["nodeName"] = self.node
        return spec

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = {"phase": self.phase, "podIP": self.ip} if self.ip else {"phase": self.phase}
        if self.conditions:
            status["conditions"] = conditions_section(self.conditions)
        return status

    def get(self, key: str, default: Any = None) -> Any:  # the hot path: no exception per miss
        if key == "metadata":
            return self.metadata()
        if key == "spec":
            return self.spec()
        if key == "status":
            return self.status()
        return default

    def __getitem__(self, key: str) -> Any:
        value = self.get(key, _NONE)
        if value is _NONE:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(_KEYS)

    def __len__(self) -> int:
        return len(_KEYS)

    def same_but_version(self, other: CompactPod) -> bool:
        """Equal to ``other`` in everything but resourceVersion."""
        return (self.name == other.name and self.ip == other.ip and self.phase == other.phase
                and self.node == other.node and self.deleted == other.deleted and self.labels == other.labels
                and self.annotations == other.annotations
                and (self.containers is other.containers or self.containers == other.containers)
                and self.hostname == other.hostname and self.subdomain == other.subdomain
                and self.namespace == other.namespace and self.conditions == other.conditions
                and self.created == other.created)

    def with_conditions(self, conditions: list[list[str]]) -> CompactPod:
        """The same pod with these lost conditions (its Node lost or back: the pod object has not changed)."""
        return CompactPod(self.name, self.namespace, self.version, self.labels, self.annotations or {},
                          self.containers, hostname=self.hostname, subdomain=self.subdomain, node=self.node,
                          phase=self.phase, ip=self.ip, deleted=self.deleted, conditions=conditions,
                          created=self.created)

    def __repr__(self) -> str:
        return f"CompactPod({dict(self)!r})"


class PodMeta(NamedTuple):
    """A pod's name, labels and annotations (empty maps when the pod has none)."""

    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


class PodLife(NamedTuple):
    """What says whether a pod can still train: its deletionTimestamp ("" if none), phase and conditions."""

    deleted: str
    phase: str
    conditions: Iterable[Sequence[str]]


_NO_LABELS: dict[str, str] = {}


def name_of(obj: object) -> str:
    """Any API object's name, or "" (whatever shape a forged object has)."""
    if type(obj) is CompactPod:
        return obj.name
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def ip_of(pod: Mapping[str, Any]) -> str | None:
    """The pod's IP as the kubelet reported it (``podIP``, else the first of ``podIPs``); unchecked."""
    if type(pod) is CompactPod:
        return pod.ip or None
    status = pod.get("status") or {}
    ips = [entry.get("ip") for entry in status.get("podIPs") or [] if entry.get("ip")]
    return status.get("podIP") or (ips[0] if ips else None)


def _text_in(pod: Mapping[str, Any], section: str, key: str) -> str:
    """``pod[section][key]`` of a pod read from the API when it is a string, else ""."""
    part = pod.get(section)
    value = part.get(key) if isinstance(part, dict) else None
    return value if isinstance(value, str) else ""


def node_of(pod: Mapping[str, Any]) -> str:
    """The Node the pod is bound to (``spec.nodeName``), or "" (unbound, or not a string)."""
    return pod.node if type(pod) is CompactPod else _text_in(pod, "spec", "nodeName")


def containers_of(pod: Mapping[str, Any]) -> list[Any]:
    """The pod's ``spec.containers`` (the one list its shape's pods share, for a held pod)."""
    if type(pod) is CompactPod:
        return pod.containers
    containers: list[Any] = pod.get("spec", {}).get("containers", [])
    return containers


def phase_of(pod: Mapping[str, Any]) -> str:
    """The pod's ``status.phase``, or "" (none, or not a string)."""
    return pod.phase if type(pod) is CompactPod else _text_in(pod, "status", "phase")


def meta_of(pod: Mapping[str, Any]) -> PodMeta:
    """The pod's name ("?" if it has none), labels and annotations: read several times per pod."""
    if type(pod) is CompactPod:
        return PodMeta(pod.name, pod.labels, pod.annotations or _NO_LABELS)
    metadata = pod.get("metadata", {})
    return PodMeta(metadata.get("name", "?"), metadata.get("labels", {}) or _NO_LABELS,
                   metadata.get("annotations", {}) or _NO_LABELS)


def version_of(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, resourceVersion), or None when the pod does not say both as strings."""
    if type(pod) is CompactPod:
        name, version = pod.name, pod.version
    else:
        try:
            meta = pod["metadata"]
            name, version = meta["name"], meta["resourceVersion"]
        except (KeyError, TypeError):
            return None
    if type(name) is not str or type(version) is not str or not version:
        return None
    return name, version


def life_of(pod: Mapping[str, Any]) -> PodLife:
    """Its deletionTimestamp, phase and conditions (type, status, reason), whatever the form."""
    if type(pod) is CompactPod:
        return PodLife(pod.deleted, pod.phase, pod.conditions or ())
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    return PodLife(meta.get("deletionTimestamp") or "", status.get("phase") or "",
                   conditions_of(status.get("conditions")))


def same_but_version(held: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Equal but for ``metadata.resourceVersion``: the same pod to everything that reads it."""
    if held is pod:
        return True
    if type(held) is CompactPod and type(pod) is CompactPod:
        return held.same_but_version(pod)
    if held.keys() != pod.keys():
        return False
    for key, value in held.items():
        other = pod[key]
        if key != "metadata":
            if value != other:
                return False
        elif value.keys() != other.keys() or any(value[k] != other[k] for k in value if k != "resourceVersion"):
            return False
    return True


def quick_check(pod: object, seen: set[int] | None, *, label: Callable[[str], bool],
                subdomain: Callable[[str], bool]) -> bool | None:
    """For a compact pod, whether its slots have the shapes ``validation.check_pod`` asks (``label`` and
    ``subdomain``: its DNS-1123 grammars), read without building its sections: a full-view pod's start checks
    16384 published rows. None: the pod is a dict, to be checked field by field."""
    if type(pod) is not CompactPod:
        return None
    return (type(pod.name) is str and subdomain(pod.name) and type(pod.namespace) is str
            and label(pod.namespace) and type(pod.version) is str and type(pod.deleted) is str
            and _strings(pod.labels) and (pod.annotations is None or _strings(pod.annotations))
            and type(pod.hostname) is str and (not pod.hostname or label(pod.hostname))
            and type(pod.subdomain) is str and (not pod.subdomain or label(pod.subdomain))
            and type(pod.node) is str and (not pod.node or subdomain(pod.node))
            and type(pod.phase) is str and type(pod.ip) is str
            and (pod.conditions is None or (type(pod.conditions) is list and all(
                type(c) is list and len(c) == 3 and all(type(v) is str for v in c) for c in pod.conditions)))
            and seen is not None and all(id(container) in seen for container in pod.containers))


def _strings(value: object) -> bool:
    return type(value) is dict and all(type(k) is str and type(v) is str for k, v in value.items())


def sharing(pod: _Pod, earlier: Mapping[str, Any] | None) -> _Pod:
    """``pod``, just made, holding ``earlier``'s objects (its version before) wherever it says the same: its
    name, its IP, its labels. A pod that holds every member keeps a plan whose keys and members hold the objects
    of the version each member was laid out from, so each version the kubelet writes (the phase, then the
    readiness) would otherwise hold a copy of each beside them for the pod's life. Only a compact pod is shared
    into (a dict pod is the own pod, as read)."""
    if type(pod) is not CompactPod or type(earlier) is not CompactPod or pod is earlier:
        return pod
    for slot in CompactPod.__slots__:
        new, old = getattr(pod, slot), getattr(earlier, slot)
        if new is not old and new == old:
            setattr(pod, slot, old)
    return pod


def marked_lost(pod: Mapping[str, Any], lost: Mapping[str, str]) -> Mapping[str, Any] | None:
    """A held peer with the agent's Node condition as ``lost`` (each lost Node with why) says now, or None when it
    has it already. A pod as the API gives it is never held as a peer (the view compacts each, with the Nodes
    lost then: ``Compactor.lost_nodes``), so it is left as it is (None)."""
    if type(pod) is not CompactPod:
        return None
    why = lost.get(pod.node) if pod.node else None
    if node_lost_of(pod.conditions) == why:
        return None
    return pod.with_conditions(with_node_lost(pod.conditions or (), why))

