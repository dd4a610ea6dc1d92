"""What the scheduler and the kubelet add to an emulated pod: a node, an IP, Running containers. The addresses
are the caller's to choose (the sandbox and ``plan`` use loopback ones, ``loopback_address``)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

STARTED = "1970-01-01T00:00:00Z"  # a fixed time: the core has no clock


def loopback_address(n: int) -> str:
    """The n-th pod address (n >= 0): unique, in 127.1.0.0 and up, never a .0 or .255 host."""
    net, host = divmod(n, 254)
    return f"127.{1 + net // 256}.{net % 256}.{host + 1}"


def placed(pod: Mapping[str, Any], *, ip: str, node: str | None = None, host_ip: str = "127.0.0.1") -> dict[str, Any]:
    """A copy of ``pod`` bound to ``node`` (none: left unbound) and Running at ``ip``, every container ready."""
    out = copy.deepcopy(dict(pod))
    if node is not None:
        out["spec"]["nodeName"] = node
    statuses = [{"name": c.get("name", ""), "ready": True, "restartCount": 0, "started": True,
                 "image": c.get("image", ""), "state": {"running": {"startedAt": STARTED}}}
                for c in out["spec"].get("containers") or []]
    out["status"] = {**(out.get("status") or {}), "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                     "hostIP": host_ip, "containerStatuses": statuses}
    return out
