"""What the init and sidecar loops take from the API: the pods that have a pod's shape and, once the job's object
is read, are the job's own (core/gang.Roster); each refused one is logged in one line and left out, so one
broken or hostile object never stops the agent, nor stalls the other members."""

from __future__ import annotations

import logging
from typing import Any

from agent.core.gang import Roster
from agent.core.model import RawPod
from agent.core.validation import split_pods

log = logging.getLogger("topology_agent.intake")


def usable_pods(items: list[Any], roster: Roster | None = None, *, own: str | None = None) -> list[RawPod]:
    """``own``: this pod's name, never left out here (it is the one asking; init and the sidecar read it
    themselves)."""
    usable, refused = split_pods(items)
    for line in refused:
        log.warning("ignoring a pod the API sent: %s", line)
    if roster is None:
        return usable  # type: ignore[return-value]
    members = []
    for pod in usable:
        why = None if pod.get("metadata", {}).get("name") == own else roster.refusal(pod)  # type: ignore[arg-type]
        if why is None:
            members.append(pod)
        else:
            log.warning("leaving out a pod that is not the job's: %s", why)
    return members  # type: ignore[return-value]
