"""Benchmark: a member lost in a large job, from the API showing it to every survivor's files and signal.

One sandbox job of --pods pods as bench/published_bench.py builds it (Volcano, each pod as a cluster holds it and
on a Node of its own), with the Nodes as the kubelet keeps them (bench/kubelet.real_node: ~12 KB each, most of it
their images), started as there (the real inits, the kubelet's status writes). Five sidecars run, each with a
trainer of its own to signal (a process that takes SIGUSR1, named by --trainer-pid-file): the publisher (it
watches the pods and the Nodes), both standbys, a follower in the default view and a ``--view full`` pod (both
follow the publication). Then --changes losses, one at a time, the same worker each time (the last index: no rank
moves), in turn:

- its Node NotReady (the kubelet's Ready condition False), then Ready again;
- its pod marked ``DisruptionTarget`` (an eviction), then the mark cleared.

Each one changes the world size, so every sidecar writes a new generation and signals its trainer. For each:
the time from the write to each sidecar's files (the rename of the last file, ``files_at``) and to its signal
(``signal_at``), both read from the sidecar's log on the same monotonic clock; the next change waits until every
sidecar has signalled (or --wait seconds). Then the requests and bytes each sidecar made for them (the sandbox's
Stats by agent, headers included), the publisher's start-up with its Node LIST, and each sidecar's peak RSS.

    python bench/lost_bench.py --pods 4096 --changes 20
    python bench/lost_bench.py --pods 16384 --changes 20
    python bench/lost_bench.py --pods 4096 --changes 20 --forbid-nodes   # the same job, no Node read
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import installed
import kubelet
import published_bench as pb

from agent.sandbox.threaded import SandboxThread

NODES = "/v1/nodes"
TRAINER = ("import os, signal, sys, time\n"
           "signal.signal(signal.SIGUSR1, lambda *_: None)\n"
           "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
           "while True: time.sleep(3600)\n")


def build_nodes(sandbox: SandboxThread, n: int) -> int:
    """One Node per pod (``node-<i>``, as build_job binds them); returns the JSON bytes of them all (a LIST's)."""
    size = 0
    for i in range(n):
        node = kubelet.real_node(f"node-{i}")
        size += len(json.dumps(node))
        sandbox.create_node(node)
    return size


def write(sandbox: SandboxThread, resource: str, name: str, change: Any) -> int:
    """One write of the stored object, in the sandbox's own thread; its resourceVersion."""
    store = sandbox.sandbox.store
    namespace = "default" if resource == pb.PODS else ""

    def apply() -> dict[str, Any]:
        obj = store.get(resource, namespace, name)
        change(obj)
        return store.replace(resource, namespace, name, obj)

    return int(sandbox._run(apply)["metadata"]["resourceVersion"])


def node_ready(status: str) -> Any:
    def change(node: dict[str, Any]) -> None:
        for condition in node["status"]["conditions"]:
            if condition["type"] == "Ready":
                condition.update(status=status, reason="KubeletReady" if status == "True" else "KubeletNotReady")
    return change


def disruption(status: str) -> Any:
    def change(pod: dict[str, Any]) -> None:
        kept = [c for c in pod["status"]["conditions"] if c["type"] != "DisruptionTarget"]
        pod["status"]["conditions"] = [*kept, {"type": "DisruptionTarget", "status": status,
                                               "reason": "EvictionByEvictionAPI", "lastTransitionTime": kubelet.T0}]
    return change


def start_sidecar(sandbox: SandboxThread, tmp: Path, job: pb.Job, pod: str,
                  lease: int) -> tuple[subprocess.Popen[bytes], Path, subprocess.Popen[bytes]]:
    """The pod's sidecar, as published_bench starts it, signalling a trainer of its own."""
    pid_file = tmp / f"trainer-{pod}.pid"
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(pid_file)])
    pb.wait_until(pid_file.exists, 30, f"{pod}'s trainer")
    log = tmp / f"sidecar-{pod}.log"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with log.open("w") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "sidecar", "--out", str(tmp / pod),
             "--state-dir", str(pb.state_dir(tmp, pod)), "--trainer-pid-file", str(pid_file),
             "--health-host", "127.0.0.1", "--health-port", str(port), "--log-format", "json",
             "--lease-seconds", str(lease), *job.flags(pod)], env=job.pod_env(sandbox, pod), stderr=handle)
    return proc, log, trainer


def signalled(log: Path) -> list[tuple[float, float]]:
    """(files renamed at, trainer signalled at) of each generation the sidecar wrote and signalled."""
    files: dict[int, float] = {}
    found = []
    for line in log.read_text().splitlines():
        msg = json.loads(line)["msg"]
        if "files_at=" in msg:
            files[int(msg.split("generation ")[1].split()[0].rstrip(":"))] = float(
                msg.split("files_at=")[1].rstrip(")"))
        elif "signal_at=" in msg:
            generation = int(msg.split("generation ")[1].split()[0])
            found.append((files[generation], float(msg.split("signal_at=")[1].rstrip(")"))))
    return found


def one_run(args: argparse.Namespace, run: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp_name, \
            SandboxThread(Path(tmp_name) / "sb", history=args.history) as sandbox:
        tmp = Path(tmp_name)
        job = pb.Job(args.pods, list(args.agent_arg), ["--view", "full"])
        pb.build_job(sandbox, job)
        nodes_bytes = build_nodes(sandbox, args.pods)
        if args.forbid_nodes:  # as without the RBAC component: the sidecars say so once and read no Node
            sandbox.faults(status=403, count=-1, path="/nodes")
        gc.collect()
        gc.freeze()
        gc.disable()
        running: dict[str, tuple[subprocess.Popen[bytes], Path, subprocess.Popen[bytes]]] = {}
        try:
            inits = pb.start_up(sandbox, tmp, job, args.spread, seed=args.seed + run)
            roles = {"publisher": job.leader, "standby": job.standbys[0], "standby2": job.standbys[1],
                     "follower": inits["first_ip"], "full": job.full_pod}
            agents = {role: pb.AGENT.format(kind="sidecar", pod=pod) for role, pod in roles.items()}
            running = {role: start_sidecar(sandbox, tmp, job, pod, args.lease_seconds) for role, pod in roles.items()}
            pb.wait_until(lambda: "started publishing" in running["publisher"][1].read_text(), 300,
                          "the publisher to publish")
            watches = 1 if args.forbid_nodes else 2
            pb.wait_until(lambda: all(pb.traffic(sandbox, agents[r])["watches"] >= (watches if r == "publisher" else 1)
                                      for r in roles), 300, "every sidecar to watch (the publisher: pods and Nodes)")
            pb.kubelet_churn(sandbox, job, args.kubelet_spread)
            pb.settle(sandbox, [proc.pid for proc, _, _ in running.values()])
            start = {role: pb.traffic(sandbox, agents[role]) for role in roles}
            measured = set(roles.values()) | set(inits["inits"])
            lost = next(name for name in reversed(job.names) if name not in measured)
            node = f"node-{job.names.index(lost)}"
            changes = []
            for i in range(args.changes):
                kind = "pod" if args.forbid_nodes else ("node", "pod")[(i // 2) % 2]
                before = {role: len(signalled(log)) for role, (_, log, _) in running.items()}
                at = time.monotonic()
                if kind == "node":
                    write(sandbox, NODES, node, node_ready("False" if i % 2 == 0 else "True"))
                else:
                    write(sandbox, pb.PODS, lost, disruption("True" if i % 2 == 0 else "False"))
                deadline = time.monotonic() + args.wait
                while time.monotonic() < deadline and any(
                        len(signalled(log)) <= before[role] for role, (_, log, _) in running.items()):
                    time.sleep(0.05)
                seen = {}
                for role, (_, log, _) in running.items():
                    gens = signalled(log)
                    if len(gens) > before[role]:
                        files_at, signal_at = gens[before[role]]
                        seen[role] = ((files_at - at) * 1000, (signal_at - at) * 1000)
                changes.append({"kind": kind, "lost": i % 2 == 0, "seen": seen})
                time.sleep(args.gap)
            during = {role: pb.traffic(sandbox, agents[role]) for role in roles}
            rss = {role: pb.hwm_mb(proc.pid) for role, (proc, _, _) in running.items()}
        finally:
            gc.enable()
            gc.unfreeze()
            for proc, _, trainer in running.values():
                proc.terminate()
                trainer.kill()
            for child in psutil.Process().children(recursive=True):
                child.kill()
    return {"roles": roles, "changes": changes, "start": start, "rss": rss, "nodes_bytes": nodes_bytes,
            "per_change": {role: {"requests": (during[role]["requests"] - start[role]["requests"]) / args.changes,
                                  "bytes": (pb.total(during[role]) - pb.total(start[role])) / args.changes}
                           for role in roles},
            "load": os.getloadavg()[0]}


def report(args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    print(f"### {args.pods} pods, {args.runs} run(s), {args.changes} losses each (load average "
          f"{pb.med([r['load'] for r in runs], '.1f')}); a Node is {runs[0]['nodes_bytes'] // args.pods} bytes, "
          f"the Nodes' LIST {runs[0]['nodes_bytes'] / 2**20:.0f} MiB\n")
    print("| sidecar | files p50 / p99 (ms) | signal p50 / p99 (ms) | missed | per change: requests, bytes | "
          "start: requests, KiB | peak RSS |")
    print("|---|---|---|---|---|---|---|")
    for role in ("publisher", "standby", "standby2", "follower", "full"):
        files = [c["seen"][role][0] for r in runs for c in r["changes"] if role in c["seen"]]
        signals = [c["seen"][role][1] for r in runs for c in r["changes"] if role in c["seen"]]
        missed = sum(1 for r in runs for c in r["changes"] if role not in c["seen"])
        print(f"| {role} | {statistics.median(files):.0f} / {pb.percentile(files, 0.99):.0f} | "
              f"{statistics.median(signals):.0f} / {pb.percentile(signals, 0.99):.0f} | {missed} | "
              f"{pb.med([r['per_change'][role]['requests'] for r in runs], '.1f')}, "
              f"{pb.med([r['per_change'][role]['bytes'] for r in runs], '.0f')} B | "
              f"{pb.med([r['start'][role]['requests'] for r in runs], '.0f')}, "
              f"{pb.med([pb.total(r['start'][role]) / 1024 for r in runs], '.0f')} | "
              f"{pb.med([r['rss'][role] for r in runs], '.0f')} MB |")
    for kind in ("node", "pod"):
        worst = [max(s for _, s in c["seen"].values()) for r in runs for c in r["changes"]
                 if c["kind"] == kind and c["seen"]]
        if not worst:
            continue
        print(f"\n- {kind} changes, the last survivor signalled: p50 {statistics.median(worst):.0f} ms, "
              f"p99 {pb.percentile(worst, 0.99):.0f} ms, max {max(worst):.0f} ms ({len(worst)} changes)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--changes", type=int, default=20, help="losses and returns, in turn, Node then pod")
    parser.add_argument("--gap", type=float, default=0.5, help="seconds after every sidecar signalled")
    parser.add_argument("--wait", type=float, default=30.0, help="seconds a change waits for every signal")
    parser.add_argument("--spread", type=float, default=20.0, help="pods get their IPs over this many seconds")
    parser.add_argument("--kubelet-spread", type=float, default=2.0)
    parser.add_argument("--lease-seconds", type=int, default=15)
    parser.add_argument("--agent-arg", action="append", default=[], help="one more argument for every process")
    parser.add_argument("--history", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--forbid-nodes", action="store_true", help="every request for Nodes gets 403, as without "
                        "manifests/rbac/nodes: only the pod changes are written (--changes counts them)")
    args = parser.parse_args()
    installed.compile_agent()
    runs = []
    for run in range(args.runs):
        runs.append(one_run(args, run))
        print(f"run {run + 1}: {json.dumps(runs[-1])}", file=sys.stderr, flush=True)
    report(args, runs)


if __name__ == "__main__":
    main()
