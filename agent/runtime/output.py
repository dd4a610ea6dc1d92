"""One generation of output: the core's files plus, when the job's SSH Secret is mounted, the SSH files."""

from __future__ import annotations

from pathlib import Path

from agent.core import Rendered
from agent.core.model import Options
from agent.core.rendering import EXECUTABLE, MARKERS
from agent.core.ssh_config import SshPaths
from agent.files.writing import write_files


def write_generation(out_dir: Path, rendered: Rendered, options: Options, ssh: object | None = None) -> list[str]:
    """Write everything for this pod; return the names written. ``ssh`` is an ``SshSettings`` or None."""
    files = dict(rendered.files)
    modes: dict[str, int] = {}
    owner = None
    private: tuple[str, ...] = ()
    if ssh is not None:
        from agent.ssh.material import SshSettings, load_job_keys, ssh_files

        assert isinstance(ssh, SshSettings)
        keys = load_job_keys(ssh.secret_dir)
        ssh_out, modes = ssh_files(rendered, keys, paths=SshPaths(str(out_dir.resolve() / "ssh")), port=ssh.port,
                                   cluster_domain=options.cluster_domain)
        markers = {name: files.pop(name) for name in MARKERS}
        files.update(ssh_out)
        files.update(markers)  # the markers stay last
        owner = ssh.owner
        private = ("ssh",)
    for name in EXECUTABLE:
        modes[name] = 0o755
    write_files(out_dir, files, modes=modes, owner=owner, private_dirs=private)
    return list(files)
