"""init in this process against the sandbox's API in memory (tests/fakeapi.py): the real ``run_init`` with the
settings its flags give, the real client and reflector, real API semantics; no socket, no process. One init per
pod runs in a thread of its own where pods of a job wait together. tests/integration/test_init.py keeps the
scenarios that need real processes and real HTTPS."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import time
from pathlib import Path

import pytest

from agent import examples
from tests.fakeapi import agent_name, init_pod
from tests.jobs import configmap, create_volcano_job, forge_publication, rogue


@pytest.mark.slow  # seconds of real waiting (backoffs, a timeout): the whole suite runs it
def test_a_missing_pod_times_out_naming_it(memory, api, logs, tmp_path):
    pods = create_volcano_job(memory, (("master", 1), ("worker", 3)))
    memory.delete_pod("default", "demo-worker-2")
    ran = init_pod(api, logs, pods[0]["metadata"]["name"], tmp_path / "out", "--timeout", "3")
    assert ran.code == 4
    last = ran.err.strip().splitlines()[-1]
    assert re.search(r"timed out after 3\.\d s \(--timeout 3\) waiting for the gang: 3 of 4 training pods "
                     r"present; missing: worker 2", last), last
    assert not list((tmp_path / "out").iterdir())


def test_a_role_named_in_roles_that_no_pod_has_is_refused_in_one_line(memory, api, logs, tmp_path, monkeypatch):
    create_volcano_job(memory, (("master", 1), ("worker", 2)))
    monkeypatch.setenv("TOPOLOGY_ROLES", "mastr,worker")
    ran = init_pod(api, logs, "demo-worker-0", tmp_path / "out", "--timeout", "20")
    assert ran.code == 2, ran.err
    errors = [line for line in ran.err.strip().splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in ran.err and "\n" not in str(ran.error)
    assert "TOPOLOGY_ROLES names 'mastr', but Job 'demo' has no such role (roles present: master, worker)" \
           in errors[0]
    assert not list((tmp_path / "out").iterdir())


def test_forbidden_gives_one_line_naming_verb_resource_namespace_and_rbac(memory, api, logs, tmp_path):
    create_volcano_job(memory, (("master", 1), ("worker", 1)))
    memory.faults(status=403)
    ran = init_pod(api, logs, "demo-worker-0", tmp_path / "out", "--timeout", "30")
    assert ran.code == 3
    lines = [line for line in ran.err.strip().splitlines() if "error:" in line]
    assert len(lines) == 1 and "\n" not in str(ran.error)
    assert "refused get pod 'demo-worker-0' in namespace 'default' (403" in lines[0]
    assert "manifests/rbac" in lines[0]
    assert "retry" not in ran.err


def test_429_with_retry_after_is_honoured_then_succeeds(memory, api, logs, tmp_path):
    create_volcano_job(memory, (("master", 1), ("worker", 1)))
    memory.faults(status=429, count=2, retry_after=1)
    waits: list[float] = []
    ran = init_pod(api, logs, "demo-master-0", tmp_path / "out", "--timeout", "60", sleep=waits.append)
    assert ran.code == 0, ran.err
    # Retry-After is honoured as the least wait; up to 50 % jitter spreads the pods that got it together.
    assert ran.err.count("API answered 429") == 2 and re.search(r"retry 2 in 1\.[0-5] s", ran.err), ran.err
    assert len(waits) == 2 and sum(waits) >= 2.0 and all(1.0 <= wait <= 1.5 for wait in waits), waits


def test_an_api_that_resets_connections_at_start_is_retried_until_it_answers(memory, api, logs, tmp_path):
    """The API server away at start (tests/integration keeps it down for real): each connection closed without
    an answer is 'unreachable', retried with backoff, until it answers."""
    create_volcano_job(memory, (("master", 1), ("worker", 1)))
    memory.faults(status=503, count=3, reset=True)
    waits: list[float] = []
    ran = init_pod(api, logs, "demo-worker-0", tmp_path / "out", "--timeout", "60", sleep=waits.append)
    assert ran.code == 0, ran.err
    assert "unreachable" in ran.err and "retry 1 in" in ran.err and "retry 3 in" in ran.err
    assert len(waits) == 3 and waits[0] < waits[1] < waits[2]  # 0.8 s doubling, jittered by at most half
    assert (tmp_path / "out" / "torch.env").is_file()


@pytest.mark.slow  # seconds of real waiting (backoffs, a timeout): the whole suite runs it
def test_watch_resumes_after_a_dropped_stream_and_relists_after_410(memory, api, logs, inits, tmp_path):
    pods = create_volcano_job(memory, (("master", 1), ("worker", 2)), with_ips=False)
    who = inits.start("demo-master-0", tmp_path / "out", "--address", "ip", "--timeout", "60")
    api.notice.wait_until(lambda: api.watching(agent_name("init", "demo-master-0"), "/api/v1/namespaces/default/pods"),
                          what="init watching")
    memory.set_pod_ip("default", "demo-master-0", examples.loopback_ip(0))
    memory.faults(drop_watches=True)
    memory.set_pod_ip("default", "demo-worker-0", examples.loopback_ip(1))  # happens while disconnected
    memory.faults(compact=True)  # and its resourceVersion is forgotten: the resume gets 410
    memory.set_pod_ip("default", "demo-worker-1", examples.loopback_ip(2))
    ran = inits.finish(who)
    assert ran.code == 0, ran.err
    assert "listing again" in ran.err  # the 410: a relist, which saw what happened meanwhile
    doc = json.loads((tmp_path / "out" / "topology.json").read_text())
    assert [m["address"] for m in doc["members"]] == [examples.loopback_ip(i) for i in range(3)]
    assert len(pods) == 3


def test_wait_dns_refuses_a_headless_service_that_hides_not_ready_pods(memory, api, logs, tmp_path):
    create_volcano_job(memory, (("master", 1), ("worker", 1)))
    memory.create("/v1/services", "default", {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "demo"},
                                              "spec": {"clusterIP": "None", "selector": {"app": "x"}}})
    ran = init_pod(api, logs, "demo-worker-0", tmp_path / "out", "--wait-dns", "--timeout", "20")
    assert ran.code == 2
    assert "publishNotReadyAddresses" in ran.err.strip().splitlines()[-1]


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


@pytest.mark.slow  # seconds of real waiting (backoffs, a timeout): the whole suite runs it
def test_slow_api_responses_delay_init_but_it_completes(memory, api, logs, tmp_path):
    create_volcano_job(memory, (("master", 1), ("worker", 1)))
    memory.faults(delay=1.0, delay_count=3)
    started = time.monotonic()
    ran = init_pod(api, logs, "demo-worker-0", tmp_path / "out", "--timeout", "30")
    assert ran.code == 0, ran.err
    assert memory.sandbox.faults.delay_count == 0  # three answers delayed ...
    assert time.monotonic() - started >= 3.0  # ... a second each, all waited for
    assert (tmp_path / "out" / "torch.env").is_file()


def waiting(api, pod: str) -> bool:
    """``pod``'s init waits on its watch: of the pods (the gang) or of the published ConfigMaps."""
    return any(api.watching(agent_name("init", pod), f"/api/v1/namespaces/default/{what}")
               for what in ("pods", "configmaps"))


def lease_calls(api, pod: str) -> list[str]:
    """The verbs of the requests ``pod``'s init made to the publisher Lease."""
    return [request.verb for agent, request in api.requests
            if agent == agent_name("init", pod) and "/leases" in request.path]


def test_published_source_gives_every_pod_the_same_files_for_a_fraction_of_the_bytes(memory, api, logs, inits,
                                                                                       tmp_path):
    pods = create_volcano_job(memory, (("master", 1), ("worker", 5), ("extras", 2)))
    names = [p["metadata"]["name"] for p in pods]
    last = next(p for p in pods if p["metadata"]["name"] == "demo-worker-4")
    results = {}
    for source in ("pods", "published"):
        memory.reset_stats()
        api.requests.clear()
        memory.opened.clear()  # the watches of the round before
        memory.delete_pod("default", "demo-worker-4")
        # every other init at once, rank 0's last: the first training pod's init to run leads (the Lease's create
        # decides between those that race), the others wait for its publication; the last pod comes once each
        # of them waits on its watch, and its init starts after the gang is complete
        started = [inits.start(n, tmp_path / source / n, "--source", source, "--timeout", "60")
                   for n in reversed(names) if n != "demo-worker-4"]
        api.notice.wait_until(lambda: all(waiting(api, n) for n in names if n != "demo-worker-4"),
                              what="every init waiting")
        memory.create_pod(last)
        started.append(inits.start("demo-worker-4", tmp_path / source / "demo-worker-4", "--source", source,
                                   "--timeout", "60"))
        for who in started:
            ran = inits.finish(who)
            assert ran.code == 0, ran.err
        stats = memory.stats()["byAgent"]
        results[source] = {name: ((tmp_path / source / name / "torch.env").read_text(),
                                  stats[agent_name("init", name)]) for name in names}
    for name in names:
        assert results["published"][name][0] == results["pods"][name][0], name
    publisher = configmap(memory, "demo-topology")["data"]["leader"]
    lease = memory.sandbox.store.get("coordination.k8s.io/v1/leases", "default", "demo-topology")
    assert lease["spec"]["holderIdentity"] == publisher and publisher.startswith(("demo-master-", "demo-worker-"))
    for name in names:
        if name == publisher:
            continue
        follower, looked = results["published"][name][1], lease_calls(api, name)
        # get pod, get owner, list the published objects, get their writer pod (who wrote them); a pod in its own
        # view that lists before the leader has published also asks whether the journal is there (its metadata
        # only, a few hundred bytes: a deleted summary is read around, one not published yet is waited for). A pod
        # that does not train lists the whole topology after the summary told it its files name every member.
        assert follower["requests"] - follower["watches"] - len(looked) <= (6 if "extras" in name else 5), name
        # and the Lease: a training pod reads it once, and only an init that raced the publisher for it writes (a
        # create that got 409, then a second look); a guard (rank 0 and the first three workers,
        # core/publication/leading.py) looks again before each of its watches; a pod that does not train never looks
        first, later = (looked[:3], looked[3:]) if looked[1:2] == ["create"] else (looked[:1], looked[1:])
        if "extras" in name:
            assert looked == [], name
        else:
            assert first in (["get"], ["get", "create", "get"]) and set(later) <= {"get"}, (name, looked)
            assert not later or name in ("demo-master-0", "demo-worker-0", "demo-worker-1", "demo-worker-2"), name
        assert follower["bytes"] < results["pods"][name][1]["bytes"] / 2
    leader, took = results["published"][publisher][1], lease_calls(api, publisher)
    # get pod, get owner, list pods; create the snapshot, the journal and the summary; and, having taken the
    # Lease, a GET of the summary (a 404: no copy of an earlier incarnation to leave to its writer, as the
    # leader's files come from the pods it lists whatever is there). The Lease: read, created, and renewed every
    # 2 s while the leader waited, if it did
    assert leader["requests"] - leader["watches"] - len(took) == 7
    assert took[:2] == ["get", "create"] and set(took[2:]) <= {"update"}, took
    configmap_ = memory.sandbox.store.get("/v1/configmaps", "default", "demo-topology")
    assert configmap_["metadata"]["ownerReferences"][0]["kind"] == "Job"


def test_init_takes_run_launcher_as_worker_and_slots_from_the_mpijob(memory, api, logs, tmp_path):
    owner = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": "allreduce",
             "namespace": "default", "uid": examples.owner_uid("mpijob", "default", "allreduce")},
             "spec": {"slotsPerWorker": 4, "runLauncherAsWorker": True,
                      "mpiReplicaSpecs": {"Launcher": {"replicas": 1}, "Worker": {"replicas": 2}}}}
    memory.create("kubeflow.org/v2beta1/mpijobs", "default", owner)
    for pod in examples.mpijob(workers=2):
        memory.create_pod(pod)
    ran = init_pod(api, logs, "allreduce-worker-0", tmp_path / "out", "--timeout", "30")
    assert ran.code == 0, ran.err
    assert "MPIJob runLauncherAsWorker: the launcher is node rank 0" in ran.err
    assert (tmp_path / "out" / "hostfile").read_text().splitlines() == [
        "allreduce-launcher.allreduce slots=4", "allreduce-worker-0.allreduce slots=4",
        "allreduce-worker-1.allreduce slots=4"]
    document = json.loads((tmp_path / "out" / "topology.json").read_text())
    env = document["env"]
    assert (env["NODE_RANK"], env["RANK"], env["WORLD_SIZE"], env["NPROC_PER_NODE"]) == ("1", "1", "3", "4")
    assert document["processes"] == 12 and [m["rank"] for m in document["members"][:3]] == [0, 4, 8]


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
    from agent.core.plan.gang import Expectation
    from agent.runtime.init import LINGER, Init, InitSettings, decide
    from agent.runtime.init.gang import wait_for_gang

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
    _, gang = asyncio.run(wait_for_gang(init, pods[0], decide(pods[0], settings, expected, ()), expected, None))
    assert gang.tracker.status().ready
    last = 1.0 + gap * (n - 2)
    if lingers:
        assert 0.002 * n / LINGER / 2 <= len(arrivals.sleeps) <= 0.002 * n / LINGER + 2  # ~one read per LINGER
        assert arrivals.now <= last + LINGER  # the last pod's event handled at most LINGER late ...
        assert all(at < last - 0.002 * (n // 100 - 1) for at, _ in arrivals.sleeps)  # ... no pause for the last 1 %
    else:
        assert arrivals.sleeps == [] and arrivals.now == last


def test_expect_below_the_pods_present_says_every_pod_is_a_member(memory, api, logs, tmp_path):
    """init --expect 2 with 4 training pods used to log 'gang complete: 4 of 2'."""
    create_volcano_job(memory, (("master", 1), ("worker", 3)))
    ran = init_pod(api, logs, "demo-worker-0", tmp_path / "out", "--expect", "2")
    assert ran.code == 0, ran.err
    assert "gang complete: 4 training pods present (2 expected: every present pod is a member)" in ran.err
    assert "--expect 2, but 4 training pods are present: the files name all of them" in ran.err
    assert "export WORLD_SIZE='4'" in (tmp_path / "out" / "torch.env").read_text()


def test_pods_with_the_jobs_labels_only_are_left_out_and_nobody_stalls(memory, api, logs, inits, tmp_path):
    """A rogue pod with a new index grew WORLD_SIZE and put its IP in the hostfile; one with a duplicate index
    made every init exit 2; one with role WORKER exported VC_WORKER_HOSTS twice."""
    pods = create_volcano_job(memory, (("master", 1), ("worker", 2)))
    for pod in (rogue("rogue-new", "worker", 7, 70), rogue("rogue-dup", "worker", 0, 71),
                rogue("rogue-case", "WORKER", 0, 72)):
        memory.create_pod(pod)
    started = {p["metadata"]["name"]: inits.start(p["metadata"]["name"], tmp_path / p["metadata"]["name"],
                                                  "--address", "ip", "--timeout", "30") for p in pods}
    for name, who in started.items():
        ran = inits.finish(who)
        assert ran.code == 0, ran.err
        for other in ("rogue-new", "rogue-dup", "rogue-case"):
            assert f"leaving out a pod that is not the job's: pod '{other}' has the labels of Job 'demo' but is " \
                   "not owned by it" in ran.err
        env = (tmp_path / name / "torch.env").read_text()
        assert "export WORLD_SIZE='3'" in env and env.count("VC_WORKER_HOSTS=") == 1
        assert not any(examples.loopback_ip(i) in (tmp_path / name / "hostfile").read_text() for i in (70, 71, 72))


def test_the_leader_never_follows_a_topology_someone_made_before_it(memory, api, logs, tmp_path):
    """Whoever created `<job>-topology` before the job's leader published captured the leader (its create got
    409 and it followed the copy): the pod that runs the SSH launcher got the forger's hosts."""
    from agent.core import Options
    from agent.core.publication.journal import PublishedState, Publisher
    from agent.core.publication.published import configmap_body, configmap_name, pack

    pods = create_volcano_job(memory, (("master", 1), ("worker", 2)))
    forged_pods = copy.deepcopy(pods)
    forged_pods[1]["status"].update(podIP="127.9.9.9", podIPs=[{"ip": "127.9.9.9"}])
    forger = Publisher(PublishedState(job="demo", namespace="default"), Options(address="ip"),
                       leader="demo-master-0")
    forger.change({p["metadata"]["name"]: p for p in forged_pods}, [p["metadata"]["name"] for p in forged_pods])
    memory.create("/v1/configmaps", "default", configmap_body(
        configmap_name("demo"), pack(forger.snapshot_document()), generation=forger.state.seq,
        leader="demo-master-0", owner=None))
    ran = init_pod(api, logs, "demo-master-0", tmp_path / "leader", "--source", "published", "--address", "ip",
                   "--timeout", "30", "--view", "full")  # the hostfile, as the launcher's view has it
    assert ran.code == 0, ran.err
    assert "configmap demo-topology exists already (this init ran before, or another writer made it): not " \
           "followed" in ran.err
    hostfile = (tmp_path / "leader" / "hostfile").read_text()
    assert "127.9.9.9" not in hostfile and pods[1]["status"]["podIP"] in hostfile


@pytest.mark.parametrize("view", ["full", "auto"])
@pytest.mark.parametrize("case", ["another_jobs_agent", "no_writer_named", "a_pod_not_owned"])
def test_followers_never_use_a_topology_that_no_pod_of_the_job_wrote(memory, api, logs, inits, tmp_path, case,
                                                                      view):
    """Any pod under the agent's ServiceAccount could create another job's `<job>-topology` naming itself, and the
    followers used it (MASTER_ADDR and the hosts of the forger's choosing). Each follower now reads the writer pod
    once: a copy whose writer is not a member of this job, by name and uid, is refused in one line and the
    follower reads the pods; no follower waits for a forged copy to name it. (The leader's name with another uid
    is the leader's earlier incarnation, since the policy binds the name to the token: followers wait for it to
    publish again, test_after_the_whole_job_is_re_created_... in test_sidecar.py.)"""
    pods = create_volcano_job(memory, (("master", 1), ("worker", 2)))
    if case == "another_jobs_agent":  # a running pod of another job, with its own bound token
        other = memory.create_pod(examples.volcano_job("other", (("master", 1),))[0])
        writer, uid, why = "other-master-0", other["metadata"]["uid"], "belongs to job 'other', not 'demo'"
    elif case == "no_writer_named":
        writer, uid, why = "demo-master-0", "", "does not name the pod that wrote it"
    else:  # the job's labels, made by a pod creator, but not owned by the Volcano Job
        rogue_pod = copy.deepcopy(examples.volcano_job("demo", (("master", 1),))[0])
        rogue_pod["metadata"]["name"] = "demo-master-9"
        rogue_pod["metadata"]["labels"]["volcano.sh/task-index"] = "0"
        rogue_pod["metadata"]["ownerReferences"][0]["uid"] = "not-the-jobs-uid"
        created = memory.create_pod(rogue_pod)
        writer, uid, why = "demo-master-9", created["metadata"]["uid"], "is not a member"
    forge_publication(memory, pods, writer=writer, writer_uid=uid)
    names = [p["metadata"]["name"] for p in pods]
    started = {n: inits.start(n, tmp_path / n, "--source", "published", "--address", "ip", "--timeout", "30",
                              "--view", view) for n in reversed(names)}
    ran_ = {name: inits.finish(who) for name, who in started.items()}
    # the first init to run leads (it holds the Lease) and never reads the copy it finds
    publisher = memory.sandbox.store.get("coordination.k8s.io/v1/leases", "default", "demo-topology")["spec"][
        "holderIdentity"]
    assert "configmap demo-topology exists already" in ran_[publisher].err and "not followed" in ran_[publisher].err
    for name, ran in ran_.items():
        assert ran.code == 0, ran.err
        if view == "full":
            hostfile = (tmp_path / name / "hostfile").read_text()
            assert "127.9.9.9" not in hostfile and all(p["status"]["podIP"] in hostfile for p in pods)
        env = (tmp_path / name / "torch.env").read_text()
        assert "127.9.9.9" not in env and f"export MASTER_ADDR='{pods[0]['status']['podIP']}'" in env
        if name != publisher:
            assert "the published topology is not used (configmap demo-topology" in ran.err and why in ran.err, \
                ran.err
            assert "reading the pods instead" in ran.err
            if view == "auto":  # its own view read the forged summary first, and refused it as well
                assert "the published summary is not used (configmap demo-topology" in ran.err, ran.err


def _watching_pods(api, pod: str) -> bool:
    return api.watching(agent_name("init", pod), "/api/v1/namespaces/default/pods")


def test_the_leader_builds_its_rows_while_it_waits_and_none_after_the_gang_is_complete(memory, api, logs, inits,
                                                                                        tmp_path, monkeypatch):
    """The leader's init stages each pod's row as the pod arrives (building 16384 rows after the last IP cost
    ~0.1 s on every pod's start-up path); its publication then matches what the pods say."""
    from agent.core.publication import journal as journal_module
    from agent.core.publication.journal import Publisher
    from agent.core.publication.published import decode_configmap

    pods = create_volcano_job(memory, (("master", 1), ("worker", 5), ("extras", 1)), with_ips=False)
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
    who = inits.start("demo-master-0", tmp_path / "out", "--address", "ip", "--timeout", "30", "--source",
                      "published")
    api.notice.wait_until(lambda: _watching_pods(api, "demo-master-0"), what="the leader waiting for the gang")
    for pod in reversed(pods):  # the pod that does not train first: nobody waits for it
        memory.set_pod_ip("default", pod["metadata"]["name"], ips[pod["metadata"]["name"]])
    ran = inits.finish(who)
    assert ran.code == 0, ran.err
    rendered = ran.held.rendered
    assert rendered.plan.topology.processes == 6
    assert built_in_change == []  # every row was staged while the pods arrived
    snapshot = memory.sandbox.store.get("/v1/configmaps", "default", "demo-topology")
    published = {row[0]: row[8] for row in decode_configmap(snapshot)["pods"]}
    assert published == ips  # each with the IP it got after it was first staged without one


def test_the_leaders_plan_is_carried_through_the_wait_not_made_again_once_the_gang_is_complete(memory, api, logs,
                                                                                                inits, tmp_path,
                                                                                                monkeypatch):
    """init lays the job out once, from its LIST, and follows each pod's IP into that layout; the plan once the
    last IP is in is one change away (16384 pods: ~90 ms of planning from scratch saved on every pod's start-up
    path), and it is the plan the pods make from scratch."""
    from agent.core.model import Options
    from agent.core.plan.layout import _lay_out, build_plan

    tasks = (("master", 1), ("worker", 7), ("extras", 1))
    pods = create_volcano_job(memory, tasks, with_ips=False)
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in examples.volcano_job("demo", tasks)}
    memory.set_pod_ip("default", "demo-master-0", ips["demo-master-0"])  # init runs in a pod that has its IP
    laid_out = []
    real = _lay_out
    monkeypatch.setattr("agent.core.plan.planner._lay_out",
                        lambda *a, **k: laid_out.append(k.get("provisional")) or real(*a, **k))
    who = inits.start("demo-master-0", tmp_path / "out", "--address", "ip", "--timeout", "30", "--source", "pods")
    api.notice.wait_until(lambda: _watching_pods(api, "demo-master-0"), what="the leader waiting for the gang")
    for pod in [pods[-1], *pods[1:-1]]:  # the pod that does not train first: the gang is complete at the last
        memory.set_pod_ip("default", pod["metadata"]["name"], ips[pod["metadata"]["name"]])
    ran = inits.finish(who)
    assert ran.code == 0, ran.err
    held = ran.held
    rendered = held.rendered
    assert laid_out == [True]  # once, from the LIST (every worker without its IP); never from scratch again
    planner = held.planner
    assert planner.followed >= 8 and planner.incremental == 1  # each IP as it came; the plan from that layout
    listed = memory.sandbox.store.list("/v1/pods", "default")
    assert rendered.plan == build_plan(listed, "demo-master-0", Options(address="ip"))
    assert rendered.plan.topology.processes == 8


def test_a_tf_job_named_by_dns_writes_tf_config_from_the_summary(memory, api, logs, inits, tmp_path):
    """A published TF job whose pods have DNS names (the default address): each training follower reads the summary
    alone (the workers' addresses as a template) and writes the TF_CONFIG every pod's list gives (the master is
    TF's chief); a parameter server, which does not train, reads the whole topology."""
    pods = create_volcano_job(memory, (("master", 1), ("worker", 20), ("ps", 2)))
    names = [p["metadata"]["name"] for p in pods]
    files = {}
    for source in ("pods", "published"):
        started = {n: inits.start(n, tmp_path / source / n, "--source", source, "--frameworks", "tf", "--timeout",
                                  "60") for n in names}
        ran = {n: inits.finish(who) for n, who in started.items()}
        for name in names:
            assert ran[name].code == 0, ran[name].err
        files[source] = {n: (tmp_path / source / n / "tf_config.json").read_text() for n in names}
    for name in names:
        assert files["published"][name] == files["pods"][name], name
    assert json.loads(files["pods"]["demo-worker-7"])["cluster"]["worker"][7] == "demo-worker-7.demo:2222"
    publisher = configmap(memory, "demo-topology")["data"]["leader"]
    for name in names:
        log = ran[name].err
        if name == publisher:
            continue
        if name.startswith("demo-ps-"):
            assert "reading the whole topology" in log, log
        else:
            assert "reading the whole topology" not in log and "waiting for the job's publisher" in log, log
            assert "its summary" in log, log


def test_a_follower_counts_the_dra_gpus_of_the_published_pods(memory, api, logs, tmp_path):
    """The published rows hold the pods compact (no spec.resourceClaims, no status): the leader counts the claims
    before it publishes, and a follower that renders the rows (the whole view: a launcher's, a hostfile's) reads
    them too, so every hostfile says 4 GPUs, not the 96 CPUs."""
    from tests.runtime.test_sidecar import _allocated, _dra_pod

    pods = create_volcano_job(memory, (("master", 1), ("worker", 2)))
    for pod in pods:
        name = pod["metadata"]["name"]
        memory.update_pod("default", name, lambda p, n=name: _dra_pod(p, f"{n}-gpus-a"))
        _allocated(memory, name, f"{name}-gpus-a")
    for name in ("demo-worker-0", "demo-master-0"):  # the first publishes, the other follows its publication
        ran = init_pod(api, logs, name, tmp_path / name, "--source", "published", "--address", "ip",
                       "--timeout", "30", "--view", "full")
        assert ran.code == 0, ran.err
        doc = json.loads((tmp_path / name / "topology.json").read_text())
        assert doc["env"]["NPROC_PER_NODE"] == "4", ran.err
        hostfile = (tmp_path / name / "hostfile").read_text().split("\n")
        assert [line.split()[-1] for line in hostfile if line] == ["slots=4"] * 3
