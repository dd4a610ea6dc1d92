"""Benchmark: the admission webhook's latency at a steady request rate, on one core.

`topology-agent webhook` runs as a real process pinned to one CPU (taskset), with its TLS and the sandbox as its
API server (the benchmark's thread, on the other CPU). The benchmark sends AdmissionReviews of real pods (a
Volcano job's worker, 4-5 KB) over one keep-alive TLS connection per sender, as the API server does, open-loop
at ``--rate`` requests/s (a request is due at t0 + i/rate whether or not the one before has been answered), and
times each from its due time to the answer read (so a backlog counts). Each run sends ``--requests`` reviews of
distinct pods (one namespace: its settings are read once, then cached). ``--through-sandbox`` also times pod
CREATEs through the sandbox with the webhook configured against without (what admission adds to a create).

    python bench/webhook_bench.py --rate 100 --requests 3000 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from agent import examples
from agent.core.adoption.injection import INJECT_LABEL
from agent.sandbox.threaded import SandboxThread

ROOT = Path(__file__).resolve().parents[1]
SERVICE = "topology-agent-system/topology-agent-webhook"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pod(i: int) -> dict[str, Any]:
    worker = copy.deepcopy(examples.volcano_job("bench", (("master", 1), ("worker", 2)))[1])
    worker["metadata"]["name"] = f"bench-worker-{i}"
    worker["metadata"]["labels"][INJECT_LABEL] = "enabled"
    for key in ("resourceVersion", "uid", "creationTimestamp"):
        worker["metadata"].pop(key, None)
    worker.pop("status", None)
    worker["spec"].pop("initContainers", None)
    worker["spec"].pop("volumes", None)
    for container in worker["spec"]["containers"]:
        container.pop("volumeMounts", None)
    return worker


def review(i: int) -> bytes:
    obj = pod(i)
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": f"uid-{i}", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "name": obj["metadata"]["name"],
        "namespace": "default", "operation": "CREATE", "object": obj, "oldObject": None}}).encode()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def send_at_rate(url: str, context: ssl.SSLContext, bodies: list[bytes], rate: float,
                       senders: int) -> list[float]:
    """Open loop: request i is due at t0 + i/rate; ``senders`` connections take them in turn."""
    latencies: list[float] = [0.0] * len(bodies)
    connector = aiohttp.TCPConnector(ssl=context, limit=senders, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(senders):  # open the connections first (the API server keeps its own open)
            async with session.post(url, data=review(10**9), headers={"Content-Type": "application/json"}) as r:
                await r.read()
        start = time.perf_counter() + 0.05

        async def one(i: int) -> None:
            due = start + i / rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            async with session.post(url, data=bodies[i], headers={"Content-Type": "application/json"}) as r:
                answer = await r.json()
            assert answer["response"]["allowed"] and answer["response"]["patch"], answer
            latencies[i] = time.perf_counter() - due

        await asyncio.gather(*(one(i) for i in range(len(bodies))))
    return latencies


def webhook_process(sandbox: SandboxThread, port: int, cpu: str) -> subprocess.Popen[str]:
    env = {**os.environ, "KUBECONFIG": str(sandbox.sandbox.kubeconfig), "POD_NAMESPACE": "topology-agent-system"}
    pin = ["taskset", "-c", cpu] if shutil.which("taskset") else []
    proc = subprocess.Popen([*pin, sys.executable, "-m", "agent.cli", "webhook", "--host", "127.0.0.1", "--port",
                             str(port), "--cert-host", "127.0.0.1"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        if proc.poll() is not None:
            raise SystemExit(f"the webhook exited: {proc.communicate()[1][-500:]}")
        time.sleep(0.05)
    raise SystemExit("the webhook did not listen within 30 s")


def server_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def creates(sandbox: SandboxThread, count: int, offset: int) -> list[float]:
    """Pod CREATEs through the sandbox's HTTPS API, one at a time; the latency of each."""
    from agent.k8s.client import Client
    from agent.k8s.config import load_config

    api = Client(load_config(str(sandbox.sandbox.kubeconfig)), user_agent="webhook-bench")
    times = []
    for i in range(count):
        body = pod(offset + i)
        started = time.perf_counter()
        api.create("/api/v1/namespaces/default/pods", body)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--senders", type=int, default=4, help="keep-alive connections (API server replicas)")
    parser.add_argument("--webhook-cpu", default="1", help="the CPU the webhook is pinned to (taskset -c)")
    parser.add_argument("--through-sandbox", type=int, default=0, metavar="N",
                        help="also time N pod CREATEs through the sandbox with and without the webhook")
    args = parser.parse_args()
    port = free_port()
    os.sched_setaffinity(0, {c for c in os.sched_getaffinity(0) if str(c) != args.webhook_cpu} or {0})
    with tempfile.TemporaryDirectory() as tmp, SandboxThread(Path(tmp) / "sb",
                                                             services={SERVICE: f"127.0.0.1:{port}"}) as sandbox:
        sandbox.create("/v1/namespaces", "", {"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": "topology-agent-system"}})
        config = yaml.safe_load((ROOT / "manifests" / "webhook" / "mutatingwebhookconfiguration.yaml").read_text())
        sandbox.create("admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", "", config)
        proc = webhook_process(sandbox, port, args.webhook_cpu)
        try:
            time.sleep(0.5)  # the caBundle is written right after the listener opens
            stored = sandbox.sandbox.store.get("admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", "",
                                               "topology-agent")
            import base64

            ca = base64.b64decode(stored["webhooks"][0]["clientConfig"]["caBundle"]).decode()
            context = ssl.create_default_context(cadata=ca)
            url = f"https://127.0.0.1:{port}/mutate"
            results = []
            for run in range(args.runs):
                bodies = [review(run * args.requests + i) for i in range(args.requests)]
                cpu_before, wall_before = server_cpu(proc.pid), time.perf_counter()
                latencies = asyncio.run(send_at_rate(url, context, bodies, args.rate, args.senders))
                cpu = server_cpu(proc.pid) - cpu_before
                wall = time.perf_counter() - wall_before
                results.append({"p50": percentile(latencies, 0.5) * 1e3, "p99": percentile(latencies, 0.99) * 1e3,
                                "max": max(latencies) * 1e3, "cpu_per_review": cpu / args.requests * 1e3,
                                "busy": cpu / wall})
                print(f"run {run + 1}: p50 {results[-1]['p50']:.2f} ms, p99 {results[-1]['p99']:.2f} ms, "
                      f"max {results[-1]['max']:.2f} ms, webhook CPU {results[-1]['cpu_per_review']:.2f} ms per "
                      f"review ({results[-1]['busy'] * 100:.0f} % of its core)", flush=True)
            sandbox_rows = None
            if args.through_sandbox:
                with_hook = creates(sandbox, args.through_sandbox, 10**6)
                sandbox.call(_delete_config(sandbox))
                without = creates(sandbox, args.through_sandbox, 2 * 10**6)
                sandbox_rows = (with_hook, without)
        finally:
            proc.terminate()
            proc.wait(15)
    med = {k: statistics.median(r[k] for r in results) for k in results[0]}
    span = {k: (min(r[k] for r in results), max(r[k] for r in results)) for k in results[0]}
    print("\n| rate | reviews per run | runs | p50 (ms) | p99 (ms) | max (ms) | webhook CPU per review (ms) |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.rate:g}/s | {args.requests} | {args.runs} | {med['p50']:.2f} ({span['p50'][0]:.2f}-"
          f"{span['p50'][1]:.2f}) | {med['p99']:.2f} ({span['p99'][0]:.2f}-{span['p99'][1]:.2f}) | "
          f"{med['max']:.1f} | {med['cpu_per_review']:.2f} |")
    if sandbox_rows:
        with_hook, without = sandbox_rows
        print(f"\npod CREATE through the sandbox, {len(with_hook)} one at a time: with the webhook p50 "
              f"{percentile(with_hook, 0.5) * 1e3:.2f} ms / p99 {percentile(with_hook, 0.99) * 1e3:.2f} ms; "
              f"without p50 {percentile(without, 0.5) * 1e3:.2f} ms / p99 {percentile(without, 0.99) * 1e3:.2f} ms")


async def _delete_config(sandbox: SandboxThread) -> None:
    sandbox.sandbox.store.delete("admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", "",
                                 "topology-agent")


if __name__ == "__main__":
    main()
