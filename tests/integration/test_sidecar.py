"""The sidecar against the sandbox API server: files and generation follow membership; the trainer is signalled."""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent import examples
from tests.integration.conftest import finish, start_init
from tests.integration.test_init import create_volcano_job

HERE = Path(__file__).resolve().parent


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


def generation(out: Path) -> int:
    try:
        return int((out / "generation").read_text())
    except (OSError, ValueError):
        return 0


class Running:
    def __init__(self, sandbox, tmp_path, *extra, pod="demo-worker-0", debounce="0", with_init=True):
        self.out = tmp_path / "shared"
        self.record = tmp_path / "signals.txt"
        self.record.touch()
        if with_init:
            code, err = finish(start_init(sandbox, pod, self.out, "--address", "ip"))
            assert code == 0, err
        self.trainer = subprocess.Popen([sys.executable, str(HERE / "fake_trainer.py"), str(self.record),
                                         str(self.out)])
        self.bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)  # fake_trainer?"])
        wait_for(lambda: Path(str(self.record) + ".pid").exists(), what="trainer start")
        self.port = free_port()
        env = {**os.environ, **sandbox.client_env(), "POD_NAME": pod, "POD_NAMESPACE": "default"}
        env.pop("KUBECONFIG", None)
        self.log = tmp_path / "sidecar.log"
        with self.log.open("w") as handle:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agent.cli", "sidecar", "--out", str(self.out), "--address", "ip",
                 "--debounce", debounce, "--trainer-match", r"fake_trainer\.py", "--health-port", str(self.port),
                 "--health-topology",
                 "--health-host", "127.0.0.1", *extra], env=env, stderr=handle)
        wait_for(lambda: self.get("/readyz")[0] == 200, what="sidecar ready")

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


def add_worker(sandbox, index, ip_index):
    pod = examples.volcano_job("demo", (("master", 1), ("worker", index + 1)))[-1]
    pod["status"].update(podIP=examples.loopback_ip(ip_index), podIPs=[{"ip": examples.loopback_ip(ip_index)}])
    sandbox.create_pod(pod)


def test_start_from_init_files_rewrites_nothing_and_signals_nobody(job):
    assert generation(job.out) == 1
    time.sleep(0.5)
    assert generation(job.out) == 1 and job.signals() == []


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


def test_scale_down_delete_terminate_and_replace_are_followed(job, sandbox):
    # Each change waits for the signal of the one before: two SIGUSR1 pending at once are one (POSIX), and on a
    # loaded machine the trainer may not run between two rewrites 30 ms apart.
    sandbox.delete_pod("default", "demo-worker-1")
    wait_for(lambda: generation(job.out) == 2 and job.env()["WORLD_SIZE"] == "2", what="scale down")
    wait_for(lambda: len(job.signals()) == 1, what="the first signal")
    add_worker(sandbox, 1, 20)  # replacement with a new IP
    wait_for(lambda: generation(job.out) == 3, what="replacement")
    assert json.loads((job.out / "topology.json").read_text())["members"][2]["address"] == examples.loopback_ip(20)
    wait_for(lambda: len(job.signals()) == 2, what="the second signal")
    sandbox.update_pod("default", "demo-worker-1",
                       lambda p: p["metadata"].__setitem__("deletionTimestamp", "2026-11-22T01:00:00Z"))
    wait_for(lambda: generation(job.out) == 4 and job.env()["WORLD_SIZE"] == "2", what="terminating excluded")
    wait_for(lambda: len(job.signals()) == 3, what="three signals")
    assert [line.split()[1] for line in job.signals()] == ["2", "3", "4"]


def test_an_unchanged_relist_after_410_triggers_nothing(job, sandbox):
    sandbox.faults(down_for=1.0)  # while the sidecar is away, a change that moves no one, then compaction
    sandbox.update_pod("default", "demo-worker-1", lambda p: p["metadata"]["annotations"].__setitem__("note", "x"))
    sandbox.faults(compact=True)
    wait_for(lambda: "topology_agent_relists_total 1.0" in job.get("/metrics")[1], what="relist")
    time.sleep(0.3)
    assert generation(job.out) == 1 and job.signals() == []


def test_changes_during_a_dropped_watch_a_410_and_5xx_are_not_lost(job, sandbox):
    sandbox.faults(status=500, count=2, path="/pods")
    sandbox.faults(drop_watches=True)
    add_worker(sandbox, 2, 30)  # while the sidecar is disconnected and failing
    wait_for(lambda: generation(job.out) == 2, what="catch-up after 5xx")
    sandbox.faults(down_for=1.0)
    sandbox.delete_pod("default", "demo-worker-2")
    sandbox.faults(compact=True)  # and the version it resumes from is gone: 410, relist
    wait_for(lambda: generation(job.out) == 3 and job.env()["WORLD_SIZE"] == "3", timeout=20,
             what="catch-up after outage and 410")
    assert (job.out / "torch.env").read_text().count("export WORLD_SIZE='3'") == 1


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


def test_debounce_coalesces_a_burst_into_one_generation(sandbox, tmp_path):
    create_volcano_job(sandbox, (("master", 1), ("worker", 1)))
    running = Running(sandbox, tmp_path, debounce="0.8")
    try:
        for i in range(1, 4):
            add_worker(sandbox, i, 60 + i)
        wait_for(lambda: generation(running.out) == 2 and running.env()["WORLD_SIZE"] == "5", what="one rewrite")
        time.sleep(1.0)
        assert generation(running.out) == 2
        wait_for(lambda: running.signals() == ["SIGUSR1 2"], what="one signal")
    finally:
        running.stop()


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
                                "--debounce", "0", "--trainer-match", r"train\.py", "--health-port", "0"],
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


def test_with_a_published_topology_only_the_leader_watches_pods_and_followers_follow(sandbox, tmp_path):
    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 3)))
    for pod in pods:
        code, err = finish(start_init(sandbox, pod["metadata"]["name"], tmp_path / pod["metadata"]["name"],
                                      "--address", "ip", "--source", "published"))
        assert code == 0, err
    sidecars = {}
    for name in ("demo-master-0", "demo-worker-2"):
        env = {**os.environ, **sandbox.client_env(), "POD_NAME": name, "POD_NAMESPACE": "default"}
        env.pop("KUBECONFIG", None)
        log = (tmp_path / f"{name}.log").open("w")
        sidecars[name] = (subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "sidecar", "--out", str(tmp_path / name), "--address", "ip",
             "--debounce", "0", "--signal", "none", "--health-port", "0"], env=env, stderr=log), log)
    try:
        wait_for(lambda: "(follower)" in (tmp_path / "demo-worker-2.log").read_text()
                 and "started publishing" in (tmp_path / "demo-master-0.log").read_text(), what="modes chosen")
        agent = "topology-agent/0.1.0 sidecar (default/demo-worker-2)"
        wait_for(lambda: sandbox.stats()["byAgent"].get(agent, {}).get("watches", 0) >= 1, what="follower watching")
        sandbox.reset_stats()
        add_worker(sandbox, 3, 80)
        follower_out = tmp_path / "demo-worker-2"
        wait_for(lambda: generation(follower_out) == 2, what="the follower follows the leader's publication")
        env = json.loads((follower_out / "topology.json").read_text())["env"]
        assert env["WORLD_SIZE"] == "5" and env["NODE_RANK"] == "3"
        assert (follower_out / "hostfile").read_text() == (tmp_path / "demo-master-0" / "hostfile").read_text()
        stats = sandbox.stats()["byAgent"]
        assert "topology-agent/0.1.0 sidecar (default/demo-worker-2)" not in stats or \
            stats["topology-agent/0.1.0 sidecar (default/demo-worker-2)"]["requests"] == 0  # the watch was open
    finally:
        for proc, log in sidecars.values():
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0
            log.close()


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


def configmap(sandbox, name: str) -> dict:
    return sandbox.sandbox.store.get("/v1/configmaps", "default", name)


def policy_admits(sandbox, operation: str, writer: str, obj: dict, old: dict | None) -> bool:
    """What manifests/policy says of the agent's real write ``obj`` (over ``old``) by pod ``writer``'s bound token,
    evaluated by a real CEL engine (tests/vap.py); Deny is raised with the policy's message."""
    from tests.vap import Policy, agent_request

    pod = sandbox.sandbox.store.get("/v1/pods", "default", writer)
    request = agent_request(operation, namespace="default", pod=writer, pod_uid=pod["metadata"]["uid"],
                            name=obj["metadata"]["name"])
    return Policy().admit(request, obj, old)


def published_job(sandbox, tmp_path, workers, *extra):
    pods = create_volcano_job(sandbox, (("master", 1), ("worker", workers)))
    for pod in pods:
        code, err = finish(start_init(sandbox, pod["metadata"]["name"], tmp_path / pod["metadata"]["name"],
                                      "--address", "ip", "--source", "published", *extra))
        assert code == 0, err
    return pods


def world(out: Path) -> tuple[str, str]:
    env = json.loads((out / "topology.json").read_text())["env"]
    return env["WORLD_SIZE"], env["MASTER_ADDR"]


def test_a_follower_receives_only_the_journal_and_the_leader_names_its_standbys(sandbox, tmp_path):
    """Issue 13: each change reached every follower as the whole snapshot (88 KiB at 4096 pods)."""
    published_job(sandbox, tmp_path, 7)
    procs = {n: start_sidecar(sandbox, tmp_path, n) for n in ("demo-master-0", "demo-worker-0", "demo-worker-5")}
    try:
        wait_for(lambda: "(candidate)" in (tmp_path / "demo-worker-0.log").read_text(), what="standby named")
        agent = "topology-agent/0.1.0 sidecar (default/demo-worker-5)"
        wait_for(lambda: sandbox.stats()["byAgent"].get(agent, {}).get("watches", 0) >= 1, what="follower watching")
        assert "(follower)" in (tmp_path / "demo-worker-5.log").read_text()
        snapshot = sandbox.sandbox.store.get("/v1/configmaps", "default", "demo-topology")
        sandbox.reset_stats()
        add_worker(sandbox, 7, 90)
        wait_for(lambda: world(tmp_path / "demo-worker-5")[0] == "9", what="the follower sees the new worker")
        follower = sandbox.stats()["byAgent"][agent]
        assert follower["requests"] == 0  # its watch was open already
        assert follower["bytes"] < len(json.dumps(snapshot))  # the journal, not the snapshot
        journal = sandbox.sandbox.store.get("/v1/configmaps", "default", "demo-topology-journal")
        assert journal["data"]["leader"] == "demo-master-0"
        assert journal["data"]["standby"] == "demo-worker-0,demo-worker-1"
        # Issue 23, H3: the leader's real objects pass the admission policy as a CREATE by its own pod's token
        for name in ("demo-topology", "demo-topology-journal"):
            assert policy_admits(sandbox, "CREATE", "demo-master-0", configmap(sandbox, name), None)
    finally:
        stop_sidecars(procs)


def test_without_rbac_for_leases_the_leader_still_publishes_without_failover(sandbox, tmp_path):
    """RBAC from before the Lease (no leases rule): init says the topology is published without failover; the
    leader named in the journal must then keep publishing, not wait for a Lease it cannot read."""
    sandbox.faults(status=403, path="/leases", count=-1)
    published_job(sandbox, tmp_path, 5)
    procs = {n: start_sidecar(sandbox, tmp_path, n) for n in ("demo-master-0", "demo-worker-3")}
    try:
        wait_for(lambda: "(follower)" in (tmp_path / "demo-worker-3.log").read_text(), what="follower up")
        wait_for(lambda: "without failover" in (tmp_path / "demo-master-0.log").read_text(), what="leader's notice")
        add_worker(sandbox, 5, 91)
        wait_for(lambda: world(tmp_path / "demo-worker-3")[0] == "7", what="the follower sees the new worker")
    finally:
        stop_sidecars(procs)


@pytest.mark.parametrize("how", ["crash", "sigterm"])
def test_when_the_leader_goes_a_standby_takes_over_and_followers_see_the_new_membership(sandbox, tmp_path, how):
    """Issue 13: followers kept the last membership forever when the leader pod went away."""
    published_job(sandbox, tmp_path, 5)
    procs = {n: start_sidecar(sandbox, tmp_path, n, "--lease-seconds", "3")
             for n in ("demo-master-0", "demo-worker-0", "demo-worker-1", "demo-worker-4")}
    try:
        wait_for(lambda: "(candidate)" in (tmp_path / "demo-worker-1.log").read_text(), what="standby named")
        wait_for(lambda: "started publishing" in (tmp_path / "demo-master-0.log").read_text(), what="leader up")
        # The follower must follow the journal before the leader goes (a follower that starts after the leader's
        # pod is deleted refuses the copy its writer no longer vouches for, issue 23, and reads the pods).
        wait_for(lambda: "(follower)" in (tmp_path / "demo-worker-4.log").read_text(), what="follower following")
        before = world(tmp_path / "demo-worker-4")
        published_before = {n: configmap(sandbox, n) for n in ("demo-topology", "demo-topology-journal")}
        leader, leader_log = procs.pop("demo-master-0")
        if how == "crash":
            leader.kill()  # no release: the standbys wait out the lease
        else:
            leader.send_signal(signal.SIGTERM)
        assert leader.wait(15) in (0, -signal.SIGKILL)
        leader_log.close()
        sandbox.delete_pod("default", "demo-master-0")
        wait_for(lambda: world(tmp_path / "demo-worker-4")[0] == "5", timeout=30,
                 what="the follower sees the leader gone")
        after = world(tmp_path / "demo-worker-4")
        assert before[0] == "6" and after[1] != before[1]  # a new rank 0, a new MASTER_ADDR
        took = [n for n in ("demo-worker-0", "demo-worker-1")
                if "started publishing" in (tmp_path / f"{n}.log").read_text()]
        assert len(took) == 1
        lease = sandbox.sandbox.store.get("coordination.k8s.io/v1/leases", "default", "demo-topology")
        assert lease["spec"]["holderIdentity"] == took[0] and lease["spec"]["leaseTransitions"] >= 1
        # Issue 23, H3: the new publisher's real writes pass the admission policy as an UPDATE by its own pod
        # (a standby the previous leader named), journal and snapshot alike.
        wait_for(lambda: configmap(sandbox, "demo-topology")["data"]["leader"] == took[0], what="snapshot rewritten")
        from tests.vap import Deny

        for name, old in published_before.items():
            assert policy_admits(sandbox, "UPDATE", took[0], configmap(sandbox, name), old)
            with pytest.raises(Deny, match=r"only the pod named in data\.leader"):  # the same write by a follower
                policy_admits(sandbox, "UPDATE", "demo-worker-4", configmap(sandbox, name), old)
        if how == "sigterm":
            assert "released lease demo-topology" in (tmp_path / "demo-master-0.log").read_text()
    finally:
        stop_sidecars(procs)


def test_sigterm_while_the_api_is_down_at_start_exits_0_at_once(sandbox, tmp_path):
    # Issue 12: the start-up retry loop ignored SIGTERM; the pod then waited for its grace period's SIGKILL.
    create_volcano_job(sandbox, (("master", 1), ("worker", 1)))
    sandbox.faults(down_for=60)
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": "demo-worker-0", "POD_NAMESPACE": "default"}
    env.pop("KUBECONFIG", None)
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "sidecar", "--out", str(tmp_path / "out"),
                             "--health-port", "0"], env=env, stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)
    assert proc.poll() is None, "the sidecar keeps retrying while the API is down"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=5)
    assert proc.returncode == 0, err
    assert "stopped before the first list" in err


def test_a_pod_with_the_jobs_labels_only_neither_joins_nor_freezes_the_sidecar(job, sandbox):
    """Issue 23, H2: a rogue pod with a duplicate index froze a running sidecar (readyz 503) until deleted."""
    rogue = examples.volcano_job("demo", (("master", 1), ("worker", 1)))[1]
    rogue["metadata"]["name"] = "rogue-dup"
    rogue["metadata"].pop("ownerReferences")
    rogue["spec"]["hostname"] = "rogue-dup"
    rogue["status"].update(podIP=examples.loopback_ip(80), podIPs=[{"ip": examples.loopback_ip(80)}])
    sandbox.create_pod(rogue)
    wait_for(lambda: "leaving out a pod that is not the job's: pod 'rogue-dup'" in job.log.read_text(),
             what="the rogue pod refused")
    assert job.get("/readyz")[0] == 200 and generation(job.out) == 1
    add_worker(sandbox, 2, 81)  # the job's own pod still joins
    wait_for(lambda: generation(job.out) == 2, what="generation 2")
    assert job.env()["WORLD_SIZE"] == "4" and examples.loopback_ip(80) not in (job.out / "hostfile").read_text()


def test_a_follower_leaves_a_journal_that_a_pod_of_another_job_rewrote_and_follows_the_pods(sandbox, tmp_path):
    """Issue 23, H3: a journal rewritten by a writer that is not a member of the job (here another job's pod, in
    a namespace without the admission policy) was applied by every follower. A new writer is now read once
    before its journal is used: this one is refused in one line, and the follower follows the pods, so the
    job's changes still reach it."""
    published_job(sandbox, tmp_path, 3)
    other = sandbox.create_pod(examples.volcano_job("other", (("master", 1),))[0])
    procs = {n: start_sidecar(sandbox, tmp_path, n) for n in ("demo-worker-2",)}
    try:
        log = tmp_path / "demo-worker-2.log"
        wait_for(lambda: "(follower)" in log.read_text(), what="following the journal")
        journal = sandbox.sandbox.store.get("/v1/configmaps", "default", "demo-topology-journal")
        journal["data"].update(leader="other-master-0", leaderUid=other["metadata"]["uid"])
        journal["metadata"].pop("resourceVersion")
        sandbox.sandbox.store.replace("/v1/configmaps", "default", "demo-topology-journal", journal)
        wait_for(lambda: "the published topology is not used (configmap demo-topology-journal: its writer, pod "
                         "'other-master-0', belongs to job 'other', not 'demo'" in log.read_text(),
                 what="the forged journal refused")
        wait_for(lambda: "following the pods from now on" in log.read_text(), what="the switch to the pods")
        add_worker(sandbox, 3, 81)
        wait_for(lambda: world(tmp_path / "demo-worker-2")[0] == "5", what="the follower sees the new worker")
    finally:
        stop_sidecars(procs)
    # a follower that starts now (the same pod's sidecar, restarted) refuses the copy at once
    procs = {n: start_sidecar(sandbox, tmp_path, n) for n in ("demo-worker-2",)}
    try:
        log = tmp_path / "demo-worker-2.log"
        wait_for(lambda: log.exists() and "(pods)" in log.read_text(), what="the pods followed from the start")
        assert "the published topology is not used (configmap demo-topology-journal: its writer" in log.read_text()
    finally:
        stop_sidecars(procs)


def test_a_leader_re_created_under_a_new_uid_rewrites_the_publication_and_followers_use_it(sandbox, tmp_path):
    """Issue 23, H3: readers accept a copy only from the pod that holds the writer's name *and* uid. Volcano
    re-creates a failed pod under its name with a new uid: the new leader's sidecar must not be locked out by
    its earlier incarnation's copy. It stays the candidate, rewrites the snapshot first and then the journal under
    its new uid (the policy admits it: the name is the leader's), and a follower that starts then uses them."""
    pods = published_job(sandbox, tmp_path, 3)
    old_uid = sandbox.sandbox.store.get("/v1/configmaps", "default", "demo-topology")["data"]["leaderUid"]
    earlier = {n: configmap(sandbox, n) for n in ("demo-topology", "demo-topology-journal")}
    sandbox.delete_pod("default", "demo-master-0")
    reborn = copy.deepcopy(pods[0])
    reborn["metadata"]["uid"] = "6f1e2d3c-0000-4000-8000-00000000abcd"
    sandbox.create_pod(reborn)
    procs = {"demo-master-0": start_sidecar(sandbox, tmp_path, "demo-master-0")}
    try:
        def rewritten() -> bool:
            store = sandbox.sandbox.store
            return all(store.get("/v1/configmaps", "default", name)["data"]["leaderUid"] == reborn["metadata"]["uid"]
                       for name in ("demo-topology", "demo-topology-journal"))
        wait_for(rewritten, what="the snapshot and the journal rewritten under the new uid")
        assert old_uid == pods[0]["metadata"]["uid"] != reborn["metadata"]["uid"]
        for name, old in earlier.items():  # the policy admits the new incarnation's rewrite (the leader's name)
            assert policy_admits(sandbox, "UPDATE", "demo-master-0", configmap(sandbox, name), old)
        procs["demo-worker-2"] = start_sidecar(sandbox, tmp_path, "demo-worker-2")
        log = tmp_path / "demo-worker-2.log"
        wait_for(lambda: "(follower)" in log.read_text(), what="the follower follows the journal")
        add_worker(sandbox, 3, 82)
        wait_for(lambda: world(tmp_path / "demo-worker-2")[0] == "5", what="the follower sees the new worker")
        assert "not used" not in log.read_text()
    finally:
        stop_sidecars(procs)


def test_with_view_own_a_follower_reads_the_summary_alone_and_follows_changes_and_a_takeover(sandbox, tmp_path):
    """Issue 24: a follower read the whole snapshot twice and rewrote every file; with --view own it reads the
    journal's summary (never the snapshot), writes torch.env equal to the full view's, and follows a new worker
    and a new rank 0. The pods that hold every pod (the leader, its standbys) write the same three files, made
    from their own plan's summary: one shape of files across the job."""
    published_job(sandbox, tmp_path, 7, "--view", "own")  # every pod with the job's options: the leader summarizes
    light_files = ["generation", "topology.json", "torch.env"]
    for pod in ("demo-master-0", "demo-worker-0", "demo-worker-6"):  # the leader, a standby, a follower
        assert sorted(p.name for p in (tmp_path / pod).iterdir()) == light_files, pod
        assert json.loads((tmp_path / pod / "topology.json").read_text())["view"] == "own"
    light = tmp_path / "light"
    code, err = finish(start_init(sandbox, "demo-worker-5", light, "--address", "ip", "--source", "published",
                                  "--view", "own"))
    assert code == 0, err
    assert "waiting for the leader to publish its summary" in err and "not used" not in err
    assert sorted(p.name for p in light.iterdir()) == ["generation", "topology.json", "torch.env"]
    full = tmp_path / "full"
    code, err = finish(start_init(sandbox, "demo-worker-5", full, "--address", "ip", "--source", "published"))
    assert code == 0, err
    full_env = json.loads((full / "topology.json").read_text())["env"]
    assert json.loads((light / "topology.json").read_text())["env"] == full_env  # 7 workers: lists are kept

    env = {**os.environ, **sandbox.client_env(), "POD_NAME": "demo-worker-5", "POD_NAMESPACE": "default"}
    env.pop("KUBECONFIG", None)
    procs = {n: start_sidecar(sandbox, tmp_path, n, "--lease-seconds", "3", "--view", "own")
             for n in ("demo-master-0", "demo-worker-0", "demo-worker-1")}
    log = (tmp_path / "light.log").open("w")
    procs["light"] = (subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "sidecar", "--out", str(light), "--address", "ip", "--debounce", "0",
         "--signal", "none", "--health-port", "0", "--lease-seconds", "3", "--view", "own"], env=env, stderr=log),
        log)
    try:
        wait_for(lambda: "started publishing" in (tmp_path / "demo-master-0.log").read_text(), what="leader up")
        wait_for(lambda: "(follower)" in (tmp_path / "light.log").read_text(), what="light follower up")
        agent = "topology-agent/0.1.0 sidecar (default/demo-worker-5)"
        wait_for(lambda: sandbox.stats()["byAgent"].get(agent, {}).get("watches", 0) >= 1, what="watching")
        assert generation(light) == 1  # the summary places it where init did: nothing rewritten
        add_worker(sandbox, 7, 90)
        wait_for(lambda: world(light)[0] == "9", what="the light follower sees the new worker")
        for pod in ("demo-master-0", "demo-worker-0"):  # the leader's and a standby's sidecars, from the pods
            wait_for(lambda pod=pod: world(tmp_path / pod) == world(light), what=f"{pod} sees the new worker")
            assert sorted(p.name for p in (tmp_path / pod).iterdir()) == light_files, pod
            env = json.loads((tmp_path / pod / "topology.json").read_text())["env"]
            assert env["NODE_RANK"] == ("0" if pod == "demo-master-0" else "1") and "VC_WORKER_HOSTS" in env
        leader, leader_log = procs.pop("demo-master-0")
        leader.kill()
        leader.wait(15)
        leader_log.close()
        before = world(light)
        sandbox.delete_pod("default", "demo-master-0")
        wait_for(lambda: world(light)[0] == "8", timeout=30, what="the light follower sees the leader gone")
        assert world(light)[1] != before[1]  # a new rank 0, a new MASTER_ADDR
        assert sorted(p.name for p in light.iterdir()) == ["generation", "topology.json", "torch.env"]
        text = (tmp_path / "light.log").read_text()
        assert "not used" not in text and "reading the whole topology" not in text
    finally:
        stop_sidecars(procs)


def test_with_view_own_but_no_summary_published_a_pod_says_so_and_reads_the_whole_topology(sandbox, tmp_path):
    published_job(sandbox, tmp_path, 4)  # the leader without --view own publishes no summary
    out = tmp_path / "light"
    code, err = finish(start_init(sandbox, "demo-worker-3", out, "--address", "ip", "--source", "published",
                                  "--view", "own"))
    assert code == 0, err
    assert "--view own not used: the leader published no summary" in err
    assert (out / "hostfile").read_text() == (tmp_path / "demo-worker-3" / "hostfile").read_text()
    assert (out / "torch.env").read_text() == (tmp_path / "demo-worker-3" / "torch.env").read_text()
