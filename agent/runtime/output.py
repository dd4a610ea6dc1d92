"""One generation of output: the core's files plus, when the job's SSH Secret is mounted, the SSH files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agent.core import Rendered
from agent.core.files.rendering import EXECUTABLE, MARKERS
from agent.core.model import Options
from agent.files.writing import write_files

if TYPE_CHECKING:
    from agent.core.files.ssh_config import SshTexts


def write_generation(out_dir: Path, rendered: Rendered, options: Options, ssh: object | None = None, *,
                     ssh_membership_only: bool = False, ssh_texts: SshTexts | None = None) -> list[str]:
    """Write everything for this pod; return the names written. ``ssh`` is an ``SshSettings`` or None; the
    sidecar passes ``ssh_membership_only`` (known_hosts and ssh_config follow the members; the pod's host key,
    which sshd has loaded, stays) and ``ssh_texts`` (an ``SshTexts`` it keeps between generations)."""
    files = rendered.files.parts()
    modes: dict[str, int] = {}
    owner = None
    private: tuple[str, ...] = ()
    if ssh is not None:
        from agent.core.files.ssh_config import SshPaths  # with the SSH material only: most pods have none
        from agent.ssh.files import PUBLIC, SshSettings, membership_files

        assert isinstance(ssh, SshSettings)
        paths = SshPaths(str(out_dir.resolve() / "ssh"))
        if ssh_membership_only:
            ca_public = (ssh.secret_dir / "host_ca.pub").read_text().strip()
            ssh_out = membership_files(rendered, ca_public, paths=paths, port=ssh.port, texts=ssh_texts)
            modes = dict.fromkeys(ssh_out, PUBLIC)
        else:
            from agent.ssh.material import load_job_keys, ssh_files  # init's host key and certificate

            keys = load_job_keys(ssh.secret_dir)
            ssh_out, modes = ssh_files(rendered, keys, paths=paths, port=ssh.port,
                                       cluster_domain=options.cluster_domain)
        markers = {name: files.pop(name) for name in MARKERS}
        files.update((name, (data,)) for name, data in ssh_out.items())
        files.update(markers)  # the markers stay last
        owner = ssh.owner
        private = ("ssh",)
    for name in EXECUTABLE:
        modes[name] = 0o755
    write_files(out_dir, files, modes=modes, owner=owner, private_dirs=private)
    return list(files)
