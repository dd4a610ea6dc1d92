"""What init and the sidecar share: the in-cluster flags, and the pod's start.

Every option is checked first (a bad value is one line, before anything runs or is written), then the output
directory is proven writable, then the API's configuration is read and the pod's identity found: the start of
init and of the sidecar alike.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Generic, NamedTuple, TypedDict, TypeVar

from agent.core.model import STATE_DIR, Options
from agent.errors import InputError
from agent.flags.common import (
    DEFAULT_OUT,
    at_least_one_second,
    knob,
    kubeconfig,
    log_format,
    options_from_args,
    out_dir,
    seconds,
    ssh_settings,
    state_dir,
)

if TYPE_CHECKING:
    from agent.k8s.config import ApiConfig
    from agent.ssh.files import SshSettings

Own = TypeVar("Own")


def add_in_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--state-dir", help=f"directory only the agent's containers mount (an emptyDir), never the "
                                            f"trainer: init leaves what it read there for the sidecar (default "
                                            f"{STATE_DIR}; not there: the sidecar reads it from the API server)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account, else $KUBECONFIG)")
    parser.add_argument("--log-format", help="text (default) or json")
    parser.add_argument("--watch-idle", help="seconds a watch may show no event or bookmark before it counts as "
                                             "dead and the list is read again (default 60; init: at most a third "
                                             "of --timeout)")


def watch_idle(args: argparse.Namespace) -> float | None:
    return at_least_one_second(knob(args, "watch-idle"), 60.0, high=3600)


def add_lease_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lease-seconds", help="large jobs: duration of the Lease that elects the pod publishing the "
                                                "topology; a publisher that stopped is replaced after it (default 15)")


LEASE_SECONDS = 15  # the publisher Lease's duration when --lease-seconds is not given (init and the sidecar)


def lease_seconds(args: argparse.Namespace) -> int:
    """The publisher Lease's duration: init's leader holds it while it waits for the gang, the sidecar's after."""
    lease_k = knob(args, "lease-seconds")
    value = seconds(lease_k.label, lease_k.value, LEASE_SECONDS, high=3600)
    if value < 2 or value != int(value):
        raise InputError(f"{lease_k.label} '{lease_k.value}' must be a whole number of seconds from 2 to 3600 "
                         "(a Lease counts whole seconds)")
    return int(value)


class PodFields(TypedDict):
    """The fields ``InitSettings`` and ``SidecarSettings`` share, by their names there."""

    namespace: str
    pod_name: str
    options: Options
    out_dir: Path
    state_dir: Path


class PodStart(NamedTuple, Generic[Own]):
    """What init and the sidecar know before their first request."""

    pod: PodFields
    own: Own  # the command's own settings, from its module
    ssh: SshSettings | None
    log_format: str
    config: ApiConfig


def pod_start(args: argparse.Namespace, own: Callable[[argparse.Namespace], Own]) -> PodStart[Own]:
    """Every option checked, the output directory proven writable, then the API's configuration read and the
    pod's identity found."""
    from agent.k8s.config import load_config

    fmt = log_format(args)
    options = options_from_args(args)
    values = own(args)
    ssh = ssh_settings(args)
    config_file = kubeconfig(args)
    state = state_dir(args, out_dir(args))
    out = out_dir(args, check=True)
    config = load_config(config_file)
    namespace, pod_name = _identity(config)
    pod = PodFields(namespace=namespace, pod_name=pod_name, options=options, out_dir=out, state_dir=state)
    return PodStart(pod=pod, own=values, ssh=ssh, log_format=fmt, config=config)


def _identity(config: ApiConfig) -> tuple[str, str]:
    """The pod's namespace and name: the downward API's, else the service account's namespace, the host name."""
    import socket

    from agent.k8s.config import serviceaccount_dir

    pod_name = os.environ.get("POD_NAME") or socket.gethostname()
    namespace = os.environ.get("POD_NAMESPACE")
    if not namespace:
        ns_file = serviceaccount_dir() / "namespace"
        namespace = ns_file.read_text().strip() if ns_file.is_file() else (config.namespace or "default")
    return namespace, pod_name
