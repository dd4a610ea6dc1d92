"""What the init and sidecar loops take from the API: the pods that have a pod's shape; each refused one is
logged in one line and left out, so one broken or hostile object never stops the agent."""

from __future__ import annotations

import logging
from typing import Any

from agent.core.model import RawPod
from agent.core.validation import split_pods

log = logging.getLogger("topology_agent.intake")


def usable_pods(items: list[Any]) -> list[RawPod]:
    usable, refused = split_pods(items)
    for line in refused:
        log.warning("ignoring a pod the API sent: %s", line)
    return usable  # type: ignore[return-value]
