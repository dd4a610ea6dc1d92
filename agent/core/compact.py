"""A peer pod held as its published row's fields, read through the pod interface the core uses.

A pod that holds every member (the publisher, its standbys, a launcher, a pod whose files name every member) holds
16384 of them for its life. As nested dicts each costs ~1.3 KB (four dicts and a list, ~800 bytes of them
structure); held in slots it is ~0.6 KB, the strings it must keep and the labels. The core reads a pod through
``get``/``[]`` of "metadata", "spec" and "status": each read builds that section as the dict ``_pod_of`` would
(what equality, JSON and every reader see), so nothing reading it can tell the difference but ``type``; the
sections are built once per pod version in practice, since the facts are memoised per resourceVersion.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

_KEYS = ("metadata", "spec", "status")
_NONE: dict[str, Any] = {}


def conditions_section(conditions: list[list[str]]) -> list[dict[str, str]]:
    """A row's conditions ([type, status, reason]) as ``status.conditions`` says them (an empty reason: none)."""
    return [{"type": kind, "status": status, **({"reason": reason} if reason else {})}
            for kind, status, reason in conditions]


class CompactPod(Mapping[str, Any]):
    """One peer: read-only (no reader writes into a pod; the view replaces a pod with its next version)."""

    __slots__ = ("annotations", "conditions", "containers", "deleted", "hostname", "ip", "labels", "name",
                 "namespace", "node", "phase", "subdomain", "version")

    def __init__(self, name: str, namespace: str, version: str, labels: dict[str, str],
                 annotations: dict[str, str], containers: list[dict[str, Any]], *, hostname: str = "",
                 subdomain: str = "", node: str = "", phase: str = "", ip: str = "", deleted: str = "",
                 conditions: list[list[str]] | None = None) -> None:
        self.name, self.namespace, self.version, self.labels = name, namespace, version, labels
        self.annotations = annotations or None  # the empty ones not held: ~64 bytes a pod
        self.containers = containers  # one list per container shape, shared by the pods of that shape
        self.hostname, self.subdomain, self.node = hostname, subdomain, node
        self.phase, self.ip, self.deleted = phase, ip, deleted
        self.conditions = conditions or None  # [type, status, reason] of those that say the pod is lost (lost.py)

    def metadata(self) -> dict[str, Any]:
        meta = {"name": self.name, "namespace": self.namespace, "labels": self.labels,
                "annotations": self.annotations if self.annotations is not None else {}}
        if self.version:
            meta["resourceVersion"] = self.version
        if self.deleted:
            meta["deletionTimestamp"] = self.deleted
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
                and self.namespace == other.namespace and self.conditions == other.conditions)

    def __repr__(self) -> str:
        return f"CompactPod({dict(self)!r})"
