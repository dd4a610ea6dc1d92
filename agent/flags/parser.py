"""The whole command line: the commands (``COMMANDS``, each a module in agent/flags/), their arguments under one
parser (``build_parser``), and the check of a command line the agent writes into a pod (``check_command_line``)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NoReturn

from agent import __version__
from agent.core.escaping import printable
from agent.errors import InputError
from agent.flags.common import options_from_args, ssh_values


class UsageError(Exception):
    """argparse's complaint, as one line (argparse itself prints the whole usage first)."""


def _did_you_mean(given: str, known: Sequence[str]) -> str:
    """`` (did you mean --pods?)`` for a near miss among ``known``, else nothing."""
    import difflib  # only on a mistake: not on every pod's start

    close = difflib.get_close_matches(given, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


class _Parser(argparse.ArgumentParser):
    """No abbreviations (``--pod`` is not ``--pods``), and an unknown option is named before a missing one: argparse
    checks required options first, so ``--podz x`` said that ``--pods`` was required. A mistyped option, command or
    choice is answered with the nearest known one (difflib), in the same line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        required = [a for a in self._actions if a.required and a.option_strings]
        for action in required:
            action.required = False
        try:
            parsed, extra = super().parse_known_args(argv, namespace)
        finally:
            for action in required:
                action.required = True
        unknown = [a for a in extra if a.startswith("-")]
        if unknown:
            known = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
            named = [a + _did_you_mean(a.partition("=")[0], known) for a in unknown]
            self.error(f"unrecognized arguments: {' '.join(named)}")
        missing = [a for a in required if getattr(parsed, a.dest, None) is None]
        if missing:
            self.error(f"the following arguments are required: {', '.join(a.option_strings[0] for a in missing)}")
        return parsed, extra

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices and isinstance(value, str):
            choices = [str(c) for c in action.choices]
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{_did_you_mean(value, choices)}; "
                                                 f"choose from {', '.join(choices)}")
        super()._check_value(action, value)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


# The commands, each with its help line; a command's module in agent/flags/ has the same name and gives its
# arguments (add_arguments) and its settings (settings_from). A module is read when its command runs or --help
# lists its flags, so a pod's init reads 4 of them and builds 26 of the 128 options.
COMMANDS = {
    "render": "write the files for one pod from a pods JSON file (offline)",
    "explain": "print every variable, its value and the rule behind it",
    "plan": "from a job's manifest, no cluster: its pods as the controller makes them, each one's ranks and files",
    "status": "every member of a running job: role, rank, node, address, generation seen; the pods left out",
    "init": "init container: wait for the job's pods, then write the files",
    "sidecar": "elastic jobs: follow membership, rewrite files, signal the trainer",
    "sandbox": "run the sandbox API server (for kubectl and the agent, no cluster)",
    "keygen": "print (or --apply) the job's SSH Secret: user key pair and host CA",
    "inject": "add the agent to the pod templates of manifests: topology-agent inject -f job.yaml | kubectl apply -f -",
    "webhook": "mutating admission webhook: adds the agent to Pods and jobs at CREATE, as inject does "
               "(manifests/webhook)",
    "demo": "show the agent at work on an example Volcano job in the sandbox",
}
IN_PODS = ("init", "sidecar")  # the commands inject and the webhook write into pods: their own flags are checked


def command(name: str) -> ModuleType:
    """The module of command ``name``: ``add_arguments(parser)``, ``settings_from(args)``."""
    return importlib.import_module(f"agent.flags.{name}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only``, the other commands keep their help line but not their arguments."""
    parser = _Parser(
        prog="topology-agent",
        description="Configure a multi-pod training job from its pods: torch.env, hostfile, host files.",
    )
    parser.add_argument("--version", action="version", version=f"topology-agent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for name, help_line in COMMANDS.items():
        sub = commands.add_parser(name, help=help_line)
        if only in (None, name):
            command(name).add_arguments(sub)
    return parser


def parse_command_line(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``argv`` (default: this process's) parsed with its command's arguments only."""
    given = list(sys.argv[1:] if argv is None else argv)
    return build_parser(given[0] if given and given[0] in COMMANDS else None).parse_args(given)


def settings_from(args: argparse.Namespace) -> Any:
    """The command's settings, from its module: every value checked."""
    return command(args.command).settings_from(args)


def check_command_line(argv: list[str], where: str) -> None:
    """A command line written into a pod (by inject or the webhook) must parse and give valid options, or nothing
    is written: the agent's own parser decides, so they and the agent cannot disagree. The environment's
    TOPOLOGY_* play no part."""
    try:
        args = parse_command_line(argv)
    except UsageError as err:
        raise InputError(f"{where}: {err}; fix the topology-agent.io/ annotation that gave it") from None
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("TOPOLOGY_")}
    try:
        options_from_args(args)
        if args.command in IN_PODS:
            command(args.command).check(args)
        ssh_values(args)
    except InputError as err:
        # the values come from annotations: whatever a check quoted of them is shown on one line
        raise InputError(f"{where}: {printable(str(err))} (from a topology-agent.io/ annotation or --set)") from None
    finally:
        os.environ.update(saved)
