"""Where each pod landed (the topology labels of its Node) and the rank order that follows the network.

NCCL builds its rings and trees in rank order. Ranks that follow the controller's pod index put neighbours in
different racks at almost every hop; ranks ordered so that the pods of each domain are contiguous cross each
domain boundary once per ring. This module knows levels, the domains a Node's labels give, and how often a ring
of members crosses them; the order itself, like every rank decision, is the plan's (rank.py's ``topology_order``). Pure.

Levels are listed outermost first, as Kueue's Topology object lists them (``spec.levels``). The defaults are the
labels clusters carry today: Kubernetes' well-known zone and region labels, GKE's compact placement labels
(``cloud.google.com/gce-topology-block``, ``-subblock``, ``-host``), EKS's network-node layers
(``topology.k8s.aws/network-node-layer-1`` is the top of the hierarchy, ``-3`` the bottom for most instance
types, ``-4`` on four-layer types) and NVIDIA's multi-node NVLink clique (``nvidia.com/gpu.clique``, set by the
GPU feature discovery on GB200 NVL72 nodes). A cluster carries the labels of its own provider only; a level
that no node of the job carries groups nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from agent.core.pods.validation import is_label_key, is_label_value
from agent.errors import InputError


@dataclass(frozen=True)
class Level:
    """One level of the network hierarchy: the Node label that names its domains, and the name the files use
    (``TOPOLOGY_<NAME>`` in torch.env, ``<name>`` in topology.json)."""

    label: str
    name: str


DEFAULT_LEVELS: tuple[Level, ...] = (
    Level("topology.kubernetes.io/region", "REGION"),
    Level("topology.kubernetes.io/zone", "ZONE"),
    Level("cloud.google.com/gce-topology-block", "BLOCK"),
    Level("cloud.google.com/gce-topology-subblock", "SUBBLOCK"),
    Level("topology.k8s.aws/network-node-layer-1", "NETWORK_LAYER_1"),
    Level("topology.k8s.aws/network-node-layer-2", "NETWORK_LAYER_2"),
    Level("topology.k8s.aws/network-node-layer-3", "NETWORK_LAYER_3"),
    Level("topology.k8s.aws/network-node-layer-4", "NETWORK_LAYER_4"),
    Level("nvidia.com/gpu.clique", "GPU_CLIQUE"),
    Level("cloud.google.com/gce-topology-host", "HOST"),
)
_KNOWN = {level.label: level.name for level in DEFAULT_LEVELS} | {"kubernetes.io/hostname": "HOSTNAME"}
RESERVED = frozenset({"NODE", "LEVELS", "RANK_ORDER"})  # TOPOLOGY_NODE etc. are not levels
RANK_ORDERS: tuple[Literal["index", "topology"], ...] = ("index", "topology")

def level_name(label: str) -> str:
    """The name of a level in the files: a known label's documented name, else the key's name part upper-cased
    (``example.com/rack`` -> ``RACK``)."""
    return _KNOWN.get(label) or re.sub(r"[^A-Z0-9]", "_", label.rpartition("/")[2].upper())


def parse_levels(text: str, *, option: str = "--topology-levels") -> tuple[Level, ...]:
    """``default``, or label keys outermost first (``default`` may appear among them and stands for the list)."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    if not keys:
        raise InputError(f"{option} is empty; give Node label keys outermost first, e.g. "
                         "topology.kubernetes.io/zone,example.com/rack, or 'default'")
    levels: list[Level] = []
    for key in keys:
        if key == "default":
            levels.extend(level for level in DEFAULT_LEVELS if level not in levels)
            continue
        if not is_label_key(key):
            shown = key if len(key) <= 60 else key[:57] + "..."
            raise InputError(f"{option}: '{shown}' is not a label key ([prefix/]name, e.g. example.com/rack)")
        levels.append(Level(key, level_name(key)))
    seen: dict[str, str] = {}
    for level in levels:
        if level.name in RESERVED:
            raise InputError(f"{option}: label '{level.label}' would be TOPOLOGY_{level.name}, which the agent "
                             "writes itself; use a label whose name part differs")
        if level.name in seen and seen[level.name] != level.label:
            raise InputError(f"{option}: labels '{seen[level.name]}' and '{level.label}' would both be "
                             f"TOPOLOGY_{level.name}; list only one of them")
        if seen.get(level.name) == level.label:
            raise InputError(f"{option}: label '{level.label}' is listed twice")
        seen[level.name] = level.label
    return tuple(levels)


def node_domains(node: str, labels: Mapping[str, str] | None, levels: Sequence[Level]) -> tuple[str, ...] | None:
    """The Node's value at each level ('' where it has no such label); None when its labels are unknown.

    Label values reach torch.env and topology.json: a value the API server could not have stored is refused."""
    if labels is None:
        return None
    values = []
    for level in levels:
        value = labels.get(level.label, "")
        if not isinstance(value, str) or not is_label_value(value):
            shown = repr(value)[:40]
            raise InputError(f"node '{node}': label '{level.label}' value {shown} is not a label value "
                             "(at most 63 letters, digits, '-', '_', '.'); fix the Node's labels")
        values.append(value)
    return tuple(values)


def ring_crossings(paths: Sequence[tuple[str, ...]], depth: int) -> int:
    """Edges of the ring 0 -> 1 -> ... -> n-1 -> 0 whose ends lie in different domains at ``depth`` (1: the
    outermost level). For the benchmark and the tests: what NCCL's ring pays at that level."""
    n = len(paths)
    if n < 2:
        return 0
    return sum(paths[i][:depth] != paths[(i + 1) % n][:depth] for i in range(n))


def domains_used(paths: Sequence[tuple[str, ...]], depth: int) -> int:
    """The lower bound of ``ring_crossings``: a ring that visits k domains crosses at least k boundaries (none
    when k is 1)."""
    k = len({path[:depth] for path in paths})
    return 0 if k < 2 else k
