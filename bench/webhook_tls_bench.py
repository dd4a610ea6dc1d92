"""Benchmark: how long the admission webhook takes to repair each breakage of its TLS material.

Each scenario applies ``manifests/webhook`` to a fresh sandbox with real kubectl, breaks one thing as the
integration tests do (tests/integration/test_webhook.py), and times from the breakage to the moment the API
server could call every replica again: the certificate each serves is the Secret's and verifies, for the
Service's name, against the configuration's caBundle (read from the sandbox's store every 10 ms, with a real
TLS handshake). Breakages found at start are timed from the process's start (its interpreter's start-up
included: ``start`` with a sound Secret gives that part alone); the ``--tls-dir`` pair is timed to its exit with
one line.

Scenarios: ``start`` (a sound Secret: the start-up alone); ``key`` (tls.key is not tls.crt's key, at start);
``other-ca`` (a serving pair of another CA, at start); ``ca-key`` (a ca.key that is not the CA's, found at the
renewal due at start); ``broken`` (another CA's pair written into the Secret while serving); ``deleted`` (the
Secret deleted under two replicas: both must serve the new CA's certificate); ``recreated`` (the configuration
deleted and applied again from the manifest, without its caBundle); ``tls-dir`` (cert-manager's files with a key
that is not the certificate's: exit 2).

    python bench/webhook_tls_bench.py --runs 3
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agent.runtime.webhook import certs
from agent.sandbox.store import NotFound
from agent.sandbox.threaded import SandboxThread

ROOT = Path(__file__).resolve().parents[1]
SERVICE = "topology-agent-system/topology-agent-webhook"
NAMESPACE, SECRET, CONFIG = "topology-agent-system", "topology-agent-webhook-tls", "topology-agent"
SVC_NAME = "topology-agent-webhook.topology-agent-system.svc"
CONFIGS = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
HOSTS = certs.service_hosts("topology-agent-webhook", NAMESPACE)
LIMIT = 30.0  # seconds a scenario may take before it counts as not repaired


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """A sandbox with manifests/webhook applied by kubectl, and the webhook processes started on it."""

    def __init__(self, sandbox: SandboxThread, port: int, tmp: Path, cpu: str) -> None:
        self.sb, self.port, self.tmp, self.cpu = sandbox, port, tmp, cpu
        self.procs: list[subprocess.Popen[str]] = []

    def kubectl(self, *args: str, stdin: str | None = None) -> None:
        run = subprocess.run(["kubectl", "--kubeconfig", str(self.sb.sandbox.kubeconfig), *args], input=stdin,
                             capture_output=True, text=True, timeout=60)
        if run.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)}: {run.stderr.strip()}")

    def apply_manifests(self) -> None:
        self.kubectl("apply", "-k", str(ROOT / "manifests" / "webhook"))

    def webhook(self, port: int, *extra: str) -> subprocess.Popen[str]:
        env = {**os.environ, "KUBECONFIG": str(self.sb.sandbox.kubeconfig), "POD_NAMESPACE": NAMESPACE}
        pin = ["taskset", "-c", self.cpu] if shutil.which("taskset") else []
        proc = subprocess.Popen([*pin, sys.executable, "-m", "agent.cli", "webhook", "--host", "127.0.0.1",
                                 "--port", str(port), *extra], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                proc.communicate(timeout=20)

    def secret(self) -> certs.Bundle | None:
        try:
            stored = self.sb.sandbox.store.get("/v1/secrets", NAMESPACE, SECRET)
        except NotFound:
            return None
        return certs.from_secret(stored)

    def write_secret(self, bundle: certs.Bundle) -> None:
        self.kubectl("apply", "-f", "-", stdin=json.dumps(certs.to_secret(bundle, SECRET, NAMESPACE)))

    def ca_bundle(self) -> bytes:
        try:
            hooks = self.sb.sandbox.store.get(CONFIGS, "", CONFIG)["webhooks"]
        except NotFound:
            return b""
        bundles = {h["clientConfig"].get("caBundle", "") for h in hooks}
        return base64.b64decode(bundles.pop()) if len(bundles) == 1 else b""

    def sound(self, *ports: int) -> bool:
        """Every replica serves the Secret's certificate, and it verifies against the caBundle."""
        bundle, trust = self.secret(), self.ca_bundle()
        return bundle is not None and all(served(port, trust) == der(bundle.cert) for port in ports)

    def until(self, condition: Callable[[], bool], started: float) -> float:
        while not condition():
            for proc in self.procs:
                if proc.poll() is not None:
                    raise SystemExit(f"a webhook ended: {proc.communicate()[1][-1000:]}")
            if time.monotonic() - started > LIMIT:
                return float("inf")
            time.sleep(0.01)
        return time.monotonic() - started


def served(port: int, trust: bytes) -> bytes | None:
    if not trust.strip():
        return None
    context = ssl.create_default_context(cadata=trust.decode())
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as raw, \
                context.wrap_socket(raw, server_hostname=SVC_NAME) as tls:
            return tls.getpeercert(binary_form=True)
    except OSError:
        return None


def der(pem: bytes) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    return x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)


def two_bundles(days_ago: float = 0) -> tuple[certs.Bundle, certs.Bundle]:
    at = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=days_ago)
    return certs.renew(None, HOSTS, at)[0], certs.renew(None, HOSTS, at)[0]


def at_start(cluster: Cluster, bundle: certs.Bundle | None) -> float:
    """Seconds from the webhook's start, with ``bundle`` in the Secret, until it serves soundly."""
    if bundle is not None:
        cluster.write_secret(bundle)
    started = time.monotonic()
    cluster.webhook(cluster.port)
    return cluster.until(lambda: cluster.sound(cluster.port), started)


def serving(cluster: Cluster, *ports: int) -> None:
    for port in ports:
        cluster.webhook(port)
    if cluster.until(lambda: cluster.sound(*ports), time.monotonic()) == float("inf"):
        raise SystemExit("the webhook did not start serving")
    time.sleep(0.5)  # its watches are open


def start(cluster: Cluster) -> float:
    return at_start(cluster, None)


def key(cluster: Cluster) -> float:
    good, other = two_bundles()
    return at_start(cluster, certs.Bundle(good.cert, other.key, good.ca_cert, good.ca_key, good.trust))


def other_ca(cluster: Cluster) -> float:
    good, other = two_bundles()
    return at_start(cluster, certs.Bundle(other.cert, other.key, good.ca_cert, good.ca_key, good.trust))


def ca_key(cluster: Cluster) -> float:
    due, other = two_bundles(days_ago=75)  # 15 days left: renewed at start, with a ca.key that is another CA's
    return at_start(cluster, certs.Bundle(due.cert, due.key, due.ca_cert, other.ca_key, due.trust))


def broken(cluster: Cluster) -> float:
    serving(cluster, cluster.port)
    now = cluster.secret()
    assert now is not None
    _, other = two_bundles()
    started = time.monotonic()
    cluster.write_secret(certs.Bundle(other.cert, other.key, now.ca_cert, now.ca_key, now.trust))
    return cluster.until(lambda: cluster.sound(cluster.port) and (cluster.secret() or other).cert != other.cert,
                         started)


def deleted(cluster: Cluster) -> float:
    second = free_port()
    serving(cluster, cluster.port, second)
    old = cluster.secret()
    assert old is not None
    started = time.monotonic()
    cluster.kubectl("delete", "secret", SECRET, "-n", NAMESPACE)
    return cluster.until(lambda: (cluster.secret() or old).ca_cert != old.ca_cert
                         and cluster.sound(cluster.port, second), started)


def recreated(cluster: Cluster) -> float:
    serving(cluster, cluster.port)
    trust = cluster.ca_bundle()
    started = time.monotonic()
    cluster.kubectl("delete", "mutatingwebhookconfiguration", CONFIG)
    cluster.apply_manifests()
    return cluster.until(lambda: cluster.ca_bundle() == trust and cluster.sound(cluster.port), started)


def tls_dir(cluster: Cluster) -> float:
    good, other = two_bundles()
    directory = cluster.tmp / "tls"
    directory.mkdir()
    (directory / "tls.crt").write_bytes(good.cert)
    (directory / "tls.key").write_bytes(other.key)
    started = time.monotonic()
    proc = cluster.webhook(cluster.port, "--tls-dir", str(directory))
    cluster.procs.remove(proc)
    _, err = proc.communicate(timeout=LIMIT)
    seconds = time.monotonic() - started
    errors = [line for line in err.splitlines() if "error" in line]
    if proc.returncode != 2 or len(errors) != 1 or "tls.key is not the private key of tls.crt" not in errors[0]:
        raise SystemExit(f"--tls-dir with a mismatched pair: exit {proc.returncode}, {err[-500:]}")
    return seconds


SCENARIOS: dict[str, Callable[[Cluster], float]] = {
    "start": start, "key": key, "other-ca": other_ca, "ca-key": ca_key, "broken": broken, "deleted": deleted,
    "recreated": recreated, "tls-dir": tls_dir}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--webhook-cpu", default="1", help="the CPU the webhooks are pinned to (taskset -c)")
    parser.add_argument("--only", nargs="*", default=None, choices=sorted(SCENARIOS))
    args = parser.parse_args()
    if shutil.which("kubectl") is None:
        raise SystemExit("kubectl is not on PATH")
    os.sched_setaffinity(0, {c for c in os.sched_getaffinity(0) if str(c) != args.webhook_cpu} or {0})
    times: dict[str, list[float]] = {s: [] for s in SCENARIOS if not args.only or s in args.only}
    for run in range(args.runs):
        for name in times:
            port = free_port()
            with tempfile.TemporaryDirectory() as tmp, SandboxThread(
                    Path(tmp) / "sb", bookmark_interval=0.5, services={SERVICE: f"127.0.0.1:{port}"}) as sb:
                cluster = Cluster(sb, port, Path(tmp), args.webhook_cpu)
                try:
                    cluster.apply_manifests()
                    seconds = SCENARIOS[name](cluster)
                finally:
                    cluster.stop()
            times[name].append(seconds)
            print(f"run {run + 1} {name}: {seconds:.2f} s", flush=True)
    print("\n| breakage | seconds to repaired (median, min-max) | within 10 s |")
    print("|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f}) | "
              f"{'yes' if max(values) <= 10 else 'no'} |")


if __name__ == "__main__":
    main()
