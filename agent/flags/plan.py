"""`topology-agent plan -f JOB.yaml`: its flags, and the manifests it reads (``PlanSettings``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NamedTuple

from agent.errors import InputError
from agent.flags.common import choice

OUTPUTS = ("table", "json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("From a job's manifest, with no cluster: the pods its controller would create, each one's "
                          "role, ranks, world size, processes and the files its init would write (docs/plan.md).")
    parser.add_argument("-f", "--filename", required=True, help="the job's manifest (YAML, multi-document, or "
                                                                "JSON; '-' is stdin); a TrainJob's runtime may be "
                                                                "in it too")
    parser.add_argument("--runtime", action="append", help="a TrainJob's (Cluster)TrainingRuntime manifest "
                                                           "(default: one in -f, else manifests/trainer/<name>.yaml)")
    parser.add_argument("--out", metavar="DIR", help="write DIR/<pod>/<each file init would write>")
    parser.add_argument("--self", metavar="POD", help="print this pod's explain instead of the table")
    parser.add_argument("-o", "--output", default="table", help="table (default) or json")


class PlanSettings(NamedTuple):
    filename: str  # '-' is stdin
    runtimes: tuple[str, ...]
    out: Path | None
    me: str | None
    output: str


def settings_from(args: argparse.Namespace) -> PlanSettings:
    output = choice("--output", args.output, OUTPUTS)
    if args.self is not None and not args.self:
        raise InputError("--self needs a pod name; see the table that plan prints without it")
    return PlanSettings(filename=args.filename, runtimes=tuple(args.runtime or ()),
                        out=Path(args.out) if args.out else None, me=args.self, output=output)
