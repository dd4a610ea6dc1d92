"""SSH text files for a job: sshd_config snippet, ssh_config, known_hosts, and each pod's host-cert principals.

Host keys are verified through a certificate authority instead of being skipped (the incumbents write
``StrictHostKeyChecking no``). known_hosts holds one ``@cert-authority`` line whose patterns cover every name a
job's pod is reached by, the same for any size of job and any membership: ssh checks the certificate's principals
against the name it dialled (ssh(1), sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT"), so a list of the members would add
nothing, and a pod that knows only rank 0 and itself (its own view) writes the same line as one that knows every
member. Each pod's certificate, signed by the job's CA (its Secret), names that pod alone. ssh_config maps a pod's
short name to its DNS name by pattern where the names allow it, and names the others one block each.
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from agent.core.model import Member, Topology, member_fields


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


_TRAILING_INDEX = re.compile(r"(-[0-9]+)+$")


_NAME, _ADDRESS, _DNS, _IP = map(member_fields, ("name", "address", "dns_name", "ip"))


def known_hosts_patterns(topology: Topology, port: int, texts: SshTexts | None = None) -> list[str]:
    """The job's names as patterns that do not grow with the job (a few per DNS domain), and any IP address of the
    members' families: the certificate decides which host is which (the module's docstring). A member's patterns
    follow from its DNS domain alone, so the distinct domains are found first. ``texts``: each member's domain and
    family kept from the last generation (the launcher of a 16384-pod job rewrites this at every change)."""
    patterns: list[str] = []

    def add(name: str) -> None:
        pattern = _pattern(name, port)
        if pattern not in patterns:
            patterns.append(pattern)

    kept = (texts or SshTexts()).look(topology.members)
    domains = dict.fromkeys(filter(None, kept.domains))
    families = set(kept.families)
    for dot, text in domains:
        for name in _dns_patterns_of(text if dot else None, text):
            add(name.replace("{ns}", topology.namespace))
    if False in families:
        add("*.*.*.*")
    if True in families:
        add("*:*")
    return patterns


def _domain(dns: str | None) -> tuple[str, str] | None:
    """What a member's patterns follow from: ('.', the suffix after its DNS name's first dot), or ('', a
    single-label name); None without a DNS name."""
    if not dns:
        return None
    head, dot, suffix = dns.partition(".")
    return (dot, suffix) if dot else ("", head)


def _family(ip: str | None) -> bool | None:
    """True for an IPv6 address, False for IPv4, None without one."""
    return (":" in ip) if ip else None


def _dns_patterns_of(suffix: str | None, name: str) -> list[str]:
    """Patterns for the names a member's certificate carries beside its IP, from its DNS name's ``suffix`` after
    the first dot: ``*.<suffix>`` (the headless Service's domain), with the ``.<ns>.svc`` and
    ``.svc.cluster.local`` forms ``host_principals`` adds to a relative name; a single-label ``name`` (a
    per-replica Service; ``suffix`` None) with its trailing index as ``*``."""
    if suffix is None:
        return [_TRAILING_INDEX.sub("-*", name)] if _TRAILING_INDEX.search(name) else [name]
    return [f"*.{suffix}"] if "." in suffix else [f"*.{suffix}", f"*.{suffix}.{{ns}}.svc",
                                                 f"*.{suffix}.{{ns}}.svc.cluster.local"]


def render_known_hosts(topology: Topology, ca_public_key: str, port: int, texts: SshTexts | None = None) -> str:
    patterns = ",".join(known_hosts_patterns(topology, port, texts))
    return (f"# Written by topology-agent: hosts of job '{topology.job}' are trusted when their host certificate is\n"
            f"# signed by the job's CA for the name used.\n@cert-authority {patterns} {ca_public_key.strip()}\n")


def host_pattern(member: Member) -> tuple[str, str] | None:
    """(``Host`` pattern, ``HostName``) that reach this member by its short name without naming it: its pod name is
    its host name, its address its DNS name ``<host>.<suffix>``, and the name ends in an index."""
    dns = member.dns_name
    if not dns or member.address != dns or "." not in dns:
        return None
    host, suffix = dns.split(".", 1)
    if host != member.name or not _TRAILING_INDEX.search(host):
        return None
    return f"{_TRAILING_INDEX.sub('-*', host)} !*.*", f"%h.{suffix}"


def _role_patterns(topology: Topology, found: Sequence[tuple[str, str] | None] | None = None
                   ) -> tuple[dict[str, str], Sequence[tuple[str, str] | None]]:
    """Each member's pattern and the patterns whose block reaches only members it names the right way: every
    member whose name the glob matches has that pattern and that ``HostName`` (ssh takes the first matching block,
    so a pattern shared by two DNS domains, or one that also matches another role's names, would send someone to
    the wrong host). ``found``: each member's ``host_pattern``, when known."""
    if found is None:
        found = [host_pattern(member) for member in topology.members]
    targets: dict[str, set[str]] = {}
    for glob, hostname in filter(None, found):
        targets.setdefault(glob, set()).add(hostname)
    if not targets:  # no member reached by a pattern (IP addresses): every member has its own block
        return {}, found
    prefixes = {pattern.split(" ", 1)[0][:-1]: pattern for pattern in targets}  # "demo-worker-"
    # Two globs match one name only if one's prefix starts the other's: those are the ones to look at.
    related = {pattern: tuple(q for q in prefixes if q != p and (q.startswith(p) or p.startswith(q)))
               for p, pattern in prefixes.items()}
    every = tuple(prefixes)
    for member, pair in zip(topology.members, found, strict=True):
        others = every if pair is None else related[pair[0]]
        if others and member.name.startswith(others):
            for prefix in others:
                if member.name.startswith(prefix):
                    targets[prefixes[prefix]].add("")  # a name this glob reaches that is not its own
    kept = {pattern: next(iter(hostnames)) for pattern, hostnames in targets.items() if len(hostnames) == 1}
    return kept, found


def render_ssh_config(topology: Topology, paths: SshPaths, port: int, texts: SshTexts | None = None) -> str:
    """One ``Host`` block per member that no pattern reaches (each name it goes by -> its address), one per pattern
    (``demo-worker-* !*.*`` -> ``%h.demo``: a name with no dot, completed), then the settings for every host."""
    kept = (texts or SshTexts()).look(topology.members)
    patterns, found = _role_patterns(topology, kept.found)
    own = zip(kept.blocks, topology.members, strict=True)
    listed = own if not patterns else itertools.compress(own, map(_listed, found, itertools.repeat(patterns)))
    blocks = "".join(block if block is not None else _host_block(member) for block, member in listed)
    lines = ["# Written by topology-agent. Use: ssh -F this-file, or link it to ~/.ssh/config.", "", blocks]
    for pattern, hostname in patterns.items():
        lines += [f"Host {pattern}", f"    HostName {hostname}", ""]
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


def _listed(pair: tuple[str, str] | None, patterns: dict[str, str]) -> bool:
    """Whether a member needs a block of its own: no pattern reaches it the right way."""
    return pair is None or patterns.get(pair[0]) != pair[1]


def _host_block(member: Member) -> str:
    aliases = [member.name]
    if member.dns_name:
        short = member.dns_name.split(".")[0]
        aliases += [a for a in (short, member.dns_name) if a not in aliases]
    return f"Host {' '.join(aliases)}\n    HostName {member.address}\n\n"


class _Kept(NamedTuple):
    members: tuple[Member, ...]
    domains: list[tuple[str, str] | None]
    families: list[bool | None]
    found: list[tuple[str, str] | None]
    blocks: list[str | None]  # a member's own Host block where no pattern reaches it, else None (made if used)


_SAME = 4096  # distinct (domain, pattern) pairs SshTexts holds once; a job has a few per role


class SshTexts:
    """What each member adds to known_hosts and ssh_config, kept between a launcher's generations place by place
    (as ``rendering.MemberTexts``): a change that keeps the members in their places computes only the places that
    changed (the two member tuples compared by pointer), where both files at 16384 members cost ~17 ms."""

    def __init__(self) -> None:
        self._kept: _Kept | None = None
        self._same: dict[tuple[str, str], tuple[str, str]] = {}  # each distinct domain and pattern pair, held once

    def _once(self, pair: tuple[str, str] | None) -> tuple[str, str] | None:
        """``pair`` as held already: every member of a role repeats its domain and its pattern, and each was a
        pair of new strings per member (~5 MB at 16384 members); past ``_SAME`` distinct pairs, kept as made."""
        if pair is None or len(self._same) >= _SAME:
            return pair
        return self._same.setdefault(pair, pair)

    def look(self, members: tuple[Member, ...]) -> _Kept:
        kept = self._kept
        if kept is not None and kept.members is members:
            return kept
        if kept is not None and len(kept.members) == len(members):
            domains, families = list(kept.domains), list(kept.families)
            found, blocks = list(kept.found), list(kept.blocks)
            for at in itertools.compress(range(len(members)), map(operator.is_not, members, kept.members)):
                member = members[at]
                domains[at], families[at] = self._once(_domain(member.dns_name)), _family(member.ip)
                found[at] = self._once(host_pattern(member))
                blocks[at] = _host_block(member) if found[at] is None else None
        else:
            # A pod joined or left: the members that stayed are the same objects in other places, gathered at
            # C level; only the new ones are made (all 16384 made again would be ~11 of a launcher's ~19 ms for
            # both files at such a change, in-process)
            places = dict(zip(map(id, kept.members), itertools.count())) if kept is not None else {}
            where = list(map(places.get, map(id, members)))
            new = list(itertools.compress(range(len(where)), map(operator.is_, where, itertools.repeat(None))))
            if kept is not None and len(members) > 1 and len(new) <= len(members) // 2:
                pick = operator.itemgetter(*(0 if at is None else at for at in where))
                domains, families = list(pick(kept.domains)), list(pick(kept.families))
                found, blocks = list(pick(kept.found)), list(pick(kept.blocks))
                for at in new:
                    member = members[at]
                    domains[at], families[at] = self._once(_domain(member.dns_name)), _family(member.ip)
                    found[at] = self._once(host_pattern(member))
                    blocks[at] = _host_block(member) if found[at] is None else None
            else:
                domains = list(map(self._once, map(_domain, map(_DNS, members))))
                families = list(map(_family, map(_IP, members)))
                found = list(map(self._once, map(host_pattern, members)))
                blocks = _own_blocks(members, found)
        self._kept = _Kept(members, domains, families, found, blocks)
        return self._kept


def _own_blocks(members: Sequence[Member], found: Sequence[tuple[str, str] | None]) -> list[str | None]:
    """Each member's own ``Host`` block where no pattern can reach it (``found`` None), else None: a role reached
    by its pattern needs none (~2.5 MB of blocks at 16384 members), and the few whose pattern cannot be used
    (``_role_patterns``) are made when the file is."""
    made = iter(_host_blocks_each([member for member, pair in zip(members, found, strict=True) if pair is None]))
    return [next(made) if pair is None else None for pair in found]


def _host_blocks_each(members: Sequence[Member]) -> list[str]:
    """One ``Host`` block per member; the common case (a DNS name ``<pod name>.<domain>``) in one C-level pass."""
    names, dns_names = list(map(_NAME, members)), list(map(_DNS, members))
    if all(dns_names) and all(map(str.startswith, dns_names, names)) and \
            list(map(str.find, dns_names, itertools.repeat("."))) == list(map(len, names)):  # <name>.<domain>
        return list(map("Host {} {}\n    HostName {}\n\n".format, names, dns_names, map(_ADDRESS, members)))
    return list(map(_host_block, members))


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
