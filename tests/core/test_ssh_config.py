"""SSH text renderers: principals, known_hosts patterns, ssh_config and sshd_config."""

from __future__ import annotations

import dataclasses
import re

import pytest

from agent import examples
from agent.core.files.ssh_config import SshPaths, host_principals, known_hosts_patterns, render_ssh_config
from tests.conftest import render

PRINCIPAL_CASES = [
    ("dns names, relative", {}, "demo-worker-0",
     ["demo-worker-0", "demo-worker-0.demo", "demo-worker-0.demo.default.svc",
      "demo-worker-0.demo.default.svc.cluster.local", "127.1.0.2"]),
    ("dns names, cluster domain", {"cluster_domain": "c.local"}, "demo-worker-0",
     ["demo-worker-0", "demo-worker-0.demo.default.svc.c.local", "127.1.0.2"]),
    ("ip addresses", {"address": "ip"}, "demo-master-0",
     ["demo-master-0", "demo-master-0.demo", "demo-master-0.demo.default.svc",
      "demo-master-0.demo.default.svc.cluster.local", "127.1.0.1"]),
]


@pytest.mark.parametrize(("options", "pod", "expected"), [c[1:] for c in PRINCIPAL_CASES],
                         ids=[c[0] for c in PRINCIPAL_CASES])
def test_host_certificate_principals_cover_every_name_peers_use(options, pod, expected):
    rendered = render(examples.volcano_job(tasks=(("master", 1), ("worker", 1))), pod, **options)
    topo = rendered.plan.topology
    assert host_principals(topo.me, topo, options.get("cluster_domain")) == expected


@pytest.mark.parametrize(("port", "first"), [(22, "*.demo"), (2222, "[*.demo]:2222")])
def test_known_hosts_patterns_use_brackets_only_off_port_22(port, first):
    topo = render(examples.volcano_job(tasks=(("master", 1), ("worker", 1))), "demo-master-0").plan.topology
    patterns = known_hosts_patterns(topo, port)
    assert patterns[0] == first
    assert patterns[-1] == ("*.*.*.*" if port == 22 else "[*.*.*.*]:2222")


def ssh_matches(pattern: str, name: str) -> bool:
    """ssh's match_pattern: '*' and '?' are wildcards, everything else (brackets too) is literal."""
    return re.fullmatch("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern),
                        name) is not None


JOBS = [
    ("volcano, dns", examples.volcano_job("demo", (("master", 1), ("worker", 5))), {}),
    ("volcano, ip", examples.volcano_job("demo", (("master", 1), ("worker", 5))), {"address": "ip"}),
    ("volcano, cluster domain", examples.volcano_job("demo", (("master", 1), ("worker", 5))),
     {"cluster_domain": "c.local"}),
    ("pytorchjob (per-replica Services)", examples.pytorchjob(workers=5), {}),
    ("jobset", examples.jobset(rjobs=(("driver", 1, 1), ("workers", 3, 2))), {}),
]


def dialled(config: str, name: str) -> str:
    """The name ssh checks the host certificate against when asked for ``name`` with this ssh_config: the first
    ``Host`` block that matches (no negated pattern matching) gives ``HostName`` (``%h``: the name asked)."""
    for block in config.split("\nHost ")[1:]:
        head, *body = block.splitlines()
        patterns = head.split()
        if any(p.startswith("!") and ssh_matches(p[1:], name) for p in patterns):
            continue
        if any(not p.startswith("!") and ssh_matches(p, name) for p in patterns):
            for line in body:
                if line.strip().startswith("HostName "):
                    return line.split(None, 1)[1].replace("%h", name)
    return name


@pytest.mark.parametrize(("pods", "options"), [j[1:] for j in JOBS], ids=[j[0] for j in JOBS])
@pytest.mark.parametrize("port", [22, 2222])
def test_known_hosts_matches_every_name_a_member_is_reached_by_and_no_member_list(pods, options, port):
    """One line serves any size. Every DNS name and IP a member's certificate carries is matched by the
    line's patterns (ssh then checks the certificate), so is every name ssh_config sends a pod's name or host name
    to, and the line does not name the members: a pod that knows only rank 0 and itself writes the same line."""
    names = [p["metadata"]["name"] for p in pods]
    topo = render(pods, names[-1], **options).plan.topology
    patterns = known_hosts_patterns(topo, port)
    config = render_ssh_config(topo, SshPaths("/shared/ssh"), port)

    def covered(name: str) -> bool:
        return any(ssh_matches(p, name if port == 22 else f"[{name}]:{port}") for p in patterns)

    for member in topo.members:
        principals = host_principals(member, topo, options.get("cluster_domain"))
        for principal in principals:
            if "." in principal or ":" in principal:  # a name DNS resolves, or an IP: dialled as it is
                assert covered(principal), (principal, patterns)
            else:  # a pod or host name: ssh_config completes it to one the certificate carries
                assert dialled(config, principal) in principals and covered(dialled(config, principal)), principal
    assert not any(m.ip in p or m.name in p for m in topo.members for p in patterns if m.ip)
    own = dataclasses.replace(topo, members=(topo.training[0], topo.me))
    assert known_hosts_patterns(own, port) == patterns
    assert len(patterns) <= 5


def test_ssh_config_maps_aliases_to_addresses_and_checks_host_keys():
    topo = render(examples.pytorchjob(workers=1), "mnist-master-0", address="ip").plan.topology
    text = render_ssh_config(topo, SshPaths("/shared/ssh"), 2222)
    assert "Host mnist-worker-0\n    HostName 127.1.0.2\n" in text
    assert text.index("Host mnist-worker-0") < text.index("Host *")  # first match wins in ssh_config
    assert "StrictHostKeyChecking yes" in text and "IdentityFile /shared/ssh/id_ed25519" in text


def test_ssh_config_reaches_dns_named_pods_by_pattern_not_one_block_each():
    """A pod named as its host name, addressed by its DNS name, is reached by a pattern per role: the
    file does not grow with the job, and a pod in its own view writes the same blocks for rank 0's role and its
    own."""
    topo = render(examples.volcano_job("demo", (("master", 1), ("worker", 40))), "demo-worker-3").plan.topology
    text = render_ssh_config(topo, SshPaths("/shared/ssh"), 2222)
    assert "Host demo-master-* !*.*\n    HostName %h.demo\n" in text
    assert "Host demo-worker-* !*.*\n    HostName %h.demo\n" in text
    assert text.count("Host ") == 3 and "demo-worker-7" not in text
    own = dataclasses.replace(topo, members=(topo.training[0], topo.me))
    assert render_ssh_config(own, SshPaths("/shared/ssh"), 2222) == text


def _ssh_g_hostname(text: str, name: str) -> str:
    """What ssh -G would dial for ``name``: the first block whose patterns match it (ssh(1)'s rule)."""
    import fnmatch

    for block in text.split("\nHost ")[1:]:
        head, _, body = block.partition("\n")
        globs = head.split()
        if any(g.startswith("!") and fnmatch.fnmatchcase(name, g[1:]) for g in globs):
            continue
        if any(not g.startswith("!") and fnmatch.fnmatchcase(name, g) for g in globs) and "HostName" in body:
            return body.split("HostName ", 1)[1].split("\n", 1)[0].replace("%h", name)
    return name


@pytest.mark.parametrize(("subdomains", "blocks"), [
    ({2: "other"}, 4 + 1 + 1),               # a worker in another domain: the workers are named one block each
    ({1: "x", 2: "x", 3: "x", 4: "x"}, 3),  # every worker in one domain of its own: one pattern still serves them
])
def test_a_role_pattern_is_written_only_when_it_sends_every_name_it_matches_to_its_own_host(subdomains, blocks):
    """A pattern is shared by a role's members; ssh takes the first matching block, so members of one role in two
    DNS domains (found by the hostile-files property test) are named one block each instead."""
    pods = examples.volcano_job("demo", (("master", 1), ("worker", 4)))
    for index, subdomain in subdomains.items():
        pods[index]["spec"]["subdomain"] = subdomain
    topo = render(pods, "demo-master-0").plan.topology
    text = render_ssh_config(topo, SshPaths("/shared/ssh"), 2222)
    for member in topo.members:
        assert _ssh_g_hostname(text, member.name) == member.address, (member.name, text)
    assert text.count("\nHost ") == blocks


def test_a_role_pattern_that_matches_another_roles_names_is_not_written():
    """``demo-a-*`` also matches ``demo-a-b-0``: when their domains differ, neither is reached by the wrong block."""
    pods = examples.volcano_job("demo", (("a", 2), ("a-b", 2)))
    for pod in pods[2:]:
        pod["spec"]["subdomain"] = "other"
    topo = render(pods, "demo-a-0").plan.topology
    text = render_ssh_config(topo, SshPaths("/shared/ssh"), 2222)
    for member in topo.members:
        assert _ssh_g_hostname(text, member.name) == member.address, (member.name, text)


# --- the launcher's per-change passes (C-level) against the member-by-member rules they replace ---------------

_TRAILING = re.compile(r"(-[0-9]+)+$")


def _reference_patterns(members, namespace: str, port: int) -> list[str]:
    """known_hosts patterns member by member, as the rules say (the module's docstring)."""
    patterns: list[str] = []
    for member in members:
        dns = member.dns_name
        if not dns:
            names = []
        elif "." not in dns:
            names = [_TRAILING.sub("-*", dns)] if _TRAILING.search(dns) else [dns]
        else:
            suffix = dns.split(".", 1)[1]
            names = [f"*.{suffix}"] if "." in suffix else [f"*.{suffix}", f"*.{suffix}.{{ns}}.svc",
                                                         f"*.{suffix}.{{ns}}.svc.cluster.local"]
        for name in names:
            pattern = name.replace("{ns}", namespace)
            pattern = pattern if port == 22 else f"[{pattern}]:{port}"
            if pattern not in patterns:
                patterns.append(pattern)
    families = {":" in m.ip for m in members if m.ip}
    for family, pattern in ((False, "*.*.*.*"), (True, "*:*")):
        if family in families:
            pattern = pattern if port == 22 else f"[{pattern}]:{port}"
            if pattern not in patterns:
                patterns.append(pattern)
    return patterns


def _reference_blocks(members) -> str:
    blocks = []
    for member in members:
        aliases = [member.name]
        if member.dns_name:
            short = member.dns_name.split(".")[0]
            aliases += [a for a in (short, member.dns_name) if a not in aliases]
        blocks.append(f"Host {' '.join(aliases)}\n    HostName {member.address}\n\n")
    return "".join(blocks)


def _member(name, dns, ip, address=None):
    from agent.core.model import Member

    return Member(name=name, role="worker", index=(0,), ordinal=0, address=address or ip or dns or name,
                  dns_name=dns, ip=ip, training=True, slots=1, node_rank=0, first_rank=0)


MEMBER_SETS = {
    "one domain, IPv4": [_member(f"w-{i}", f"w-{i}.demo", f"10.0.0.{i}") for i in range(4)],
    "two domains and a fully qualified one": [
        _member("a-0", "a-0.x", "10.0.0.1"), _member("b-0", "b-0.y", "10.0.0.2"),
        _member("c-0", "c-0.z.ns.svc", "10.0.0.3"), _member("a-1", "a-1.x", "10.0.0.4")],
    "single-label names among dotted ones": [
        _member("a-0", "a-0.x", "10.0.0.1"), _member("svc-3", "svc-3", "10.0.0.2"),
        _member("plain", "plain", "fd00::1"), _member("a-1", "a-1.x", None)],
    "no DNS names, both families": [_member("p", None, "fd00::2"), _member("q", None, "10.1.1.1")],
    "a DNS name that is not the pod's": [_member("w-0", "host-0.demo", "10.0.0.1"),
                                          _member("w.1", "w.1.demo", "10.0.0.2")],
}


@pytest.mark.parametrize("port", [22, 2222])
@pytest.mark.parametrize("case", sorted(MEMBER_SETS))
def test_known_hosts_patterns_and_host_blocks_are_the_member_by_member_rules(case, port):
    from agent.core.files.ssh_config import _host_blocks_each
    from agent.core.model import Topology

    members = tuple(MEMBER_SETS[case])
    topo = Topology(controller="volcano", namespace="ns", job="demo", job_uid=None, self_name=members[0].name,
                    training_roles=("worker",), members=members)
    assert known_hosts_patterns(topo, port) == _reference_patterns(members, "ns", port)
    assert "".join(_host_blocks_each(members)) == _reference_blocks(members)


def test_the_member_fields_read_by_position_are_the_named_ones():
    from agent.core.files import ssh_config

    member = _member("n", "n.d", "10.0.0.9", address="addr")
    assert (ssh_config._NAME(member), ssh_config._ADDRESS(member), ssh_config._DNS(member), ssh_config._IP(member)) \
        == (member.name, member.address, member.dns_name, member.ip)


STEPS = {
    "the same tuple": lambda ms: ms,
    "one moved to a new IP": lambda ms: (*ms[:1], _member(ms[1].name, ms[1].dns_name, "10.9.9.9"), *ms[2:]),
    "one to a new domain": lambda ms: (*ms[:2], _member(ms[2].name, f"{ms[2].name}.other", "10.0.0.7"), *ms[3:]),
    "one to IPv6": lambda ms: (_member(ms[0].name, ms[0].dns_name, "fd00::9"), *ms[1:]),
    "one without a DNS name": lambda ms: (*ms[:3], _member(ms[3].name, None, "10.0.0.8")),
    "one left": lambda ms: ms[:-1],
    "one more": lambda ms: (*ms, _member("w-9", "w-9.demo", "10.0.0.99")),
    "equal members, new objects": lambda ms: tuple(_member(m.name, m.dns_name, m.ip, m.address) for m in ms),
    "the first left, one moved to a new IP": lambda ms: (*ms[1:3], _member(ms[3].name, ms[3].dns_name, "10.8.8.8",
                                                                           ms[3].address), *ms[4:]),
    "one joined first, one without an IP": lambda ms: (_member("w-7", "w-7.demo", "10.0.0.77"), *ms[:2],
                                                       _member(ms[2].name, ms[2].dns_name, None, ms[2].address),
                                                       *ms[3:]),
    "one more in IPv6": lambda ms: (*ms, _member("w-8", "w-8.demo", "fd00::8")),
}


@pytest.mark.parametrize("family", ["10.0.0.{}", "fd00::{}"])
@pytest.mark.parametrize("address", ["ip", "dns"])
@pytest.mark.parametrize("step", sorted(STEPS))
def test_the_sidecars_kept_ssh_texts_make_the_files_made_from_scratch(step, address, family):
    """A launcher keeps what each member adds to known_hosts and ssh_config (SshTexts) and recomputes only the
    places that changed: the files are those rendered from scratch, whatever changed."""
    from agent.core.files.ssh_config import SshTexts, render_known_hosts
    from agent.core.model import Topology

    def member(i: int):
        return _member(f"w-{i}", f"w-{i}.demo", family.format(i), address=f"w-{i}.demo" if address == "dns" else None)

    def topology(members):
        return Topology(controller="volcano", namespace="ns", job="demo", job_uid=None, self_name="w-0",
                        training_roles=("worker",), members=tuple(members))

    texts, paths = SshTexts(), SshPaths("/shared/ssh")
    members = tuple(member(i) for i in range(5))
    for now in (members, STEPS["one moved to a new IP"](members), STEPS[step](members)):
        topo = topology(now)
        assert render_known_hosts(topo, "ssh-ed25519 CA", 2222, texts) == render_known_hosts(topo, "ssh-ed25519 CA",
                                                                                             2222)
        assert render_ssh_config(topo, paths, 2222, texts) == render_ssh_config(topo, paths, 2222)
        members = now


def test_the_kept_domains_and_patterns_of_one_role_are_held_once():
    """Every member of a role repeats its DNS domain and its Host pattern: SshTexts holds each pair once, not a
    pair of new strings per member (~5 MB at 16384 members), whichever way the members came (all at once, in
    place, or new ones beside the kept)."""
    from agent.core.files.ssh_config import SshTexts

    members = tuple(_member(f"w-{i}", f"w-{i}.demo", f"10.0.0.{i}", address=f"w-{i}.demo") for i in range(6))
    texts = SshTexts()
    for now in (members, (*members[:5], _member("w-5", "w-5.demo", "10.0.0.50", address="w-5.demo")),
                (_member("w-9", "w-9.demo", "10.0.0.9", address="w-9.demo"), *members[:5])):
        kept = texts.look(now)
        assert kept.found[0] == ("w-* !*.*", "%h.demo") and all(pair is kept.found[0] for pair in kept.found)
        assert kept.domains[0] == (".", "demo") and all(pair is kept.domains[0] for pair in kept.domains)
        assert kept.blocks == [None] * len(now)  # the pattern reaches them all: no block of their own is held


def test_a_member_whose_pattern_cannot_be_used_gets_its_block_when_the_file_is_made():
    """A Host block of its own is held only for a member no pattern can reach; one whose role's pattern cannot
    be used (two domains behind one glob) has its block made with the file, as from scratch."""
    from agent.core.files.ssh_config import SshTexts
    from agent.core.model import Topology

    members = tuple(_member(f"w-{i}", f"w-{i}.{'other' if i == 2 else 'demo'}", f"10.0.0.{i}",
                            address=f"w-{i}.{'other' if i == 2 else 'demo'}") for i in range(4))
    topo = Topology(controller="volcano", namespace="ns", job="demo", job_uid=None, self_name="w-0",
                    training_roles=("worker",), members=members)
    texts = SshTexts()
    text = render_ssh_config(topo, SshPaths("/shared/ssh"), 2222, texts)
    assert texts.look(members).blocks == [None] * 4
    assert all(f"Host w-{i} w-{i}." in text for i in range(4)) and "w-* !*.*" not in text
