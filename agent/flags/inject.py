"""`topology-agent inject`: its flags, the defaults ``--set`` gives, and the manifests ``-f`` names."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from agent.errors import InputError
from agent.flags.common import add_set_argument, defaults_from

if TYPE_CHECKING:
    from agent.core.adoption.injection import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", action="append", help="manifest file (YAML, multi-document, JSON or a "
                                                                   "kubectl List); '-' or none: stdin")
    add_set_argument(parser)


class InjectSettings(NamedTuple):
    defaults: Settings  # every job's settings, under its own annotations
    filenames: tuple[str, ...]  # '-' is stdin


def settings_from(args: argparse.Namespace) -> InjectSettings:
    return InjectSettings(defaults=defaults_from(args), filenames=tuple(args.filename or ["-"]))


def read_manifest(name: str) -> str:
    """The text of a manifest file, or of stdin for '-': bytes decoded without newline translation, so inject
    writes CRLF back where it read CRLF."""
    try:
        if name == "-":
            stdin = getattr(sys.stdin, "buffer", None)
            return stdin.read().decode("utf-8") if stdin is not None else sys.stdin.read()
        return Path(name).read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"-f {name}: cannot read it ({getattr(err, 'strerror', None) or err})") from None
