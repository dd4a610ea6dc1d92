"""`topology-agent status JOB`: its flags, as kubectl's (``-n``, ``--kubeconfig``, ``--context``, ``-o``, ``-w``),
and the options a job's pods were given (``options_of``: their init container's command line, as init read it)."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any, NamedTuple

from agent.core.controllers import CONTROLLERS
from agent.core.model import Options, RawPod
from agent.core.pods.validation import is_dns1123_label, is_dns1123_subdomain
from agent.errors import InputError
from agent.flags.common import choice, kubeconfig

if TYPE_CHECKING:
    from agent.k8s.config import ApiConfig

OUTPUTS = ("table", "json")
JOB_KINDS = tuple(key for key, c in CONTROLLERS.items() if c.job_kind is not None)  # --controller's choices
INIT = "topology-agent"  # the init container inject and the webhook add (core/adoption/injection.INIT)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="the job's name (its object's: Volcano Job, PyTorchJob, ...)")
    parser.add_argument("-n", "--namespace", help="the job's namespace (default: the kubeconfig context's, else "
                                                  "default)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    parser.add_argument("--context", help="the kubeconfig context to use (default: its current context)")
    parser.add_argument("--controller", help=f"the job's kind, by controller: {', '.join(JOB_KINDS)} (default: "
                                             "each kind is looked for)")
    parser.add_argument("-o", "--output", default="table", help="table (default) or json")
    parser.add_argument("-w", "--watch", action="store_true", help="after the first, print again at each change")


class StatusSettings(NamedTuple):
    job: str
    namespace: str
    config: ApiConfig
    controller: str | None  # a key of CONTROLLERS, or None: each job kind is looked for
    output: str
    watch: bool


def settings_from(args: argparse.Namespace) -> StatusSettings:
    from agent.k8s.config import load_config

    if not is_dns1123_subdomain(args.job):
        raise InputError(f"JOB '{args.job[:80]}' is not a valid object name: lower-case letters, digits, '-' and '.', "
                         "starting and ending with a letter or digit")
    if args.namespace is not None and not is_dns1123_label(args.namespace):
        raise InputError(f"--namespace '{args.namespace[:80]}' is not a valid namespace name")
    if args.controller is not None:
        choice("--controller", args.controller, JOB_KINDS)
    output = choice("--output", args.output, OUTPUTS)
    config = load_config(kubeconfig(args), args.context)
    return StatusSettings(job=args.job, namespace=args.namespace or config.namespace or "default", config=config,
                          controller=args.controller, output=output, watch=bool(args.watch))


def _init_container(pod: RawPod) -> dict[str, Any] | None:
    spec: Any = pod.get("spec") or {}
    return next((c for c in spec.get("initContainers") or [] if isinstance(c, dict) and c.get("name") == INIT), None)


def init_args(pod: RawPod) -> list[str] | None:
    """The command line of the agent's init container in ``pod`` (``init ...``), or None: no such container."""
    container = _init_container(pod)
    args = container.get("args") if container is not None else None
    if not isinstance(args, list) or not args or args[0] != "init" or not all(isinstance(a, str) for a in args):
        return None
    return args


def options_of(pod: RawPod) -> Options | None:
    """The options the agent's init container in ``pod`` runs with: its command line and its ``TOPOLOGY_*``
    values, read by the agent's own parser (None: the pod has no such container, or its line does not parse)."""
    from agent.flags.common import options_from_args
    from agent.flags.parser import UsageError, parse_command_line

    container = _init_container(pod)
    args = init_args(pod)
    if container is None or args is None:
        return None
    given = {e["name"]: e["value"] for e in container.get("env") or []
             if isinstance(e, dict) and isinstance(e.get("name"), str) and e["name"].startswith("TOPOLOGY_")
             and isinstance(e.get("value"), str)}
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("TOPOLOGY_")}
    os.environ.update(given)
    try:
        return options_from_args(parse_command_line(args))
    except (UsageError, InputError):
        return None
    finally:
        for key in given:
            os.environ.pop(key, None)
        os.environ.update(saved)
