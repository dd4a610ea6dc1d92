"""Benchmark: the sidecar following a 1024-pod job, debounce 0.

Each change moves one worker to a new IP (a membership change: one rewrite, one signal). For each change it
records the time the benchmark asked the sandbox to make it, the time the sidecar renamed the files into place
(its own log, CLOCK_MONOTONIC, which is system-wide on Linux) and the time the trainer process received the
signal. Reports p50/p99 of both latencies, the sidecar's steady RSS, CPU per change, and CPU while idle.

    python bench/sidecar_bench.py --pods 1024 --changes 200
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
from init_bench import build_job
from published_bench import generations as written

TRAINER = r"""
import signal, sys, time
out = open(sys.argv[1], "a", buffering=1)
def handler(signum, frame):
    out.write(f"{time.monotonic():.6f}\n")
signal.signal(signal.SIGUSR1, handler)
open(sys.argv[1] + ".ready", "w").close()
while True:
    signal.pause()
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def delays(emitted: list[float], versions: list[int], log: Path, record: Path) -> tuple[list[float], list[float], int]:
    """Seconds from each change (when it was written, its resourceVersion) to the first generation that carries it:
    to its files renamed (the sidecar's ``log``) and to its trainer signalled (the stub trainer's ``record``); and
    how many generations the sidecar wrote."""
    generations = [(rv, at) for rv, _, at in written(log)]  # (resourceVersion included, files renamed at)
    signal_at = [float(x) for x in record.read_text().split()]
    if len(signal_at) != len(generations):
        raise SystemExit(f"{len(generations)} generations but {len(signal_at)} signals")
    files, signals = [], []
    for emitted_at, version in zip(emitted, versions, strict=True):
        # The first generation computed with this change's resourceVersion (or a later one) carries it.
        index = next(i for i, (rv, _) in enumerate(generations) if rv >= version)
        files.append(generations[index][1] - emitted_at)
        signals.append(signal_at[index] - emitted_at)
    return files, signals, len(generations)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=1024)
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between changes")
    parser.add_argument("--debounce", default="0", help="the sidecar's --debounce; 'default' passes none")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name, SandboxThread(Path(tmp_name) / "sb",
                                                                  bookmark_interval=1.0) as sandbox:
        tmp = Path(tmp_name)
        build_job(sandbox, args.pods, 0)
        shared = tmp / "shared"
        state = tmp / "agent-state"  # the pod's state volume, as inject mounts one: init's reads for its sidecar
        state.mkdir()
        env = {**os.environ, **sandbox.client_env(), "POD_NAME": "demo-worker-1", "POD_NAMESPACE": "default"}
        env.pop("KUBECONFIG", None)
        # Every pod follows the pods here; the published mode is measured by scale_bench.py --source published.
        subprocess.run([sys.executable, "-m", "agent.cli", "init", "--out", str(shared), "--state-dir", str(state),
                        "--address", "ip", "--source", "pods"], env=env, check=True, stderr=subprocess.DEVNULL)
        record = tmp / "signals.txt"
        trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(record)])
        while not Path(str(record) + ".ready").exists():
            time.sleep(0.01)
        log_path = tmp / "sidecar.log"
        pid_file = tmp / "trainer.pid"
        pid_file.write_text(str(trainer.pid))
        with log_path.open("w") as log:
            sidecar = subprocess.Popen(
                [sys.executable, "-m", "agent.cli", "sidecar", "--out", str(shared), "--state-dir", str(state),
                 "--address", "ip",
                 *([] if args.debounce == "default" else ["--debounce", args.debounce]),
                 "--trainer-pid-file", str(pid_file), "--health-port", "0", "--log-format", "json"],
                env=env, stderr=log)
        proc = psutil.Process(sidecar.pid)
        time.sleep(3.0)  # list, watch, settle
        idle_cpu_start = sum(proc.cpu_times()[:2])
        time.sleep(5.0)
        idle_cpu = sum(proc.cpu_times()[:2]) - idle_cpu_start
        cpu_start = sum(proc.cpu_times()[:2])
        emitted, versions = [], []
        for i in range(args.changes):
            name = f"demo-worker-{2 + i % (args.pods - 3)}"
            ip = examples.loopback_ip(args.pods + i)  # past every pod's address
            emitted.append(time.monotonic())
            versions.append(int(sandbox.set_pod_ip("default", name, ip)["metadata"]["resourceVersion"]))
            time.sleep(args.gap)
        time.sleep(2.0)
        cpu_used = sum(proc.cpu_times()[:2]) - cpu_start
        time.sleep(2.0)  # the sidecar returns freed memory 2 s after a burst of changes
        steady_rss = rss_mb(sidecar.pid)
        sidecar.terminate()
        sidecar.wait(15)
        trainer.kill()
        trainer.wait()
        files, signals, count = delays(emitted, versions, log_path, record)
    files, signals = [s * 1000 for s in files], [s * 1000 for s in signals]
    coalesced = args.changes - count
    print("| pods | changes (generations) | files renamed p50 / p99 (ms) | signal delivered p50 / p99 (ms) |"
          " steady RSS (MB) | CPU per change (ms) | CPU while idle (ms/s) |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.pods} | {args.changes} ({args.changes - coalesced}) | "
          f"{statistics.median(files):.1f} / {percentile(files, 0.99):.1f} | "
          f"{statistics.median(signals):.1f} / {percentile(signals, 0.99):.1f} | {steady_rss:.0f} | "
          f"{cpu_used / args.changes * 1000:.1f} | {idle_cpu / 5.0 * 1000:.1f} |")


if __name__ == "__main__":
    main()
