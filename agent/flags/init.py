"""`topology-agent init`: its flags and ``InitSettings``, the settings they give: a flag is its argument, its
field (with its one default) and its check, here."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from agent.core.model import Options
from agent.flags.common import Knob, add_topology_arguments, choice_knob, env_flag, knob, whole_knob
from agent.flags.pod import (
    LEASE_SECONDS,
    PodFields,
    PodStart,
    add_in_cluster_arguments,
    add_lease_argument,
    lease_seconds,
    pod_start,
    watch_idle,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_in_cluster_arguments(parser)
    parser.add_argument("--expect", help="number of training pods to wait for (default: read from the owner object)")
    parser.add_argument("--timeout", help="seconds to wait for the gang (default 600)")
    parser.add_argument("--wait-dns", action="store_true", default=None,
                        help="also wait until every peer's DNS name resolves")
    parser.add_argument("--source", help="where peers come from: pods (every pod lists the job's pods), published "
                                         "(the leader publishes a compact topology), auto (default: published from "
                                         "256 training pods)")
    add_lease_argument(parser)
    add_topology_arguments(parser)


@dataclass(kw_only=True)
class InitOwn:
    """The settings init's own flags give."""

    expect: int | None = None
    timeout: float = 600.0
    wait_dns: bool = False
    source: str = "auto"  # pods | published | auto (published from PUBLISH_THRESHOLD training pods up)
    watch_idle: float | None = None  # seconds without progress before a watch counts as dead (None: derived)
    lease_seconds: int = LEASE_SECONDS  # the publisher Lease's duration (large jobs only)


@dataclass
class InitSettings(InitOwn):
    """Everything init runs with: the pod's own fields, then its flags' (keywords only)."""

    namespace: str
    pod_name: str
    options: Options
    out_dir: Path
    state_dir: Path | None = None  # mounted by the agent's containers alone: init's reads for the sidecar go there

    @classmethod
    def of(cls, pod: PodFields, own: InitOwn) -> InitSettings:
        return cls(**pod, **{f.name: getattr(own, f.name) for f in dataclasses.fields(InitOwn)})


def check(args: argparse.Namespace) -> InitOwn:
    """init's own flags, checked (inject and the webhook check every command line they write with it)."""
    timeout = whole_knob(knob(args, "timeout"), high=86_400)
    source_k = knob(args, "source")
    return InitOwn(
        timeout=float(timeout) if timeout is not None else InitOwn.timeout,
        expect=whole_knob(knob(args, "expect"), high=1_000_000),
        source=choice_knob(Knob(source_k.value or InitOwn.source, source_k.label), ("auto", "pods", "published")),
        wait_dns=env_flag(args, "wait-dns"),
        watch_idle=watch_idle(args),
        lease_seconds=lease_seconds(args),
    )


def settings_from(args: argparse.Namespace) -> PodStart[InitOwn]:
    """Everything init needs before its first request: ``InitSettings.of(start.pod, start.own)``."""
    return pod_start(args, check)
