"""`topology-agent demo`: its flag, the directory each pod's files go to."""

from __future__ import annotations

import argparse
from pathlib import Path

from agent.errors import OutputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="demo-out", help="where each pod's files go (default ./demo-out)")


def settings_from(args: argparse.Namespace) -> Path:
    """The output directory, made and proven writable."""
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".topology-agent-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise OutputError(f"--out {out}: cannot write there ({err.strerror or err}); give a writable directory, "
                          "e.g. --out ./demo-out") from None
    return out
