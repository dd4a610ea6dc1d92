"""Benchmark: ``topology-agent init`` for one pod of a large job in the sandbox.

Measures, per run, from process start to exit (files written): wall time, API requests and bytes the sandbox
served to that process, and the process's peak RSS (VmHWM, as the agent logs it). Prints medians over the runs as a
Markdown table. With ``--kubectl``, each run is followed by one ``kubectl get pods -o json`` of the same namespace
from the same sandbox (the same pods, bytes and TLS), and the table adds its median and init's ratio to it: a
figure that holds on a machine whose speed drifts, since both sides drift together. The job's pods all have IPs,
so the gang is complete at the first LIST; ``--late N`` leaves
N pods without IP until 0.5 s after init starts, which exercises the one WATCH.

    python bench/init_bench.py --pods 1024 --runs 7
    python bench/init_bench.py --pods 1024 --runs 9 --kubectl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import agent
from agent import examples
from agent.runtime.demo import volcano_owner
from agent.sandbox.threaded import SandboxThread

sys.path.insert(0, str(Path(__file__).resolve().parent))
import installed

AGENT_PATH: str | None = None
IMPORTED = str(Path(agent.__file__).resolve().parent.parent)  # the checkout (or site-packages) of this agent


def managed_fields(pod: dict) -> list[dict]:
    """Server-side-apply bookkeeping as real pods carry it (~5 KB): most of a real pod's bytes."""
    fields = {f"f:{k}": {} for k in ("metadata", "spec", "status")}
    fields["f:spec"] = {"f:containers": {f'k:{{"name":"c{i}"}}': {".": {}, "f:image": {}, "f:env": {
        f'k:{{"name":"VAR_{j}"}}': {".": {}, "f:name": {}, "f:value": {}} for j in range(12)}} for i in range(2)}}
    return [{"manager": "volcano-controller", "operation": "Update", "apiVersion": "v1",
             "time": "2026-11-22T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields}]


def build_job(sandbox: SandboxThread, n: int, late: int) -> list[str]:
    owner = volcano_owner()
    owner["spec"]["tasks"] = [{"name": "master", "replicas": 1, "template": {}},
                              {"name": "worker", "replicas": n - 1, "template": {}}]
    created = sandbox.create("batch.volcano.sh/v1alpha1/jobs", "default", owner)
    pods = examples.volcano_job("demo", (("master", 1), ("worker", n - 1)))
    late_names = []
    for i, pod in enumerate(pods):
        pod["metadata"]["ownerReferences"][0]["uid"] = created["metadata"]["uid"]
        pod["metadata"]["managedFields"] = managed_fields(pod)
        if i >= n - late:
            pod["status"] = {"phase": "Pending"}
            late_names.append(pod["metadata"]["name"])
        sandbox.create_pod(pod)
    return late_names


def one_run(sandbox: SandboxThread, pod: str, out: Path, late: list[str], ips: dict[str, str],
            extra: tuple[str, ...] = (), spread: float = 0.0) -> dict:
    with tempfile.TemporaryFile() as log_file:  # not a pipe: nobody reads it until the process ends
        return _one_run(sandbox, pod, out, late, ips, extra, spread, log_file)


def _one_run(sandbox: SandboxThread, pod: str, out: Path, late: list[str], ips: dict[str, str],
             extra: tuple[str, ...], spread: float, log_file: Any) -> dict:
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": pod, "POD_NAMESPACE": "default"}
    env.pop("KUBECONFIG", None)
    # The agent this benchmark imported, or another checkout's (side-by-side comparisons), found through
    # PYTHONPATH alone: run from outside any checkout, `python -m` would put the current directory's agent first.
    env["PYTHONPATH"] = AGENT_PATH or IMPORTED
    agent = f"topology-agent/0.1.0 init (default/{pod})"
    sandbox.reset_stats()
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "init", "--out", str(out), "--address", "ip",
                             "--log-format", "json", *extra], env=env, stdout=subprocess.DEVNULL,
                            stderr=log_file, cwd=out.parent)
    timer = None
    last_ip = [started]
    if late:
        def give_ips() -> None:
            for k, name in enumerate(late):  # evenly over `spread` seconds: pods start one by one in a cluster
                if spread:
                    time.sleep(max(0.0, started + 0.5 + spread * (k + 1) / len(late) - time.perf_counter()))
                sandbox.set_pod_ip("default", name, ips[name])
            last_ip[0] = time.perf_counter()
        timer = threading.Timer(0.5, give_ips)
        timer.start()
    _, status, usage = os.wait4(proc.pid, 0)
    ended = time.perf_counter()
    wall = ended - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    log_file.seek(0)
    err = log_file.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"init failed: {err[-500:]}")
    if timer:
        timer.join()
        for name in late:  # reset for the next run
            sandbox.update_pod("default", name, lambda p: p.__setitem__("status", {"phase": "Pending"}))
    everything = sandbox.stats()
    stats = everything["byAgent"].get(agent, {"requests": 0, "bytes": 0, "watches": 0})
    last_sent = everything["lastEventAt"].get(agent, last_ip[0])  # the sandbox shares this process's GIL
    # rusage's ru_maxrss would include this (large) parent's memory at fork; the agent logs its own VmHWM.
    last = json.loads(err.strip().splitlines()[-1])["msg"]
    rss_mb = float(last.rsplit("peak RSS ", 1)[1].split()[0])
    return {"wall": wall, "rss_mb": rss_mb, "requests": stats["requests"] - stats["watches"],
            "watches": stats["watches"], "bytes": stats["bytes"], "cpu": usage.ru_utime + usage.ru_stime,
            "after_last_ip": ended - last_ip[0] if late else 0.0,
            "after_last_event": ended - max(last_ip[0], last_sent) if late else 0.0,
            "event_lag": max(0.0, last_sent - last_ip[0]) if late else 0.0}


def kubectl_run(sandbox: SandboxThread) -> tuple[float, float]:
    """Wall and CPU seconds of one ``kubectl get pods -o json`` of the job's namespace, output discarded."""
    cmd = ["kubectl", "--kubeconfig", str(sandbox.sandbox.kubeconfig), "get", "pods", "-n", "default", "-o", "json"]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"kubectl get pods failed: exit {os.waitstatus_to_exitcode(status)}")
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--late", type=int, default=0)
    parser.add_argument("--source", default="pods", choices=["pods", "published"])
    parser.add_argument("--spread", type=float, default=0.0, help="late pods get their IPs evenly over this many s")
    parser.add_argument("--kubectl", action="store_true",
                        help="after each run, time kubectl get pods -o json of the same pods; print the ratio")
    parser.add_argument("--agent-path", help="run the agent from this checkout (PYTHONPATH of the agent process "
                                             "only): the same pods and sandbox, another commit's init")
    args = parser.parse_args()
    installed.compile_agent()  # as pip install does: no process below compiles the agent
    global AGENT_PATH
    AGENT_PATH = args.agent_path
    if AGENT_PATH:
        installed.compile_agent(Path(AGENT_PATH) / "agent")
    with tempfile.TemporaryDirectory() as tmp, SandboxThread(Path(tmp) / "sb") as sandbox:
        late = build_job(sandbox, args.pods, args.late)
        ips = {p["metadata"]["name"]: p["status"]["podIP"]
               for p in examples.volcano_job("demo", (("master", 1), ("worker", args.pods - 1)))}
        pod = f"demo-worker-{args.pods // 2}"
        baseline = []
        for _ in range(args.runs):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            baseline.append(time.perf_counter() - t)
        extra = ("--source", args.source)
        if args.source == "published":  # the leader (node rank 0) publishes once; the runs measure a follower
            one_run(sandbox, "demo-master-0", Path(tmp) / "leader", [], ips, extra)
        runs: list[dict] = []
        kubectl: list[tuple[float, float]] = []
        for i in range(args.runs):
            runs.append(one_run(sandbox, pod, Path(tmp) / f"out{i}", late, ips, extra, args.spread))
            if args.kubectl:
                kubectl.append(kubectl_run(sandbox))
        pod_bytes = len(json.dumps(sandbox.sandbox.store.get("/v1/pods", "default", pod)))
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print("| pods | late pods | runs | wall median (s) | wall min-max (s) | API requests (+watches) | bytes received |"
          " peak RSS median (MB) | bare `python -c pass` (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {args.pods} | {args.late} | {args.runs} | {med['wall']:.2f} | {min(r['wall'] for r in runs):.2f}-"
          f"{max(r['wall'] for r in runs):.2f} | {med['requests']:.0f} (+{med['watches']:.0f}) | "
          f"{med['bytes'] / 1e3:.0f} kB | {med['rss_mb']:.0f} | {statistics.median(baseline):.2f} |")
    print(f"\none pod object is {pod_bytes} bytes of JSON; init CPU median {med['cpu']:.2f} s "
          f"({min(r['cpu'] for r in runs):.2f}-{max(r['cpu'] for r in runs):.2f}); done after the last pod's IP: "
          f"median {med['after_last_ip']:.2f} s ({min(r['after_last_ip'] for r in runs):.2f}-"
          f"{max(r['after_last_ip'] for r in runs):.2f}); of which the sandbox (a thread of this benchmark) "
          f"took {med['event_lag']:.2f} s to send the last event; done after the last event was sent: median "
          f"{med['after_last_event']:.2f} s ({min(r['after_last_event'] for r in runs):.2f}-"
          f"{max(r['after_last_event'] for r in runs):.2f})")
    if kubectl:
        walls, cpus = [k[0] for k in kubectl], [k[1] for k in kubectl]
        ratios = sorted(r["wall"] / k for r, k in zip(runs, walls, strict=True))
        print(f"kubectl get pods -o json: wall median {statistics.median(walls):.2f} s ({min(walls):.2f}-"
              f"{max(walls):.2f}), CPU median {statistics.median(cpus):.2f} s; init / kubectl: wall "
              f"{med['wall'] / statistics.median(walls):.2f}x (per run {ratios[0]:.2f}-{ratios[-1]:.2f}x), CPU "
              f"{med['cpu'] / statistics.median(cpus):.2f}x")


if __name__ == "__main__":
    main()
