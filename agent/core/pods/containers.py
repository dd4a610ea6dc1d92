"""The trainer container of a pod: which one it is, what the user set in its env, how many processes it runs.

Decides NPROC_PER_NODE. The incumbents' ``nproc_per_node=auto`` asks the *host* for its CPU count, so a
2-CPU container on a 128-core node starts 128 processes; here the count comes only from the container's own
resources, never from the machine the agent runs on.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Literal

from agent.core.compact import containers_of, name_of
from agent.core.injected import controller_entries
from agent.core.model import Options, RawContainer, RawPod, RawResources, is_whole_number
from agent.core.pods.accelerators import accelerator_of, is_unknown_extended
from agent.core.pods.claims import dra_devices
from agent.errors import InputError

AGENT_NAME = "topology-agent"

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SUFFIX = {
    None: Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


@dataclass(frozen=True)
class UserValue:
    """A variable the user set in the trainer container; ``value`` is None when it comes from ``valueFrom``."""

    value: str | None
    container: str


@functools.lru_cache(maxsize=256)
def _quantity(text: str) -> Decimal | None:
    match = _QUANTITY.match(text)
    if not match:
        return None
    try:
        return Decimal(match.group(1)) * _SUFFIX[match.group(2)]
    except InvalidOperation:  # pragma: no cover - the regex admits only valid decimals
        return None


def parse_quantity(raw: str | int | float, *, where: str) -> Decimal:
    """Parse a Kubernetes resource quantity ("2500m", "0.5", "1Gi", 4). Cached: a job has few distinct values."""
    text = str(raw).strip()
    value = _quantity(text) if len(text) <= 64 else None
    if value is None or value < 0 or value.adjusted() > 18:  # 1e999999 parses, and ceil() of it never ends
        shown = repr(text if len(text) <= 40 else text[:37] + "...")
        raise InputError(f"{where}: {shown} is not a Kubernetes quantity below 10^18; use a value like 2, 500m "
                         "or 1.5")
    return value


def is_agent_container(container: RawContainer) -> bool:
    words = [container.get("name", ""), *container.get("command", []), *container.get("args", [])]
    image = container.get("image", "")
    return any(AGENT_NAME in w for w in words) or f"/{AGENT_NAME}:" in image or image.startswith(AGENT_NAME)


def pick_trainer_container(pod: RawPod, wanted: str | None) -> RawContainer | None:
    """The container that runs the trainer: ``--container``, else the first regular one that is not the agent."""
    containers: list[RawContainer] = containers_of(pod)
    if wanted:
        for container in containers:
            if container.get("name") == wanted:
                return container
        have = ", ".join(c.get("name", "?") for c in containers) or "none"
        raise InputError(
            f"pod '{name_of(pod) or '?'}': no container named '{wanted}' (containers: {have}); fix --container"
        )
    for container in containers:
        if not is_agent_container(container):
            return container
    return None


def user_env(container: RawContainer | None, *, controller: str | None = None) -> dict[str, UserValue]:
    """Variables the user set explicitly in the container: every entry but those the controller wrote, which
    ``agent.core.injected`` tells apart by how that controller writes (appended block, upsert, plugin blocks)."""
    if container is None:
        return {}
    entries = container.get("env", [])
    written = controller_entries(controller, entries) if controller else set()
    found: dict[str, UserValue] = {}
    for position, entry in enumerate(entries):
        name = entry.get("name", "")
        if not name or name in found or position in written:
            continue
        value = None if "valueFrom" in entry else str(entry.get("value", ""))
        found[name] = UserValue(value=value, container=container.get("name", "?"))
    return found


_NPROC_VARS = ("PET_NPROC_PER_NODE", "NPROC_PER_NODE")
CPU_RULE = "CPU limit "  # how resolve_nproc's rule begins when the CPU limit decided (torchrun's CPU rule)
DEVICES_RULE = " accelerator(s) in container "  # ... and where it says the accelerators decided


def nproc_kind(rule: str) -> Literal["explicit", "devices", "cpu", "none"]:
    """What decided a pod's processes, from the rule ``resolve_nproc`` gave: a setting or a variable
    ("explicit"), the accelerators ("devices"), the CPU limit ("cpu"), or nothing (1: "none"). Frameworks that
    run one process per device, or per pod, do not follow the CPU rule (core/frameworks)."""
    if rule.startswith(CPU_RULE):
        return "cpu"
    if DEVICES_RULE in rule:
        return "devices"
    if rule == "--nproc-per-node" or " set by user in container " in rule:
        return "explicit"
    return "none"


def resolve_nproc(pod: RawPod, container: RawContainer | None, options: Options) -> tuple[int, str]:
    """Processes per pod and the rule that decided it.

    Order: explicit value (``--nproc-per-node N``, or an integer PET_NPROC_PER_NODE / NPROC_PER_NODE in the
    trainer's env) > accelerators: those the container's DRA claims give (core/pods/claims.py) plus those of its
    limits (else requests) > CPU limit rounded up (unless ``accelerators`` was asked for) > 1. DRA and device
    plugin devices add up: a container's ``resources.claims`` and its extended resources are separate devices
    (a DeviceClass that serves an extended resource makes a claim of its own, not in ``resources.claims``). DRA
    claims whose count is not known (not read, or an ``All`` request before allocation) fall back to the rest,
    and the rule says so.
    """
    pod_name = pod.get("metadata", {}).get("name", "?")
    if isinstance(options.processes.per_node, int):
        return options.processes.per_node, "--nproc-per-node"
    explicit = {e.get("name"): e for e in (container or {}).get("env", ()) if e.get("name") in _NPROC_VARS}
    for var in _NPROC_VARS:
        entry = explicit.get(var)
        value = str(entry.get("value", "")) if entry is not None and "valueFrom" not in entry else ""
        if is_whole_number(value):
            cname = (container or {}).get("name", "?")
            count = int(value) if len(value.strip()) <= 7 else 0  # int() of thousands of digits is refused
            if not 1 <= count <= 1_000_000:
                shown = repr(value if len(value) <= 20 else value[:17] + "...")
                raise InputError(f"pod '{pod_name}': {var}={shown} in container '{cname}' must be a whole number "
                                 "from 1 to 1000000")
            return count, f"{var}={count} set by user in container '{cname}'"
    if container is None:
        return 1, "no trainer container: 1"
    resources = container.get("resources", {})
    cname = container.get("name", "?")
    named: set[str] = set(resources.get("limits") or {}) | set(resources.get("requests") or {})
    unknown = sorted(k for k in named if is_unknown_extended(k))
    unknown_note = (f"; extended resource(s) {', '.join(unknown)} not counted: not a known accelerator (set "
                    "--nproc-per-node if they are)") if unknown else ""
    dra = dra_devices(pod, container, options.processes.claims)
    plugin, plugin_text = _plugin_devices(resources, pod_name, cname)
    if dra is not None and dra.accelerators:
        total = dra.accelerators + plugin
        said = f"DRA {dra.text}" + (f" + {plugin_text}" if plugin else "")
        return total, f"{total}{DEVICES_RULE}'{cname}': {said}{unknown_note}"
    dra_note = f"; DRA: {dra.text}" if dra is not None else ""
    if plugin:
        return plugin, f"{plugin}{DEVICES_RULE}'{cname}' {plugin_text}{dra_note}{unknown_note}"
    if options.processes.per_node == "accelerators":
        return 1, f"no accelerators in container '{cname}': 1 (Trainer's MPI rule: numProcPerNode 1 is the GPUs of " \
                  f"a node, else 1){dra_note}{unknown_note}"
    cpu = (resources.get("limits", {}) or {}).get("cpu")
    if cpu is not None:
        cores = parse_quantity(cpu, where=f"pod '{pod_name}' container '{cname}' limits.cpu")
        count = max(1, math.ceil(cores))
        return count, f"{CPU_RULE}{cpu} of container '{cname}' rounded up{dra_note}{unknown_note}"
    return 1, f"container '{cname}' has no accelerators and no CPU limit: 1{dra_note}{unknown_note}"


def _plugin_devices(resources: RawResources, pod_name: str, cname: str) -> tuple[int, str]:
    """The device plugins' accelerators of the container's limits (else requests), and where they were read."""
    for section in ("limits", "requests"):
        quantities: dict[str, str | int | float] = resources.get(section, {}) or {}  # type: ignore[assignment]
        devices = [(k, v, row) for k, v in sorted(quantities.items()) if (row := accelerator_of(k)) is not None]
        if devices:
            total = 0
            for key, raw, _ in devices:
                total += int(parse_quantity(raw, where=f"pod '{pod_name}' container '{cname}' {section}.{key}"))
            if total > 0:
                names = ", ".join(f"{k}: {row.family}" for k, _, row in devices)
                notes = "".join(f"; {row.note}" for _, _, row in devices if row.note)
                return total, f"resources.{section} ({names}){notes}"
    return 0, ""
