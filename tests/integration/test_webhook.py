"""The webhook as a cluster runs it: `kubectl apply -k manifests/webhook`, `topology-agent webhook` as a real
process, the sandbox calling it on every CREATE over TLS it trusts through the caBundle the webhook wrote, real
kubectl creating what a controller creates, and init writing the files from the injected pods."""

from __future__ import annotations

import base64
import copy
import datetime
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agent import examples
from agent.core.adoption.injection import INIT, INJECT_LABEL, INJECTED, PREFIX, SIDECAR
from agent.runtime.demo import volcano_owner
from agent.runtime.webhook import certs
from agent.sandbox.threaded import SandboxThread
from tests.integration.conftest import finish, start_init

ROOT = Path(__file__).resolve().parents[2]
SERVICE = "topology-agent-system/topology-agent-webhook"
CONFIG = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/topology-agent"
SECRET = "/api/v1/namespaces/topology-agent-system/secrets/topology-agent-webhook-tls"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def cluster(tmp_path):
    """A sandbox whose Service topology-agent-system/topology-agent-webhook answers on a loopback port."""
    port = free_port()
    with SandboxThread(tmp_path / "sandbox", bookmark_interval=0.5, services={SERVICE: f"127.0.0.1:{port}"}) as sb:
        sb.webhook_port = port  # type: ignore[attr-defined]
        yield sb


def kubectl(sandbox: SandboxThread, *args: str, input: str | None = None, check: bool = True):
    binary = __import__("shutil").which("kubectl")
    if binary is None:
        pytest.skip("kubectl is not on PATH (.ci/run provides it)")
    run = subprocess.run([binary, "--kubeconfig", str(sandbox.sandbox.kubeconfig), *args], capture_output=True,
                         text=True, input=input, timeout=60)
    if check:
        assert run.returncode == 0, run.stderr
    return run


def start_webhook(sandbox: SandboxThread, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "KUBECONFIG": str(sandbox.sandbox.kubeconfig), "POD_NAMESPACE": "topology-agent-system"}
    return subprocess.Popen([sys.executable, "-m", "agent.cli", "webhook", "--host", "127.0.0.1", "--port",
                             str(sandbox.webhook_port), *extra], env=env,  # type: ignore[attr-defined]
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def get(sandbox: SandboxThread, path: str) -> dict:
    return json.loads(kubectl(sandbox, "get", "--raw", path).stdout)


def wait_serving(sandbox: SandboxThread, proc: subprocess.Popen[str], timeout: float = 30) -> None:
    """Until the configuration trusts the webhook's CA and the port answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        hooks = get(sandbox, CONFIG)["webhooks"]
        if all(h["clientConfig"].get("caBundle") for h in hooks):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", sandbox.webhook_port)) == 0:  # type: ignore[attr-defined]
                    return
        time.sleep(0.1)
    raise AssertionError("the webhook did not start serving")


def stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    return err


def users_pods(namespace: str) -> list[dict]:
    """A Volcano job's pods as its controller creates them from the user's template: no agent, no status."""
    pods = examples.volcano_job("demo", (("master", 1), ("worker", 2)), namespace=namespace)
    created = []
    for pod in pods:
        pod = copy.deepcopy(pod)
        pod.pop("status", None)
        for key in ("resourceVersion", "uid", "creationTimestamp"):
            pod["metadata"].pop(key, None)
        pod["spec"].pop("initContainers", None)
        pod["spec"].pop("volumes", None)  # the example's own shared volume: the webhook adds the agent's
        for container in pod["spec"]["containers"]:
            container.pop("volumeMounts", None)
        created.append(pod)
    return created


def test_a_labelled_namespace_gets_the_agent_in_every_pod_and_init_writes_the_files(cluster, tmp_path):
    kubectl(cluster, "apply", "-k", str(ROOT / "manifests" / "webhook"))
    webhook = start_webhook(cluster)
    try:
        wait_serving(cluster, webhook)
        # the one line: the namespace opts in
        kubectl(cluster, "create", "namespace", "team-a")
        kubectl(cluster, "label", "namespace", "team-a", f"{INJECT_LABEL}=enabled")
        kubectl(cluster, "annotate", "namespace", "team-a", f"{PREFIX}timeout=60")  # a namespace-wide setting
        owner = volcano_owner()
        owner["metadata"]["namespace"] = "team-a"
        owner["spec"]["tasks"] = [{"name": "master", "replicas": 1, "template": {}},
                                  {"name": "worker", "replicas": 2, "template": {}}]
        uid = cluster.create("batch.volcano.sh/v1alpha1/jobs", "team-a", owner)["metadata"]["uid"]
        pods = users_pods("team-a")
        for pod in pods:
            pod["metadata"]["ownerReferences"][0]["uid"] = uid
        kubectl(cluster, "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))
        stored = json.loads(kubectl(cluster, "get", "pods", "-n", "team-a", "-o", "json").stdout)["items"]
        assert len(stored) == 3
        for pod in stored:
            assert pod["metadata"]["annotations"][INJECTED]
            init = pod["spec"]["initContainers"][0]
            assert init["name"] == INIT and init["args"][init["args"].index("--timeout") + 1] == "60"
            assert {"name": "topology-agent-shared", "mountPath": "/shared"} in pod["spec"]["containers"][0][
                "volumeMounts"]
            assert pod["spec"]["serviceAccountName"] == "topology-agent"
        # the pods run: init, as injected, writes each pod's files
        ips = {p["metadata"]["name"]: p["status"]["podIP"]
               for p in examples.volcano_job("demo", (("master", 1), ("worker", 2)), namespace="team-a")}
        for name, ip in ips.items():
            cluster.set_pod_ip("team-a", name, ip)
        procs = {}
        for pod in stored:
            args = pod["spec"]["initContainers"][0]["args"]
            args = [a for i, a in enumerate(args[1:], 1) if a != "--out" and args[i - 1] != "--out"]
            name = pod["metadata"]["name"]
            procs[name] = start_init(cluster, name, tmp_path / name, *args, namespace="team-a")
        for name, proc in procs.items():
            code, err = finish(proc)
            assert code == 0, err
            env = (tmp_path / name / "torch.env").read_text()
            assert "export WORLD_SIZE='3'" in env and "export MASTER_ADDR='demo-master-0.demo'" in env
        # a pod that opts out, and a namespace that did not opt in, are left alone
        plain = users_pods("team-a")[0]
        plain["metadata"]["name"] = "not-me"
        plain["metadata"]["labels"][INJECT_LABEL] = "disabled"
        kubectl(cluster, "apply", "-f", "-", input=json.dumps(plain))
        assert "initContainers" not in get(cluster, "/api/v1/namespaces/team-a/pods/not-me")["spec"]
        elsewhere = users_pods("default")[0]
        kubectl(cluster, "apply", "-f", "-", input=json.dumps(elsewhere))
        assert "initContainers" not in get(cluster, "/api/v1/namespaces/default/pods/demo-master-0")["spec"]
    finally:
        stop(webhook)


def test_one_label_on_a_job_injects_every_template_and_a_bad_setting_is_refused_by_name(cluster):
    kubectl(cluster, "apply", "-k", str(ROOT / "manifests" / "webhook"))
    webhook = start_webhook(cluster)
    try:
        wait_serving(cluster, webhook)
        job = yaml.safe_load((ROOT / "tests" / "upstream" / "training-operator-pytorch-simple.yaml").read_text())
        job["metadata"]["namespace"] = "default"
        job["metadata"].setdefault("labels", {})[INJECT_LABEL] = "enabled"  # the one line
        kubectl(cluster, "apply", "-f", "-", input=json.dumps(job))
        stored = get(cluster, f"/apis/kubeflow.org/v1/namespaces/default/pytorchjobs/{job['metadata']['name']}")
        for replica in stored["spec"]["pytorchReplicaSpecs"].values():
            names = [c["name"] for c in replica["template"]["spec"]["initContainers"]]
            assert names == [INIT] and replica["template"]["metadata"]["annotations"][INJECTED]
        # elastic from the job's own elasticPolicy: the job-level path sees it
        elastic = copy.deepcopy(job)
        elastic["metadata"]["name"] = "elastic"
        elastic["spec"]["elasticPolicy"] = {"minReplicas": 1, "maxReplicas": 3}
        kubectl(cluster, "apply", "-f", "-", input=json.dumps(elastic))
        stored = get(cluster, "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs/elastic")
        worker = stored["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
        assert [c["name"] for c in worker["initContainers"]] == [INIT, SIDECAR]
        # a misspelt setting: refused, naming the job, the annotation and the webhook
        bad = copy.deepcopy(job)
        bad["metadata"]["name"] = "bad"
        bad["metadata"]["annotations"] = {PREFIX + "rank-ordr": "topology"}
        run = kubectl(cluster, "apply", "-f", "-", input=json.dumps(bad), check=False)
        assert run.returncode != 0
        assert ('admission webhook "jobs.topology-agent.io" denied the request: topology-agent: PyTorchJob bad: '
                "annotation 'topology-agent.io/rank-ordr' is not a setting of the agent") in run.stderr
    finally:
        stop(webhook)


def test_without_a_webhook_opted_in_pods_are_refused_and_the_others_are_not(cluster):
    kubectl(cluster, "apply", "-k", str(ROOT / "manifests" / "webhook"))
    pod = users_pods("default")[0]
    pod["metadata"]["labels"][INJECT_LABEL] = "enabled"
    run = kubectl(cluster, "apply", "-f", "-", input=json.dumps(pod), check=False)
    assert run.returncode != 0  # failurePolicy Fail: no pod starts without its agent
    assert 'failed calling webhook "pods.topology-agent.io"' in run.stderr and "connection refused" in run.stderr
    other = users_pods("default")[1]
    kubectl(cluster, "apply", "-f", "-", input=json.dumps(other))  # not opted in: no webhook is called


def test_replicas_share_one_secret_and_a_certificate_near_its_end_is_renewed(cluster):
    kubectl(cluster, "apply", "-k", str(ROOT / "manifests" / "webhook"))
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=75)  # 15 days left of 90
    hosts = certs.service_hosts("topology-agent-webhook", "topology-agent-system")
    old, _ = certs.renew(None, hosts, long_ago)
    kubectl(cluster, "apply", "-f", "-", input=json.dumps(certs.to_secret(old, "topology-agent-webhook-tls",
                                                                         "topology-agent-system")))
    first = start_webhook(cluster)
    try:
        wait_serving(cluster, first)
        secret = get(cluster, SECRET)
        renewed = certs.from_secret(secret)
        assert renewed is not None and renewed.cert != old.cert and renewed.ca_cert == old.ca_cert
        bundle = base64.b64decode(get(cluster, CONFIG)["webhooks"][0]["clientConfig"]["caBundle"])
        assert bundle == old.trust  # the same CA: API servers keep trusting through the change
        second_port = free_port()
        env = {**os.environ, "KUBECONFIG": str(cluster.sandbox.kubeconfig), "POD_NAMESPACE": "topology-agent-system"}
        second = subprocess.Popen([sys.executable, "-m", "agent.cli", "webhook", "--host", "127.0.0.1", "--port",
                                   str(second_port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        try:
            deadline = time.monotonic() + 30
            with socket.socket() as s:
                while s.connect_ex(("127.0.0.1", second_port)) != 0:
                    assert time.monotonic() < deadline and second.poll() is None
                    time.sleep(0.1)
            assert get(cluster, SECRET)["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]
        finally:
            stop(second)
        pod = users_pods("default")[0]
        pod["metadata"]["labels"][INJECT_LABEL] = "enabled"
        kubectl(cluster, "apply", "-f", "-", input=json.dumps(pod))  # served with the renewed certificate
    finally:
        stop(first)


def _served_certificate(port: int, trust: bytes) -> bytes:
    import ssl

    context = ssl.create_default_context(cadata=trust.decode())
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return tls.getpeercert(binary_form=True)


def test_with_cert_managers_files_it_serves_them_reloads_a_renewal_and_writes_nothing(cluster, tmp_path):
    """manifests/webhook-cert-manager: --tls-dir; no Secret of its own, no caBundle written, and the files
    cert-manager rewrites are served without a restart."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    now = datetime.datetime.now(datetime.UTC)
    hosts = ["127.0.0.1"]
    first, _ = certs.renew(None, hosts, now - datetime.timedelta(days=70))  # 20 days left: due for renewal
    tls = tmp_path / "tls"
    tls.mkdir()
    (tls / "tls.crt").write_bytes(first.cert)
    (tls / "tls.key").write_bytes(first.key)
    webhook = start_webhook(cluster, "--tls-dir", str(tls), "--check-every", "1")
    try:
        port = cluster.webhook_port  # type: ignore[attr-defined]
        deadline = time.monotonic() + 30
        while True:
            try:
                served = _served_certificate(port, first.trust)
                break
            except OSError:
                assert time.monotonic() < deadline and webhook.poll() is None, "the webhook did not serve"
                time.sleep(0.1)
        assert served == x509.load_pem_x509_certificate(first.cert).public_bytes(Encoding.DER)
        renewed, why = certs.renew(first, hosts, now)  # cert-manager's renewal: the same CA, a new certificate
        assert why and renewed.ca_cert == first.ca_cert
        (tls / "tls.key").write_bytes(renewed.key)
        (tls / "tls.crt").write_bytes(renewed.cert)
        want = x509.load_pem_x509_certificate(renewed.cert).public_bytes(Encoding.DER)
        deadline = time.monotonic() + 15
        while _served_certificate(port, first.trust) != want:
            assert time.monotonic() < deadline, "the renewed certificate was not served"
            time.sleep(0.2)
        assert kubectl(cluster, "get", "--raw", SECRET, check=False).returncode != 0  # no Secret of its own
    finally:
        stop(webhook)


# Broken TLS material is repaired, or refused at start in one line, within seconds; a watch on the
# Secret and on the configuration, not the hourly check. Every wait is a deadline on a condition.

SVC_NAME = "topology-agent-webhook.topology-agent-system.svc"  # the name the API server checks
REPAIR = 10.0  # seconds: the bound on each repair (a watch, not the hourly check)


def handshake(port: int, trust: bytes, name: str = SVC_NAME) -> bytes | None:
    """The certificate served on ``port`` (DER) when the handshake verifies it against ``trust`` for ``name``, as
    the API server's does against the caBundle; None when it does not."""
    import ssl

    if not trust.strip():
        return None
    context = ssl.create_default_context(cadata=trust.decode())
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as raw, \
                context.wrap_socket(raw, server_hostname=name) as tls:
            return tls.getpeercert(binary_form=True)
    except OSError:
        return None


def ca_bundle(sandbox: SandboxThread) -> bytes:
    """The configuration's caBundle: one for all its webhooks (b"" when any lacks it)."""
    try:
        hooks = get(sandbox, CONFIG)["webhooks"]
    except AssertionError:
        return b""  # no configuration
    bundles = {h["clientConfig"].get("caBundle", "") for h in hooks}
    return base64.b64decode(bundles.pop()) if len(bundles) == 1 else b""


def wait_until(what: str, condition, procs=(), timeout: float = REPAIR) -> float:
    """Seconds until ``condition()`` holds; fails at ``timeout`` or when a process in ``procs`` ends."""
    started = time.monotonic()
    while not condition():
        for proc in procs:
            assert proc.poll() is None, f"the webhook ended: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() - started < timeout, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.05)
    return time.monotonic() - started


def der(pem: bytes) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    return x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)


def secret_bundle(sandbox: SandboxThread) -> certs.Bundle | None:
    run = kubectl(sandbox, "get", "--raw", SECRET, check=False)
    return certs.from_secret(json.loads(run.stdout)) if run.returncode == 0 else None


def sound(sandbox: SandboxThread, port: int) -> bool:
    """What the API server needs of a replica: the certificate it serves is the Secret's, and verifies against
    the configuration's caBundle for the Service's name."""
    bundle = secret_bundle(sandbox)
    return bundle is not None and handshake(port, ca_bundle(sandbox)) == der(bundle.cert)


def admitted_pod(sandbox: SandboxThread, name: str) -> None:
    """An opted-in pod created through the API server's call to the webhook (TLS checked against the caBundle)."""
    pod = users_pods("default")[0]
    pod["metadata"]["name"] = name
    pod["metadata"]["labels"][INJECT_LABEL] = "enabled"
    kubectl(sandbox, "apply", "-f", "-", input=json.dumps(pod))
    assert get(sandbox, f"/api/v1/namespaces/default/pods/{name}")["metadata"]["annotations"][INJECTED]


def write_secret(sandbox: SandboxThread, bundle: certs.Bundle) -> None:
    kubectl(sandbox, "apply", "-f", "-", input=json.dumps(certs.to_secret(bundle, "topology-agent-webhook-tls",
                                                                         "topology-agent-system")))


def two_bundles(days_ago: float = 0) -> tuple[certs.Bundle, certs.Bundle]:
    at = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=days_ago)
    hosts = certs.service_hosts("topology-agent-webhook", "topology-agent-system")
    return certs.renew(None, hosts, at)[0], certs.renew(None, hosts, at)[0]


BROKEN = {
    # the crash loop: exit 70 on every start
    "tls.key is not tls.crt's key": lambda a, b: certs.Bundle(a.cert, b.key, a.ca_cert, a.ca_key, a.trust),
    # served while /readyz said 200, failing its own caBundle
    "the serving pair is another CA's": lambda a, b: certs.Bundle(b.cert, b.key, a.ca_cert, a.ca_key, a.trust),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_serving_pair_in_the_secret_is_issued_again_by_its_ca_at_start(cluster, case):
    kubectl(cluster, "apply", "-k", str(ROOT / "manifests" / "webhook"))
    good, other = two_bundles()
    write_secret(cluster, BROKEN[case](good, other))
    webhook = start_webhook(cluster)
    try:
        wait_until("the webhook serves the Secret's certificate, trusted by the caBundle",
                   lambda: sound(cluster, cluster.webhook_port), [webhook])
        repaired = secret_bundle(cluster)
        assert repaired is not None and repaired.ca_cert == good.ca_cert  # the CA kept: the caBundle did not change
        assert ca_bundle(cluster) == good.trust
        admitted_pod(cluster, "after-repair")
    finally:
        stop(webhook)


def test_a_ca_key_that_is_not_the_cas_at_renewal_gives_a_new_ca_that_the_cabundle_trusts(cluster):
    kubectl(cluster, "apply", "-k", str(ROOT / "manifests" / "webhook"))
    due, other = two_bundles(days_ago=75)  # 15 days left: renewed at start, by a ca.key that is another CA's
    write_secret(cluster, certs.Bundle(due.cert, due.key, due.ca_cert, other.ca_key, due.trust))
    webhook = start_webhook(cluster)
    try:
        wait_until("the webhook serves a certificate trusted by the caBundle",
                   lambda: sound(cluster, cluster.webhook_port), [webhook])
        repaired = secret_bundle(cluster)
        assert repaired is not None and repaired.ca_cert != due.ca_cert
        assert ca_bundle(cluster) == repaired.ca_cert  # the CA nothing can be issued by is no longer trusted
        admitted_pod(cluster, "after-new-ca")
    finally:
        stop(webhook)


def test_a_secret_broken_while_serving_is_repaired_within_seconds(cluster):
    kubectl(cluster, "apply", "-k", str(ROOT / "manifests" / "webhook"))
    webhook = start_webhook(cluster)
    try:
        wait_serving(cluster, webhook)
        served = secret_bundle(cluster)
        assert served is not None
        _, other = two_bundles()
        write_secret(cluster, certs.Bundle(other.cert, other.key, served.ca_cert, served.ca_key, served.trust))
        wait_until("the Secret's pair is issued again by its CA and served",
                   lambda: sound(cluster, cluster.webhook_port) and secret_bundle(cluster).cert != other.cert,
                   [webhook])
        assert secret_bundle(cluster).ca_cert == served.ca_cert
        admitted_pod(cluster, "after-secret-repair")
    finally:
        stop(webhook)


def test_a_configuration_recreated_from_the_manifest_gets_its_cabundle_within_seconds(cluster):
    """Today's hourly check left it empty for up to an hour (58 s measured): every opted-in pod refused."""
    kubectl(cluster, "apply", "-k", str(ROOT / "manifests" / "webhook"))
    webhook = start_webhook(cluster)
    try:
        wait_serving(cluster, webhook)
        trust = ca_bundle(cluster)
        kubectl(cluster, "delete", "mutatingwebhookconfiguration", "topology-agent")
        kubectl(cluster, "apply", "-k", str(ROOT / "manifests" / "webhook"))
        wait_until("every webhook of the re-created configuration has the caBundle",
                   lambda: ca_bundle(cluster) == trust, [webhook])
        admitted_pod(cluster, "after-recreate")
    finally:
        stop(webhook)


def test_a_deleted_secret_under_two_replicas_converges_on_one_ca_within_seconds(cluster):
    """Today the second replica served a certificate of the CA the caBundle no longer held for up to an hour."""
    kubectl(cluster, "apply", "-k", str(ROOT / "manifests" / "webhook"))
    first = start_webhook(cluster)
    env = {**os.environ, "KUBECONFIG": str(cluster.sandbox.kubeconfig), "POD_NAMESPACE": "topology-agent-system"}
    try:
        second, second_port = second_replica(env)
    except BaseException:
        stop(first)
        raise
    try:
        wait_serving(cluster, first)
        wait_until("both replicas serve the Secret's certificate",
                   lambda: sound(cluster, cluster.webhook_port) and sound(cluster, second_port), [first, second],
                   timeout=30)
        old = secret_bundle(cluster)
        assert old is not None
        kubectl(cluster, "delete", "secret", "topology-agent-webhook-tls", "-n", "topology-agent-system")
        wait_until("a new Secret, served by both replicas and trusted by the caBundle",
                   lambda: (secret_bundle(cluster) or old).ca_cert != old.ca_cert
                   and sound(cluster, cluster.webhook_port) and sound(cluster, second_port), [first, second])
        now = secret_bundle(cluster)
        assert now is not None and ca_bundle(cluster) == now.ca_cert  # one CA: the one both serve from
        admitted_pod(cluster, "after-delete")
    finally:
        try:
            stop(second)
        finally:
            stop(first)


def second_replica(env: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
    """A second webhook process on a free loopback port, and its port. A port found free may be taken by another
    test's process before the webhook binds it: a start that finds it taken is tried again on another port."""
    for _ in range(5):
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "webhook", "--host", "127.0.0.1", "--port",
                                 str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    return proc, port
            time.sleep(0.05)
        if proc.poll() is None:
            err = stop(proc)
            raise AssertionError(f"the second replica did not listen within 30 s: {err[-2000:]}")
        _, err = proc.communicate(timeout=20)
        if "Address already in use" not in err:
            raise AssertionError(f"the second replica did not start: {err[-2000:]}")
    raise AssertionError("no free port for the second replica in 5 tries")


def test_with_tls_dir_a_mismatched_pair_at_start_is_one_line_and_exit_2(cluster, tmp_path):
    good, other = two_bundles()
    tls = tmp_path / "tls"
    tls.mkdir()
    (tls / "tls.crt").write_bytes(good.cert)
    (tls / "tls.key").write_bytes(other.key)
    webhook = start_webhook(cluster, "--tls-dir", str(tls))
    _, err = webhook.communicate(timeout=30)
    assert webhook.returncode == 2, err
    lines = [line for line in err.splitlines() if "error" in line]
    assert lines == [f"topology-agent webhook: error: --tls-dir {tls}: tls.key is not the private key of tls.crt; "
                     "give the Secret a matching tls.crt and tls.key (both from one cert-manager Certificate)"]
    assert "PRIVATE KEY" not in err


def test_with_tls_dir_a_mismatched_pair_at_a_reload_is_refused_and_the_served_pair_stays(cluster, tmp_path):
    now = datetime.datetime.now(datetime.UTC)
    first, _ = certs.renew(None, ["127.0.0.1"], now - datetime.timedelta(days=70))  # 20 days left: due
    later, _ = certs.renew(first, ["127.0.0.1"], now)  # cert-manager's renewal: the same CA, a new pair
    tls = tmp_path / "tls"
    tls.mkdir()
    (tls / "tls.crt").write_bytes(first.cert)
    (tls / "tls.key").write_bytes(first.key)
    log = tmp_path / "webhook.log"
    env = {**os.environ, "KUBECONFIG": str(cluster.sandbox.kubeconfig), "POD_NAMESPACE": "topology-agent-system"}
    port = cluster.webhook_port  # type: ignore[attr-defined]
    with log.open("w") as err:
        webhook = subprocess.Popen([sys.executable, "-m", "agent.cli", "webhook", "--host", "127.0.0.1", "--port",
                                    str(port), "--tls-dir", str(tls), "--check-every", "1"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        wait_until("the webhook serves the files", lambda: handshake(port, first.trust, "127.0.0.1") is not None,
                   [webhook], timeout=30)
        (tls / "tls.crt").write_bytes(later.cert)  # the new certificate with the old key: a pair that does not match
        wait_until("a warning names the refused pair",
                   lambda: "tls.key is not the private key of tls.crt" in log.read_text(), [webhook])
        assert handshake(port, first.trust, "127.0.0.1") == der(first.cert)  # still served, still whole
        (tls / "tls.key").write_bytes(later.key)  # the rest of the renewal arrives
        wait_until("the renewed pair is served", lambda: handshake(port, first.trust, "127.0.0.1") == der(later.cert),
                   [webhook])
    finally:
        webhook.terminate()
        webhook.wait(timeout=20)
    assert webhook.returncode == 0 and "PRIVATE KEY" not in log.read_text()


def test_kube_system_and_the_webhooks_own_namespace_are_never_sent_to_the_webhook(cluster):
    """Labelled by mistake, with the webhook down (failurePolicy Fail): their pods are still created, as the
    webhook's own replacement pods must be; a labelled team namespace's pods are refused."""
    kubectl(cluster, "apply", "-k", str(ROOT / "manifests" / "webhook"))
    kubectl(cluster, "create", "namespace", "team-a")
    for namespace in ("kube-system", "topology-agent-system", "team-a"):
        kubectl(cluster, "label", "namespace", namespace, f"{INJECT_LABEL}=enabled")
        labels = get(cluster, f"/api/v1/namespaces/{namespace}")["metadata"]["labels"]
        assert labels["kubernetes.io/metadata.name"] == namespace  # as the API server labels every namespace
    for namespace in ("kube-system", "topology-agent-system"):
        for pod in users_pods(namespace)[:1]:
            pod["metadata"]["labels"][INJECT_LABEL] = "enabled"  # the object's own label: the other webhook
            kubectl(cluster, "apply", "-f", "-", input=json.dumps(pod))
        plain = users_pods(namespace)[1]
        kubectl(cluster, "apply", "-f", "-", input=json.dumps(plain))
    run = kubectl(cluster, "apply", "-f", "-", input=json.dumps(users_pods("team-a")[0]), check=False)
    assert run.returncode != 0 and 'failed calling webhook "namespace-pods.topology-agent.io"' in run.stderr
