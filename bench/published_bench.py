"""Benchmark: a large job with a published topology, measured where users wait (issue 13).

One sandbox job of --pods pods (Volcano, master + workers; each pod ~4.4 KB of JSON with managedFields), then:

1. Start-up with every pod late: the pods exist without IPs; they get their IPs one by one over --spread
   seconds, in a random order, and each measured pod's init starts when its own pod has its IP (an init
   container cannot start earlier). Measured: the leader's init (demo-master-0: it waits for the whole gang and
   publishes), the first standby (demo-worker-0) and two followers. Critical path: from the first IP to the last
   init done; the agent's share: last init done minus the last IP. Requests, bytes, CPU and peak RSS per init.
2. Steady state: the sidecars of the leader, the standby and a follower; --changes single-pod changes (a worker
   gets a new IP), one every --gap seconds. Event-to-file per change (p50/p99) for the follower, credited to the
   first generation whose published sequence contains that change (read from the journal's content, not from
   resourceVersions) and for the leader (its own watch: the resourceVersion is exact there). Bytes a follower
   receives per change, CPU per change and peak RSS of each sidecar, bytes and requests of each sidecar's start.
3. Takeover: the leader's sidecar is killed (--takeover crash: SIGKILL, nothing released; sigterm: it releases
   the Lease) and its pod deleted; the time until the follower's torch.env names a new MASTER_ADDR.

    python bench/published_bench.py --pods 4096 --runs 3 --changes 200 --gap 0.1 --spread 10 --takeover crash
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from agent import examples
from agent.sandbox.threaded import SandboxThread

sys.path.insert(0, str(Path(__file__).resolve().parent))
from init_bench import build_job

AGENT = "topology-agent/0.1.0 {kind} (default/{pod})"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pod_env(sandbox: SandboxThread, pod: str) -> dict[str, str]:
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": pod, "POD_NAMESPACE": "default"}
    env.pop("KUBECONFIG", None)
    return env


VIEW: list[str] = []  # --view own: given to every measured init and sidecar (as inject gives it to every pod)


def start_up(sandbox: SandboxThread, tmp: Path, n: int, spread: float, seed: int) -> dict[str, Any]:
    measured = ["demo-master-0", "demo-worker-0", f"demo-worker-{n // 2}", f"demo-worker-{n - 2}"]
    ips = {p["metadata"]["name"]: p["status"]["podIP"]
           for p in examples.volcano_job("demo", (("master", 1), ("worker", n - 1)))}
    order = list(ips)
    random.Random(seed).shuffle(order)
    procs: dict[str, tuple[subprocess.Popen[bytes], Any]] = {}
    first = time.perf_counter()
    for k, name in enumerate(order):
        time.sleep(max(0.0, first + spread * k / max(1, n - 1) - time.perf_counter()))
        sandbox.set_pod_ip("default", name, ips[name])
        if name in measured:
            log = (tmp / f"init-{name}.log").open("w+b")
            procs[name] = (subprocess.Popen(
                [sys.executable, "-m", "agent.cli", "init", "--out", str(tmp / name), "--address", "ip",
                 "--log-format", "json", *VIEW], env=pod_env(sandbox, name), stdout=subprocess.DEVNULL,
                stderr=log), log)
    last_ip = time.perf_counter()
    result: dict[str, Any] = {"inits": {}}
    done = []
    for name, (proc, log) in procs.items():
        _, status, usage = os.wait4(proc.pid, 0)
        done.append(time.perf_counter())
        log.seek(0)
        lines = log.read().decode().strip().splitlines()
        log.close()
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"init of {name} failed: {lines[-1] if lines else ''}")
        rss = float(json.loads(lines[-1])["msg"].rsplit("peak RSS ", 1)[1].split()[0])
        stats = sandbox.stats()["byAgent"].get(AGENT.format(kind="init", pod=name), {})
        result["inits"][name] = {"cpu": usage.ru_utime + usage.ru_stime, "rss": rss,
                                 "requests": stats.get("requests", 0) - stats.get("watches", 0),
                                 "watches": stats.get("watches", 0), "bytes": stats.get("bytes", 0)}
    result["critical_path"] = max(done) - first
    result["after_last_ip"] = max(done) - last_ip
    return result


def start_sidecar(sandbox: SandboxThread, tmp: Path, pod: str, lease: int) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp / f"sidecar-{pod}.log"
    with log.open("w") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "sidecar", "--out", str(tmp / pod), "--address", "ip",
             "--signal", "none", "--health-port", "0", "--log-format", "json", "--lease-seconds", str(lease), *VIEW],
            env=pod_env(sandbox, pod), stderr=handle)
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
            found.append((int(msg.split("rv=")[1].split()[0]), int(msg.split("seq=")[1].split()[0]),
                          float(msg.split("files_at=")[1].rstrip(")"))))
    return found


def journal_entries(sandbox: SandboxThread) -> dict[int, set[tuple[str, str]]]:
    journal = sandbox.sandbox.store.get("/v1/configmaps", "default", "demo-topology-journal")
    return {entry["seq"]: {(row[0], row[8]) for row in entry["put"]}
            for entry in json.loads(journal["data"]["changes.json"])}


def steady(sandbox: SandboxThread, tmp: Path, n: int, changes: int, gap: float, lease: int,
           takeover: str) -> dict[str, Any]:
    roles = {"leader": "demo-master-0", "standby": "demo-worker-0", "follower": f"demo-worker-{n // 2}"}
    sandbox.reset_stats()
    running = {role: start_sidecar(sandbox, tmp, pod, lease) for role, pod in roles.items()}
    agents = {role: AGENT.format(kind="sidecar", pod=pod) for role, pod in roles.items()}
    wait_until(lambda: "started publishing" in running["leader"][1].read_text(), 60, "the leader to publish")
    wait_until(lambda: "(candidate)" in running["standby"][1].read_text(), 60, "the standby to be named")
    wait_until(lambda: all(sandbox.stats()["byAgent"].get(agents[r], {}).get("watches", 0) >= 1 for r in roles),
               60, "every sidecar to watch")
    time.sleep(1.0)
    start = {role: dict(sandbox.stats()["byAgent"][agents[role]]) for role in roles}
    cpu0 = {role: sum(psutil.Process(proc.pid).cpu_times()[:2]) for role, (proc, _) in running.items()}
    workers = [f"demo-worker-{i}" for i in range(2, n) if f"demo-worker-{i}" != roles["follower"]]
    emitted: list[tuple[float, int, str, str]] = []
    seen: dict[int, set[tuple[str, str]]] = {}
    for i in range(changes):
        name, ip = workers[i % len(workers)], examples.loopback_ip(n + i)  # past every pod's own
        at = time.monotonic()
        obj = sandbox.set_pod_ip("default", name, ip)
        emitted.append((at, int(obj["metadata"]["resourceVersion"]), name, ip))
        seen.update(journal_entries(sandbox))
        time.sleep(gap)
    time.sleep(2.0)
    seen.update(journal_entries(sandbox))
    cpu1 = {role: sum(psutil.Process(proc.pid).cpu_times()[:2]) for role, (proc, _) in running.items()}
    rss = {role: hwm_mb(proc.pid) for role, (proc, _) in running.items()}
    during = {role: sandbox.stats()["byAgent"][agents[role]] for role in roles}
    follower_gens = generations(running["follower"][1])
    leader_gens = generations(running["leader"][1])
    follower_ms, leader_ms, unpublished = [], [], 0
    for at, rv, name, ip in emitted:
        seq = min((s for s, puts in seen.items() if (name, ip) in puts), default=None)
        if seq is None:
            unpublished += 1
        else:
            written = next((t for _, s, t in follower_gens if s >= seq), None)
            if written is not None:
                follower_ms.append((written - at) * 1000)
        written = next((t for r, _, t in leader_gens if r >= rv), None)
        if written is not None:
            leader_ms.append((written - at) * 1000)
    result: dict[str, Any] = {
        "start": {role: {"requests": start[role]["requests"] - start[role]["watches"], "bytes": start[role]["bytes"]}
                  for role in roles},
        "per_change_bytes": {role: (during[role]["bytes"] - start[role]["bytes"]) / changes for role in roles},
        "cpu_ms": {role: (cpu1[role] - cpu0[role]) * 1000 / changes for role in roles},
        "rss": rss, "follower_ms": follower_ms, "leader_ms": leader_ms, "unpublished": unpublished,
        "missing_seqs": sorted(set(range(min(seen, default=0), max(seen, default=0) + 1)) - set(seen)),
    }
    # Takeover: the leader goes; the follower's files must name a new rank 0.
    env_file = tmp / roles["follower"] / "torch.env"

    def master() -> str:
        for line in env_file.read_text().splitlines():
            if line.startswith("export MASTER_ADDR=") or line.startswith("MASTER_ADDR="):
                return line.split("=", 1)[1]
        return ""

    before = master()
    leader = running.pop("leader")[0]
    killed = time.monotonic()
    if takeover == "crash":
        leader.kill()
    else:
        leader.terminate()
    leader.wait(30)
    sandbox.delete_pod("default", roles["leader"])
    wait_until(lambda: master() not in ("", before), lease + 30, "the follower to see a new rank 0")
    result["takeover"] = time.monotonic() - killed
    for proc, _ in running.values():
        proc.terminate()
        proc.wait(30)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.1, help="seconds between single-pod changes")
    parser.add_argument("--spread", type=float, default=10.0, help="pods get their IPs over this many seconds")
    parser.add_argument("--lease-seconds", type=int, default=15)
    parser.add_argument("--takeover", choices=["crash", "sigterm"], default="crash")
    parser.add_argument("--view", choices=["full", "own"], default="full", help="what followers read (--view)")
    parser.add_argument("--seed", type=int, default=0, help="run k uses IP order seed + k (compare commits on the "
                                                            "same orders)")
    args = parser.parse_args()
    VIEW[:] = ["--view", args.view]
    runs = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp_name, SandboxThread(Path(tmp_name) / "sb") as sandbox:
            tmp = Path(tmp_name)
            build_job(sandbox, args.pods, args.pods)
            first = start_up(sandbox, tmp, args.pods, args.spread, seed=args.seed + run)
            runs.append({**first, **steady(sandbox, tmp, args.pods, args.changes, args.gap, args.lease_seconds,
                                           args.takeover)})
        print(f"run {run + 1}: {json.dumps({k: v for k, v in runs[-1].items() if not k.endswith('_ms')})}",
              file=sys.stderr)

    def med(values: list[float], fmt: str = ".2f") -> str:
        return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"

    n = args.pods
    leader, follower = "demo-master-0", f"demo-worker-{n // 2}"
    print(f"### {n} pods, {args.runs} runs: medians (min-max)\n")
    print(f"Start-up, every pod late (IPs over {args.spread:g} s, random order):\n")
    print(f"- critical path, first IP to last init done: {med([r['critical_path'] for r in runs])} s; "
          f"last init done after the last IP: {med([r['after_last_ip'] for r in runs])} s")
    for name, label in ((leader, "leader"), ("demo-worker-0", "standby"), (follower, "follower")):
        inits = [r["inits"][name] for r in runs]
        rss = med([i["rss"] for i in inits], ".0f")
        print(f"- {label} init: CPU {med([i['cpu'] for i in inits])} s, peak RSS {rss}"
              f" MB, {med([i['requests'] for i in inits], '.0f')} requests (+{inits[0]['watches']} watch), "
              f"{med([i['bytes'] / 1024 for i in inits], '.0f')} KiB")
    def start_bytes(run: dict[str, Any], role: str, pod: str) -> float:
        return run["inits"][pod]["bytes"] + run["start"][role]["bytes"]

    # Every pod of the job is one of these: the leader, 2 standbys, and followers like the one measured.
    job_wide = [(start_bytes(r, "leader", leader) + 2 * start_bytes(r, "standby", "demo-worker-0")
                 + (n - 3) * start_bytes(r, "follower", follower)) / 2**30 for r in runs]
    print(f"- job-wide start-up bytes (leader + 2 standbys + {n - 3} followers, init and sidecar start): "
          f"{med(job_wide)} GiB")
    print(f"\nSteady state, {args.changes} single-pod changes, one every {args.gap:g} s:\n")
    for role in ("leader", "standby", "follower"):
        start = [r["start"][role] for r in runs]
        print(f"- {role} sidecar: start {med([s['requests'] for s in start], '.0f')} requests, "
              f"{med([s['bytes'] / 1024 for s in start], '.0f')} KiB; per change "
              f"{med([r['per_change_bytes'][role] for r in runs], '.0f')} B received, "
              f"CPU {med([r['cpu_ms'][role] for r in runs], '.1f')} ms; "
              f"peak RSS {med([r['rss'][role] for r in runs], '.0f')} MB")
    for key, label in (("follower_ms", "follower"), ("leader_ms", "leader")):
        p50 = [statistics.median(r[key]) for r in runs if r[key]]
        p99 = [percentile(r[key], 0.99) for r in runs if r[key]]
        if not p50:  # --view own: a worker's new IP changes no file of another worker
            print(f"- {label} event-to-file: no change rewrote its files")
            continue
        print(f"- {label} event-to-file: p50 {med(p50, '.0f')} ms, p99 {med(p99, '.0f')} ms "
              f"({len(runs[0][key])} changes credited in run 1)")
    print(f"- changes never published: {[r['unpublished'] for r in runs]}; journal sequences the benchmark missed: "
          f"{[len(r['missing_seqs']) for r in runs]}")
    print(f"\nTakeover ({args.takeover}, lease {args.lease_seconds} s): leader gone -> follower's files name a new "
          f"rank 0: {med([r['takeover'] for r in runs])} s")


if __name__ == "__main__":
    main()
