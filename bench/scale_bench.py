"""Scaling of the current design (every pod lists and watches every pod of its job): cost per pod and in total.

For each job size it runs init for one pod (median of --runs) and a sidecar through --changes membership
changes, then reports per-pod API requests and bytes at start, init wall time, sidecar RSS and event-to-file
latency, and the whole job's API traffic at start (N pods x bytes per pod: N^2 when every pod lists every pod).

    python bench/scale_bench.py --sizes 256 1024 4096 --runs 3 --changes 50
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from agent import examples
from agent.sandbox.threaded import SandboxThread

sys.path.insert(0, str(Path(__file__).resolve().parent))
from init_bench import build_job, one_run
from published_bench import generations as written
from sidecar_bench import rss_mb


def sidecar_run(sandbox: SandboxThread, tmp: Path, pods: int, changes: int, source: str,
                gap: float) -> dict[str, float]:
    """The sidecar of demo-worker-1; with a published topology it is a follower, and the leader's sidecar runs too."""
    shared = tmp / "sidecar-shared"
    state = tmp / "sidecar-state"  # the pod's state volume, as inject mounts one: init's reads for its sidecar
    state.mkdir(exist_ok=True)
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": "demo-worker-1", "POD_NAMESPACE": "default"}
    env.pop("KUBECONFIG", None)
    subprocess.run([sys.executable, "-m", "agent.cli", "init", "--out", str(shared), "--state-dir", str(state),
                    "--address", "ip", "--source", source], env=env, check=True, stderr=subprocess.DEVNULL)
    leader = None
    if source == "published":
        leader_env = {**env, "POD_NAME": "demo-master-0"}
        leader = subprocess.Popen([sys.executable, "-m", "agent.cli", "sidecar", "--out", str(tmp / "leader-shared"),
                                   "--address", "ip", "--debounce", "0", "--signal", "none", "--health-port", "0"],
                                  env=leader_env, stderr=subprocess.DEVNULL)
    agent = "topology-agent/0.1.0 sidecar (default/demo-worker-1)"
    sandbox.reset_stats()
    log_path = tmp / "sidecar.log"
    with log_path.open("w") as log:
        sidecar = subprocess.Popen([sys.executable, "-m", "agent.cli", "sidecar", "--out", str(shared), "--state-dir",
                                    str(state), "--address", "ip", "--debounce", "0", "--signal", "none",
                                    "--health-port", "0", "--log-format", "json"], env=env, stderr=log)
    time.sleep(3.0 + pods / 1000)
    start_stats = dict(sandbox.stats()["byAgent"].get(agent, {}))
    emitted, versions = [], []
    for i in range(changes):
        emitted.append(time.monotonic())
        new_ip = examples.loopback_ip(pods + i)  # past every pod's own address, at any size
        obj = sandbox.set_pod_ip("default", f"demo-worker-{2 + i}", new_ip)
        versions.append(int(obj["metadata"]["resourceVersion"]))
        time.sleep(gap)
    time.sleep(2.0)
    rss = rss_mb(sidecar.pid)
    psutil.Process(sidecar.pid).terminate()
    sidecar.wait(15)
    if leader is not None:
        leader.terminate()
        leader.wait(15)
    generations = [(rv, at) for rv, _, at in written(log_path)]  # (resourceVersion included, files renamed at)
    latencies = []
    for at, version in zip(emitted, versions, strict=True):
        found = next((t for rv, t in generations if rv >= version), None)
        if found is not None:
            latencies.append((found - at) * 1000)
    latencies.sort()
    return {"rss": rss, "p50": statistics.median(latencies), "p99": latencies[min(len(latencies) - 1,
                                                                                   round(0.99 * len(latencies)))],
            "start_bytes": start_stats.get("bytes", 0), "start_requests": start_stats.get("requests", 0)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--changes", type=int, default=50)
    parser.add_argument("--source", default="pods", choices=["pods", "published"])
    parser.add_argument("--gap", type=float, default=0.1, help="seconds between membership changes")
    args = parser.parse_args()
    rows = []
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as tmp_name, SandboxThread(Path(tmp_name) / "sb") as sandbox:
            tmp = Path(tmp_name)
            build_job(sandbox, size, 0)
            extra = ("--source", args.source)
            leader = None
            if args.source == "published":  # the leader publishes once; the runs measure a follower
                leader = one_run(sandbox, "demo-master-0", tmp / "leader", [], {}, extra)
            runs = [one_run(sandbox, f"demo-worker-{size // 2}", tmp / f"out{i}", [], {}, extra)
                    for i in range(args.runs)]
            init = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            side = sidecar_run(sandbox, tmp, size, args.changes, args.source, args.gap)
        rows.append((size, init, side, leader))
    print(f"source: {args.source}, a membership change every {args.gap} s")
    print("| pods | init wall (s) | init requests (+watch) | init bytes per pod | job total at start (all pods' init) |"
          " init peak RSS (MB) | sidecar start bytes per pod | sidecar RSS (MB) | event-to-file p50 / p99 (ms) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size, init, side, leader in rows:
        total = size * init["bytes"] + (leader["bytes"] - init["bytes"] if leader else 0)
        print(f"| {size} | {init['wall']:.2f} | {init['requests']:.0f} (+{init['watches']:.0f}) | "
              f"{init['bytes'] / 2**10:.0f} KiB | {total / 2**30:.3f} GiB | {init['rss_mb']:.0f} | "
              f"{side['start_bytes'] / 2**20:.1f} MiB | {side['rss']:.0f} | {side['p50']:.0f} / {side['p99']:.0f} |")


if __name__ == "__main__":
    main()
