"""The whole command line: every command's arguments under one parser (``build_parser``), and the check of a
command line the agent writes into a pod (``check_command_line``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from agent import __version__
from agent.errors import InputError
from agent.flags import demo, init, inject, keygen, render, sandbox, sidecar, webhook
from agent.flags.common import options_from_args, ssh_values


class UsageError(Exception):
    """argparse's complaint, as one line (argparse itself prints the whole usage first)."""


class _Parser(argparse.ArgumentParser):
    """No abbreviations (``--pod`` is not ``--pods``), and an unknown option is named before a missing one: argparse
    checks required options first, so ``--podz x`` said that ``--pods`` was required."""

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
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        missing = [a for a in required if getattr(parsed, a.dest, None) is None]
        if missing:
            self.error(f"the following arguments are required: {', '.join(a.option_strings[0] for a in missing)}")
        return parsed, extra

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


# Each command: its help line and its arguments, in the order --help lists them.
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "render": (render.HELP["render"], render.add_arguments),
    "explain": (render.HELP["explain"], lambda parser: render.add_arguments(parser, out=False)),
    "init": (init.HELP, init.add_arguments),
    "sidecar": (sidecar.HELP, sidecar.add_arguments),
    "sandbox": (sandbox.HELP, sandbox.add_arguments),
    "keygen": (keygen.HELP, keygen.add_arguments),
    "inject": (inject.HELP, inject.add_arguments),
    "webhook": (webhook.HELP, webhook.add_arguments),
    "demo": (demo.HELP, demo.add_arguments),
}
# The commands whose own flags a pod's command line may carry, and their check.
OWN_CHECKS: dict[str, Callable[[argparse.Namespace], object]] = {"init": init.check, "sidecar": sidecar.check}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="topology-agent",
        description="Configure a multi-pod training job from its pods: torch.env, hostfile, host files.",
    )
    parser.add_argument("--version", action="version", version=f"topology-agent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for name, (help_line, add_arguments) in COMMANDS.items():
        add_arguments(commands.add_parser(name, help=help_line))
    return parser


def check_command_line(argv: list[str], where: str) -> None:
    """A command line written into a pod (by inject or the webhook) must parse and give valid options, or nothing
    is written: the agent's own parser decides, so they and the agent cannot disagree. The environment's
    TOPOLOGY_* play no part."""
    try:
        args = build_parser().parse_args(argv)
    except UsageError as err:
        raise InputError(f"{where}: {err}; fix the topology-agent.io/ annotation that gave it") from None
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("TOPOLOGY_")}
    try:
        options_from_args(args)
        own = OWN_CHECKS.get(args.command)
        if own is not None:
            own(args)
        ssh_values(args)
    except InputError as err:
        raise InputError(f"{where}: {err} (from a topology-agent.io/ annotation or --set)") from None
    finally:
        os.environ.update(saved)
