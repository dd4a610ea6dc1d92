"""Benchmark: the admission webhook under hostile callers, with its shipped defaults.

Each scenario starts a fresh `topology-agent webhook` process pinned to one CPU (taskset; its reviewing process
inherits the pin, as both share one container's CPU limit), with the sandbox as its API server and the benchmark's
callers on the other CPU. Memory is each process's own high-water mark (VmHWM from /proc, the kernel's exact
peak, not a sample), read for the server and for every reviewing process it started, and their sum (an upper
bound of the container's peak: the two peaks need not coincide).

Scenarios: ``idle`` (started, one review); ``connections`` (1000 TCP connections that never send a byte, held
12 s, then a review); ``heads`` (100 TLS connections that send half a request head, held 12 s); ``objects`` (a 2.85
MiB Pod, a 7.9 MiB one, a Volcano Job with a 3 MiB list, and the costliest shapes the webhook accepts, each just
under its count of JSON values: distinct map keys, short strings, empty objects); ``at_once`` (six 7.9 MiB bodies
at once); ``settings`` (1000 reviews, 8 at a time, each with a distinct 200 KB ``trainer-match``);
``settings_at_bound`` (the same with distinct values of 1000 characters, which are admitted); ``latency``
(/healthz every 10 ms and a small review every 50 ms while the 3 MiB Volcano Job is reviewed back to back);
``latency_alone`` (the same probes without the large reviews: the control for the machine's own load);
``namespaces`` (reviews naming a namespace that is no namespace name, then reviews in real ones: every request
the webhook's reviews make of the API server is listed); ``failing`` (8 reviews at once in a namespace whose read
fails: 403, 500, or no answer).

    python bench/webhook_attack_bench.py --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import multiprocessing
import os
import re
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from agent import __version__, examples
from agent.core.adoption.admission import MAX_VALUES
from agent.core.adoption.injection import INJECT_LABEL, PREFIX
from agent.sandbox.threaded import SandboxThread

SERVICE = "topology-agent-system/topology-agent-webhook"
HOSTILE_NAMESPACES = ["kube-system/secrets/x", "x?watch=true&timeoutSeconds=1", "..", "a b",
                      "topology-agent-system/secrets/topology-agent-webhook-tls"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wrap(obj: dict[str, Any], uid: str, namespace: str = "default", plural: str = "pods") -> bytes:
    group, _, version = obj["apiVersion"].rpartition("/")
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": group, "version": version, "kind": obj["kind"]},
        "resource": {"group": group, "version": version, "resource": plural}, "name": "x",
        "namespace": namespace, "operation": "CREATE", "object": obj, "oldObject": None}}).encode()


def small_pod(i: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p-{i}", "labels": {INJECT_LABEL: "enabled"}},
            "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}}


def annotated_pod(size: int) -> dict[str, Any]:
    pod = small_pod(0)
    pod["metadata"]["annotations"] = {"note": "x" * size}
    return pod


def volcano_with_list(size: int) -> dict[str, Any]:
    job = examples.volcano_job("big", (("master", 1), ("worker", 2)))[0]
    template = {"spec": {"containers": [{"name": "trainer", "image": "trainer:1", "env": []}]}}
    env = template["spec"]["containers"][0]["env"]
    while len(json.dumps(env)) < size:
        env.extend({"name": f"VARIABLE_{len(env)}", "value": f"value-{len(env)}"} for _ in range(1000))
    del job  # the example's pods are not a job object: build the Volcano Job as a user writes it
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "big"},
            "spec": {"tasks": [{"name": "master", "replicas": 1, "template": template},
                               {"name": "worker", "replicas": 2, "template": {"spec": {"containers": [
                                   {"name": "trainer", "image": "trainer:1"}]}}}]}}


def map_keys_pod(entries: int) -> dict[str, Any]:
    pod = small_pod(0)
    pod["spec"]["nodeSelector"] = {f"k{i:06d}": "" for i in range(entries)}
    return pod


def short_strings_pod(entries: int) -> dict[str, Any]:
    pod = small_pod(0)
    pod["spec"]["containers"][0]["args"] = ["ab"] * entries
    return pod


def empty_objects_pod(entries: int) -> dict[str, Any]:
    pod = small_pod(0)
    pod["spec"]["tolerations"] = [{}] * entries
    return pod


class Webhook:
    """One webhook process and what the benchmark reads of it."""

    def __init__(self, sandbox: SandboxThread, port: int, cpu: str) -> None:
        env = {**os.environ, "KUBECONFIG": str(sandbox.sandbox.kubeconfig), "POD_NAMESPACE": "topology-agent-system"}
        pin = ["taskset", "-c", cpu] if shutil.which("taskset") else []
        self.port = port
        self.proc = subprocess.Popen([*pin, sys.executable, "-m", "agent.cli", "webhook", "--host", "127.0.0.1",
                                      "--port", str(port), "--cert-host", "127.0.0.1"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.peaks: dict[int, float] = {}
        self._watching = True
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the webhook did not listen: {self.proc.communicate()[1][-500:]}")
            time.sleep(0.05)
        secret = sandbox.sandbox.store.get("/v1/secrets", "topology-agent-system", "topology-agent-webhook-tls")
        self.trust = base64.b64decode(secret["data"]["ca.crt"]).decode()
        self.context = ssl.create_default_context(cadata=self.trust)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        """Every reviewing process the server starts: its high-water mark, read until it ends."""
        main = psutil.Process(self.proc.pid)
        while self._watching:
            with_children = [main, *main.children(recursive=True)]
            for process in with_children:
                peak = hwm(process.pid)
                if peak is not None:
                    self.peaks[process.pid] = max(self.peaks.get(process.pid, 0.0), peak)
            time.sleep(0.02)

    def stop(self) -> dict[str, float]:
        """Server, reviewer (the largest) and their sum, in MiB (VmHWM is in KiB)."""
        main = self.proc.pid
        self.peaks[main] = max(self.peaks.get(main, 0.0), hwm(main) or 0.0)
        self._watching = False
        self._thread.join()
        self.proc.terminate()
        self.proc.wait(20)
        reviewers = [v for pid, v in self.peaks.items() if pid != main and v > 0]
        server = self.peaks[main]
        reviewer = max(reviewers, default=0.0)
        return {"server": server, "reviewer": reviewer, "sum": server + reviewer}

    def url(self, path: str = "/mutate") -> str:
        return f"https://127.0.0.1:{self.port}{path}"


def hwm(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def post(session: aiohttp.ClientSession, hook: Webhook, body: bytes) -> tuple[int, bytes]:
    async with session.post(hook.url(), data=io.BytesIO(body), ssl=hook.context,
                            headers={"Content-Type": "application/json"}) as answer:
        return answer.status, await answer.read()


async def idle(hook: Webhook) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        status, _ = await post(session, hook, wrap(small_pod(0), "u"))
    return {"answered": status == 200}


async def connections(hook: Webhook) -> dict[str, Any]:
    sockets = []
    for _ in range(1000):
        sock = socket.socket()
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.connect(("127.0.0.1", hook.port))
        sockets.append(sock)
    await asyncio.sleep(12)
    async with aiohttp.ClientSession() as session:  # while they are still open
        started = time.monotonic()
        status, _ = await post(session, hook, wrap(small_pod(0), "u"))
        late = time.monotonic() - started
    for sock in sockets:
        sock.close()
    return {"review after 12 s": f"{status} in {late * 1e3:.0f} ms"}


async def heads(hook: Webhook) -> dict[str, Any]:
    pairs = []
    for _ in range(100):
        reader, writer = await asyncio.open_connection("127.0.0.1", hook.port, ssl=hook.context,
                                                       server_hostname="127.0.0.1")
        writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: applic")
        await writer.drain()
        pairs.append((reader, writer))
    await asyncio.sleep(12)
    closed = 0
    for reader, writer in pairs:
        with contextlib.suppress(TimeoutError, OSError):
            closed += await asyncio.wait_for(reader.read(1), 0.01) == b""
        writer.close()
    return {"half-sent heads closed by the webhook after 12 s": closed}


# The largest of each shape the webhook accepts: just under admission.MAX_VALUES and webhook.MAX_BODY.
UNDER_CAP = int(MAX_VALUES * 0.97)
OBJECTS: dict[str, Callable[[], bytes]] = {
    "Pod, 2.85 MiB annotation": lambda: wrap(annotated_pod(int(2.85 * (1 << 20))), "a"),
    "Pod, 7.9 MiB annotation (the most bytes)": lambda: wrap(annotated_pod(int(7.9 * (1 << 20))), "b"),
    "Volcano Job, 3 MiB list": lambda: wrap(volcano_with_list(3 << 20), "v", plural="jobs"),
    "Pod, distinct map keys at the cap": lambda: wrap(map_keys_pod(UNDER_CAP // 2), "m"),
    "Pod, short strings at the cap": lambda: wrap(short_strings_pod(UNDER_CAP), "s"),
    "Pod, empty objects at the cap": lambda: wrap(empty_objects_pod(UNDER_CAP // 2), "e"),
}


async def objects(hook: Webhook) -> dict[str, Any]:
    out = {}
    async with aiohttp.ClientSession() as session:
        for name, make in OBJECTS.items():
            body = make()
            started = time.monotonic()
            status, answer = await post(session, hook, body)
            result = json.loads(answer)["response"] if status == 200 else {"status": status}
            out[name] = (f"{len(body) / (1 << 20):.2f} MiB: {status}, "
                         f"{'allowed' if result.get('allowed') else result}, {time.monotonic() - started:.2f} s")
            del body
    return out


async def at_once(hook: Webhook) -> dict[str, Any]:
    """Six of the largest bodies at once: the server holds at most 16 MiB of them, the rest wait."""
    body = OBJECTS["Pod, 7.9 MiB annotation (the most bytes)"]()
    async with aiohttp.ClientSession() as session:
        answers = await asyncio.gather(*(post(session, hook, body) for _ in range(6)))
    counts: dict[int, int] = {}
    for status, _ in answers:
        counts[status] = counts.get(status, 0) + 1
    return {"answers": counts}


async def distinct_settings(hook: Webhook, value: Callable[[int], str], **spec: Any) -> dict[str, Any]:
    """1000 reviews, 8 at a time, each Pod with its own ``trainer-match`` (and the sidecar it configures)."""
    counts: dict[str, int] = {}
    async with aiohttp.ClientSession() as session:
        queue = list(range(1000))

        async def sender() -> None:
            while queue:
                i = queue.pop()
                pod = small_pod(i)
                pod["metadata"]["annotations"] = {PREFIX + "sidecar": "true", PREFIX + "trainer-match": value(i)}
                pod["spec"].update(spec)
                status, answer = await post(session, hook, wrap(pod, f"u{i}"))
                result = str(status) if status != 200 else (
                    "allowed" if json.loads(answer)["response"]["allowed"] else "denied")
                counts[result] = counts.get(result, 0) + 1

        started = time.monotonic()
        await asyncio.gather(*(sender() for _ in range(8)))
    return {"answers": counts, "seconds": round(time.monotonic() - started, 1)}


async def settings(hook: Webhook) -> dict[str, Any]:
    """Distinct 200 KB values: each refused by the setting's length bound (1024) before any parser sees it."""
    return await distinct_settings(hook, lambda i: f"{i:06d}" + "x" * (200 * 1024))


async def settings_at_bound(hook: Webhook) -> dict[str, Any]:
    """Distinct values of the most a setting may hold, each a regex the agent's parser compiles: admitted."""
    return await distinct_settings(hook, lambda i: f"train(er)?-{i:06d}-" + "[a-z]" * 200,
                                   shareProcessNamespace=True, securityContext={"runAsUser": 1000})


def send_large(port: int, trust: str, seconds: float, reviewed: Any) -> None:
    """The 3 MiB Volcano Job reviewed back to back for ``seconds``, from a process of its own: encrypting 3 MiB
    on the probes' event loop would delay the probes on the caller's side, not the webhook's."""
    async def send() -> int:
        context = ssl.create_default_context(cadata=trust)
        body = wrap(volcano_with_list(3 << 20), "v", plural="jobs")
        done, stop = 0, time.monotonic() + seconds
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < stop:
                async with session.post(f"https://127.0.0.1:{port}/mutate", data=io.BytesIO(body), ssl=context,
                                        headers={"Content-Type": "application/json"}) as answer:
                    await answer.read()
                    done += answer.status == 200
        return done

    reviewed.value = asyncio.run(send())


async def latency(hook: Webhook, seconds: float = 20.0, large_too: bool = True) -> dict[str, Any]:
    health: list[float] = []
    small: list[float] = []
    spawn = multiprocessing.get_context("spawn")
    reviewed = spawn.Value("i", 0)
    sender = spawn.Process(target=send_large, args=(hook.port, hook.trust, seconds + 2, reviewed))
    if large_too:
        sender.start()
        await asyncio.sleep(2)  # the sender's start-up, and its first large review under way
    stop = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:
        async def healthz() -> None:
            while time.monotonic() < stop:
                started = time.perf_counter()
                async with session.get(hook.url("/healthz"), ssl=hook.context) as answer:
                    await answer.read()
                health.append(time.perf_counter() - started)
                await asyncio.sleep(0.01)

        async def smalls() -> None:
            i = 0
            while time.monotonic() < stop:
                started = time.perf_counter()
                status, _ = await post(session, hook, wrap(small_pod(i), f"s{i}"))
                assert status == 200
                small.append(time.perf_counter() - started)
                i += 1
                await asyncio.sleep(0.05)

        await asyncio.gather(healthz(), smalls())
    if large_too:
        await asyncio.to_thread(sender.join, 60)
    return {"large reviewed": reviewed.value, "healthz": health, "small": small}


async def latency_alone(hook: Webhook) -> dict[str, Any]:
    """The same probes with no large review: what the machine's own load costs them (the control)."""
    return await latency(hook, large_too=False)


def record_requests(sandbox: SandboxThread) -> list[tuple[str, str, str, str]]:
    """Every request the sandbox gates from now on: (User-Agent, method, path, query). The sandbox counts
    requests per client; this keeps what each asked for (the benchmark wraps its gate in its own process)."""
    seen: list[tuple[str, str, str, str]] = []
    gate = sandbox.sandbox._gate

    async def recording(request: Any, agent: str) -> Any:
        seen.append((agent, request.method, request.path, request.query_string))
        return await gate(request, agent)

    sandbox.sandbox._gate = recording  # type: ignore[method-assign]
    return seen


REVIEWS_CLIENT = f"topology-agent/{__version__} webhook"  # the namespaces' reads (cli.py); its TLS has its own
NAMESPACE_GET = re.compile(r"/api/v1/namespaces/[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


async def namespaces(hook: Webhook, sandbox: SandboxThread) -> dict[str, Any]:
    """Reviews naming hostile namespaces (20 of each), then 5 reviews in each of 3 real ones: every request the
    webhook's reviews made is listed."""
    seen = record_requests(sandbox)
    denied = allowed = 0
    async with aiohttp.ClientSession() as session:
        for round_ in range(20):
            for namespace in HOSTILE_NAMESPACES:
                status, answer = await post(session, hook, wrap(small_pod(round_), "n", namespace=namespace))
                denied += status == 200 and not json.loads(answer)["response"]["allowed"]
        for namespace in ("default", "team-a", "team-b"):
            for i in range(5):
                status, answer = await post(session, hook, wrap(small_pod(i), "ok", namespace=namespace))
                allowed += status == 200 and json.loads(answer)["response"]["allowed"]
    reviews = [s for s in seen if s[0] == REVIEWS_CLIENT]
    other = [s for s in reviews if s[1] != "GET" or s[3] or not NAMESPACE_GET.fullmatch(s[2])]
    return {"hostile reviews": 20 * len(HOSTILE_NAMESPACES), "denied": denied, "reviews in real namespaces": 15,
            "allowed": allowed, "requests by the reviews' client": [f"{m} {p}" for _, m, p, _ in reviews],
            "requests to any other path": len(other)}


async def failing(hook: Webhook, sandbox: SandboxThread) -> dict[str, Any]:
    """8 reviews at once in a namespace whose read fails, for each way it can fail: how many are answered, with
    the reason, and when. Sent with ?timeout=5s, as the shipped timeoutSeconds makes the API server send them."""
    out: dict[str, Any] = {}
    faults = {"403 (no RBAC)": {"status": 403}, "500 on every read": {"status": 500},
              "no answer (hangs)": {"delay": 60.0}}
    async with aiohttp.ClientSession() as session:
        for i, (name, knobs) in enumerate(faults.items()):
            namespace = f"failing-{i}"
            sandbox.faults(path=f"/api/v1/namespaces/{namespace}", **knobs)

            async def one(uid: str, namespace: str = namespace) -> tuple[bool, float]:
                started = time.monotonic()
                url = hook.url("/mutate?timeout=5s")
                async with session.post(url, data=wrap(small_pod(0), uid, namespace=namespace), ssl=hook.context,
                                        headers={"Content-Type": "application/json"}) as answer:
                    body = await answer.json() if answer.status == 200 else {}
                response = body.get("response", {})
                reason = response.get("status", {}).get("message", "")
                return (response.get("allowed") is False and f"Namespace {namespace}" in reason,
                        time.monotonic() - started)

            results = await asyncio.gather(*(one(f"u{j}") for j in range(8)), return_exceptions=True)
            sandbox.faults(clear=True)
            answered = [r for r in results if isinstance(r, tuple) and r[0]]
            out[name] = {"answered with the reason": f"{len(answered)} of 8",
                         "slowest (s)": round(max((r[1] for r in answered), default=float("nan")), 2)}
    return out


LATENCY = ("healthz p99", "healthz max", "small p99", "small max")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--webhook-cpu", default="1")
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    os.sched_setaffinity(0, {c for c in os.sched_getaffinity(0) if str(c) != args.webhook_cpu} or {0})
    scenarios = ["idle", "connections", "heads", "objects", "at_once", "settings", "settings_at_bound", "latency",
                 "latency_alone", "namespaces", "failing"]
    rows: dict[str, list[dict[str, float]]] = {s: [] for s in scenarios if not args.only or s in args.only}
    notes: dict[str, Any] = {}
    lat: dict[str, dict[str, list[float]]] = {}
    for run in range(args.runs):
        for scenario in rows:
            port = free_port()
            with tempfile.TemporaryDirectory() as tmp, SandboxThread(Path(tmp) / "sb",
                                                                     services={SERVICE: f"127.0.0.1:{port}"}) as sb:
                sb.create("/v1/namespaces", "", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": "topology-agent-system"}})
                hook = Webhook(sb, port, args.webhook_cpu)
                try:
                    if scenario in ("namespaces", "failing"):
                        result = asyncio.run(globals()[scenario](hook, sb))
                    else:
                        result = asyncio.run(globals()[scenario](hook))
                finally:
                    peaks = hook.stop()
            rows[scenario].append(peaks)
            if scenario.startswith("latency"):
                for name in ("healthz", "small"):
                    values = result.pop(name)
                    result[f"{name} count"] = len(values)
                    for key in ("p99", "max"):
                        result[f"{name} {key} (ms)"] = round(figure(values, key), 1)
                for key in LATENCY:
                    lat.setdefault(scenario, {}).setdefault(key, []).append(result[f"{key} (ms)"])
            notes.setdefault(scenario, []).append(result)
            print(f"run {run + 1} {scenario}: server {peaks['server']:.1f} MiB, reviewer {peaks['reviewer']:.1f} "
                  f"MiB, sum {peaks['sum']:.1f} MiB; {result}", flush=True)
    summary(rows, lat, notes)


def figure(seconds: list[float], key: str) -> float:
    return (percentile(seconds, 0.99) if key == "p99" else max(seconds)) * 1e3


def summary(rows: dict[str, list[dict[str, float]]], lat: dict[str, dict[str, list[float]]],
            notes: dict[str, Any]) -> None:
    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

    print("\n| scenario | server peak (MiB) | reviewer peak (MiB) | sum (MiB) |")
    print("|---|---|---|---|")
    for scenario, runs in rows.items():
        print(f"| {scenario} | {' | '.join(cell([r[k] for r in runs]) for k in ('server', 'reviewer', 'sum'))} |")
    if lat:
        print("\n| probe | " + " | ".join(f"{s}: median (min-max) of runs, ms" for s in lat) + " |")
        print("|---|" + "---|" * len(lat))
        for key in LATENCY:
            print(f"| {key} | " + " | ".join(cell(lat[s][key]) for s in lat) + " |")
    print("\n" + json.dumps({k: v[-1] for k, v in notes.items()}, indent=1, default=str))


if __name__ == "__main__":
    main()
