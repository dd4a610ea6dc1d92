"""`topology-agent init`: its flags, and the fields of ``runtime.init.InitSettings`` they give."""

from __future__ import annotations

import argparse
from typing import TypedDict

from agent.flags.common import Knob, add_topology_arguments, choice_knob, env_flag, knob, whole_knob
from agent.flags.pod import PodStart, add_in_cluster_arguments, add_lease_argument, lease_seconds, pod_start, watch_idle


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


class InitFields(TypedDict):
    """``InitSettings``' fields that init's own flags give, by their names there."""

    expect: int | None
    timeout: float
    wait_dns: bool
    source: str
    watch_idle: float | None
    lease_seconds: int


def check(args: argparse.Namespace) -> InitFields:
    """init's own flags, checked (inject and the webhook check every command line they write with it)."""
    timeout = whole_knob(knob(args, "timeout"), high=86_400)
    source_k = knob(args, "source")
    return InitFields(
        timeout=float(timeout if timeout is not None else 600),
        expect=whole_knob(knob(args, "expect"), high=1_000_000),
        source=choice_knob(Knob(source_k.value or "auto", source_k.label), ("auto", "pods", "published")),
        wait_dns=env_flag(args, "wait-dns"),
        watch_idle=watch_idle(args),
        lease_seconds=lease_seconds(args),
    )


def settings_from(args: argparse.Namespace) -> PodStart[InitFields]:
    """Everything init needs before its first request: ``InitSettings(**start.pod, **start.own)``."""
    return pod_start(args, check)
