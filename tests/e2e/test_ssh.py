"""Passwordless SSH with verified host keys, driven with real OpenSSH sshd/ssh, pdsh and DeepSpeed's launcher.

Each "pod" is an sshd on its own loopback address (127.1.0.x) with the host key, certificate and sshd_config
snippet the agent wrote for that pod. The client side uses the agent's ssh_config (through an ``ssh`` wrapper on
PATH that adds ``-F``, as a trainer image would by linking ~/.ssh/config: ssh reads the passwd home, not $HOME).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import examples
from agent.cli import main
from tests.jobs import ssh_secret

# One at a time, on one worker (xdist): the consumers' processes and ports.
pytestmark = [pytest.mark.consumer, pytest.mark.xdist_group("e2e")]
SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
SSH = shutil.which("ssh")
if SSHD is None or SSH is None:
    pytest.skip("OpenSSH sshd/ssh are not installed (apt-get install openssh-server openssh-client; .ci/run does)",
                allow_module_level=True)

NAMES = ["demo-master-0", "demo-worker-0", "demo-worker-1"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def held_port() -> tuple[int, dict[str, socket.socket]]:
    """A port held on each pod address (127.1.0.1-8) until its sshd starts (``start_sshd(..., held=)``): between
    the pick and sshd's bind other tests' servers bind ports too, and one on 0.0.0.0 would take the port from the
    sshd and answer in its place."""
    while True:
        port, holders = free_port(), {}
        try:
            for last in range(1, 9):
                holder = socket.socket()
                holders[f"127.1.0.{last}"] = holder
                holder.bind((f"127.1.0.{last}", port))
        except OSError:
            for holder in holders.values():
                holder.close()
            continue
        return port, holders


def start_sshd(config: Path, address: str, log: Path, held: dict[str, socket.socket] | None = None) -> subprocess.Popen:
    if held is not None and address in held:
        held.pop(address).close()  # the port is this sshd's now
    with log.open("w") as handle:
        return subprocess.Popen([SSHD, "-D", "-e", "-f", str(config), "-o", f"ListenAddress={address}"],
                                stderr=handle)


def wait_listening(address: str, port: int, proc: subprocess.Popen, log: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"sshd exited: {log.read_text()}")
        # This sshd's own word that it listens there: a connect alone may reach another process's listener on the
        # port (or the socket itself, by TCP's simultaneous open), and this sshd then fails to bind
        if f"Server listening on {address} port {port}." in log.read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise AssertionError(f"sshd on {address}:{port} did not listen")


@pytest.fixture
def job(home_tmp):
    """Three pods, each rendered with the job's Secret, each with its own running sshd."""
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    port = free_port()
    pods = examples.volcano_job("demo", (("master", 1), ("worker", 2)))
    pods_file = home_tmp / "pods.json"
    pods_file.write_text(json.dumps(pods))
    secret = ssh_secret(home_tmp / "secret")
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}
    procs = []
    for name in NAMES:
        assert main(["render", "--pods", str(pods_file), "--self", name, "--out", str(home_tmp / name),
                     "--address", "ip", "--ssh-secret-dir", str(secret), "--ssh-port", str(port),
                     "--nproc-per-node", "1"]) == 0
        log = home_tmp / f"sshd-{name}.log"
        proc = start_sshd(home_tmp / name / "ssh" / "sshd_config", ips[name], log)
        procs.append(proc)
        wait_listening(ips[name], port, proc, log)
    bindir = home_tmp / "bin"
    bindir.mkdir()
    wrapper = bindir / "ssh"
    wrapper.write_text(f'#!/bin/sh\nexec {SSH} -F {home_tmp / NAMES[0] / "ssh" / "ssh_config"} "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    yield {"dir": home_tmp, "port": port, "ips": ips, "secret": secret, "env": env, "procs": procs}
    for proc in procs:
        proc.terminate()
        proc.wait(10)


def ssh(job, *args, config_pod=NAMES[0]):
    config = job["dir"] / config_pod / "ssh" / "ssh_config"
    return subprocess.run([SSH, "-F", str(config), "-o", "BatchMode=yes", *args], capture_output=True, text=True,
                          timeout=30)


def test_written_files_have_safe_modes_and_strict_checking(job):
    ssh_dir = job["dir"] / NAMES[1] / "ssh"
    assert ssh_dir.stat().st_mode & 0o777 == 0o700
    assert (ssh_dir / "id_ed25519").stat().st_mode & 0o777 == 0o600
    assert (ssh_dir / "ssh_host_ed25519_key").stat().st_mode & 0o777 == 0o600
    config = (ssh_dir / "ssh_config").read_text()
    assert "StrictHostKeyChecking yes" in config and "StrictHostKeyChecking no" not in config
    known = (ssh_dir / "known_hosts").read_text()
    assert f"@cert-authority [*.demo]:{job['port']}," in known and f"[*.*.*.*]:{job['port']} " in known
    assert not any(ip in known for ip in job["ips"].values())  # the certificates say which host is which


@pytest.mark.parametrize("peer", NAMES)
def test_ssh_reaches_every_peer_with_strict_host_key_checking(job, peer):
    result = ssh(job, peer, "echo $TOPOLOGY_SSH_POD")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == peer


def test_ssh_by_address_as_the_hostfile_names_it(job):
    for name, ip in job["ips"].items():
        result = ssh(job, ip, "echo $TOPOLOGY_SSH_POD", config_pod=NAMES[2])
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == name


def test_a_server_whose_host_key_the_job_ca_did_not_sign_is_refused(job, home_tmp):
    # An impostor takes demo-worker-1's address and port with a certificate from another CA for the same names.
    victim = NAMES[2]
    job["procs"][2].terminate()
    job["procs"][2].wait(10)
    other_secret = ssh_secret(home_tmp / "other-secret", job="impostor")
    pods_file = home_tmp / "pods.json"
    assert main(["render", "--pods", str(pods_file), "--self", victim, "--out", str(home_tmp / "impostor"),
                 "--address", "ip", "--ssh-secret-dir", str(other_secret), "--ssh-port", str(job["port"])]) == 0
    # It even accepts the job's user key, so only the host check stands in the way.
    (home_tmp / "impostor" / "ssh" / "authorized_keys").write_text(
        (job["secret"] / "id_ed25519.pub").read_text() + "\n")
    log = home_tmp / "sshd-impostor.log"
    impostor = start_sshd(home_tmp / "impostor" / "ssh" / "sshd_config", job["ips"][victim], log)
    try:
        wait_listening(job["ips"][victim], job["port"], impostor, log)
        result = ssh(job, victim, "echo reached")
        assert result.returncode == 255
        assert "reached" not in result.stdout
        assert "Host key verification failed" in result.stderr or "certificate" in result.stderr.lower()
        # The same server is accepted when the client skips verification: the refusal came from the CA check.
        lax = ssh(job, "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", victim, "echo reached")
        assert lax.returncode == 0 and lax.stdout.strip() == "reached", lax.stderr
    finally:
        impostor.terminate()
        impostor.wait(10)


def test_deepspeeds_own_ssh_check_succeeds(job):
    # DeepSpeed's runner runs exactly this for the first hostfile entry (ssh finds the config like ~/.ssh/config).
    first = (job["dir"] / NAMES[1] / "hostfile").read_text().split()[0]
    result = subprocess.run(["ssh", "-o", "PasswordAuthentication=no", first, "hostname"], env=job["env"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == socket.gethostname()


def test_pdsh_runs_a_command_on_every_peer(job):
    if shutil.which("pdsh") is None:
        pytest.skip("pdsh is not installed (apt-get install pdsh; .ci/run does)")
    hosts = ",".join(job["ips"].values())
    result = subprocess.run(["pdsh", "-R", "ssh", "-w", hosts, "echo $TOPOLOGY_SSH_POD"], env=job["env"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    got = sorted(line.split(": ", 1)[1] for line in result.stdout.strip().splitlines())
    assert got == sorted(NAMES)


def deepspeed_script(job) -> tuple[Path, Path]:
    """A script DeepSpeed's pdsh launcher starts on every peer: each rank leaves a mark naming its pod (or skips
    the test, saying why, without DeepSpeed or pdsh)."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is installed by scripts/test")
    if shutil.which("pdsh") is None:
        pytest.skip("pdsh is not installed (apt-get install pdsh; .ci/run does)")
    marks = job["dir"] / "marks"
    marks.mkdir()
    script = job["dir"] / "trivial.py"
    script.write_text(f"import os, pathlib\npathlib.Path('{marks}', os.environ['RANK'])"
                      ".write_text(os.environ.get('TOPOLOGY_SSH_POD', '?'))\n")
    return marks, script


def test_deepspeed_pdsh_launcher_starts_the_script_on_every_peer(job):
    marks, script = deepspeed_script(job)
    hostfile = job["dir"] / NAMES[0] / "hostfile"
    result = subprocess.run(
        [sys.executable, "-m", "deepspeed.launcher.runner", "--launcher", "pdsh", "--hostfile", str(hostfile),
         "--master_addr", job["ips"][NAMES[0]], "--master_port", str(free_port()), str(script)],
        env={**job["env"], "PDSH_RCMD_TYPE": "ssh"}, capture_output=True, text=True, timeout=240, cwd=job["dir"])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert sorted(p.name for p in marks.iterdir()) == ["0", "1", "2"]


def test_ssh_owner_gives_the_trainers_user_the_files(home_tmp):
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root (CI runs as root)")
    pods_file = home_tmp / "pods.json"
    pods_file.write_text(json.dumps(examples.volcano_job("demo", (("master", 1),))))
    secret = ssh_secret(home_tmp / "secret")
    out = home_tmp / "shared"
    out.mkdir(mode=0o777)
    out.chmod(0o777)  # as an emptyDir is created
    assert main(["render", "--pods", str(pods_file), "--self", "demo-master-0", "--out", str(out),
                 "--ssh-secret-dir", str(secret), "--ssh-owner", "1234:2345"]) == 0
    for path in [out / "ssh", *(out / "ssh").iterdir()]:
        assert (path.stat().st_uid, path.stat().st_gid) == (1234, 2345), path
    assert out.stat().st_mode & 0o777 == 0o755  # sshd's StrictModes: no group/other write above the keys


def test_the_sidecar_keeps_known_hosts_current_when_a_member_joins_by_ip(home_tmp):
    """With --address ip the sidecar rewrites ssh/ when a member joins: its IP must be in known_hosts, or strict
    host key checking refuses it."""
    from agent.sandbox.threaded import SandboxThread
    from tests.integration.conftest import finish, start_init
    from tests.integration.test_sidecar import start_sidecar, wait_for
    from tests.jobs import add_worker, create_volcano_job, generation

    Path("/run/sshd").mkdir(exist_ok=True)
    port = free_port()
    secret = ssh_secret(home_tmp / "secret")
    ssh_args = ("--address", "ip", "--ssh-secret-dir", str(secret), "--ssh-port", str(port), "--nproc-per-node", "1")
    procs = []
    with SandboxThread(home_tmp / "sandbox", bookmark_interval=0.5) as sandbox:
        pods = create_volcano_job(sandbox, (("master", 1), ("worker", 1)))

        def start_pod(name: str, ip: str) -> None:
            code, err = finish(start_init(sandbox, name, home_tmp / name, *ssh_args))
            assert code == 0, err
            log = home_tmp / f"sshd-{name}.log"
            procs.append(start_sshd(home_tmp / name / "ssh" / "sshd_config", ip, log))
            wait_listening(ip, port, procs[-1], log)

        try:
            for pod in pods:
                start_pod(pod["metadata"]["name"], pod["status"]["podIP"])
            sidecar, sidecar_log = start_sidecar(sandbox, home_tmp, "demo-master-0", *ssh_args[2:])
            procs.append(sidecar)
            wait_for(lambda: "following" in (home_tmp / "demo-master-0.log").read_text(), what="sidecar started")
            add_worker(sandbox, 1, 40)
            new_ip = examples.loopback_ip(40)
            start_pod("demo-worker-1", new_ip)
            wait_for(lambda: generation(home_tmp / "demo-master-0") == 2, what="the sidecar's generation 2")
            config = home_tmp / "demo-master-0" / "ssh" / "ssh_config"
            result = subprocess.run([SSH, "-F", str(config), "-o", "BatchMode=yes", new_ip, "true"],
                                    capture_output=True, text=True, timeout=30)
            assert result.returncode == 0, result.stderr
            sidecar_log.close()
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)


OWN_NAMES = ["demo-master-0", "demo-worker-0", "demo-worker-1", "demo-worker-2"]


@pytest.fixture(params=["auto", "own"])
def published_job(request, home_tmp):
    """Four pods of a job that publishes its topology, each init a real process with the job's Secret, each pod
    with its own sshd: by default (auto) rank 0 launches over SSH and holds every member, the workers hold their
    own view; with --view own every pod does."""
    from agent.sandbox.threaded import SandboxThread
    from tests.integration.conftest import finish, start_init
    from tests.jobs import create_volcano_job

    Path("/run/sshd").mkdir(exist_ok=True)
    port, held = held_port()
    secret = ssh_secret(home_tmp / "secret")
    args = ("--address", "ip", "--source", "published", "--ssh-secret-dir", str(secret), "--ssh-port", str(port),
            "--nproc-per-node", "1", "--view", request.param)
    procs = []
    with SandboxThread(home_tmp / "sandbox", bookmark_interval=0.5) as sandbox:
        pods = create_volcano_job(sandbox, (("master", 1), ("worker", 3)))
        ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}
        started = {name: start_init(sandbox, name, home_tmp / name, *args) for name in OWN_NAMES}
        for proc in started.values():
            code, err = finish(proc)
            assert code == 0, err
        try:
            for name in OWN_NAMES:
                log = home_tmp / f"sshd-{name}.log"
                procs.append(start_sshd(home_tmp / name / "ssh" / "sshd_config", ips[name], log, held))
                wait_listening(ips[name], port, procs[-1], log)
            for name, proc in zip(OWN_NAMES, procs, strict=True):  # each still serving, its port its own
                assert proc.poll() is None, (name, (home_tmp / f"sshd-{name}.log").read_text())
            yield {"dir": home_tmp, "port": port, "ips": ips, "secret": secret, "view": request.param,
                   "sshd": dict(zip(OWN_NAMES, procs, strict=True))}
        finally:
            for holder in held.values():  # the addresses no pod took
                holder.close()
            for proc in procs:
                proc.terminate()
                proc.wait(10)


def views(job) -> dict[str, str]:
    return {name: json.loads((job["dir"] / name / "topology.json").read_text()).get("view", "full")
            for name in OWN_NAMES}


def test_in_its_own_view_a_pod_reaches_every_peer_over_ssh_and_its_known_hosts_names_no_member(published_job):
    """SSH works in either view. A worker that knows only rank 0 and itself writes one @cert-authority
    line that names no member, and reaches every peer, by the address the launcher's hostfile gives, with strict
    host key checking; by default rank 0 (the SSH launcher) holds every member and writes the hostfile."""
    job = published_job
    expected = {"demo-master-0": "full" if job["view"] == "auto" else "own"} | {n: "own" for n in OWN_NAMES[1:]}
    assert views(job) == expected
    assert (job["dir"] / "demo-master-0" / "hostfile").exists() == (job["view"] == "auto")
    for me in OWN_NAMES[1:]:
        known = (job["dir"] / me / "ssh" / "known_hosts").read_text()
        assert not any(ip in known for ip in job["ips"].values()) and known.count("@cert-authority") == 1
        for peer, ip in job["ips"].items():
            result = ssh(job, ip, "echo $TOPOLOGY_SSH_POD", config_pod=me)
            assert result.returncode == 0, (me, peer, result.stderr)
            assert result.stdout.strip() == peer


def test_in_its_own_view_a_server_the_job_ca_did_not_sign_is_still_refused(published_job, home_tmp):
    """The line trusts any address of the job's family only for a certificate of the job's CA naming that address:
    an impostor on a peer's address with another CA's certificate for the same names is refused."""
    job = published_job
    victim, me = "demo-worker-2", "demo-worker-1"
    other_pods = home_tmp / "pods.json"
    other_pods.write_text(json.dumps(examples.volcano_job("demo", (("master", 1), ("worker", 3)))))
    other_secret = ssh_secret(home_tmp / "other-secret", job="impostor")
    assert main(["render", "--pods", str(other_pods), "--self", victim, "--out", str(home_tmp / "impostor"),
                 "--address", "ip", "--ssh-secret-dir", str(other_secret), "--ssh-port", str(job["port"])]) == 0
    (home_tmp / "impostor" / "ssh" / "authorized_keys").write_text((job["secret"] / "id_ed25519.pub").read_text())
    ip = job["ips"][victim]
    victim_sshd = job["sshd"][victim]  # this fixture's own sshd on that address, by its process (not a pattern)
    victim_sshd.terminate()
    victim_sshd.wait(10)
    log = home_tmp / "sshd-impostor.log"
    impostor = start_sshd(home_tmp / "impostor" / "ssh" / "sshd_config", ip, log)
    try:
        wait_listening(ip, job["port"], impostor, log)
        result = ssh(job, ip, "echo reached", config_pod=me)
        assert result.returncode == 255 and "reached" not in result.stdout
        lax = ssh(job, "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", ip, "echo reached",
                  config_pod=me)
        assert lax.returncode == 0 and lax.stdout.strip() == "reached", lax.stderr
    finally:
        impostor.terminate()
        impostor.wait(10)


@pytest.mark.parametrize("published_job", ["auto"], indirect=True)  # --view own: rank 0 writes no hostfile
def test_by_default_the_launcher_runs_deepspeed_on_every_peer_whose_own_view_serves_its_sshd(published_job):
    """The pdsh launcher (rank 0, every member) reaches the workers, which hold their own view."""
    job = published_job
    assert job["view"] == "auto"
    marks, script = deepspeed_script(job)
    bindir = job["dir"] / "bin"
    bindir.mkdir()
    (bindir / "ssh").write_text(f'#!/bin/sh\nexec {SSH} -F {job["dir"] / OWN_NAMES[0] / "ssh" / "ssh_config"} "$@"\n')
    (bindir / "ssh").chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "PDSH_RCMD_TYPE": "ssh"}
    result = subprocess.run(
        [sys.executable, "-m", "deepspeed.launcher.runner", "--launcher", "pdsh", "--hostfile",
         str(job["dir"] / OWN_NAMES[0] / "hostfile"), "--master_addr", job["ips"][OWN_NAMES[0]], "--master_port",
         str(free_port()), str(script)], env=env, capture_output=True, text=True, timeout=240, cwd=job["dir"])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert sorted(p.name for p in marks.iterdir()) == ["0", "1", "2", "3"]
