"""Generated hostile pods against the real parsers of every file: whatever the pods say, bash exports
exactly the agent's variables, ``ssh -G`` sees exactly one Host block per member and no directive of a pod's,
``ssh-keygen -F`` finds the one @cert-authority line, DeepSpeed's own hostfile parser reads exactly the training
pods, and sh prints exactly their host:slots. A pod the agent refuses is fine; a file with an extra line is not."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent import examples
from agent.core import Options, render_pod
from agent.core.files.ssh_config import SshPaths, host_pattern, render_known_hosts, render_ssh_config
from agent.errors import InputError

# One at a time, on one worker (xdist): the consumers' processes and ports.
pytestmark = pytest.mark.xdist_group("e2e")

if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
    pytest.skip("OpenSSH ssh/ssh-keygen are not installed (apt-get install openssh-client; .ci/run does)",
                allow_module_level=True)

CA = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH8l5Y3r2m8V4o0bQ3CwzDqNkRj7m8b9G7sX0bS1d3f2 job-ca"
HOSTILE = st.one_of(
    st.text(min_size=0, max_size=30),
    st.sampled_from(["worker", "extras", "0", "5", "127.1.0.9", "fd00::5", "::ffff:127.1.0.9", "demo", "w-1",
                     "x.y", "Worker_2"]),
    st.sampled_from(["worker\nHost *\n  ProxyCommand touch /tmp/x", "a b", "x,y", "*", "#c", "$(id)", "'q'",
                     "w\u2028x", "@cert-authority", "demo\n", "127.1.0.9\nevil slots=8", "EOF", ""]),
)


@st.composite
def hostile_jobs(draw):
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", draw(st.integers(1, 3))), ("extras", 1)))
    for pod in pods[1:]:
        meta, spec = pod["metadata"], pod["spec"]
        choice = draw(st.sampled_from(["label", "annotation", "hostname", "subdomain", "ip", "env"] + ["none"] * 9))
        value = draw(HOSTILE)
        if choice == "label":
            meta["labels"][draw(st.sampled_from(["volcano.sh/task-spec", "volcano.sh/task-index"]))] = value
        elif choice == "annotation":
            del meta["labels"]["volcano.sh/task-spec"]
            meta["annotations"]["volcano.sh/task-spec"] = value
        elif choice in ("hostname", "subdomain"):
            spec[choice] = value
        elif choice == "ip":
            pod["status"]["podIP"] = value
        elif choice == "env":
            spec["containers"][0]["env"].insert(0, {"name": "MASTER_ADDR", "value": value})
    return pods, draw(st.sampled_from(["dns", "ip"]))


def _same_hostname_twice() -> list:
    """Two workers given one hostname (and so one DNS name, ``0.demo``): the case a run once found."""
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2), ("extras", 1)))
    for pod in pods[1:3]:
        pod["spec"]["hostname"] = "0"
    return pods


def _two_domains_in_one_role() -> list:
    """Two workers of one role in two DNS domains (``%h.0`` and ``%h.demo``): the case a CI run found."""
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2), ("extras", 1)))
    pods[2]["spec"]["subdomain"] = "0"
    return pods


def _write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text)
    return path


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(hostile_jobs())
@example(job=(_same_hostname_twice(), "dns"))
@example(job=(_two_domains_in_one_role(), "dns"))
def test_every_file_parses_to_exactly_the_members(tmp_path_factory, job):
    pods, address = job
    try:
        rendered = render_pod(pods, "demo-master-0", Options(address=address))
    except InputError:
        return  # refused in one line: fine
    tmp = tmp_path_factory.mktemp("files")
    topo = rendered.plan.topology
    training = topo.training

    # bash: the exported names are exactly the agent's written variables
    env_file = _write(tmp, "torch.env", rendered.files["torch.env"].decode())
    out = subprocess.run(["bash", "-c", f"env -i bash -c 'set -a; . {env_file}; env -0'"], capture_output=True,
                         check=True).stdout.decode()
    names = {item.split("=", 1)[0] for item in out.split("\0") if "=" in item} - {"PWD", "SHLVL", "_"}
    written = {v.name for v in rendered.variables if v.written and not v.unset}
    assert names == written

    # A host list names each address once, for the first pod that holds it (two pods can share one: hostNetwork
    # pods on one node, or pods given one hostname and subdomain); torch.env counts every pod.
    repeated = set(map(id, topo.repeated_hosts))
    hosts = [m for m in training if id(m) not in repeated]
    assert len({m.address for m in hosts}) == len(hosts) == len({m.address for m in training})

    # DeepSpeed's own parser: the training pods, in rank order, with their slots
    from deepspeed.launcher.runner import fetch_hostfile

    hostfile = _write(tmp, "hostfile", rendered.files["hostfile"].decode())
    parsed = fetch_hostfile(str(hostfile))
    assert list(parsed.items()) == [(m.address, m.slots) for m in hosts]

    # sh: discover_hosts.sh prints exactly host:slots of the running training pods
    script = _write(tmp, "discover_hosts.sh", rendered.files["discover_hosts.sh"].decode())
    printed = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=True).stdout.splitlines()
    assert printed == [f"{m.address}:{m.slots}" for m in hosts if m.running]

    # ssh -G: one Host block per member that no role pattern reaches (at most one per member), one per pattern,
    # then the defaults; every member dialled at its own address; no pod text becomes a directive
    config = _write(tmp, "ssh_config", render_ssh_config(topo, SshPaths(str(tmp)), 2222))
    text = config.read_text()
    patterns = {host_pattern(m) for m in topo.members} - {None}
    alone = [m for m in topo.members if host_pattern(m) is None]
    blocks = text.count("\nHost ") + text.startswith("Host ")
    assert len(alone) + 1 <= blocks <= len(topo.members) + len(patterns) + 1
    assert all(not line or line.startswith(("Host ", "    ", "#")) for line in text.splitlines())
    for member in topo.members:
        got = subprocess.run(["ssh", "-G", "-F", str(config), member.name], capture_output=True, text=True,
                             check=True).stdout.splitlines()
        settings_seen = dict(line.split(" ", 1) for line in got if " " in line)
        assert settings_seen["hostname"] == member.address and settings_seen["port"] == "2222"
        assert "proxycommand" not in settings_seen and settings_seen["stricthostkeychecking"] == "true"

    # ssh-keygen -F: one @cert-authority line, found for a member under its port
    known = _write(tmp, "known_hosts", render_known_hosts(topo, CA, 2222))
    lines = [line for line in known.read_text().splitlines() if line and not line.startswith("#")]
    assert len(lines) == 1 and lines[0].startswith("@cert-authority ")
    member = training[0]
    found = subprocess.run(["ssh-keygen", "-F", f"[{member.address}]:2222", "-f", str(known)],
                           capture_output=True, text=True)
    assert found.returncode == 0 and "@cert-authority" in found.stdout
