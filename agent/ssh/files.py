"""The SSH files that name the members, and where the job's SSH material is: what the sidecar needs.

Without key work, so the sidecar, which rewrites known_hosts and ssh_config as members come and go, never loads
asyncssh (its import is ~16 MB of every process that loads it); init's keys and host certificate are
material.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.core import Rendered
from agent.core.files.ssh_config import SshPaths, SshTexts, render_known_hosts, render_ssh_config

PRIVATE = 0o600
PUBLIC = 0o644


def membership_files(rendered: Rendered, ca_public: str, *, paths: SshPaths, port: int,
                     texts: SshTexts | None = None) -> dict[str, bytes]:
    """The SSH files that name the members (the sidecar rewrites these when membership changes: with
    ``--address ip`` a new member is known by its IP only). The pod's own host key and certificate stay.
    ``texts``: what each member adds to them, kept by the sidecar between generations."""
    topo = rendered.plan.topology
    return {"ssh/known_hosts": render_known_hosts(topo, ca_public, port, texts).encode(),
            "ssh/ssh_config": render_ssh_config(topo, paths, port, texts).encode()}


@dataclass(frozen=True)
class SshSettings:
    secret_dir: Path
    port: int = 2222
    owner: tuple[int, int] | None = None
