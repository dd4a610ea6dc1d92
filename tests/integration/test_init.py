"""init against the sandbox API server over real HTTPS, one real process per pod: the scenarios that need the
process (its stderr, its exit) or the socket (TLS, a server that is down). The others run in process, over the
sandbox's API in memory: tests/runtime/test_init.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import examples
from agent.sandbox.store import NotFound
from tests.integration.conftest import finish, start_init
from tests.jobs import create_volcano_job

HERE = Path(__file__).resolve().parent.parent / "e2e"


def test_init_in_one_process_per_pod_agrees_on_the_topology(sandbox, tmp_path):
    pods = create_volcano_job(sandbox)
    procs = {p["metadata"]["name"]: start_init(sandbox, p["metadata"]["name"], tmp_path / p["metadata"]["name"])
             for p in pods}
    docs = {}
    for name, proc in procs.items():
        code, err = finish(proc)
        assert code == 0, err
        docs[name] = json.loads((tmp_path / name / "topology.json").read_text())
    views = {json.dumps([(m["name"], m["nodeRank"], m["address"]) for m in d["members"]]) for d in docs.values()}
    assert len(views) == 1
    assert docs["demo-worker-2"]["env"]["NODE_RANK"] == "3"
    assert docs["demo-worker-2"]["env"]["WORLD_SIZE"] == "4"
    assert "WORLD_SIZE" not in docs["demo-extras-0"]["env"]


def test_init_waits_for_ips_given_later_with_kubectl_patch_status(sandbox, kubectl, tmp_path):
    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 2)), with_ips=False)
    proc = start_init(sandbox, "demo-worker-1", tmp_path / "out", "--address", "ip", "--timeout", "60")
    time.sleep(1.5)
    assert proc.poll() is None, "init must wait while pods have no IP"
    out = tmp_path / "out"
    assert not (out.exists() and list(out.iterdir())), "nothing is written while waiting"  # a slow start: no dir
    for pod in pods:
        name, ip = pod["metadata"]["name"], examples.loopback_ip(pods.index(pod))
        patch = json.dumps({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})
        kubectl("patch", "pod", name, "--subresource=status", "--type=merge", "-p", patch)
    code, err = finish(proc)
    assert code == 0, err
    env = json.loads((tmp_path / "out" / "topology.json").read_text())["env"]
    assert env["MASTER_ADDR"] == examples.loopback_ip(0) and env["NODE_RANK"] == "2"
    assert "waiting for the gang" in err


def test_api_down_at_start_then_up_a_few_seconds_later(sandbox, tmp_path):
    """The API is down until init has said so and scheduled its first retry (however long its start takes on a
    loaded machine), then comes back: init carries on and writes its files."""
    create_volcano_job(sandbox, (("master", 1), ("worker", 1)))
    sandbox.faults(down_for=60)
    proc = start_init(sandbox, "demo-worker-0", tmp_path / "out", "--timeout", "60")
    said = ""
    for line in proc.stderr:
        said += line
        if "unreachable" in said and "retry 1 in" in said:
            break
    sandbox.faults(up=True)
    code, err = finish(proc)
    err = said + err
    assert code == 0, err
    assert "unreachable" in err and "retry 1 in" in err
    assert (tmp_path / "out" / "torch.env").is_file()


def test_json_logs_are_one_object_per_line(sandbox, tmp_path):
    create_volcano_job(sandbox, (("master", 1),))
    proc = start_init(sandbox, "demo-master-0", tmp_path / "out", "--log-format", "json")
    code, err = finish(proc)
    assert code == 0, err
    entries = [json.loads(line) for line in err.strip().splitlines()]
    assert entries and all({"ts", "level", "msg"} <= set(e) for e in entries)


def test_the_first_init_to_run_publishes_and_rank_0_started_last_reads_its_publication(sandbox, tmp_path):
    """A large job's publisher is the first training pod's init to run (it takes the publisher Lease), not rank
    0's: rank 0's pod gets its IP last, its init starts once the gang is complete and reads the publication of the
    worker that followed the pods through the wait, instead of listing every pod itself."""
    tasks = (("master", 1), ("worker", 3))
    pods = create_volcano_job(sandbox, tasks, with_ips=False)
    names = [p["metadata"]["name"] for p in pods]
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in examples.volcano_job("demo", tasks)}
    args = ("--source", "published", "--address", "ip", "--timeout", "60")
    sandbox.set_pod_ip("default", "demo-worker-2", ips["demo-worker-2"])
    procs = {"demo-worker-2": start_init(sandbox, "demo-worker-2", tmp_path / "demo-worker-2", *args)}

    def lease_holder() -> str:
        try:
            return sandbox.sandbox.store.get("coordination.k8s.io/v1/leases", "default", "demo-topology")["spec"][
                "holderIdentity"]
        except NotFound:
            return ""

    deadline = time.monotonic() + 30
    while lease_holder() != "demo-worker-2" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lease_holder() == "demo-worker-2"
    for name in ("demo-worker-0", "demo-worker-1"):
        sandbox.set_pod_ip("default", name, ips[name])
        procs[name] = start_init(sandbox, name, tmp_path / name, *args)
    sandbox.set_pod_ip("default", "demo-master-0", ips["demo-master-0"])  # the last IP: the gang is complete
    procs["demo-master-0"] = start_init(sandbox, "demo-master-0", tmp_path / "demo-master-0", *args)
    errs = {}
    for name, proc in procs.items():
        code, errs[name] = finish(proc)
        assert code == 0, errs[name]
    assert "lease demo-topology created" in errs["demo-worker-2"] and "waiting for the gang" in errs["demo-worker-2"]
    assert "lease demo-topology is held by pod demo-worker-2" in errs["demo-master-0"]
    assert "waiting for the gang" not in errs["demo-master-0"]  # it never listed the pods
    journal = sandbox.sandbox.store.get("/v1/configmaps", "default", "demo-topology-journal")["data"]
    assert (journal["leader"], journal["standby"]) == ("demo-worker-2", "demo-master-0,demo-worker-0")
    for rank, name in enumerate(names):
        env = json.loads((tmp_path / name / "topology.json").read_text())["env"]
        assert (env["NODE_RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == (str(rank), "4", ips["demo-master-0"])


@pytest.mark.consumer
def test_torch_all_reduce_from_files_written_by_init(sandbox, tmp_path):
    pytest.importorskip("torch", reason="torch is installed by scripts/test (pip install torch==2.13.0)")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 2)), with_ips=False)
    names = [p["metadata"]["name"] for p in pods]
    procs = [start_init(sandbox, n, tmp_path / n, "--address", "ip", "--master-port", str(port),
                        "--nproc-per-node", "1") for n in names]
    for k, name in enumerate(names):  # every "pod" is a process here, each at its own loopback address
        sandbox.set_pod_ip("default", name, f"127.0.0.{k + 1}")
    for proc in procs:
        code, err = finish(proc)
        assert code == 0, err
    env = {"PATH": os.environ["PATH"], "GLOO_SOCKET_IFNAME": "lo", "HOME": str(tmp_path)}
    workers = [subprocess.Popen(["bash", "-c", f'. {tmp_path / n}/torch.env && exec "{sys.executable}" '
                                               f'{HERE / "worker_allreduce.py"}'],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in names]
    results = []
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        results.append(out.strip())
    assert sorted(results) == [f"rank={r} node_rank={r} world=3 sum=6" for r in range(3)]


def test_init_writes_ssh_material_and_never_logs_a_private_key(sandbox, tmp_path):
    import base64

    import yaml

    from agent.ssh.material import generate_secret_manifest

    create_volcano_job(sandbox, (("master", 1), ("worker", 1)))
    secret = tmp_path / "secret"
    secret.mkdir()
    manifest = yaml.safe_load(generate_secret_manifest("demo", "default"))
    for key, value in manifest["data"].items():
        (secret / key).write_bytes(base64.b64decode(value))
        (secret / key).chmod(0o644)  # readable by others: the agent must warn
    proc = start_init(sandbox, "demo-worker-0", tmp_path / "out", "--ssh-secret-dir", str(secret))
    code, err = finish(proc)
    assert code == 0, err
    ssh_dir = tmp_path / "out" / "ssh"
    assert {p.name for p in ssh_dir.iterdir()} >= {"id_ed25519", "ssh_host_ed25519_key-cert.pub", "known_hosts",
                                                   "ssh_config", "sshd_config", "authorized_keys"}
    assert "readable by group or others" in err
    assert "PRIVATE KEY" not in err
    for key in ("id_ed25519", "host_ca"):
        body = (secret / key).read_text().splitlines()[1]
        assert body not in err
    host_key = (ssh_dir / "ssh_host_ed25519_key").read_text().splitlines()[1]
    assert host_key not in err


def _other_ca(directory: Path) -> None:
    """A service account mount whose ca.crt is some other CA's: the sandbox's certificate does not chain to it."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "some other CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (directory / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


@pytest.mark.parametrize("command", ["init", "sidecar"])
def test_a_certificate_that_fails_verification_is_named_at_once_not_retried(sandbox, tmp_path, command):
    """Python 3.13 verifies strictly; a wrong CA used to be retried until --timeout as 'unreachable: SSLError'."""
    create_volcano_job(sandbox, (("master", 1), ("worker", 1)))
    account = tmp_path / "account"
    account.mkdir()
    for name in ("token", "namespace"):
        (account / name).write_text((sandbox.sandbox.serviceaccount_dir / name).read_text())
    _other_ca(account)
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": "demo-worker-0", "POD_NAMESPACE": "default",
           "TOPOLOGY_SERVICEACCOUNT_DIR": str(account)}
    env.pop("KUBECONFIG", None)
    started = time.monotonic()
    extra = ["--health-port", "0"] if command == "sidecar" else ["--timeout", "60"]
    result = subprocess.run([sys.executable, "-m", "agent.cli", command, "--out", str(tmp_path / "out"), *extra],
                            env=env, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 15
    assert result.returncode == 3, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "its TLS certificate failed verification (unable to get local issuer certificate)" in last, last
    assert "ca.crt" in last
