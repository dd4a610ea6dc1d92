"""Who leads a large job's publication, over the sandbox's API in memory (tests/fakeapi.py): the first training
pod's init to run takes the publisher Lease and publishes, whichever pod it is; inits that race for the Lease
agree; a guard replaces a leading init that died before publishing; a Lease or a publication left by an earlier
incarnation of the job stalls nobody. The rules themselves: tests/core/test_leading.py; real processes over HTTPS:
tests/integration/test_init.py."""

from __future__ import annotations

import asyncio
import copy
import re
import threading
from pathlib import Path

import pytest

from agent import examples
from agent.core.publication.lease import Timing, lease_body, read_record
from agent.runtime.publication.leading import InitLease
from agent.runtime.publication.publishing import now_wall
from tests.fakeapi import agent_name, init_pod
from tests.jobs import add_worker, configmap, create_volcano_job, policy_admits, world
from tests.runtime.test_sidecar import CONFIGMAPS, PODS, init, start_sidecar

LEASES = "coordination.k8s.io/v1/leases"
PUBLISHED = ("--source", "published", "--address", "ip")


def lease(memory) -> dict:
    return memory.sandbox.store.get(LEASES, "default", "demo-topology")


def watching(api, pod: str, path: str) -> bool:
    return api.watching(agent_name("init", pod), path)


def same_files_as_the_pods_give(api, logs, tmp_path: Path, outs: dict[str, Path], *files: str) -> None:
    """Each pod's files are those it writes when it lists the pods itself (--source pods)."""
    for name, out in outs.items():
        direct = tmp_path / "direct" / name
        ran = init_pod(api, logs, name, direct, "--source", "pods", "--address", "ip", who=f"direct {name}")
        assert ran.code == 0, ran.err
        for file in ("torch.env", *files):
            assert (out / file).read_text() == (direct / file).read_text(), (name, file)


def test_two_inits_racing_for_the_lease_one_leads_and_the_other_follows_with_the_same_files(
        memory, api, logs, inits, tmp_path, monkeypatch):
    """Both inits find no Lease and both create it: the API server's create decides, and the loser follows the
    winner's publication."""
    create_volcano_job(memory, (("master", 1), ("worker", 1)))
    names = ("demo-master-0", "demo-worker-0")
    both_looked = threading.Barrier(2, timeout=20)
    asked = api._asked

    def racing(agent: str, request) -> None:
        if request.verb == "create" and request.path.endswith("/leases"):
            both_looked.wait()  # each has read no Lease before either creates it
        asked(agent, request)

    monkeypatch.setattr(api, "_asked", racing)
    started = {n: inits.start(n, tmp_path / n, *PUBLISHED, "--view", "full", "--timeout", "30") for n in names}
    ran = {n: inits.finish(who) for n, who in started.items()}
    for name in names:
        assert ran[name].code == 0, ran[name].err
    leader = [n for n in names if "lease demo-topology created" in ran[n].err]
    assert len(leader) == 1, {n: r.err for n, r in ran.items()}
    follower = next(n for n in names if n != leader[0])
    assert f"lease demo-topology is held by pod {leader[0]}: it publishes the topology" in ran[follower].err
    assert "read the published topology demo-topology" in ran[follower].err
    calls = [r.verb for a, r in api.requests if a == agent_name("init", follower) and "/leases" in r.path]
    assert calls[:3] == ["get", "create", "get"]  # it lost the create, and looked again to see who won
    assert lease(memory)["spec"]["holderIdentity"] == leader[0] == configmap(memory, "demo-topology")["data"]["leader"]
    same_files_as_the_pods_give(api, logs, tmp_path, {n: tmp_path / n for n in names}, "hostfile")


async def test_the_first_init_to_run_leads_though_a_worker_and_rank_0_started_last_follows(
        memory, api, logs, inits, sidecars, tmp_path):
    """Rank 0's pod gets its IP last, so its init starts once the gang is complete: it reads the publication of
    the worker whose init ran first (which followed the pods through the wait) instead of listing every pod after
    the last IP. That worker's sidecar then publishes, with rank 0 and the first worker as its standbys."""
    tasks = (("master", 1), ("worker", 5))
    pods = create_volcano_job(memory, tasks, with_ips=False)
    names = [p["metadata"]["name"] for p in pods]
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in examples.volcano_job("demo", tasks)}
    memory.set_pod_ip("default", "demo-worker-3", ips["demo-worker-3"])  # an init starts once its pod has an IP
    first = inits.start("demo-worker-3", tmp_path / "demo-worker-3", *PUBLISHED, "--timeout", "60")
    await api.notice.until(lambda: watching(api, "demo-worker-3", PODS), what="the first init waiting for the gang")
    assert lease(memory)["spec"]["holderIdentity"] == "demo-worker-3"
    others = [n for n in names if n not in ("demo-worker-3", "demo-master-0")]
    for name in others:
        memory.set_pod_ip("default", name, ips[name])
    started = {n: inits.start(n, tmp_path / n, *PUBLISHED, "--timeout", "60") for n in others}
    await api.notice.until(lambda: all(watching(api, n, CONFIGMAPS) for n in others), what="the others waiting")
    memory.set_pod_ip("default", "demo-master-0", ips["demo-master-0"])  # the last IP: the gang is complete
    ran = {"demo-worker-3": await inits.finish_async(first)}
    zero = await init(api, logs, "demo-master-0", tmp_path / "demo-master-0", *PUBLISHED, "--timeout", "60")
    for name, who in started.items():
        ran[name] = await inits.finish_async(who)
        assert ran[name].code == 0, ran[name].err
    assert "lease demo-topology created" in ran["demo-worker-3"].err
    assert "published the topology as configmap demo-topology" in ran["demo-worker-3"].err
    assert "lease demo-topology is held by pod demo-worker-3" in zero.err
    assert "waiting for the job's publisher, pod demo-worker-3 (the holder of lease demo-topology)" in zero.err
    assert not any(a == agent_name("init", "demo-master-0") and r.path == PODS for a, r in api.requests)  # no LIST
    published = configmap(memory, "demo-topology-journal")["data"]
    assert (published["leader"], published["standby"]) == ("demo-worker-3", "demo-master-0,demo-worker-0")
    await asyncio.to_thread(same_files_as_the_pods_give, api, logs, tmp_path, {n: tmp_path / n for n in names})

    running = {n: await start_sidecar(sidecars, tmp_path, n) for n in
               ("demo-worker-3", "demo-master-0", "demo-worker-0", "demo-worker-4")}
    await logs.until("demo-worker-3", "started publishing")
    for standby in ("demo-master-0", "demo-worker-0"):
        await logs.until(standby, "(standby)")
    await logs.until("demo-worker-4", "(follower)")
    add_worker(memory, 5, 90)
    await running["demo-worker-4"].until(lambda: world(tmp_path / "demo-worker-4")[0] == "7",
                                         what="the follower sees the new worker")


@pytest.mark.slow  # seconds of real waiting: a lease duration, and the dead init's --timeout
def test_a_leading_init_that_dies_before_publishing_is_replaced_by_a_guard(memory, api, logs, inits, tmp_path):
    """The first init took the Lease and waits for the gang; then its node is lost (nothing it sends arrives
    again). The guards that wait for its publication (rank 0 and the first three workers) see the Lease unrenewed
    for its whole duration, one takes it over and publishes; every live init is done."""
    tasks = (("master", 1), ("worker", 5))
    pods = create_volcano_job(memory, tasks, with_ips=False)
    names = [p["metadata"]["name"] for p in pods]
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in examples.volcano_job("demo", tasks)}
    args = (*PUBLISHED, "--lease-seconds", "2")
    dead = inits.start("demo-worker-3", tmp_path / "demo-worker-3", *args, "--timeout", "5")
    api.notice.wait_until(lambda: watching(api, "demo-worker-3", PODS), what="the first init waiting")
    api.cut.add(agent_name("init", "demo-worker-3"))  # its node is lost
    live = [n for n in names if n != "demo-worker-3"]
    started = {n: inits.start(n, tmp_path / n, *args, "--timeout", "60") for n in live}
    api.notice.wait_until(lambda: all(watching(api, n, CONFIGMAPS) for n in live), what="the others waiting")
    for name in names:  # the lost node's pod still shows its IP: the gang is complete, and nobody publishes
        memory.set_pod_ip("default", name, ips[name])
    ran = {n: inits.finish(who) for n, who in started.items()}
    for name in live:
        assert ran[name].code == 0, ran[name].err
    took = [n for n in live if "lease demo-topology taken over from pod demo-worker-3" in ran[n].err]
    assert len(took) == 1 and took[0] in ("demo-master-0", "demo-worker-0", "demo-worker-1", "demo-worker-2")
    unrenewed = float(re.search(r"not renewed for ([\d.]+) s", ran[took[0]].err).group(1))
    assert unrenewed >= 2.0  # never before a whole lease duration of the guard's own clock
    looked = [r.verb for a, r in api.requests if a == agent_name("init", "demo-worker-4") and "/leases" in r.path]
    assert looked == ["get"]  # not a guard: it looked once
    assert lease(memory)["spec"]["holderIdentity"] == took[0] == configmap(memory, "demo-topology")["data"]["leader"]
    assert inits.finish(dead).code != 0
    same_files_as_the_pods_give(api, logs, tmp_path, {n: tmp_path / n for n in live})


def test_a_lease_left_by_an_earlier_incarnation_of_the_job_does_not_stall_it(memory, api, logs, inits, tmp_path):
    """The job was deleted and made again under its name before the garbage collector removed its Lease: renewed
    as far as anyone can tell, held by a pod the new job does not have. Its owner is the old job: the first init
    takes it over at once (a guard would wait 15 s, past these inits' --timeout)."""
    pods = create_volcano_job(memory, (("master", 1), ("worker", 3)))
    names = [p["metadata"]["name"] for p in pods]
    before = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "demo", "uid": "uid-of-the-job-before"}
    memory.create(LEASES, "default", lease_body("demo-topology", "demo-worker-9", now_wall=now_wall(), previous=None,
                                                owner=before))
    started = {n: inits.start(n, tmp_path / n, *PUBLISHED, "--timeout", "10") for n in reversed(names)}
    ran = {n: inits.finish(who) for n, who in started.items()}
    for name in names:
        assert ran[name].code == 0, ran[name].err
    now = lease(memory)
    leader = now["spec"]["holderIdentity"]
    assert leader == configmap(memory, "demo-topology")["data"]["leader"]
    assert "lease demo-topology left by an earlier incarnation of the job (owner uid uid-of-the-job-before), taken " \
           "over" in ran[leader].err
    assert now["metadata"]["ownerReferences"][0]["uid"] == pods[0]["metadata"]["ownerReferences"][0]["uid"]
    assert not any("not renewed for" in r.err for r in ran.values())


def restart(memory, pods, *, without_ip: str) -> None:
    """What a controller that restarts a job does: every pod re-created under its name with a new uid (one not
    given its IP yet); the publication, owned by the job, stays."""
    for pod in pods:
        memory.delete_pod("default", pod["metadata"]["name"])
        pod["metadata"]["uid"] = pod["metadata"]["uid"][:-4] + "beef"
        if pod["metadata"]["name"] == without_ip:
            pod["status"] = {"phase": "Pending"}
        memory.create_pod(pod)


def release(memory) -> None:
    """The Lease as the publisher's sidecar leaves it on SIGTERM: held by nobody."""
    released = copy.deepcopy(lease(memory))
    released["spec"]["holderIdentity"] = ""
    released["metadata"].pop("resourceVersion")
    memory._run(memory.sandbox.store.replace, LEASES, "default", "demo-topology", released)


async def rewritten_by(api, memory, old: dict, writer: str, uid: str) -> None:
    """Each of the copies in ``old``, written again, names ``writer`` (its new incarnation, ``uid``), as the policy
    admits. Waited for: the followers' inits end on the journal written again, and the leader's sidecar writes the
    snapshot again after the journal (runtime/publication/publishing.py)."""
    def says(name: str) -> tuple[str, str]:
        data = configmap(memory, name)["data"]
        return data["leader"], data["leaderUid"]

    await api.notice.until(lambda: all(says(name) == (writer, uid) for name in old),
                           what=f"{', '.join(old)} written again by {writer}")
    for name, before in old.items():
        assert policy_admits(memory, "UPDATE", writer, configmap(memory, name), before)


async def published_before(memory, api, logs, tmp_path, *, first: str) -> tuple[list, list[str]]:
    """A 5-pod job whose inits all ran, ``first`` first (it published), and whose Lease is free again: the job as
    its controller's restart finds it."""
    pods = create_volcano_job(memory, (("master", 1), ("worker", 4)))
    names = [p["metadata"]["name"] for p in pods]
    for name in [first, *(n for n in names if n != first)]:
        await init(api, logs, name, tmp_path / "before" / name, *PUBLISHED)
    release(memory)
    return pods, names


async def test_after_the_job_is_re_created_the_first_init_leaves_the_lease_to_the_pod_that_published_before(
        memory, api, logs, inits, sidecars, tmp_path):
    """The controller restarted the job; the publication stays, written by demo-worker-2, whose init ran first
    before. Now demo-master-0's init runs first and takes the free Lease, but only demo-worker-2 may write over
    its copy (the admission policy binds the writer's name to its token): demo-master-0 finds the copy before it
    lists any pod, hands demo-worker-2 the Lease and waits with the others; demo-worker-2's init leads, and its
    sidecar rewrites the copy the followers wait for."""
    pods, names = await published_before(memory, api, logs, tmp_path, first="demo-worker-2")
    old = {n: configmap(memory, n) for n in ("demo-topology", "demo-topology-journal", "demo-topology-summary")}
    restart(memory, pods, without_ip="demo-worker-3")
    followers = {"demo-master-0": inits.start("demo-master-0", tmp_path / "demo-master-0", *PUBLISHED,
                                              "--timeout", "60")}
    await logs.until("init demo-master-0", "handed lease demo-topology to pod demo-worker-2")
    again = inits.start("demo-worker-2", tmp_path / "demo-worker-2", *PUBLISHED, "--timeout", "60")
    await api.notice.until(lambda: watching(api, "demo-worker-2", PODS), what="it waits for the gang")
    followers.update({n: inits.start(n, tmp_path / n, *PUBLISHED, "--timeout", "60")
                      for n in ("demo-worker-0", "demo-worker-1")})
    memory.set_pod_ip("default", "demo-worker-3", examples.loopback_ip(4))
    followers["demo-worker-3"] = inits.start("demo-worker-3", tmp_path / "demo-worker-3", *PUBLISHED,
                                             "--timeout", "60")
    ran = {"demo-worker-2": await inits.finish_async(again)}
    assert ran["demo-worker-2"].code == 0, ran["demo-worker-2"].err
    assert "lease demo-topology held under this pod's name, taken again" in ran["demo-worker-2"].err
    for name in followers:  # each found the copy before it is written again (a slow start under load looked after)
        await logs.until(f"init {name}", "waiting for the published topology to be written again")
    await start_sidecar(sidecars, tmp_path, "demo-worker-2")
    for name, who in followers.items():
        ran[name] = await inits.finish_async(who)
        assert ran[name].code == 0, ran[name].err
        assert "waiting for the published topology to be written again" in ran[name].err
        assert "reading the pods instead" not in ran[name].err and "waiting for the gang" not in ran[name].err
    assert lease(memory)["spec"]["holderIdentity"] == "demo-worker-2"
    await rewritten_by(api, memory, old, "demo-worker-2", pods[3]["metadata"]["uid"])
    await asyncio.to_thread(same_files_as_the_pods_give, api, logs, tmp_path, {n: tmp_path / n for n in names})


async def test_a_pod_that_finds_its_earlier_incarnations_copy_publishes_again_while_another_holds_the_lease(
        memory, api, logs, inits, sidecars, tmp_path):
    """As above, but the summary was deleted before the restart, so the first init (demo-master-0) finds no copy
    when it looks and leads. demo-worker-3 (no guard: it looks at the Lease once) reads the whole topology
    instead of the summary, finds its earlier incarnation's copy, which no other pod may write over, and publishes
    again itself; demo-master-0 hands it the Lease when its own snapshot create finds the copy."""
    pods, names = await published_before(memory, api, logs, tmp_path, first="demo-worker-3")
    memory.delete("/v1/configmaps", "default", "demo-topology-summary")
    old = {n: configmap(memory, n) for n in ("demo-topology", "demo-topology-journal")}
    restart(memory, pods, without_ip="demo-worker-1")
    leader = inits.start("demo-master-0", tmp_path / "demo-master-0", *PUBLISHED, "--timeout", "60")
    await api.notice.until(lambda: watching(api, "demo-master-0", PODS), what="the first init waiting")
    again = inits.start("demo-worker-3", tmp_path / "demo-worker-3", *PUBLISHED, "--timeout", "60")
    await logs.until("init demo-worker-3", "this pod publishes the topology again")
    await api.notice.until(lambda: watching(api, "demo-worker-3", PODS), what="it waits for the gang too")
    followers = {n: inits.start(n, tmp_path / n, *PUBLISHED, "--timeout", "60") for n in ("demo-worker-0",
                                                                                          "demo-worker-2")}
    memory.set_pod_ip("default", "demo-worker-1", examples.loopback_ip(2))
    followers["demo-worker-1"] = inits.start("demo-worker-1", tmp_path / "demo-worker-1", *PUBLISHED,
                                             "--timeout", "60")
    ran = {"demo-master-0": await inits.finish_async(leader), "demo-worker-3": await inits.finish_async(again)}
    assert ran["demo-master-0"].code == 0 and ran["demo-worker-3"].code == 0, ran
    assert "handed lease demo-topology to pod demo-worker-3" in ran["demo-master-0"].err
    assert lease(memory)["spec"]["holderIdentity"] == "demo-worker-3"
    await start_sidecar(sidecars, tmp_path, "demo-worker-3")
    for name, who in followers.items():
        ran[name] = await inits.finish_async(who)
        assert ran[name].code == 0, ran[name].err
        assert "waiting for the published topology to be written again" in ran[name].err
        assert "reading the pods instead" not in ran[name].err
    await rewritten_by(api, memory, old, "demo-worker-3", pods[4]["metadata"]["uid"])
    await asyncio.to_thread(same_files_as_the_pods_give, api, logs, tmp_path, {n: tmp_path / n for n in names})


def test_the_keeper_renews_the_lease_again_when_this_init_holds_it_again():
    """An init that handed the Lease on (a copy's writer must publish) and later holds it again (a guard that
    took it over) renews it again."""
    class Calls:
        def __init__(self) -> None:
            self.renewed = threading.Semaphore(0)

        def replace(self, path, body):
            self.renewed.release()
            return {**body, "metadata": {**body["metadata"], "resourceVersion": "8"}}

        def get_object(self, path, *, metadata_only=False):
            raise AssertionError("no conflict here")

    calls = Calls()
    held = InitLease(None, "default", "demo-topology", "demo-worker-0", owner=None, timing=Timing(2),
                     clock=lambda: 0.0, blocking=calls)
    for _ in range(2):
        held.keeper.record = read_record(lease_body("demo-topology", "demo-worker-0", now_wall=now_wall(),
                                                    previous=None, owner=None))
        held.keep()
        assert calls.renewed.acquire(timeout=10), "not renewed"
        held.stop()
