"""The sidecar process against the sandbox API server over real HTTPS: the scenarios that need the process (the
trainer it finds and signals, its health port, SIGTERM, SIGKILL). The others run in process, over the sandbox's
API in memory: tests/runtime/test_sidecar.py."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent import examples
from tests.integration.conftest import finish, start_init
from tests.jobs import add_worker, configmap, create_volcano_job, generation, policy_admits, world

TRAINER = Path(__file__).resolve().parents[1] / "fake_trainer.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Running:
    def __init__(self, sandbox, tmp_path, *extra, pod="demo-worker-0", debounce="0", with_init=True):
        self.out = tmp_path / "shared"
        self.record = tmp_path / "signals.txt"
        self.record.touch()
        if with_init:
            code, err = finish(start_init(sandbox, pod, self.out, "--address", "ip"))
            assert code == 0, err
        self.trainer = subprocess.Popen([sys.executable, str(TRAINER), str(self.record), str(self.out)],
                                        stdout=subprocess.DEVNULL)
        self.bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)  # fake_trainer?",
                                           str(self.record)])  # a near miss of --trainer-match
        wait_for(lambda: Path(str(self.record) + ".pid").exists(), what="trainer start")
        self.port = free_port()
        env = {**os.environ, **sandbox.client_env(), "POD_NAME": pod, "POD_NAMESPACE": "default"}
        env.pop("KUBECONFIG", None)
        self.log = tmp_path / "sidecar.log"
        with self.log.open("w") as handle:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agent.cli", "sidecar", "--out", str(self.out), "--address", "ip",
                 "--debounce", debounce, "--trainer-match", self.match, "--health-port", str(self.port),
                 "--health-topology",
                 "--health-host", "127.0.0.1", *extra], env=env, stderr=handle)
        wait_for(lambda: self.get("/readyz")[0] == 200, what="sidecar ready")

    @property
    def match(self) -> str:
        """This test's trainer alone: tests run side by side, each with its fake_trainer.py."""
        return r"fake_trainer\.py " + re.escape(str(self.record))

    def get(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
        except OSError:
            return 0, ""

    def signals(self):
        return self.record.read_text().splitlines()

    def env(self):
        return json.loads((self.out / "topology.json").read_text())["env"]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(15)
        for proc in (self.trainer, self.bystander):
            proc.kill()
            proc.wait(5)
        return code


@pytest.fixture
def job(sandbox, tmp_path):
    create_volcano_job(sandbox, (("master", 1), ("worker", 2)))
    running = Running(sandbox, tmp_path)
    yield running
    if running.proc.poll() is None:
        running.stop()


def test_scale_up_rewrites_with_a_new_generation_and_signals_the_trainer(job, sandbox):
    add_worker(sandbox, 2, 10)
    wait_for(lambda: generation(job.out) == 2, what="generation 2")
    assert job.env()["WORLD_SIZE"] == "4"
    assert (job.out / "hostfile").read_text().splitlines()[-1] == f"{examples.loopback_ip(10)} slots=1"
    assert (job.out / "discover_hosts.sh").stat().st_mode & 0o111
    hosts = subprocess.run([str(job.out / "discover_hosts.sh")], capture_output=True, text=True, check=True)
    assert hosts.stdout.splitlines()[-1] == f"{examples.loopback_ip(10)}:1"
    wait_for(lambda: job.signals() == ["SIGUSR1 2"], what="one signal at generation 2")
    assert job.bystander.poll() is None  # the process that does not match was not signalled (SIGUSR1 kills)


def test_a_pod_kubectl_marks_for_disruption_leaves_the_world_and_rejoins_when_cleared(job, sandbox, kubectl):
    """The condition as a controller writes it, through the status subresource over real HTTPS: the sidecar
    process leaves the member out at once, signals the trainer, and takes it back once the mark is cleared."""
    worker_1 = examples.loopback_ip(2)
    mark = [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
             "lastTransitionTime": "2026-11-22T01:00:00Z"}]
    kubectl("patch", "pod", "demo-worker-1", "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"conditions": mark}}))
    wait_for(lambda: generation(job.out) == 2, what="the evicted member left")
    assert job.env()["WORLD_SIZE"] == "2" and worker_1 not in (job.out / "hostfile").read_text()
    wait_for(lambda: job.signals() == ["SIGUSR1 2"], what="the trainer signalled")
    kubectl("patch", "pod", "demo-worker-1", "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"conditions": [{**mark[0], "status": "False"}]}}))
    wait_for(lambda: generation(job.out) == 3, what="the member back")
    assert job.env()["WORLD_SIZE"] == "3" and worker_1 in (job.out / "hostfile").read_text()
    wait_for(lambda: job.signals() == ["SIGUSR1 2", "SIGUSR1 3"], what="the trainer signalled again")


def test_metrics_parse_and_health_endpoints_answer(job, sandbox):
    add_worker(sandbox, 2, 40)
    wait_for(lambda: generation(job.out) == 2, what="generation 2")
    code, text = job.get("/metrics")
    assert code == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["topology_agent_rewrites"].samples[0].value == 1.0
    assert families["topology_agent_generation"].samples[0].value == 2.0
    assert any(s.labels.get("result") == "sent" and s.value == 1.0 for s in families["topology_agent_signals"].samples)
    assert any(s.name.endswith("_count") and s.value == 1.0
               for s in families["topology_agent_event_to_file_seconds"].samples)
    assert job.get("/healthz")[0] == 200
    assert job.get("/readyz") == (200, "generation 2\n")
    code, body = job.get("/topology")
    assert code == 200 and json.loads(body)["generation"] == 2


def test_sigterm_exits_0_and_leaves_the_last_complete_files(job, sandbox):
    add_worker(sandbox, 2, 50)
    wait_for(lambda: generation(job.out) == 2, what="generation 2")
    before = {p.name: p.read_bytes() for p in job.out.iterdir() if p.is_file()}
    assert job.stop() == 0
    after = {p.name: p.read_bytes() for p in job.out.iterdir() if p.is_file()}
    assert before == after
    assert not [n for n in after if n.startswith(".topology-agent-")]


def test_a_trainer_using_agent_trainer_sees_the_new_world_size(sandbox, tmp_path):
    create_volcano_job(sandbox, (("master", 1), ("worker", 1)))
    script = tmp_path / "train.py"
    report = tmp_path / "report.txt"
    script.write_text(
        "import sys, time\n"
        "from agent.trainer import TopologyWatcher\n"
        f"world = TopologyWatcher({str(tmp_path / 'shared')!r})\n"
        f"open({str(report)!r}, 'w').write(f'start {{world.current.world_size}}\\n')\n"
        "deadline = time.monotonic() + 60\n"
        "while time.monotonic() < deadline:\n"
        "    if world.changed():\n"
        "        early = world.signalled.is_set()\n"
        "        new = world.reload(apply_env=True)\n"
        "        # the files can be seen before the signal lands: wait for it, then report both\n"
        "        got = early or world.signalled.wait(10)\n"
        f"        line = f'now {{new.world_size}} gen {{new.generation}} signal {{got}}\\n'\n"
        f"        open({str(report)!r}, 'a').write(line)\n"
        "        break\n"
        "    time.sleep(0.05)  # one training step\n"
    )
    out = tmp_path / "shared"
    code, err = finish(start_init(sandbox, "demo-worker-0", out, "--address", "ip"))
    assert code == 0, err
    trainer = subprocess.Popen([sys.executable, str(script)], cwd=Path(__file__).resolve().parents[2])
    wait_for(lambda: report.exists() and report.read_text().startswith("start 2"), what="trainer start")
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": "demo-worker-0", "POD_NAMESPACE": "default"}
    env.pop("KUBECONFIG", None)
    sidecar_log = (tmp_path / "sidecar.log").open("w")
    sidecar = subprocess.Popen([sys.executable, "-m", "agent.cli", "sidecar", "--out", str(out), "--address", "ip",
                                "--debounce", "0", "--trainer-match", re.escape(str(script)), "--health-port", "0"],
                               env=env, stderr=sidecar_log)
    try:
        time.sleep(0.5)
        add_worker(sandbox, 1, 70)
        assert trainer.wait(30) == 0, (tmp_path / "sidecar.log").read_text() + report.read_text()
        assert report.read_text().splitlines()[1] == "now 3 gen 2 signal True"
    finally:
        sidecar.send_signal(signal.SIGTERM)
        assert sidecar.wait(15) == 0
        sidecar_log.close()


def start_sidecar(sandbox, tmp_path, name, *extra):
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": name, "POD_NAMESPACE": "default"}
    env.pop("KUBECONFIG", None)
    log = (tmp_path / f"{name}.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "sidecar", "--out", str(tmp_path / name), "--address", "ip",
         "--debounce", "0", "--signal", "none", "--health-port", "0", *extra], env=env, stderr=log)
    return proc, log


def stop_sidecars(procs):
    """SIGTERM each sidecar; each must exit 0 (it stops cleanly, releasing the Lease if it held it)."""
    for proc, log in procs.values():
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        log.close()


def published_job(sandbox, tmp_path, workers, *extra):
    pods = create_volcano_job(sandbox, (("master", 1), ("worker", workers)))
    for pod in pods:
        code, err = finish(start_init(sandbox, pod["metadata"]["name"], tmp_path / pod["metadata"]["name"],
                                      "--address", "ip", "--source", "published", *extra))
        assert code == 0, err
    return pods


def test_when_the_leader_crashes_a_standby_takes_over_and_followers_see_the_new_membership(sandbox, tmp_path):
    """Followers follow a new publisher when the leader pod goes away. Here its process is killed (no Lease
    released: the standbys wait it out); tests/runtime/test_sidecar.py stops one cleanly."""
    published_job(sandbox, tmp_path, 5)
    procs = {n: start_sidecar(sandbox, tmp_path, n, "--lease-seconds", "3")
             for n in ("demo-master-0", "demo-worker-0", "demo-worker-1", "demo-worker-4")}
    try:
        for standby in ("demo-worker-0", "demo-worker-1"):  # both stand by before the leader goes
            wait_for(lambda s=standby: "(standby)" in (tmp_path / f"{s}.log").read_text(), what="standby named")
        wait_for(lambda: "started publishing" in (tmp_path / "demo-master-0.log").read_text(), what="leader up")
        # The follower must follow the journal before the leader goes (a follower that starts after the leader's
        # pod is deleted refuses the copy its writer no longer vouches for, and reads the pods).
        wait_for(lambda: "(follower)" in (tmp_path / "demo-worker-4.log").read_text(), what="follower following")
        before = world(tmp_path / "demo-worker-4")
        published_before = {n: configmap(sandbox, n) for n in ("demo-topology", "demo-topology-journal")}
        leader, leader_log = procs.pop("demo-master-0")
        leader.kill()  # no release: the standbys wait out the lease
        assert leader.wait(15) == -signal.SIGKILL
        leader_log.close()
        sandbox.delete_pod("default", "demo-master-0")
        wait_for(lambda: world(tmp_path / "demo-worker-4")[0] == "5", timeout=30,
                 what="the follower sees the leader gone")
        after = world(tmp_path / "demo-worker-4")
        assert before[0] == "6" and after[1] != before[1]  # a new rank 0, a new MASTER_ADDR
        took = [n for n in ("demo-worker-0", "demo-worker-1")
                if "started publishing" in (tmp_path / f"{n}.log").read_text()]
        assert len(took) == 1
        # it followed the publication until the Lease went unrenewed for a third of its duration, listed the pods then,
        # and took the Lease once it expired
        text = (tmp_path / f"{took[0]}.log").read_text()
        ready = text.index("lease demo-topology is free or was not renewed for a third of its duration")
        assert ready < text.index("started publishing")
        lease = sandbox.sandbox.store.get("coordination.k8s.io/v1/leases", "default", "demo-topology")
        assert lease["spec"]["holderIdentity"] == took[0] and lease["spec"]["leaseTransitions"] >= 1
        # The new publisher's real writes pass the admission policy as an UPDATE by its own pod
        # (a standby the previous leader named), journal and snapshot alike.
        wait_for(lambda: configmap(sandbox, "demo-topology")["data"]["leader"] == took[0], what="snapshot rewritten")
        from tests.vap import Deny

        for name, old in published_before.items():
            assert policy_admits(sandbox, "UPDATE", took[0], configmap(sandbox, name), old)
            with pytest.raises(Deny, match=r"only the pod named in data\.leader"):  # the same write by a follower
                policy_admits(sandbox, "UPDATE", "demo-worker-4", configmap(sandbox, name), old)
    finally:
        stop_sidecars(procs)


def test_kubectl_delete_of_the_summary_neither_stops_an_init_nor_stays(sandbox, kubectl, tmp_path):
    """A user's `kubectl delete configmap demo-topology-summary`, over real HTTPS: an init in its own view that runs
    then reads the whole topology (it waited out its --timeout), and the leader's sidecar process writes the summary
    again within a lease duration while nothing changes (it wrote it only when what it says changed).
    tests/runtime/test_sidecar.py follows the same steps in process, with a sidecar in its own view too."""
    published_job(sandbox, tmp_path, 20)
    kubectl("delete", "configmap", "demo-topology-summary")
    code, err = finish(start_init(sandbox, "demo-worker-7", tmp_path / "again", "--address", "ip", "--source",
                                  "published", "--timeout", "10"))
    assert code == 0, err
    assert "configmap demo-topology-summary is gone while configmap demo-topology-journal is published" in err
    assert world(tmp_path / "again") == world(tmp_path / "demo-worker-7")
    procs = {"demo-master-0": start_sidecar(sandbox, tmp_path, "demo-master-0", "--lease-seconds", "2")}
    try:
        # a new leadership writes the summary that is not there; then it is deleted while the leader publishes
        wait_for(lambda: kubectl("get", "configmap", "demo-topology-summary", check=False).returncode == 0,
                 what="the summary written by the new leader")
        kubectl("delete", "configmap", "demo-topology-summary")
        wait_for(lambda: "configmap demo-topology-summary was gone (deleted?); wrote it again" in
                 (tmp_path / "demo-master-0.log").read_text(), timeout=20, what="the summary written again")
        assert kubectl("get", "configmap", "demo-topology-summary", "-o", "name").stdout.strip() == \
            "configmap/demo-topology-summary"
        code, err = finish(start_init(sandbox, "demo-worker-8", tmp_path / "later", "--address", "ip", "--source",
                                      "published", "--timeout", "10"))
        assert code == 0, err
        assert "is gone" not in err and "reading the whole topology" not in err
    finally:
        stop_sidecars(procs)


def test_sigterm_while_the_api_is_down_at_start_exits_0_at_once(sandbox, tmp_path):
    # The start-up retry loop ends at SIGTERM: the pod need not wait for its grace period's SIGKILL.
    create_volcano_job(sandbox, (("master", 1), ("worker", 1)))
    sandbox.faults(down_for=60)
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": "demo-worker-0", "POD_NAMESPACE": "default"}
    env.pop("KUBECONFIG", None)
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "sidecar", "--out", str(tmp_path / "out"),
                             "--health-port", "0"], env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    # Its first line says it cannot reach the API: it is in the start-up retry loop (a loaded machine can take
    # seconds to start the interpreter, and a SIGTERM before the handlers are set is the default one)
    wait_for(lambda: lines, timeout=30, what="the sidecar's first line")
    time.sleep(1.0)
    assert proc.poll() is None, "the sidecar keeps retrying while the API is down"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=5)
    reader.join(5)
    proc.stderr.close()
    err = "".join(lines)
    assert proc.returncode == 0, err
    assert "stopped before the first list" in err
