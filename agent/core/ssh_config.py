"""SSH text files for a job: sshd_config snippet, ssh_config, known_hosts, and each pod's host-cert principals.

Host keys are verified through a certificate authority instead of being skipped (the incumbents write
``StrictHostKeyChecking no``). known_hosts holds one ``@cert-authority`` line whose patterns cover the job's
names (the headless Service's wildcard and the peers' IPs), so a new member needs no new key line: its
certificate, signed by the job's CA for its own names, is what ssh checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.core.model import Member, Topology


@dataclass(frozen=True)
class SshPaths:
    """Where the files live as the trainer sees them (the init container writes the same volume)."""

    directory: str

    def file(self, name: str) -> str:
        return f"{self.directory.rstrip('/')}/{name}"


def host_principals(member: Member, topology: Topology, cluster_domain: str | None) -> list[str]:
    """The names a peer may use to reach this pod: short host, DNS name, fully qualified name, IP, pod name."""
    names: list[str] = []

    def add(name: str | None) -> None:
        if name and name not in names:
            names.append(name)

    if member.dns_name:
        add(member.dns_name.split(".")[0])
        add(member.dns_name)
        if not cluster_domain and member.dns_name.count(".") == 1:
            add(f"{member.dns_name}.{topology.namespace}.svc")
            add(f"{member.dns_name}.{topology.namespace}.svc.cluster.local")
    add(member.name)
    add(member.ip)
    add(member.address)
    return names


def _pattern(name: str, port: int) -> str:
    return name if port == 22 else f"[{name}]:{port}"


def known_hosts_patterns(topology: Topology, port: int) -> list[str]:
    """Wildcards for the job's DNS suffixes (stable across membership changes) plus every member's IP."""
    patterns: list[str] = []

    def add(name: str) -> None:
        pattern = _pattern(name, port)
        if pattern not in patterns:
            patterns.append(pattern)

    for member in topology.members:
        if member.dns_name and "." in member.dns_name:
            add("*." + member.dns_name.split(".", 1)[1])
        elif member.dns_name:
            add(member.dns_name)
        add(member.name)
    for member in topology.members:
        if member.ip:
            add(member.ip)
    return patterns


def render_known_hosts(topology: Topology, ca_public_key: str, port: int) -> str:
    patterns = ",".join(known_hosts_patterns(topology, port))
    return (f"# Written by topology-agent: hosts of job '{topology.job}' are trusted when their host certificate is\n"
            f"# signed by the job's CA for the name used.\n@cert-authority {patterns} {ca_public_key.strip()}\n")


def render_ssh_config(topology: Topology, paths: SshPaths, port: int) -> str:
    lines = ["# Written by topology-agent. Use: ssh -F this-file, or link it to ~/.ssh/config.", ""]
    for member in topology.members:
        aliases = [member.name]
        if member.dns_name:
            short = member.dns_name.split(".")[0]
            aliases += [a for a in (short, member.dns_name) if a not in aliases]
        lines += [f"Host {' '.join(aliases)}", f"    HostName {member.address}", ""]
    lines += [
        "Host *",
        f"    Port {port}",
        f"    IdentityFile {paths.file('id_ed25519')}",
        "    IdentitiesOnly yes",
        f"    UserKnownHostsFile {paths.file('known_hosts')}",
        "    GlobalKnownHostsFile /dev/null",
        "    StrictHostKeyChecking yes",
        "    PasswordAuthentication no",
        "    KbdInteractiveAuthentication no",
        "    LogLevel ERROR",
        "",
    ]
    return "\n".join(lines)


def render_sshd_config(paths: SshPaths, port: int, *, pod_name: str) -> str:
    return "\n".join([
        "# Written by topology-agent: include it in the trainer's sshd (sshd -f this-file), non-root on a high port.",
        f"Port {port}",
        f"HostKey {paths.file('ssh_host_ed25519_key')}",
        f"HostCertificate {paths.file('ssh_host_ed25519_key-cert.pub')}",
        f"AuthorizedKeysFile {paths.file('authorized_keys')}",
        f"PidFile {paths.file('sshd.pid')}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "StrictModes yes",
        "UsePAM no",
        "PermitUserEnvironment no",
        f"SetEnv TOPOLOGY_SSH_POD={pod_name}",
        "",
    ])
