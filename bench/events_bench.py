"""Benchmark: what a job's Events cost the API server while it starts (runtime/events.py, core/report/events.py).

A Volcano job of N pods is created with every pod unscheduled; the pods are then scheduled (node and IP) one by
one in a random order over ``--spread`` seconds, and each pod's init starts when its pod is scheduled, as an init
container does. Every init runs in this process over the sandbox's API in memory (tests/fakeapi.py: the agent's
own clients and the sandbox's API semantics, no socket), each with the client of its own that its Events go on.
The sandbox counts requests and response bytes per client (User-Agent); the request bodies are summed from the
requests made. Reported per run: the Events created and the series patched (job-wide, and the most for one
pod), their request and response bytes, and the longest any init waited for its last Events at exit (its
``EXIT_GRACE``), beside init's own traffic.

    python bench/events_bench.py --pods 1024 --spread 20 --runs 3
    python bench/events_bench.py --pods 1024 --spread 120 --runs 1   # waits long enough for series to repeat
    python bench/events_bench.py --exit 16 --runs 5                  # init's exit, with and without its Events

``--exit N``: N real init processes of a complete gang over HTTPS, their exit measured from the line that says
the files are written (``--log-format json``, milliseconds) to the process's end, once with the Events recorded
and once with the API server refusing them (403: recording stops at once), so the difference is what the Events
add to init's exit.

Numbers are counts (not timings), so the machine's speed changes little in them; the inits share this process's
two cores, so the waits are longer than in a cluster, which can only add Events (a wait over ``WAIT_FIRST``). A
thousand inits in one process is what its two cores carry when the pods are scheduled over two minutes: over 20 s
the sandbox's one loop fell behind, requests timed out and were retried, and the measure was of that.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent import examples
from agent.runtime import events as recording
from agent.runtime.demo import volcano_owner
from agent.sandbox.memory import Memory
from tests.fakeapi import FakeApi, Inits, Logs

JOB = "bench"


def make_job(memory: Memory, pods: int) -> list[dict[str, Any]]:
    owner = volcano_owner()
    owner["metadata"]["name"] = JOB
    owner["spec"]["tasks"] = [{"name": "master", "replicas": 1}, {"name": "worker", "replicas": pods - 1}]
    created = memory.create("batch.volcano.sh/v1alpha1/jobs", "default", owner)
    made = examples.volcano_job(JOB, (("master", 1), ("worker", pods - 1)))
    for pod in made:
        pod["metadata"]["ownerReferences"][0]["uid"] = created["metadata"]["uid"]
        pod["status"] = {"phase": "Pending"}
        memory.create_pod(pod)
    return made


class Exits:
    """How long each init's Events held its exit (ThreadRecorder.close), timed."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.counts: list[recording.Counts] = []  # each recorder's own count (dropped: given up, not sent)
        self.lock = threading.Lock()
        self.original = recording.ThreadRecorder.close

    def __enter__(self) -> Exits:
        original, waits, lock, counts = self.original, self.waits, self.lock, self.counts

        def timed(recorder: recording.ThreadRecorder, grace: float = recording.EXIT_GRACE) -> None:
            started = time.perf_counter()
            original(recorder, grace)
            with lock:
                waits.append(time.perf_counter() - started)
                counts.append(recorder.counts)

        recording.ThreadRecorder.close = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *_: object) -> None:
        recording.ThreadRecorder.close = self.original  # type: ignore[method-assign]


def run(pods: int, spread: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp, Memory(Path(tmp) / "sandbox", bookmark_interval=1.0) as memory, \
            Exits() as exits:
        api = FakeApi(memory)
        logs = Logs()  # not attached: a thousand threads formatting log lines starved the sandbox's loop
        made = make_job(memory, pods)
        order = list(range(pods))
        rng.shuffle(order)
        inits = Inits(api, logs)
        started = time.perf_counter()
        names = []
        for step, index in enumerate(order):
            name = made[index]["metadata"]["name"]
            delay = started + step * spread / pods - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            memory.schedule("default", name, examples.loopback_ip(index), f"node-{index // 8}")
            names.append(inits.start(name, Path(tmp) / "out" / name, "--address", "ip", "--timeout", "900"))
        failed = [ran.err[-300:] for ran in (inits.finish(who, timeout=900) for who in names) if ran.code != 0]
        if failed:
            raise SystemExit(f"{len(failed)} inits failed, the first: {failed[0]}")
        result = measure(memory, api, exits.waits, pods)
        result["dropped by the recorders"] = sum(c.dropped for c in exits.counts)
        return result


def measure(memory: Memory, api: FakeApi, waits: list[float], pods: int) -> dict[str, Any]:
    stats = memory.stats()["byAgent"]
    events_agents = {agent: figures for agent, figures in stats.items() if " events (" in agent}
    init_agents = {agent: figures for agent, figures in stats.items() if " init (" in agent}
    verbs: Counter[str] = Counter()
    per_pod: dict[str, Counter[str]] = {}
    sent = 0
    for agent, request in list(api.requests):
        if agent in events_agents:
            verbs[request.verb] += 1
            per_pod.setdefault(agent, Counter())[request.verb] += 1
            sent += len(request.body or b"")
    stored = memory.sandbox.store.list("/v1/events", "default")
    reasons = Counter(event["reason"] for event in stored)
    received = sum(f["bytes"] for f in events_agents.values())
    return {
        "pods": pods, "events": len(stored), "reasons": dict(reasons),
        "creates": verbs["create"], "patches": verbs["patch"],
        "most creates for one pod": max((c["create"] for c in per_pod.values()), default=0),
        "most patches for one pod": max((c["patch"] for c in per_pod.values()), default=0),
        "request bytes": sent, "response bytes": received,
        "bytes per pod": round((sent + received) / pods),
        "init bytes per pod (without Events)": round(sum(f["bytes"] for f in init_agents.values()) / pods),
        "exit wait max s": round(max(waits, default=0.0), 4), "exit wait median s": round(statistics.median(waits), 4),
    }


def exits(pods: int, *, refuse: bool) -> list[float]:
    """Seconds from each init's "wrote" line to its process's end (module docstring, ``--exit``)."""
    import os
    import subprocess
    from datetime import datetime

    from agent.sandbox.threaded import SandboxThread

    with tempfile.TemporaryDirectory() as tmp, SandboxThread(Path(tmp) / "sandbox", bookmark_interval=1.0) as sb:
        made = make_job(sb, pods)  # type: ignore[arg-type]
        for index, pod in enumerate(made):
            sb.schedule("default", pod["metadata"]["name"], examples.loopback_ip(index), "node-0")
        if refuse:
            sb.faults(status=403, path="/events")
        ended: dict[str, float] = {}
        procs = {}
        for pod in made:
            name = pod["metadata"]["name"]
            env = {**os.environ, **sb.client_env(), "POD_NAME": name, "POD_NAMESPACE": "default"}
            env.pop("KUBECONFIG", None)
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "agent.cli", "init", "--out", f"{tmp}/{name}", "--address", "ip",
                 "--log-format", "json"], env=env, stderr=subprocess.PIPE, text=True)

        def wait(name: str) -> None:
            procs[name].wait()
            ended[name] = time.time()

        waiters = [threading.Thread(target=wait, args=(name,)) for name in procs]
        for thread in waiters:
            thread.start()
        delays = []
        for name, proc in procs.items():
            err = proc.stderr.read() if proc.stderr else ""
            proc.stderr.close() if proc.stderr else None
            wrote = [json.loads(line) for line in err.splitlines() if '"wrote ' in line]
            if proc.wait() != 0 or not wrote:
                raise SystemExit(f"init {name} failed: {err[-300:]}")
            delays.append((name, datetime.fromisoformat(wrote[-1]["ts"].replace("Z", "+00:00")).timestamp()))
        for thread in waiters:
            thread.join()
        return [ended[name] - at for name, at in delays]


def main() -> None:
    logging.getLogger("topology_agent").setLevel(logging.ERROR)  # the inits' lines would only slow them
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=1024)
    parser.add_argument("--spread", type=float, default=20.0, help="seconds over which the pods are scheduled")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--exit", type=int, default=0, metavar="N", help="measure init's exit with N processes")
    args = parser.parse_args()
    if args.exit:
        for refuse in (False, True):
            runs = [statistics.median(exits(args.exit, refuse=refuse)) for _ in range(args.runs)]
            print(json.dumps({"events": "refused (403)" if refuse else "recorded", "median exit after the files s":
                              round(statistics.median(runs), 4), "runs": [round(r, 4) for r in runs]}), flush=True)
        return
    results = []
    for n in range(args.runs):
        result = run(args.pods, args.spread, args.seed + n)
        print(json.dumps(result), flush=True)
        results.append(result)
    numeric = [k for k, v in results[0].items() if isinstance(v, (int, float))]
    print("median:", json.dumps({k: statistics.median(r[k] for r in results) for k in numeric}))


if __name__ == "__main__":
    main()
