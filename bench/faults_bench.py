"""Benchmark: what init and the sidecar do when the API server misbehaves (stalls, trickles, errors).

Each scenario starts a 2-pod Volcano job in the sandbox (one worker without an IP, so init has to wait), turns on
one fault, and measures the agent process: requests per second while the fault lasts, and how long until it
recovers (init: exits with its files, or with an error; sidecar: writes the change made during the fault).

    python bench/faults_bench.py --runs 3        # every scenario, three runs each, then their medians
    python bench/faults_bench.py --only hang     # scenarios whose name contains "hang"

Numbers are wall-clock on this machine; the sandbox's own request counter (per User-Agent) counts requests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import examples
from agent.runtime.demo import volcano_owner
from agent.sandbox.threaded import SandboxThread

JOB = "faults"


def make_job(sandbox: SandboxThread) -> list[dict[str, Any]]:
    owner = volcano_owner()
    owner["metadata"]["name"] = JOB
    owner["spec"]["tasks"] = [{"name": "master", "replicas": 1}, {"name": "worker", "replicas": 1}]
    created = sandbox.create("batch.volcano.sh/v1alpha1/jobs", "default", owner)
    pods = examples.volcano_job(JOB, (("master", 1), ("worker", 1)))
    for pod in pods:
        pod["metadata"]["ownerReferences"][0]["uid"] = created["metadata"]["uid"]
    pods[1]["status"] = {"phase": "Pending"}  # no IP: init waits for it
    for pod in pods:
        sandbox.create_pod(pod)
    return pods


def agent_env(sandbox: SandboxThread, pod: str) -> dict[str, str]:
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": pod, "POD_NAMESPACE": "default"}
    env.pop("KUBECONFIG", None)
    return env


def requests_of(sandbox: SandboxThread, agent: str) -> int:
    return sum(v["requests"] for k, v in sandbox.stats()["byAgent"].items() if agent in k)


def run_init(fault: dict[str, Any], *, timeout: int, fix_after: float | None, fix: str) -> dict[str, Any]:
    """init on a job whose worker gets its IP ``fix_after`` seconds into the fault (None: never)."""
    with tempfile.TemporaryDirectory() as tmp, SandboxThread(Path(tmp) / "sandbox", bookmark_interval=0.5) as sb:
        make_job(sb)
        sb.faults(**fault)
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "init", "--out", f"{tmp}/out", "--address", "ip",
                                 "--timeout", str(timeout)], env=agent_env(sb, f"{JOB}-master-0"),
                                stderr=subprocess.PIPE, text=True)
        fixed = False
        while proc.poll() is None and time.monotonic() - started < timeout + 60:
            if fix_after is not None and not fixed and time.monotonic() - started > fix_after:
                if fix == "ip":
                    sb.set_pod_ip("default", f"{JOB}-worker-0", examples.loopback_ip(1))
                else:
                    sb.faults(clear=True)
                fixed = True
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
        took = time.monotonic() - started
        count = requests_of(sb, "init")
    return {"exit": proc.returncode, "seconds": round(took, 1), "requests": count,
            "per_second": round(count / max(took, 0.001), 1), "last": (err.strip().splitlines() or [""])[-1][:160]}


def run_sidecar(fault: dict[str, Any], *, window: float, change_after: float) -> dict[str, Any]:
    """A sidecar following the job; the fault starts (and open watches are cut), and ``change_after`` seconds
    later the worker gets its IP: how long until the sidecar's files have it, and how many requests it made."""
    with tempfile.TemporaryDirectory() as tmp, SandboxThread(Path(tmp) / "sandbox", bookmark_interval=0.5) as sb:
        make_job(sb)
        out = Path(tmp) / "out"
        proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "sidecar", "--out", str(out), "--address", "ip",
                                 "--debounce", "0", "--health-port", "0"], env=agent_env(sb, f"{JOB}-master-0"),
                                stderr=subprocess.DEVNULL)
        try:
            time.sleep(2.0)
            before = requests_of(sb, "sidecar")
            sb.faults(drop_watches=True, **fault)
            started = time.monotonic()
            changed_at, seen_at = None, None
            while time.monotonic() - started < window:
                if changed_at is None and time.monotonic() - started > change_after:
                    sb.set_pod_ip("default", f"{JOB}-worker-0", examples.loopback_ip(1))
                    changed_at = time.monotonic()
                if changed_at is not None and seen_at is None and _has_worker(out):
                    seen_at = time.monotonic()
                    break
                time.sleep(0.05)
            took = time.monotonic() - started
            count = requests_of(sb, "sidecar") - before
        finally:
            proc.terminate()
            proc.wait(15)
    return {"recovered": None if seen_at is None or changed_at is None else round(seen_at - changed_at, 1),
            "requests": count, "per_second": round(count / max(took, 0.001), 1), "window": round(took, 1)}


def _has_worker(out: Path) -> bool:
    try:
        return f"{JOB}-worker-0" in json.loads((out / "topology.json").read_text())["env"].get("VC_WORKER_HOSTS", "") \
            or examples.loopback_ip(1) in (out / "hostfile").read_text()
    except (OSError, ValueError, KeyError):
        return False


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    # init --timeout 20; the missing IP arrives 2 s in: a hung watch must not hide it
    "init: watch hangs silently": lambda: run_init({"watch": "hang", "path": "/pods"}, timeout=20, fix_after=2,
                                                   fix="ip"),
    # init --timeout 10; nothing arrives: how fast does it ask, and does it stop at the deadline
    "init: watch ends at once (200, empty)": lambda: run_init({"watch": "empty", "path": "/pods"}, timeout=10,
                                                              fix_after=None, fix=""),
    "init: every watch 410": lambda: run_init({"watch": "gone", "path": "/pods"}, timeout=10, fix_after=None,
                                              fix=""),
    "init: 429 Retry-After 0": lambda: run_init({"status": 429, "retry_after": 0}, timeout=10, fix_after=None,
                                                fix=""),
    "init: 1 byte/s": lambda: run_init({"trickle": 1.0}, timeout=10, fix_after=None, fix=""),
    "init: no answer": lambda: run_init({"delay": 3600.0}, timeout=10, fix_after=None, fix=""),
    # sidecars: the change comes 2 s into the fault; 130 s to notice it
    "sidecar: watch hangs silently": lambda: run_sidecar({"watch": "hang", "path": "/pods"}, window=130,
                                                         change_after=2),
    "sidecar: watch ends at once (200, empty)": lambda: run_sidecar({"watch": "empty", "path": "/pods"}, window=10,
                                                                    change_after=30),
    "sidecar: every watch 410": lambda: run_sidecar({"watch": "gone", "path": "/pods"}, window=10, change_after=30),
    "sidecar: 429 Retry-After 0": lambda: run_sidecar({"status": 429, "retry_after": 0}, window=10,
                                                      change_after=30),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="run the scenarios whose name contains this")
    parser.add_argument("--runs", type=int, default=1, help="runs per scenario; more than one adds the medians")
    args = parser.parse_args()
    for name, scenario in SCENARIOS.items():
        if args.only not in name:
            continue
        results = []
        for run in range(args.runs):
            results.append(scenario())
            print(f"{name} (run {run + 1}): {json.dumps(results[-1])}", flush=True)
        if args.runs > 1:
            print(f"{name} (median of {args.runs}): {json.dumps(medians(results))}", flush=True)


def medians(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Each numeric field's median (None when a run had none: a recovery that never came); the rest as listed."""
    merged: dict[str, Any] = {}
    for key in results[0]:
        values = [r[key] for r in results]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            merged[key] = statistics.median(values)
        elif any(v is None for v in values) and all(v is None or isinstance(v, int | float) for v in values):
            merged[key] = None if values.count(None) * 2 >= len(values) else statistics.median(
                [v for v in values if v is not None])
        else:
            merged[key] = sorted({str(v) for v in values})
    return merged


if __name__ == "__main__":
    main()
