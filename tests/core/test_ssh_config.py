"""SSH text renderers: principals, known_hosts patterns, ssh_config and sshd_config."""

from __future__ import annotations

import pytest

from agent import examples
from agent.core.ssh_config import SshPaths, host_principals, known_hosts_patterns, render_ssh_config
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
    assert patterns[-1] == ("127.1.0.2" if port == 22 else "[127.1.0.2]:2222")


def test_ssh_config_maps_aliases_to_addresses_and_checks_host_keys():
    topo = render(examples.pytorchjob(workers=1), "mnist-master-0", address="ip").plan.topology
    text = render_ssh_config(topo, SshPaths("/shared/ssh"), 2222)
    assert "Host mnist-worker-0\n    HostName 127.1.0.2\n" in text
    assert text.index("Host mnist-worker-0") < text.index("Host *")  # first match wins in ssh_config
    assert "StrictHostKeyChecking yes" in text and "IdentityFile /shared/ssh/id_ed25519" in text
