"""`topology-agent sidecar`: its flags, ``SidecarSettings`` and the keywords of ``run_sidecar`` they give: a flag
is its argument, its field (with its one default) and its check, here."""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

from agent.core.model import Options, is_whole_number
from agent.errors import InputError
from agent.flags.common import (
    add_topology_arguments,
    at_least_one_second,
    env_flag,
    ip_address,
    knob,
    seconds,
    whole_knob,
)
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
from agent.k8s.reflector import Settings as ReflectorSettings

if TYPE_CHECKING:
    import signal


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_in_cluster_arguments(parser)
    parser.add_argument("--debounce", help="longest wait to gather a burst of changes into one rewrite (default 1; "
                                           "a lone change waits 50 ms; 0: rewrite at once)")
    parser.add_argument("--signal", help="signal for the trainer after a rewrite: SIGUSR1 (default when a trainer is "
                                         "named), ..., none (default otherwise)")
    parser.add_argument("--trainer-pid-file", help="file holding the trainer's pid")
    parser.add_argument("--trainer-match", help="regular expression over the trainer's command line")
    parser.add_argument("--health-port", help="port of /healthz /readyz /metrics /topology (default 8090; 0: off)")
    parser.add_argument("--health-host", help="address to bind the health server (default 0.0.0.0: the kubelet's "
                                              "probes come from the node)")
    parser.add_argument("--health-topology", action="store_true", default=None,
                        help="also serve topology.json at /topology on the health port (default off)")
    parser.add_argument("--stuck-after", help="seconds without watch progress before /healthz fails (default 600)")
    add_lease_argument(parser)
    parser.add_argument("--probe-every", help="large jobs: seconds between a follower's looks at the publisher's "
                                              "Lease; a publisher that stopped is left for the pods (default 300)")
    add_topology_arguments(parser)


@dataclass(kw_only=True)
class SidecarOwn:
    """The settings the sidecar's own flags give."""

    debounce: float = 1.0
    signal: signal.Signals | None = None
    stuck_after: float = 600.0
    reflecting: ReflectorSettings = field(default_factory=ReflectorSettings)
    lease_seconds: int = LEASE_SECONDS  # the publisher Lease's duration (large jobs only)
    probe_every: float | None = None  # a follower's looks at the publisher (None: following.PROBE_EVERY)


@dataclass
class SidecarSettings(SidecarOwn):
    """Everything the sidecar runs with: the pod's own fields, then its flags' and the trainer to signal
    (keywords only)."""

    namespace: str
    pod_name: str
    options: Options
    out_dir: Path
    finder: Any = None  # signalling.TrainerFinder: the trainer to signal (None: nobody named)
    ssh: Any = None  # SshSettings: known_hosts and ssh_config follow the members
    # mounted by the agent's containers alone: init's reads (runtime/publication/handoff.py)
    state_dir: Path | None = None

    @property
    def stale_after(self) -> float:
        """No progress from the API server for this long: not ready (twice the inactivity deadline)."""
        return 2 * self.reflecting.idle

    @classmethod
    def of(cls, pod: PodFields, own: SidecarOwn, *, ssh: Any, finder: Any) -> SidecarSettings:
        return cls(**pod, **{f.name: getattr(own, f.name) for f in dataclasses.fields(SidecarOwn)}, ssh=ssh,
                   finder=finder)


class Trainer(TypedDict):
    """The process to signal, as named (``signalling.TrainerFinder``'s fields)."""

    pid_file: Path | None
    match: re.Pattern[str] | None


class Health(TypedDict):
    """``run_sidecar``'s keywords for the health server."""

    health_port: int | None
    health_host: str
    health_label: str
    health_topology: bool


class SidecarFlags(NamedTuple):
    """The sidecar's own flags, checked."""

    settings: SidecarOwn
    trainer: Trainer
    health: Health


def check(args: argparse.Namespace) -> SidecarFlags:
    """The sidecar's own flags, checked (inject and the webhook check every command line they write with it)."""
    trainer = _trainer(args)
    debounce_k, stuck_k = knob(args, "debounce"), knob(args, "stuck-after")
    debounce = seconds(debounce_k.label, debounce_k.value, SidecarOwn.debounce, high=3600)
    stuck_after = seconds(stuck_k.label, stuck_k.value, SidecarOwn.stuck_after)
    trainer_signal = _signal(args, trainer)
    health = _health(args)
    idle = watch_idle(args)
    probe_every = at_least_one_second(knob(args, "probe-every"), 300.0, high=86_400)
    fields = SidecarOwn(debounce=debounce, signal=trainer_signal, stuck_after=stuck_after,
                        lease_seconds=lease_seconds(args), reflecting=_reflecting(idle), probe_every=probe_every)
    return SidecarFlags(settings=fields, trainer=trainer, health=health)


def settings_from(args: argparse.Namespace) -> PodStart[SidecarFlags]:
    """Everything the sidecar needs before its first request: ``SidecarSettings.of(start.pod,
    start.own.settings, ssh=start.ssh, finder=TrainerFinder(**start.own.trainer))``."""
    return pod_start(args, check)


def parse_signal(name: str | None, *, label: str = "--signal") -> signal.Signals | None:
    """``SIGUSR1``, ``USR1``, ``10`` or ``none``."""
    import signal

    if name is None or name.lower() == "none":
        return None
    text = name.upper()
    try:
        if is_whole_number(text) and len(text) <= 3:
            return signal.Signals(int(text))
        return signal.Signals[text if text.startswith("SIG") else f"SIG{text}"]
    except (KeyError, ValueError):
        raise InputError(f"{label} '{name}' is not a signal; use a name like SIGUSR1, or none") from None


def _trainer(args: argparse.Namespace) -> Trainer:
    match_k = knob(args, "trainer-match")
    try:
        match = re.compile(match_k.value) if match_k.value else None
    except re.error as err:
        raise InputError(f"{match_k.label} '{match_k.value}' is not a regular expression ({err})") from None
    pid_k = knob(args, "trainer-pid-file")
    if pid_k.value is not None and Path(pid_k.value).is_dir():
        raise InputError(f"{pid_k.label} {pid_k.value} is a directory; give the file the trainer writes its pid to")
    return Trainer(pid_file=Path(pid_k.value) if pid_k.value else None, match=match)


def _signal(args: argparse.Namespace, trainer: Trainer) -> signal.Signals | None:
    # No signal unless a trainer is named: a signal nobody asked for kills torchrun and DeepSpeed's launcher.
    signal_k = knob(args, "signal")
    named = trainer["pid_file"] is not None or trainer["match"] is not None
    trainer_signal = parse_signal(signal_k.value or ("SIGUSR1" if named else "none"), label=signal_k.label)
    if trainer_signal is not None and not named:
        raise InputError(f"{signal_k.label} {signal_k.value} names a signal but no process to send it to; add "
                         f"{knob(args, 'trainer-pid-file').label} FILE or {knob(args, 'trainer-match').label} REGEX, "
                         f"or drop {signal_k.label}")
    return trainer_signal


def _health(args: argparse.Namespace) -> Health:
    port_k = knob(args, "health-port")
    port = whole_knob(port_k, low=0)
    port = 8090 if port is None else port
    host = ip_address(knob(args, "health-host", "0.0.0.0"))
    return Health(health_port=port or None, health_host=host, health_label=f"{port_k.label} {port} on {host}",
                  health_topology=env_flag(args, "health-topology"))


def _reflecting(idle: float | None) -> ReflectorSettings:
    return ReflectorSettings.with_idle(idle) if idle is not None else ReflectorSettings()
