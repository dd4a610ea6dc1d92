"""`topology-agent inject`: its flags, the defaults ``--set`` gives, and the manifests ``-f`` names."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from agent.errors import InputError

if TYPE_CHECKING:
    from agent.core.injection import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", action="append", help="manifest file (YAML, multi-document, JSON or a "
                                                                   "kubectl List); '-' or none: stdin")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="a default for every job, as annotation topology-agent.io/KEY would give it (the "
                             "job's own annotations win), e.g. --set image=registry/topology-agent:0.1.0")


class InjectSettings(NamedTuple):
    defaults: Settings  # every job's settings, under its own annotations
    filenames: tuple[str, ...]  # '-' is stdin


def settings_from(args: argparse.Namespace) -> InjectSettings:
    from agent.core.injection import PREFIX, Settings

    defaults = {}
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--set {item!r}: give KEY=VALUE, e.g. --set elastic=2:4")
        defaults[PREFIX + key.strip()] = value
    return InjectSettings(defaults=Settings().over(defaults, "--set"), filenames=tuple(args.filename or ["-"]))


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
