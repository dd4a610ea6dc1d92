"""init against the sandbox API server over real HTTPS, one real process per pod."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import examples
from agent.runtime.demo import volcano_owner
from tests.integration.conftest import finish, start_init

HERE = Path(__file__).resolve().parent.parent / "e2e"


def create_volcano_job(sandbox, tasks=(("master", 1), ("worker", 3), ("extras", 1)), *, with_ips=True):
    owner = volcano_owner()
    owner["spec"]["tasks"] = [{"name": n, "replicas": r, "template": {}} for n, r in tasks]
    created = sandbox.create("batch.volcano.sh/v1alpha1/jobs", "default", owner)
    pods = examples.volcano_job("demo", tasks)
    for pod in pods:
        pod["metadata"]["ownerReferences"][0]["uid"] = created["metadata"]["uid"]
        if not with_ips:
            pod["status"] = {"phase": "Pending"}
        sandbox.create_pod(pod)
    return pods


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


def test_a_missing_pod_times_out_naming_it(sandbox, tmp_path):
    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 3)))
    sandbox.delete_pod("default", "demo-worker-2")
    proc = start_init(sandbox, pods[0]["metadata"]["name"], tmp_path / "out", "--timeout", "3")
    code, err = finish(proc)
    assert code == 4
    last = err.strip().splitlines()[-1]
    assert re.search(r"timed out after 3\.\d s \(--timeout 3\) waiting for the gang: 3 of 4 training pods "
                     r"present; missing: worker 2", last), last
    assert not list((tmp_path / "out").iterdir())


def test_a_role_named_in_roles_that_no_pod_has_is_refused_in_one_line(sandbox, tmp_path):
    create_volcano_job(sandbox, (("master", 1), ("worker", 2)))
    proc = start_init(sandbox, "demo-worker-0", tmp_path / "out", "--timeout", "20",
                      env={"TOPOLOGY_ROLES": "mastr,worker"})
    code, err = finish(proc)
    assert code == 2, err
    errors = [line for line in err.strip().splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in err
    assert "TOPOLOGY_ROLES names 'mastr', but Job 'demo' has no such role (roles present: master, worker)" \
           in errors[0]
    assert not list((tmp_path / "out").iterdir())


def test_api_down_at_start_then_up_a_few_seconds_later(sandbox, tmp_path):
    create_volcano_job(sandbox, (("master", 1), ("worker", 1)))
    sandbox.faults(down_for=2.5)
    proc = start_init(sandbox, "demo-worker-0", tmp_path / "out", "--timeout", "60")
    code, err = finish(proc)
    assert code == 0, err
    assert "unreachable" in err and "retry 1 in" in err
    assert (tmp_path / "out" / "torch.env").is_file()


def test_forbidden_gives_one_line_naming_verb_resource_namespace_and_rbac(sandbox, tmp_path):
    create_volcano_job(sandbox, (("master", 1), ("worker", 1)))
    sandbox.faults(status=403)
    proc = start_init(sandbox, "demo-worker-0", tmp_path / "out", "--timeout", "30")
    code, err = finish(proc)
    assert code == 3
    lines = [line for line in err.strip().splitlines() if "error:" in line]
    assert len(lines) == 1
    assert "refused get pod 'demo-worker-0' in namespace 'default' (403" in lines[0]
    assert "manifests/rbac" in lines[0]
    assert "retry" not in err


def test_429_with_retry_after_is_honoured_then_succeeds(sandbox, tmp_path):
    create_volcano_job(sandbox, (("master", 1), ("worker", 1)))
    sandbox.faults(status=429, count=2, retry_after=1)
    started = time.monotonic()
    proc = start_init(sandbox, "demo-master-0", tmp_path / "out", "--timeout", "60")
    code, err = finish(proc)
    assert code == 0, err
    # Retry-After is honoured as the least wait; up to 50 % jitter spreads the pods that got it together.
    assert err.count("API answered 429") == 2 and re.search(r"retry 2 in 1\.[0-5] s", err), err
    assert time.monotonic() - started >= 2.0


def test_watch_resumes_after_a_dropped_stream_and_relists_after_410(sandbox, tmp_path):
    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 2)), with_ips=False)
    proc = start_init(sandbox, "demo-master-0", tmp_path / "out", "--address", "ip", "--timeout", "60")
    time.sleep(1.5)
    sandbox.set_pod_ip("default", "demo-master-0", examples.loopback_ip(0))
    sandbox.faults(drop_watches=True)
    sandbox.set_pod_ip("default", "demo-worker-0", examples.loopback_ip(1))  # happens while disconnected
    sandbox.faults(compact=True)  # and its resourceVersion is forgotten: the resume gets 410
    time.sleep(0.5)
    sandbox.set_pod_ip("default", "demo-worker-1", examples.loopback_ip(2))
    code, err = finish(proc)
    assert code == 0, err
    doc = json.loads((tmp_path / "out" / "topology.json").read_text())
    assert [m["address"] for m in doc["members"]] == [examples.loopback_ip(i) for i in range(3)]
    assert len(pods) == 3


def test_json_logs_are_one_object_per_line(sandbox, tmp_path):
    create_volcano_job(sandbox, (("master", 1),))
    proc = start_init(sandbox, "demo-master-0", tmp_path / "out", "--log-format", "json")
    code, err = finish(proc)
    assert code == 0, err
    entries = [json.loads(line) for line in err.strip().splitlines()]
    assert entries and all({"ts", "level", "msg"} <= set(e) for e in entries)


def test_wait_dns_refuses_a_headless_service_that_hides_not_ready_pods(sandbox, tmp_path):
    create_volcano_job(sandbox, (("master", 1), ("worker", 1)))
    sandbox.create("/v1/services", "default", {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "demo"},
                                               "spec": {"clusterIP": "None", "selector": {"app": "x"}}})
    proc = start_init(sandbox, "demo-worker-0", tmp_path / "out", "--wait-dns", "--timeout", "20")
    code, err = finish(proc)
    assert code == 2
    assert "publishNotReadyAddresses" in err.strip().splitlines()[-1]


def test_wait_dns_waits_until_the_injected_resolver_answers():
    from agent.core import Options, render_pod
    from agent.runtime.init import InitSettings, check_dns

    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 1)))
    rendered = render_pod(pods, "demo-worker-0", Options())

    class Api:
        async def get_object(self, path):
            assert path.endswith("/services/demo")
            return {"spec": {"publishNotReadyAddresses": True}}

    answers = {"demo-master-0.demo": 3, "demo-worker-0.demo": 1}
    asked = []

    def resolver(name):
        asked.append(name)
        answers[name] -= 1
        return answers[name] <= 0

    now = [0.0]
    asyncio.run(check_dns(Api(), rendered, InitSettings("default", "demo-worker-0", Options(), Path("/nonexistent")),
                          resolver=resolver, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
                          deadline=60))
    assert asked.count("demo-master-0.demo") == 3 and asked.count("demo-worker-0.demo") == 1


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


def test_slow_api_responses_delay_init_but_it_completes(sandbox, tmp_path):
    create_volcano_job(sandbox, (("master", 1), ("worker", 1)))
    sandbox.faults(delay=1.0, delay_count=3)
    started = time.monotonic()
    code, err = finish(start_init(sandbox, "demo-worker-0", tmp_path / "out", "--timeout", "30"))
    assert code == 0, err
    assert time.monotonic() - started >= 3.0  # three answers, a second each


def test_published_source_gives_every_pod_the_same_files_for_a_fraction_of_the_bytes(sandbox, tmp_path):
    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 5), ("extras", 2)))
    names = [p["metadata"]["name"] for p in pods]
    results = {}
    for source in ("pods", "published"):
        sandbox.reset_stats()
        # followers first: they must wait for the leader (demo-master-0) to publish
        procs = {n: start_init(sandbox, n, tmp_path / source / n, "--source", source, "--timeout", "60")
                 for n in reversed(names)}
        for proc in procs.values():
            code, err = finish(proc)
            assert code == 0, err
        stats = sandbox.stats()["byAgent"]
        results[source] = {name: ((tmp_path / source / name / "torch.env").read_text(),
                                  stats[f"topology-agent/0.1.0 init (default/{name})"]) for name in names}
    for name in names:
        assert results["published"][name][0] == results["pods"][name][0], name
    leader = results["published"]["demo-master-0"][1]
    follower = results["published"]["demo-worker-3"][1]
    # get pod, get owner, list the published objects, get their writer pod (issue 23: who wrote them)
    assert follower["requests"] - follower["watches"] <= 4
    assert follower["bytes"] < results["pods"]["demo-worker-3"][1]["bytes"] / 2
    # get pod, get owner, list pods; create the snapshot, the journal and the Lease
    assert leader["requests"] - leader["watches"] == 6
    configmap = sandbox.sandbox.store.get("/v1/configmaps", "default", "demo-topology")
    assert configmap["metadata"]["ownerReferences"][0]["kind"] == "Job"


def test_init_takes_run_launcher_as_worker_and_slots_from_the_mpijob(sandbox, tmp_path):
    owner = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": "allreduce",
             "namespace": "default", "uid": examples.owner_uid("mpijob", "default", "allreduce")},
             "spec": {"slotsPerWorker": 4, "runLauncherAsWorker": True,
                      "mpiReplicaSpecs": {"Launcher": {"replicas": 1}, "Worker": {"replicas": 2}}}}
    sandbox.create("kubeflow.org/v2beta1/mpijobs", "default", owner)
    for pod in examples.mpijob(workers=2):
        sandbox.create_pod(pod)
    proc = start_init(sandbox, "allreduce-worker-0", tmp_path / "out", "--timeout", "30")
    code, err = finish(proc)
    assert code == 0, err
    assert "MPIJob runLauncherAsWorker: the launcher is node rank 0" in err
    assert (tmp_path / "out" / "hostfile").read_text().splitlines() == [
        "allreduce-launcher.allreduce slots=4", "allreduce-worker-0.allreduce slots=4",
        "allreduce-worker-1.allreduce slots=4"]
    env = json.loads((tmp_path / "out" / "topology.json").read_text())["env"]
    assert (env["NODE_RANK"], env["RANK"], env["WORLD_SIZE"]) == ("1", "4", "12")


class _ArrivingPods:
    """A watch whose events arrive at given times on a fake clock: a read waits (moves the clock) until the next
    event's time, unless the caller slept past it (then the event was buffered)."""

    def __init__(self, pods, times):
        self.pods, self.times, self.now = pods, times, 0.0

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append((self.now, seconds))
        self.now += seconds

    async def list_objects(self, path, *, label_selector, limit, keep, **_):
        return keep(self.listed), "1"

    async def watch_objects(self, path, resource_version, *, timeout, label_selector, idle, **_):
        from agent.k8s.core import WatchEvent

        assert not getattr(self, "watched", False), "one watch brings every event"
        self.watched = True
        for pod, at in zip(self.pods, self.times, strict=True):
            self.now = max(self.now, at)
            yield WatchEvent("MODIFIED", pod)


@pytest.mark.parametrize(("gap", "lingers"), [(0.002, True), (0.2, False)])
def test_dense_arrivals_are_read_in_batches_and_the_last_pods_at_once(tmp_path, gap, lingers):
    """Every pod of a large job late: each read that waits is a process wakeup. While many pods are awaited and
    they come densely, init lets them pile up for LINGER between reads; the last ones (1 %) are read as they come,
    and sparse arrivals are never delayed."""
    from agent.core import Options
    from agent.core.gang import Expectation
    from agent.runtime.init import LINGER, Init, InitSettings, decide

    n = 400
    pods = examples.volcano_job("demo", (("master", 1), ("worker", n - 1)))
    for k, pod in enumerate(pods):
        pod["metadata"]["resourceVersion"] = str(k + 1)
    pending = [json.loads(json.dumps(p)) for p in pods]
    for pod in pending[1:]:
        pod["status"] = {"phase": "Pending"}
    for pod in pods[1:]:  # the events: each pod with its IP, in a newer version
        pod["metadata"]["resourceVersion"] = str(int(pod["metadata"]["resourceVersion"]) + n)
    arrivals = _ArrivingPods(pods[1:], [1.0 + gap * k for k in range(n - 1)])
    arrivals.sleeps = []
    settings = InitSettings(namespace="default", pod_name="demo-master-0", options=Options(address="ip"),
                            out_dir=tmp_path, timeout=600.0)
    init = Init(arrivals, settings, clock=arrivals.clock, sleep=arrivals.sleep, resolver=lambda name: True, ssh=None)
    arrivals.listed = [pods[0], *pending[1:]]
    expected = Expectation(total=n, per_role={"master": 1, "worker": n - 1}, source="test")
    _, gang = asyncio.run(init.gang(pods[0], decide(pods[0], settings, expected, ()), expected, None))
    assert gang.tracker.status().ready
    last = 1.0 + gap * (n - 2)
    if lingers:
        assert 0.002 * n / LINGER / 2 <= len(arrivals.sleeps) <= 0.002 * n / LINGER + 2  # ~one read per LINGER
        assert arrivals.now <= last + LINGER  # the last pod's event handled at most LINGER late ...
        assert all(at < last - 0.002 * (n // 100 - 1) for at, _ in arrivals.sleeps)  # ... no pause for the last 1 %
    else:
        assert arrivals.sleeps == [] and arrivals.now == last


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


def test_expect_below_the_pods_present_says_every_pod_is_a_member(sandbox, tmp_path):
    """init --expect 2 with 4 training pods used to log 'gang complete: 4 of 2'."""
    create_volcano_job(sandbox, (("master", 1), ("worker", 3)))
    code, err = finish(start_init(sandbox, "demo-worker-0", tmp_path / "out", "--expect", "2"))
    assert code == 0, err
    assert "gang complete: 4 training pods present (2 expected: every present pod is a member)" in err
    assert "--expect 2, but 4 training pods are present: the files name all of them" in err
    assert "export WORLD_SIZE='4'" in (tmp_path / "out" / "torch.env").read_text()


def _rogue(name: str, role: str, index: int, ip: int) -> dict:
    """A pod someone else created with the job's labels: no ownerReference to the job."""
    pod = examples.volcano_job("demo", (("master", 1), ("worker", 1)))[1]
    pod["metadata"]["name"] = name
    pod["metadata"]["labels"].update({"volcano.sh/task-spec": role, "volcano.sh/task-index": str(index)})
    pod["metadata"].pop("ownerReferences")
    pod["spec"]["hostname"] = name
    pod["status"].update(podIP=examples.loopback_ip(ip), podIPs=[{"ip": examples.loopback_ip(ip)}])
    return pod


def test_pods_with_the_jobs_labels_only_are_left_out_and_nobody_stalls(sandbox, tmp_path):
    """Issue 23, H2: a rogue pod with a new index grew WORLD_SIZE and put its IP in the hostfile; one with a
    duplicate index made every init exit 2; one with role WORKER exported VC_WORKER_HOSTS twice."""
    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 2)))
    for rogue in (_rogue("rogue-new", "worker", 7, 70), _rogue("rogue-dup", "worker", 0, 71),
                  _rogue("rogue-case", "WORKER", 0, 72)):
        sandbox.create_pod(rogue)
    procs = {p["metadata"]["name"]: start_init(sandbox, p["metadata"]["name"], tmp_path / p["metadata"]["name"],
                                               "--address", "ip", "--timeout", "30") for p in pods}
    for name, proc in procs.items():
        code, err = finish(proc)
        assert code == 0, err
        for rogue in ("rogue-new", "rogue-dup", "rogue-case"):
            assert f"leaving out a pod that is not the job's: pod '{rogue}' has the labels of Job 'demo' but is " \
                   "not owned by it" in err
        env = (tmp_path / name / "torch.env").read_text()
        assert "export WORLD_SIZE='3'" in env and env.count("VC_WORKER_HOSTS=") == 1
        assert not any(examples.loopback_ip(i) in (tmp_path / name / "hostfile").read_text() for i in (70, 71, 72))


def test_the_leader_never_follows_a_topology_someone_made_before_it(sandbox, tmp_path):
    """Issue 23, H1/H3: whoever created `<job>-topology` before the job's leader published captured the leader
    (its create got 409 and it followed the copy): the pod that runs the SSH launcher got the forger's hosts."""
    from agent.core import Options
    from agent.core.journal import PublishedState, Publisher
    from agent.core.published import configmap_body, configmap_name, pack

    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 2)))
    forged_pods = copy.deepcopy(pods)
    forged_pods[1]["status"].update(podIP="127.9.9.9", podIPs=[{"ip": "127.9.9.9"}])
    forger = Publisher(PublishedState(job="demo", namespace="default"), Options(address="ip"),
                       leader="demo-master-0")
    forger.change({p["metadata"]["name"]: p for p in forged_pods}, [p["metadata"]["name"] for p in forged_pods])
    sandbox.create("/v1/configmaps", "default", configmap_body(
        configmap_name("demo"), pack(forger.snapshot_document()), generation=forger.state.seq,
        leader="demo-master-0", owner=None))
    code, err = finish(start_init(sandbox, "demo-master-0", tmp_path / "leader", "--source", "published",
                                  "--address", "ip", "--timeout", "30"))
    assert code == 0, err
    assert "configmap demo-topology exists already (this init ran before, or another writer made it): not " \
           "followed" in err
    hostfile = (tmp_path / "leader" / "hostfile").read_text()
    assert "127.9.9.9" not in hostfile and pods[1]["status"]["podIP"] in hostfile


def forge_publication(sandbox, pods, *, writer: str, writer_uid: str, forged_ip: str = "127.9.9.9") -> None:
    """`demo-topology` and its journal, made before the job's leader publishes, by ``writer`` (issue 23, H3: the
    admission policy binds data.leader and data.leaderUid to the writer's token, not to the job)."""
    from agent.core import Options
    from agent.core.journal import PublishedState, Publisher, journal_body
    from agent.core.published import configmap_body, configmap_name, pack

    forged_pods = copy.deepcopy(pods)
    for pod in forged_pods:
        pod["status"].update(podIP=forged_ip, podIPs=[{"ip": forged_ip}])
    forger = Publisher(PublishedState(job="demo", namespace="default"), Options(address="ip"), leader=writer,
                       leader_uid=writer_uid)
    forger.change({p["metadata"]["name"]: p for p in forged_pods}, [p["metadata"]["name"] for p in forged_pods])
    sandbox.create("/v1/configmaps", "default", configmap_body(
        configmap_name("demo"), pack(forger.snapshot_document()), generation=forger.state.seq, leader=writer,
        leader_uid=writer_uid, owner=None))
    forger.start_from_snapshot()
    sandbox.create("/v1/configmaps", "default", journal_body(configmap_name("demo"), forger.journal_data(),
                                                             owner=None))


@pytest.mark.parametrize("case", ["another_jobs_agent", "no_writer_named", "a_pod_not_owned"])
def test_followers_never_use_a_topology_that_no_pod_of_the_job_wrote(sandbox, tmp_path, case):
    """Issue 23, H3: any pod under the agent's ServiceAccount could create another job's `<job>-topology` naming
    itself, and the followers used it (MASTER_ADDR and the hosts of the forger's choosing). Each follower now
    reads the writer pod once: a copy whose writer is not a member of this job, by name and uid, is refused in
    one line and the follower reads the pods; no follower waits for a forged copy to name it. (The leader's name
    with another uid is the leader's earlier incarnation, since the policy binds the name to the token: followers
    wait for it to publish again, test_after_the_whole_job_is_re_created_... below.)"""
    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 2)))
    if case == "another_jobs_agent":  # a running pod of another job, with its own bound token
        other = sandbox.create_pod(examples.volcano_job("other", (("master", 1),))[0])
        writer, uid, why = "other-master-0", other["metadata"]["uid"], "belongs to job 'other', not 'demo'"
    elif case == "no_writer_named":
        writer, uid, why = "demo-master-0", "", "does not name the pod that wrote it"
    else:  # the job's labels, made by a pod creator, but not owned by the Volcano Job
        rogue = copy.deepcopy(examples.volcano_job("demo", (("master", 1),))[0])
        rogue["metadata"]["name"] = "demo-master-9"
        rogue["metadata"]["labels"]["volcano.sh/task-index"] = "0"
        rogue["metadata"]["ownerReferences"][0]["uid"] = "not-the-jobs-uid"
        created = sandbox.create_pod(rogue)
        writer, uid, why = "demo-master-9", created["metadata"]["uid"], "is not a member"
    forge_publication(sandbox, pods, writer=writer, writer_uid=uid)
    names = [p["metadata"]["name"] for p in pods]
    procs = {n: start_init(sandbox, n, tmp_path / n, "--source", "published", "--address", "ip", "--timeout", "30")
             for n in reversed(names)}
    for name, proc in procs.items():
        code, err = finish(proc)
        assert code == 0, err
        hostfile = (tmp_path / name / "hostfile").read_text()
        assert "127.9.9.9" not in hostfile and all(p["status"]["podIP"] in hostfile for p in pods)
        env = (tmp_path / name / "torch.env").read_text()
        assert f"export MASTER_ADDR='{pods[0]['status']['podIP']}'" in env
        if name != "demo-master-0":
            assert "the published topology is not used (configmap demo-topology" in err and why in err, err
            assert "reading the pods instead" in err


def test_after_the_whole_job_is_re_created_followers_wait_for_the_leader_to_publish_again(sandbox, tmp_path):
    """Issue 23, H3, and what a real cluster does: a controller that restarts a job re-creates every pod under its
    name with a new uid, and the publication survives (the job owns it). The copy's writer is then a member under
    another uid: not a forgery. Reading the pods instead would make every follower list every pod (the load the
    publication exists to avoid), so followers wait for the leader, whose sidecar publishes again, and use its
    copy."""
    from tests.integration.test_sidecar import start_sidecar, stop_sidecars

    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 3)))
    names = [p["metadata"]["name"] for p in pods]
    for name in names:
        code, err = finish(start_init(sandbox, name, tmp_path / "before" / name, "--source", "published",
                                      "--address", "ip"))
        assert code == 0, err
    for pod in pods:  # the controller restarts the job: same names, new uids, new addresses
        sandbox.delete_pod("default", pod["metadata"]["name"])
        pod["metadata"]["uid"] = pod["metadata"]["uid"][:-4] + "beef"
        ip = examples.loopback_ip(200 + names.index(pod["metadata"]["name"]))
        pod["status"].update(podIP=ip, podIPs=[{"ip": ip}])
        sandbox.create_pod(pod)
    followers = {n: start_init(sandbox, n, tmp_path / n, "--source", "published", "--address", "ip",
                               "--timeout", "60") for n in names[1:]}
    code, err = finish(start_init(sandbox, "demo-master-0", tmp_path / "demo-master-0", "--source", "published",
                                  "--address", "ip"))
    assert code == 0, err
    sidecars = {"demo-master-0": start_sidecar(sandbox, tmp_path, "demo-master-0")}
    try:
        for name, proc in followers.items():
            code, err = finish(proc)
            assert code == 0, err
            assert "waiting for the published topology to be written again" in err and "its writer's uid" in err
            assert "reading the pods instead" not in err
            hostfile = (tmp_path / name / "hostfile").read_text()
            assert all(p["status"]["podIP"] in hostfile for p in pods), hostfile
    finally:
        stop_sidecars(sidecars)


def test_the_leader_builds_its_rows_while_it_waits_and_none_after_the_gang_is_complete(sandbox, tmp_path,
                                                                                        monkeypatch):
    """Issue 24: the leader's init stages each pod's row as the pod arrives (building 16384 rows after the last IP
    cost ~0.1 s on every pod's start-up path); its publication then matches what the pods say."""
    from agent.core import journal as journal_module
    from agent.core.journal import Publisher
    from agent.core.model import Options
    from agent.k8s.client import Client
    from agent.k8s.config import in_cluster_config
    from agent.runtime.init import InitSettings, run_init

    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 5), ("extras", 1)), with_ips=False)
    for key, value in sandbox.client_env().items():
        monkeypatch.setenv(key, value)
    config = in_cluster_config()
    assert config is not None
    built_in_change: list[str] = []
    real_row, real_change = journal_module._row, Publisher.change
    in_change = [False]

    def counting_row(pod, *args, **kwargs):
        if in_change[0]:
            built_in_change.append(pod["metadata"]["name"])
        return real_row(pod, *args, **kwargs)

    def change(self, *args, **kwargs):
        in_change[0] = True
        try:
            return real_change(self, *args, **kwargs)
        finally:
            in_change[0] = False

    monkeypatch.setattr(journal_module, "_row", counting_row)
    monkeypatch.setattr(Publisher, "change", change)
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in examples.volcano_job(
        "demo", (("master", 1), ("worker", 5), ("extras", 1)))}

    def give_ips() -> None:
        time.sleep(0.5)
        for pod in reversed(pods):  # the pod that does not train first: nobody waits for it
            sandbox.set_pod_ip("default", pod["metadata"]["name"], ips[pod["metadata"]["name"]])

    import threading
    thread = threading.Thread(target=give_ips)
    thread.start()
    settings = InitSettings(namespace="default", pod_name="demo-master-0", options=Options(address="ip"),
                            out_dir=tmp_path / "out", timeout=30, source="published")
    api = Client(config)
    try:
        rendered = run_init(api, settings).rendered
    finally:
        thread.join()
        api.close()  # an unclosed TLS socket is reported as unraisable in whichever test runs when it is collected
    assert rendered.plan.topology.world_size == 6
    assert built_in_change == []  # every row was staged while the pods arrived
    snapshot = sandbox.sandbox.store.get("/v1/configmaps", "default", "demo-topology")
    from agent.core.published import decode_configmap
    published = {row[0]: row[8] for row in decode_configmap(snapshot)["pods"]}
    assert published == ips  # each with the IP it got after it was first staged without one


def test_the_leaders_plan_is_carried_through_the_wait_not_made_again_once_the_gang_is_complete(sandbox, tmp_path,
                                                                                                monkeypatch):
    """Issue 24: init lays the job out once, from its LIST, and follows each pod's IP into that layout; the
    plan once the last IP is in is one change away (16384 pods: ~90 ms of planning from scratch saved on every
    pod's start-up path), and it is the plan the pods make from scratch."""
    from agent.core import topology
    from agent.core.model import Options
    from agent.core.topology import build_plan
    from agent.k8s.client import Client
    from agent.k8s.config import in_cluster_config
    from agent.runtime.init import InitSettings, run_init

    tasks = (("master", 1), ("worker", 7), ("extras", 1))
    pods = create_volcano_job(sandbox, tasks, with_ips=False)
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in examples.volcano_job("demo", tasks)}
    sandbox.set_pod_ip("default", "demo-master-0", ips["demo-master-0"])  # init runs in a pod that has its IP
    for key, value in sandbox.client_env().items():
        monkeypatch.setenv(key, value)
    config = in_cluster_config()
    assert config is not None
    laid_out = []
    real = topology._lay_out
    monkeypatch.setattr(topology, "_lay_out", lambda *a, **k: laid_out.append(k.get("provisional")) or real(*a, **k))

    def give_ips() -> None:
        time.sleep(0.5)
        for pod in [pods[-1], *pods[1:-1]]:  # the pod that does not train first: the gang is complete at the last
            sandbox.set_pod_ip("default", pod["metadata"]["name"], ips[pod["metadata"]["name"]])
            time.sleep(0.05)

    import threading
    thread = threading.Thread(target=give_ips)
    thread.start()
    settings = InitSettings(namespace="default", pod_name="demo-master-0", options=Options(address="ip"),
                            out_dir=tmp_path / "out", timeout=30, source="pods")
    api = Client(config)
    try:
        held = run_init(api, settings)
    finally:
        thread.join()
        api.close()
    rendered = held.rendered
    assert laid_out == [True]  # once, from the LIST (every worker without its IP); never from scratch again
    planner = held.planner
    assert planner.followed >= 8 and planner.incremental == 1  # each IP as it came; the plan from that layout
    listed = sandbox.sandbox.store.list("/v1/pods", "default")
    assert rendered.plan == build_plan(listed, "demo-master-0", Options(address="ip"))
    assert rendered.plan.topology.world_size == 8
