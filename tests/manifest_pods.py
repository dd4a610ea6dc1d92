"""The pods a controller would create from a manifest, placed on loopback addresses and Running, for tests that
feed them to render: a thin use of agent/core/emulation, the one place that knows the controllers' conventions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent.core.emulation import emulate, is_job
from agent.core.emulation import pod_templates as pod_templates
from agent.core.emulation.placing import loopback_address, placed


def pods_for(doc: Mapping[str, Any], runtimes: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """The job's pods, each Running at its own loopback address (in the controller's order); none for an object
    that is not a job (a Service beside it)."""
    if not is_job(doc):
        return []
    return [placed(pod, ip=loopback_address(n)) for n, pod in enumerate(emulate(doc, runtimes=runtimes).pods)]
