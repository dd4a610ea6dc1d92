"""`topology-agent sandbox`: its flags, and where the sandbox API server listens and keeps its files."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NamedTuple

from agent.core.pods.validation import is_dns1123_label
from agent.errors import InputError, OutputError
from agent.flags.common import is_ip, seconds, whole

MAX_NODES = 1000  # the sandbox's limit (agent/sandbox/nodes.py): each Node's pods take a loopback /24


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", default="0", help="port on 127.0.0.1 (default: any free port)")
    parser.add_argument("--state-dir", help="where to write the kubeconfig and TLS files (default: a temp dir)")
    parser.add_argument("--bookmark-interval", default="1.0", help="seconds between watch BOOKMARKs")
    parser.add_argument("--service", action="append", default=[], metavar="NAMESPACE/NAME=HOST:PORT",
                        help="where a webhook's Service answers (the sandbox has no cluster network; repeatable)")
    parser.add_argument("--controllers", action="store_true",
                        help="play the controllers: a job applied gets its pods, placed on the sandbox's Nodes and "
                             "running at loopback IPs (default: serve the API only; a job makes no pods)")
    parser.add_argument("--nodes", help="with --controllers: how many Nodes to make, two a rack, four "
                                                     f"a zone (default 4, at most {MAX_NODES})")


class SandboxSettings(NamedTuple):
    port: int  # 0: any free port
    state: Path  # made, if it was not there
    bookmark_interval: float
    services: dict[str, str]  # NAMESPACE/NAME -> HOST:PORT
    controllers: bool
    nodes: int


def settings_from(args: argparse.Namespace) -> SandboxSettings:
    import tempfile

    port = whole("--port", args.port, low=0)
    interval = seconds("--bookmark-interval", args.bookmark_interval, 1.0, high=3600)
    if interval == 0:
        raise InputError(f"--bookmark-interval '{args.bookmark_interval}' must be more than 0 seconds")
    try:
        state = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(prefix="topology-sandbox-"))
        state.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"--state-dir {args.state_dir}: cannot create it ({err.strerror or err}); "
                          "give a writable directory") from None
    if args.nodes is not None and not args.controllers:
        raise InputError(f"--nodes {args.nodes} needs --controllers: without it the sandbox makes no Nodes")
    nodes = whole("--nodes", args.nodes or "4", low=0, high=MAX_NODES) or 0
    return SandboxSettings(port=port or 0, state=state, bookmark_interval=interval, services=_services(args.service),
                           controllers=args.controllers, nodes=nodes)


def _services(items: list[str]) -> dict[str, str]:
    services = {}
    for item in items:
        name, sep, address = item.partition("=")
        host, colon, port = address.rpartition(":")
        namespace, slash, service = name.partition("/")
        if not (sep and slash and colon and is_dns1123_label(namespace) and is_dns1123_label(service)
                and is_ip(host.strip("[]")) and port.isdigit() and 0 < int(port) < 65536):
            raise InputError(f"--service {item!r}: give NAMESPACE/NAME=IP:PORT, e.g. "
                             "--service topology-agent-system/topology-agent-webhook=127.0.0.1:8443")
        services[name] = address
    return services
