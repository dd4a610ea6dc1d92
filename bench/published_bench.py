"""Benchmark: a large job with a published topology, measured where users wait.

One sandbox job of --pods pods (Volcano, master + workers), each pod as a cluster holds it (bench/kubelet.py:
~9.6 KB of JSON once running, with the token volume, tolerations, conditions, container statuses and
managedFields), bound to its own node and Pending without an IP. Then:

1. Start-up with every pod late: the pods get their IPs one by one over --spread seconds in a random order (the
   kubelet's first status write: IP, init container running). An init container starts when its own pod has its
   IP, so each real init process starts then. Which inits differ: the leader's (the first training pod's init to
   run takes the publisher Lease: it lists the pods, waits for the whole gang and publishes), and the followers'
   (every other pod: it reads the publication, the summary or the whole snapshot, whichever its view decides; the
   standbys are followers in init, and rank 0's and the first workers' inits guard the Lease while they wait). A
   follower's work does not depend on which pod it is, only on when it starts: before the publication (it waits
   on a watch) or after it (it lists it). So the real processes are the pods that get the first three IPs (the
   first leads, as the first init of the whole job does; the next one that is no standby is "the first-IP
   follower": it waits longest), the pods of node ranks 0-2 (the standbys are the first two of them that do not
   publish), the pod that gets the last IP (it starts last: "the last init done after the last IP" is its), and
   --full-pod (a pod given --view full: what a launcher holds); every other pod's init is one of these. Which pod
   led and which stand by is read from the publication (the journal's data.leader and data.standby). Each real
   init's CPU, peak RSS (VmHWM, its own log line at exit), requests and bytes both ways.
2. The job starts: the sidecars of the leader, both standbys, the first-IP follower and the full-view pod run;
   then the kubelet writes every pod's status twice more (init done and phase Running over --kubelet-spread
   seconds, then Ready over 5x as long), as it does for real pods; the publication settles. Start-up bytes per
   process: every request and answer until then, headers included (the sandbox's Stats: the leases and the
   snapshot and journal writes are requests), and each measured pod's Events (init's and the sidecar's, sent on a
   client of their own). Job-wide: the leader + 2 standbys + every other pod as the costliest follower measured
   (the few guards of core/publication/leading.py, which look at the Lease while they wait, as the costliest guard
   measured).
3. Steady state: --changes changes, one every --gap seconds: a worker gets a new IP, and every --leave-every-th
   change a worker leaves or comes back (the world size changes: every pod's torch.env). Event-to-file per change
   for each sidecar whose files the change alters (all changes for a pod that holds every member addressed by IP;
   the membership changes for any other: a pod in its own view, or one that holds every member by DNS name, whose
   files a peer's new IP does not alter), credited to the first generation whose published sequence
   contains it (followers) or whose resourceVersion is past it (pods-watchers). CPU and bytes per change.
4. Takeover: the leader's sidecar is killed (--takeover crash: SIGKILL, nothing released; sigterm: it releases
   the Lease) and its pod deleted; the time until the follower's torch.env says a world one pod smaller (a
   standby took over and published the pod gone). Then every
   sidecar's peak RSS (VmHWM, the kernel's exact high-water mark, read before the process ends; the killed
   leader's just before the kill), both standbys having run through it.

    python bench/published_bench.py --pods 16384 --runs 3 --changes 100 --gap 0.1 --spread 20 --takeover crash

``--topology-nodes Z,B,R`` gives every pod's node a Node as the kubelet keeps it (bench/kubelet.real_node, ~12 KB),
in one of Z zones x B blocks x R sub-blocks (the default levels' zone, GCE block and sub-block labels), each node
placed at random (a spreading scheduler): with ``--agent-arg=--rank-order --agent-arg=topology`` the job is ranked
by those domains.

Every process runs with the agent's defaults, peers named by DNS (``--address dns``) among them; until baa581d
this benchmark gave every process ``--address ip``: ``--agent-arg=--address --agent-arg=ip`` runs it so again.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from agent import examples
from agent.core.publication.leading import GUARDS
from agent.runtime.demo import volcano_owner
from agent.sandbox.threaded import SandboxThread

sys.path.insert(0, str(Path(__file__).resolve().parent))
import installed
import kubelet

AGENT = "topology-agent/0.1.0 {kind} (default/{pod})"
PODS = "/v1/pods"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def traffic(sandbox: SandboxThread, agent: str) -> dict[str, int]:
    """What one agent process asked and was sent so far: requests (watches apart), bytes both ways."""
    stats = sandbox.stats()["byAgent"].get(agent, {})
    return {"requests": stats.get("requests", 0) - stats.get("watches", 0), "watches": stats.get("watches", 0),
            "received": stats.get("bytes", 0) + stats.get("headers", 0), "sent": stats.get("sent", 0)}


def total(t: dict[str, int]) -> int:
    return t["received"] + t["sent"]


@dataclass
class Job:
    """The job under test: its pods, who plays which part, and what every agent process is given."""

    n: int
    args: list[str]  # given to every init and sidecar (as inject gives them to every pod)
    full_args: list[str]  # given to the --full-pod besides
    names: list[str] = field(default_factory=list)
    ips: dict[str, str] = field(default_factory=dict)
    owner_uid: str = ""
    leader: str = ""  # the publisher, as the journal names it once the job has started (data.leader)
    standbys: tuple[str, ...] = ()  # the journal's data.standby
    # node ranks 0-2: the standbys are among them (under the topology order, rank 0's domain's first pods)
    first_ranks: tuple[str, ...] = ("demo-master-0", "demo-worker-0", "demo-worker-1")

    @property
    def full_pod(self) -> str:
        return f"demo-worker-{self.n // 2}"

    def pod_env(self, sandbox: SandboxThread, pod: str) -> dict[str, str]:
        env = {**os.environ, **sandbox.client_env(), "POD_NAME": pod, "POD_NAMESPACE": "default"}
        env.pop("KUBECONFIG", None)
        return env

    def flags(self, pod: str) -> list[str]:
        return [*self.args, *(self.full_args if pod == self.full_pod else [])]


def node_domains(n: int, shape: str, seed: int) -> list[tuple[str, str, str]]:
    """Each pod's node's (zone, block, sub-block), at random among ``shape`` (``Z,B,R``)."""
    zones, blocks, racks = (int(k) for k in shape.split(","))
    rnd = random.Random(seed)
    return [(f"zone-{z}", f"block-{z}-{b}", f"sub-{z}-{b}-{r}") for z, b, r in
            ((rnd.randrange(zones), rnd.randrange(blocks), rnd.randrange(racks)) for _ in range(n + 1))]


def build_nodes(sandbox: SandboxThread, job: Job, shape: str, seed: int) -> None:
    """A Node per pod (``node-<i>``, and ``node-back`` for the worker that comes back), labelled with its domains;
    under ``--rank-order topology`` the first node ranks follow (rank.topology_order)."""
    from agent.core.plan.rank import topology_order

    domains = node_domains(job.n, shape, seed)
    for i, (zone, block, sub) in enumerate(domains):
        node = kubelet.real_node(f"node-{i}" if i < job.n else "node-back")
        node["metadata"]["labels"].update({"topology.kubernetes.io/zone": zone,
                                           "cloud.google.com/gce-topology-block": block,
                                           "cloud.google.com/gce-topology-subblock": sub})
        sandbox.create_node(node)
    if any(a == "--rank-order" and b == "topology" for a, b in itertools.pairwise(job.args)):
        order = topology_order([(*d, f"node-{i}") for i, d in enumerate(domains[:job.n])])
        job.first_ranks = tuple(job.names[k] for k in order[:3])


def build_job(sandbox: SandboxThread, job: Job) -> None:
    owner = volcano_owner()
    owner["spec"]["tasks"] = [{"name": "master", "replicas": 1, "template": {}},
                              {"name": "worker", "replicas": job.n - 1, "template": {}}]
    created = sandbox.create("batch.volcano.sh/v1alpha1/jobs", "default", owner)
    job.owner_uid = created["metadata"]["uid"]
    for i, pod in enumerate(examples.volcano_job("demo", (("master", 1), ("worker", job.n - 1)))):
        name = pod["metadata"]["name"]
        job.names.append(name)
        job.ips[name] = pod["status"]["podIP"]
        pod["metadata"]["ownerReferences"][0]["uid"] = job.owner_uid
        sandbox.create_pod(kubelet.real_pod(pod, node=f"node-{i}"))


def kubelet_write(sandbox: SandboxThread, name: str, write: Any, *args: Any) -> dict[str, Any]:
    """One status write of the kubelet's: the stored pod changed and written back in the sandbox's own thread (the
    store publishes a copy of it; a copy here too would double the harness's work)."""
    store = sandbox.sandbox.store

    def apply() -> dict[str, Any]:
        pod = store.get(PODS, "default", name)
        write(pod, *args)
        return store.replace(PODS, "default", name, pod)

    return sandbox._run(apply)  # type: ignore[no-any-return]


def start_up(sandbox: SandboxThread, tmp: Path, job: Job, spread: float, seed: int) -> dict[str, Any]:
    order = list(job.names)
    random.Random(seed).shuffle(order)
    measured = {*order[:3], *job.first_ranks, order[-1], job.full_pod}
    procs: dict[str, tuple[subprocess.Popen[bytes], Any]] = {}
    first = time.perf_counter()
    for k, name in enumerate(order):
        time.sleep(max(0.0, first + spread * k / max(1, job.n - 1) - time.perf_counter()))
        kubelet_write(sandbox, name, kubelet.kubelet_started, job.ips[name])
        if name in measured:
            log = (tmp / f"init-{name}.log").open("w+b")
            procs[name] = (subprocess.Popen(
                [sys.executable, "-m", "agent.cli", "init", "--out", str(tmp / name),
                 "--state-dir", str(state_dir(tmp, name)), "--log-format", "json", *job.flags(name)],
                env=job.pod_env(sandbox, name),
                stdout=subprocess.DEVNULL, stderr=log), log)
    last_ip = time.perf_counter()
    result: dict[str, Any] = {"inits": {}, "first_ip": order[0], "last_ip": order[-1]}
    pending = dict(procs)
    while pending:  # each as it ends: its done time is its own, whatever the order
        pid, status, usage = os.wait4(-1, 0)
        name = next((n for n, (p, _) in pending.items() if p.pid == pid), None)
        if name is None:
            continue
        done = time.perf_counter()
        proc, log = pending.pop(name)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        lines = log.read().decode().strip().splitlines()
        log.close()
        if proc.returncode != 0:
            raise SystemExit(f"init of {name} failed: {lines[-1] if lines else ''}")
        rss = float(json.loads(lines[-1])["msg"].rsplit("peak RSS ", 1)[1].split()[0])
        view = "own" if json.loads((tmp / name / "topology.json").read_text()).get("view") == "own" else "full"
        result["inits"][name] = {"cpu": usage.ru_utime + usage.ru_stime, "rss": rss, "view": view,
                                 "after_last_ip": done - last_ip,
                                 **traffic(sandbox, AGENT.format(kind="init", pod=name))}
    result["critical_path"] = max(i["after_last_ip"] for i in result["inits"].values()) + last_ip - first
    published = journal(sandbox)["data"]
    job.leader, job.standbys = published["leader"], tuple(published["standby"].split(","))
    result["leader_ip_at"] = order.index(job.leader) / max(1, job.n - 1)  # its place in the IP order (0..1)
    # the follower that waits longest: the measured pod that got the first IP and neither publishes nor stands by
    result["first_ip"] = next(n for n in order if n in measured and n not in (job.leader, *job.standbys,
                                                                               job.full_pod))
    return result


def state_dir(tmp: Path, pod: str) -> Path:
    """The pod's state volume, as inject mounts one in the agent's containers: init's reads for its sidecar."""
    state = tmp / f"{pod}.agent-state"
    state.mkdir(exist_ok=True)
    return state


def start_sidecar(sandbox: SandboxThread, tmp: Path, job: Job, pod: str, lease: int
                  ) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp / f"sidecar-{pod}.log"
    with socket.socket() as probe:  # the health server runs, as by default: on loopback, a port of its own
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with log.open("w") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "sidecar", "--out", str(tmp / pod),
             "--state-dir", str(state_dir(tmp, pod)), "--signal", "none", "--health-host", "127.0.0.1",
             "--health-port", str(port), "--log-format", "json",
             "--lease-seconds", str(lease), *job.flags(pod)], env=job.pod_env(sandbox, pod), stderr=handle)
    return proc, log


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def generations(log: Path) -> list[tuple[int, int, float]]:
    """(resourceVersion, published sequence, files renamed at) of each generation a sidecar wrote."""
    found = []
    for line in log.read_text().splitlines():
        msg = json.loads(line)["msg"]
        if "files_at=" in msg:
            found.append((int(msg.split("rv=")[1].split()[0] or 0), int(msg.split("seq=")[1].split()[0]),
                          float(msg.split("files_at=")[1].rstrip(")"))))
    return found


JOURNAL = "demo-topology-journal"


def journal(sandbox: SandboxThread) -> dict[str, Any]:
    return sandbox.sandbox.store.get("/v1/configmaps", "default", JOURNAL)


class JournalEntries:
    """Each published sequence's changes, (pod, IP) put and (pod, '') gone, from every version of the journal the
    leader wrote since the last look: the store's event log, read back to the last version seen (the journal keeps
    only its last few changes, and two writes between two looks left a sequence unseen), and the journal as it is
    now (a log that no longer reaches back)."""

    def __init__(self, sandbox: SandboxThread) -> None:
        self.sandbox, self.rv = sandbox, 0
        self.seen: dict[int, set[tuple[str, str]]] = {}

    def look(self) -> None:
        store = self.sandbox.sandbox.store

        def versions() -> tuple[list[dict[str, Any]], int]:
            found = [journal(self.sandbox)]
            for event in reversed(store.log):
                if event.rv <= self.rv:
                    break
                if event.resource == "/v1/configmaps" and event.new["metadata"]["name"] == JOURNAL:
                    found.append(event.new)
            return found, store.log[-1].rv if store.log else self.rv

        found, self.rv = self.sandbox._run(versions)
        for version in found:
            self.seen.update((entry["seq"], {(row[0], row[8]) for row in entry["put"]} |
                                            {(name, "") for name in entry["gone"]})
                             for entry in json.loads(version["data"]["changes.json"]))


def settle(sandbox: SandboxThread, pids: Sequence[int] = (), quiet: float = 2.0, timeout: float = 180.0) -> None:
    """Until the publication has not moved for ``quiet`` seconds and none of ``pids`` used more than 5 % of a core
    meanwhile (a pods-watcher still working through the kubelet's writes publishes nothing, yet is busy)."""
    def busy() -> float:
        return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)

    last, since, cpu = journal(sandbox)["metadata"]["resourceVersion"], time.monotonic(), busy()
    deadline = since + timeout
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now, used = journal(sandbox)["metadata"]["resourceVersion"], busy()
        if now != last or used - cpu > 0.05 * 0.25 * max(1, len(pids)):
            last, since = now, time.monotonic()
        cpu = used
        if time.monotonic() - since >= quiet:
            return
    raise SystemExit("the publication did not settle")


def kubelet_churn(sandbox: SandboxThread, job: Job, spread: float) -> None:
    """Every pod's init done (phase Running) over ``spread`` seconds, then Ready over five times as long."""
    for write, seconds in ((kubelet.kubelet_initialized, spread), (kubelet.kubelet_ready, 5 * spread)):
        began = time.perf_counter()
        for k, name in enumerate(job.names):
            time.sleep(max(0.0, began + seconds * k / job.n - time.perf_counter()))
            kubelet_write(sandbox, name, write)


def sidecars_up(sandbox: SandboxThread, tmp: Path, job: Job, roles: dict[str, str], lease: int,
                kubelet_spread: float) -> tuple[dict[str, tuple[subprocess.Popen[bytes], Path]], dict[str, Any]]:
    running = {role: start_sidecar(sandbox, tmp, job, pod, lease) for role, pod in roles.items()}
    agents = {role: AGENT.format(kind="sidecar", pod=pod) for role, pod in roles.items()}
    wait_until(lambda: "started publishing" in running["leader"][1].read_text(), 120, "the leader to publish")
    for standby in ("standby", "standby2"):
        wait_until(lambda s=standby: "(standby)" in running[s][1].read_text(), 120, f"{standby} to be named")
    wait_until(lambda: all(traffic(sandbox, agents[r])["watches"] >= 1 for r in roles), 120,
               "every sidecar to watch")
    kubelet_churn(sandbox, job, kubelet_spread)
    settle(sandbox, [proc.pid for proc, _ in running.values()])
    pod_bytes = len(json.dumps(sandbox.sandbox.store.get(PODS, "default", job.names[-1])))
    # each pod's Events (its init's and its sidecar's) go on a client of their own: counted apart, by pod
    events = {role: traffic(sandbox, AGENT.format(kind="events", pod=pod)) for role, pod in roles.items()}
    return running, {**{role: traffic(sandbox, agents[role]) for role in roles}, "pod_bytes": pod_bytes,
                     "events": events}


@dataclass
class Change:
    at: float
    rv: int
    name: str
    ip: str  # '' for a pod that leaves
    membership: bool  # the world size changes: every pod's files


def make_changes(sandbox: SandboxThread, job: Job, measured: set[str], changes: int, gap: float,
                 leave_every: int) -> tuple[list[Change], dict[int, set[tuple[str, str]]]]:
    workers = [n for n in job.names[3:] if n not in measured]
    mover, gone = workers[-1], None  # the worker that leaves and comes back (the last index: no rank moves)
    workers = workers[:-1]
    # its pod as the controller makes it again, built before the clock starts: building it from the whole job's
    # pods (16384) took 0.6-2 s inside every come-back change's event-to-file time, the p99 measured
    template = next(p for p in examples.volcano_job("demo", (("master", 1), ("worker", job.n - 1)))
                    if p["metadata"]["name"] == mover)
    emitted: list[Change] = []
    entries = JournalEntries(sandbox)
    entries.look()  # from here on: the versions written during the changes
    for i in range(changes):
        at = time.monotonic()
        if leave_every and i % leave_every == leave_every - 1:
            if gone is None:
                obj, gone = sandbox.delete_pod("default", mover), mover
                emitted.append(Change(at, int(obj["metadata"]["resourceVersion"]), mover, "", True))
            else:
                ip = examples.loopback_ip(job.n + i)
                pod = kubelet.real_pod(template, node="node-back")
                pod["metadata"]["ownerReferences"][0]["uid"] = job.owner_uid
                kubelet.kubelet_started(pod, ip)
                kubelet.kubelet_ready(pod)
                obj, gone = sandbox.create_pod(pod), None
                emitted.append(Change(at, int(obj["metadata"]["resourceVersion"]), mover, ip, True))
        else:
            name, ip = workers[i % len(workers)], examples.loopback_ip(job.n + i)  # past every pod's own
            obj = sandbox.update_pod("default", name, lambda pod, ip=ip: pod["status"].update(
                podIP=ip, podIPs=[{"ip": ip}]))
            emitted.append(Change(at, int(obj["metadata"]["resourceVersion"]), name, ip, False))
        entries.look()
        time.sleep(gap)
    time.sleep(2.0)
    entries.look()
    return emitted, entries.seen


def says_ips(document: dict[str, Any]) -> bool:
    """Whether a topology.json's members are addressed by IP (``--address ip``): then a peer's new IP is a new
    generation of a pod that holds every member. Addressed by DNS name, it is none: the membership key (the files'
    who-is-where) holds each member's address, not its IP, so the next generation is the next membership change's."""
    members = document.get("members") or []
    return bool(members) and members[0].get("address") == members[0].get("ip")


def credit(emitted: list[Change], seen: dict[int, set[tuple[str, str]]], gens: list[tuple[int, int, float]], *,
           ip_changes: bool, by_rv: bool) -> tuple[list[tuple[int, bool, float]], int]:
    """Event-to-file of each change that alters the pod's files (its number, whether it changed the membership,
    ms), and how many of those got no generation. Every change alters the files of a pod that holds every member
    addressed by IP (``ip_changes``); any other pod's, only the membership changes."""
    latencies, missed = [], 0
    for i, change in enumerate(emitted):
        if not (ip_changes or change.membership):
            continue
        if by_rv:
            written = next((t for r, _, t in gens if r >= change.rv), None)
        else:
            seq = min((s for s, puts in seen.items() if (change.name, change.ip) in puts), default=None)
            written = None if seq is None else next((t for _, s, t in gens if s >= seq), None)
        if written is None:
            missed += 1
        else:
            latencies.append((i, change.membership, (written - change.at) * 1000))
    return latencies, missed


def steady(sandbox: SandboxThread, tmp: Path, job: Job, args: argparse.Namespace,
           inits: dict[str, Any]) -> dict[str, Any]:
    follower = inits["first_ip"]
    roles = {"leader": job.leader, "standby": job.standbys[0], "standby2": job.standbys[1], "follower": follower,
             "full": job.full_pod}
    running, start = sidecars_up(sandbox, tmp, job, roles, args.lease_seconds, args.kubelet_spread)
    pod_bytes = start.pop("pod_bytes")
    events = start.pop("events")
    agents = {role: AGENT.format(kind="sidecar", pod=pod) for role, pod in roles.items()}
    cpu0 = {role: sum(psutil.Process(proc.pid).cpu_times()[:2]) for role, (proc, _) in running.items()}
    emitted, seen = make_changes(sandbox, job, set(roles.values()) | set(inits["inits"]), args.changes, args.gap,
                                 args.leave_every)
    cpu1 = {role: sum(psutil.Process(proc.pid).cpu_times()[:2]) for role, (proc, _) in running.items()}
    during = {role: traffic(sandbox, agents[role]) for role in roles}
    result: dict[str, Any] = {
        "roles": roles, "start": start, "pod_bytes": pod_bytes, "events": events,
        "per_change_bytes": {role: (total(during[role]) - total(start[role])) / args.changes for role in roles},
        "cpu_ms": {role: (cpu1[role] - cpu0[role]) * 1000 / args.changes for role in roles},
        "latency": {}, "missed": {}, "unpublished": sum(
            1 for c in emitted if not any((c.name, c.ip) in puts for puts in seen.values())),
        "missing_seqs": len(set(range(min(seen, default=0), max(seen, default=0) + 1)) - set(seen)),
    }
    for role, pod in roles.items():
        document = json.loads((tmp / pod / "topology.json").read_text())
        holds_all = document.get("view") != "own"
        by_rv = role == "leader"  # it watches the pods itself; the standbys follow the publication until takeover
        result["latency"][role], result["missed"][role] = credit(
            emitted, seen, generations(running[role][1]), ip_changes=holds_all and says_ips(document), by_rv=by_rv)
        result.setdefault("holds_all", {})[role] = holds_all
        result.setdefault("ip_changes", {})[role] = holds_all and says_ips(document)
    left = sum(1 if not c.ip else -1 for c in emitted if c.membership)  # the mover, gone at the end or back
    result.update(takeover(sandbox, tmp, job, roles, running, args, world_after=job.n - left - 1))
    return result


def takeover(sandbox: SandboxThread, tmp: Path, job: Job, roles: dict[str, str],
             running: dict[str, tuple[subprocess.Popen[bytes], Path]], args: argparse.Namespace, *,
             world_after: int) -> dict[str, Any]:
    """The leader goes; the follower's files must say it is gone: the world of the pods left (``world_after``; the
    leader need not be rank 0). Not "other than before": a last change the leader had not published yet (the mover
    back) and the leader gone leave the world as the follower had it. Every sidecar's peak after it."""
    env_file = tmp / roles["follower"] / "torch.env"

    def world() -> str:
        for line in env_file.read_text().splitlines():
            if line.startswith(("export WORLD_SIZE=", "WORLD_SIZE=")):
                return line.split("=", 1)[1].strip("'\"")  # torch.env quotes its values
        return ""

    rss = {"leader": hwm_mb(running["leader"][0].pid)}
    leader = running.pop("leader")[0]
    killed = time.monotonic()
    if args.takeover == "crash":
        leader.kill()
    else:
        leader.terminate()
    leader.wait(30)
    sandbox.delete_pod("default", roles["leader"])
    wait_until(lambda: world() == str(world_after), args.lease_seconds + 60, "the follower to see the leader gone")
    took = time.monotonic() - killed
    wait_until(lambda: any("started publishing" in running[s][1].read_text() for s in ("standby", "standby2")), 60,
               "a standby to publish")
    settle(sandbox, [proc.pid for proc, _ in running.values()])
    rss.update({role: hwm_mb(proc.pid) for role, (proc, _) in running.items()})
    for proc, _ in running.values():
        proc.terminate()
        proc.wait(30)
    return {"takeover": took, "rss": rss}


def ssh_secret(directory: Path) -> list[str]:
    """The job's SSH Secret (``topology-agent keygen``) as its pods mount it, and the flag that names it."""
    import base64

    import yaml

    from agent.ssh.material import generate_secret_manifest

    directory.mkdir(mode=0o700)
    for name, value in yaml.safe_load(generate_secret_manifest("demo", "default"))["data"].items():
        (directory / name).write_bytes(base64.b64decode(value))
        (directory / name).chmod(0o644 if name.endswith(".pub") else 0o600)
    return ["--ssh-secret-dir", str(directory)]


def one_run(args: argparse.Namespace, run: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp_name, \
            SandboxThread(Path(tmp_name) / "sb", history=args.history,
                          bookmark_interval=args.bookmark_interval) as sandbox:
        tmp = Path(args.keep) / f"run{run}" if args.keep else Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        job = Job(args.pods, [*(["--view", args.view] if args.view else []), *args.agent_arg,
                              *(ssh_secret(tmp / "ssh-secret") if args.ssh else [])], ["--view", args.full_pod_view])
        build_job(sandbox, job)
        if args.topology_nodes:
            build_nodes(sandbox, job, args.topology_nodes, args.seed + run)
        # The harness holds the whole job (~60 KB of objects per pod, and a copy per event in the sandbox's log):
        # its collector walking that at every full pass made the sandbox fall seconds behind the IPs it was told.
        gc.collect()
        gc.freeze()
        gc.disable()
        try:
            inits = start_up(sandbox, tmp, job, args.spread, seed=args.seed + run)
            result = {**inits, **steady(sandbox, tmp, job, args, inits), "load": os.getloadavg()[0]}
        finally:
            gc.enable()
            gc.unfreeze()
            for child in psutil.Process().children(recursive=True):  # a run that failed leaves no agent running
                child.kill()
    return result


def med(values: list[float], fmt: str = ".2f") -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def job_wide(run: dict[str, Any], n: int, *, events: bool = True) -> float:
    """GiB to start the job: the leader, both standbys, and every other pod as the costliest follower measured;
    with each pod's Events (init's and sidecar's, on their own client), or without them."""
    inits, start, roles = run["inits"], run["start"], run["roles"]
    sent = run.get("events", {}) if events else {}

    def told(role: str) -> int:
        return total(sent[role]) if role in sent else 0

    leader = total(inits[roles["leader"]]) + total(start["leader"]) + told("leader")
    standbys = sum(total(inits[roles[r]]) + total(start[r]) + told(r) for r in ("standby", "standby2"))
    followers = [name for name, i in inits.items() if name not in (roles["leader"], roles["standby"],
                                                                   roles["standby2"], roles["full"])]
    # The guards (core/publication/leading.is_guard: the first indices of each training role) look at the Lease while
    # their inits wait: a handful of pods, each counted at the costliest guard measured; every other pod at the
    # costliest other follower measured.
    guards = {"demo-master-0", *(f"demo-worker-{i}" for i in range(GUARDS))} - {roles["leader"], roles["standby"],
                                                                                 roles["standby2"]}
    rest = [name for name in followers if name not in guards] or followers
    sidecar = total(start["follower"]) + told("follower")
    follower = max(total(inits[name]) for name in rest) + sidecar
    guard = max((total(inits[name]) for name in followers if name in guards), default=follower - sidecar) + sidecar
    return (leader + standbys + len(guards) * guard + (n - 3 - len(guards)) * follower) / 2**30


def report(args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    n = args.pods
    print(f"### {n} pods, view {args.view or 'default'}, {args.runs} runs: medians (min-max); "
          f"load average {med([r['load'] for r in runs], '.1f')}; a running pod is {runs[0]['pod_bytes']} bytes\n")
    print(f"Start-up, every pod late (IPs over {args.spread:g} s, random order):\n")
    places = ", ".join(f"{r['leader_ip_at']:.0%}" for r in runs)
    print(f"- critical path, first IP to last init done: {med([r['critical_path'] for r in runs])} s")
    last = [max(i["after_last_ip"] for i in r["inits"].values()) for r in runs]
    print(f"- last init done after the last IP: {med(last)} s"
          f" (the pod that got the last IP: {med([r['inits'][r['last_ip']]['after_last_ip'] for r in runs])} s; "
          f"the leader's pod got its IP at {places} of the IP order: its init starts then and lists every pod)")
    parts = (("leader", lambda r: r["roles"]["leader"]), ("standby", lambda r: r["roles"]["standby"]),
             ("standby2", lambda r: r["roles"]["standby2"]), ("first-IP follower", lambda r: r["first_ip"]),
             ("last-IP pod", lambda r: r["last_ip"]), ("full-view pod", lambda r: r["roles"]["full"]))
    for label, pick in parts:
        inits = [r["inits"][pick(r)] for r in runs]
        print(f"- {label} init ({'/'.join(sorted({i['view'] for i in inits}))} view): "
              f"CPU {med([i['cpu'] for i in inits])} s, peak RSS {med([i['rss'] for i in inits], '.0f')} MB, "
              f"done {med([i['after_last_ip'] for i in inits])} s after the last IP, "
              f"{med([i['requests'] for i in inits], '.0f')} requests (+{inits[0]['watches']} watch), "
              f"received {med([i['received'] / 1024 for i in inits], '.0f')} KiB, "
              f"sent {med([i['sent'] / 1024 for i in inits], '.0f')} KiB")
    print(f"- job-wide start-up bytes, both ways, headers included (leader + 2 standbys + {n - 3} others, each the "
          f"costliest follower measured, the guards the costliest guard; init, sidecar, their Events, the kubelet's "
          f"status writes): "
          f"{med([job_wide(r, n) for r in runs], '.3f')} GiB; without the Events "
          f"{med([job_wide(r, n, events=False) for r in runs], '.3f')} GiB; Events per pod: leader "
          f"{med([total(r['events']['leader']) / 1024 for r in runs], '.1f')} KiB, follower "
          f"{med([total(r['events']['follower']) / 1024 for r in runs], '.1f')} KiB")
    print(f"\nSteady state, {args.changes} changes, one every {args.gap:g} s (every {args.leave_every}th a worker "
          "leaves or comes back):\n")
    for role in ("leader", "standby", "standby2", "follower", "full"):
        start = [r["start"][role] for r in runs]
        lat = [[ms for _, _, ms in r["latency"][role]] for r in runs]
        slowest = ", ".join(f"#{i} {'membership' if m else 'IP'} {ms:.0f} ms"
                            for i, m, ms in sorted(runs[0]["latency"][role], key=lambda x: -x[2])[:3])
        p50 = [statistics.median(x) for x in lat if x]
        p99 = [percentile(x, 0.99) for x in lat if x]
        held = "own view" if not runs[0]["holds_all"][role] else \
            "every member by IP: every change" if runs[0]["ip_changes"][role] else "every member by DNS name: " \
            "the membership changes"
        print(f"- {role} sidecar ({held}): start "
              f"{med([s['requests'] for s in start], '.0f')} requests, {med([total(s) / 1024 for s in start], '.0f')}"
              f" KiB; per change {med([r['per_change_bytes'][role] for r in runs], '.0f')} B, CPU "
              f"{med([r['cpu_ms'][role] for r in runs], '.1f')} ms; event-to-file p50 {med(p50, '.0f')} ms, "
              f"p99 {med(p99, '.0f')} ms ({len(lat[0])} changes credited in run 1, "
              f"{[r['missed'][role] for r in runs]} never written; slowest in run 1: {slowest}); "
              f"peak RSS {med([r['rss'][role] for r in runs], '.0f')} MB")
    print(f"- changes never published: {[r['unpublished'] for r in runs]}; journal sequences the benchmark missed: "
          f"{[r['missing_seqs'] for r in runs]}")
    print(f"\nTakeover ({args.takeover}, lease {args.lease_seconds} s): leader gone -> follower's files say it is "
          f"gone: {med([r['takeover'] for r in runs])} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--gap", type=float, default=0.1, help="seconds between changes")
    parser.add_argument("--leave-every", type=int, default=5, help="every Nth change a worker leaves or comes back")
    parser.add_argument("--spread", type=float, default=10.0, help="pods get their IPs over this many seconds")
    parser.add_argument("--kubelet-spread", type=float, default=2.0, help="pods run over this many seconds after "
                        "the start-up, and are Ready over 5x as long")
    parser.add_argument("--lease-seconds", type=int, default=15)
    parser.add_argument("--takeover", choices=["crash", "sigterm"], default="crash")
    parser.add_argument("--view", choices=["full", "own", "auto"], help="given to every process (default: none, "
                        "the agent's default)")
    parser.add_argument("--agent-arg", action="append", default=[], help="one more argument for every process")
    parser.add_argument("--full-pod-view", choices=["full", "auto", "own"], default="full",
                        help="the --view of the full-view pod (auto: it is one more follower)")
    parser.add_argument("--topology-nodes", metavar="Z,B,R", help="a Node per pod in Z zones x B blocks x R "
                        "sub-blocks, placed at random (see the module's docstring)")
    parser.add_argument("--ssh", action="store_true", help="a DeepSpeed/MPI job: every process gets the job's SSH "
                        "Secret (--ssh-secret-dir), as a pod that mounts it")
    parser.add_argument("--history", type=int, default=20_000, help="the sandbox's event log (each event holds "
                        "two copies of a pod)")
    parser.add_argument("--bookmark-interval", type=float, default=60.0, help="seconds between a quiet watch's "
                        "BOOKMARKs: a real API server's (its watch cache sends one a minute, defaultBookmarkFrequency, "
                        "and one before the watch's end); the sandbox's own default, 1, adds ~116 B a second to every "
                        "idle watch")
    parser.add_argument("--max-load", type=float, help="before each run, wait (up to 30 min) until the 1-minute "
                        "load average is below this")
    parser.add_argument("--keep", help="write the agents' files and logs here (run<k>/), not to a temporary directory")
    parser.add_argument("--seed", type=int, default=0, help="run k uses IP order seed + k (compare commits on the "
                                                            "same orders)")
    args = parser.parse_args()
    installed.compile_agent()  # as pip install does: no process below compiles the agent
    runs = []
    for run in range(args.runs):
        waited = time.monotonic()
        while args.max_load and os.getloadavg()[0] > args.max_load and time.monotonic() - waited < 1800:
            time.sleep(10)  # a machine shared with other work: start when it is quieter (at most 30 min later)
        runs.append(one_run(args, run))
        shown = {k: v for k, v in runs[-1].items() if k != "latency"}
        print(f"run {run + 1}: {json.dumps(shown)}", file=sys.stderr, flush=True)
    report(args, runs)


if __name__ == "__main__":
    main()
