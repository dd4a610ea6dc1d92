"""Benchmark: what one membership change costs inside one process, at a given job size.

No API server: the pods are built in memory (``examples.volcano_job``, in the compact form a sidecar holds), so
the figures are the agent's own work, without the sandbox sharing the cores.

1. The publisher's snapshot: encoding and compressing the first one, and again after a single-pod change (the
   leader does it whenever the journal no longer reaches its snapshot, every few changes).
2. A sidecar's change: --changes single-pod changes (a worker gets a new IP), each rendered (``Renderer``, as the
   sidecar keeps it) and written to a temporary directory, with the sidecar's malloc settings
   (``keep_freed_memory``) or glibc's defaults (``--malloc default``). CPU per change (median), page faults per
   change. (Memory is measured in the published benchmark, in real processes: this one builds full pods first.)
   Then a worker a quarter into the job leaves and comes back, 5 times each (every member after it moves in
   rank; the published benchmark's worker that leaves is the last, so it moves none): CPU of each, median.
   Each change is rendered with the collector paused, as the sidecar does.

    python bench/render_bench.py --pods 16384 --runs 3
    python bench/render_bench.py --pods 4096 --runs 3 --frameworks jax,tf,xgboost,paddle,mlx,mpi,ray

``--frameworks`` renders those frameworks' files too (agent/core/frameworks), as ``--frameworks`` does in a pod.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent import examples
from agent.core import Renderer
from agent.core.model import FrameworkOptions, Options
from agent.core.publication.journal import PublishedState, Publisher
from agent.core.publication.published import Compactor, pack
from agent.runtime.memory import collector_paused, keep_freed_memory, release_memory
from agent.runtime.output import write_generation

OPTIONS = Options(address="ip")


def job(n: int) -> dict[str, Any]:
    raw = examples.volcano_job("demo", (("master", 1), ("worker", n - 1)))
    compactor = Compactor(OPTIONS)
    pods = {p["metadata"]["name"]: compactor.pod(p) for p in raw}  # type: ignore[arg-type]
    for i, pod in enumerate(pods.values()):
        pod.version = str(1000 + i)  # type: ignore[attr-defined]  # a CompactPod, as a follower holds its peers
    return pods


def new_ip(pods: dict[str, Any], name: str, ip: str, rv: str) -> None:
    changed = copy.copy(pods[name])  # a CompactPod: a new object, as the view holds a pod's next version
    changed.ip, changed.version = ip, rv
    pods[name] = changed


def cpu_ms(call: Any) -> float:
    start = time.process_time()
    call()
    return (time.process_time() - start) * 1000


def one_run(n: int, changes: int, malloc: str, frameworks: tuple[str, ...] = ()) -> dict[str, float]:
    options = dataclasses.replace(OPTIONS, frameworks=FrameworkOptions(names=frameworks))
    if malloc == "sidecar":
        keep_freed_memory()
    pods = job(n)
    gc.collect()
    release_memory()
    publisher = Publisher(PublishedState(job="demo", namespace="default"), options, leader="demo-master-0")
    publisher.change(pods, pods)
    first = cpu_ms(publisher.snapshot_packed)
    whole = cpu_ms(lambda: pack(publisher.snapshot_document()))
    workers = [f"demo-worker-{i}" for i in range(1, n - 1)]
    after: list[float] = []
    for k in range(20):
        name = workers[(k * 97) % len(workers)]
        new_ip(pods, name, examples.loopback_ip(n + k), str(10**6 + k))
        publisher.change(pods, [name])
        after.append(cpu_ms(publisher.snapshot_packed))
    me = f"demo-worker-{n // 2}"
    renderer = Renderer(options, me, checked=True)
    out = Path(tempfile.mkdtemp(prefix="render-bench-"))
    first_rendered = renderer.render(pods, generation=1, files_dir=str(out))
    write_generation(out, first_rendered, options)
    keys = [renderer.membership_key(first_rendered)]  # the last one, compared with each change's (as the sidecar)
    del first_rendered
    gc.collect()
    gc.freeze()
    per: list[float] = []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for k in range(changes):
        name = workers[(k * 89) % len(workers)]
        new_ip(pods, name, examples.loopback_ip(2 * n + k), str(2 * 10**6 + k))

        def change(generation: int = k + 2) -> None:
            rendered = renderer.render(pods, generation=generation, files_dir=str(out))
            key = renderer.membership_key(rendered)
            if key != keys[-1]:
                keys[-1] = key
            write_generation(out, rendered, options)
        per.append(cpu_ms(lambda: paused(change)))
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    # A worker in the first quarter leaves and comes back, 5 times: every member after it moves in rank.
    mover = workers[len(workers) // 4]
    moves: dict[str, list[float]] = {"leave": [], "come_back": []}
    for k in range(10):
        if k % 2 == 0:
            gone = pods.pop(mover)
        else:
            pods[mover] = gone

        def move(generation: int = changes + k + 2) -> None:
            rendered = renderer.render(pods, generation=generation, files_dir=str(out))
            key = renderer.membership_key(rendered)
            if key != keys[-1]:
                keys[-1] = key
            write_generation(out, rendered, options)
        moves["come_back" if k % 2 else "leave"].append(cpu_ms(lambda: paused(move)))
    return {"snapshot_first_ms": first, "snapshot_whole_ms": whole,
            "snapshot_after_change_ms": statistics.median(after), "change_cpu_ms": statistics.median(per),
            "faults_per_change": faults / changes, "topology_json_bytes": (out / "topology.json").stat().st_size,
            "leave_cpu_ms": statistics.median(moves["leave"]),
            "come_back_cpu_ms": statistics.median(moves["come_back"])}


def paused(call: Any) -> None:
    """As the sidecar evaluates a change: with the cyclic collector off (runtime/memory.collector_paused)."""
    with collector_paused():
        call()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=16384)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--malloc", choices=["sidecar", "default"], default="sidecar")
    parser.add_argument("--frameworks", default="", help="comma-separated frameworks to render too")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a run, in its own process
    args = parser.parse_args()
    if args.one:
        frameworks = tuple(filter(None, args.frameworks.split(",")))
        print(json.dumps(one_run(args.pods, args.changes, args.malloc, frameworks)))
        return
    runs = []
    for run in range(args.runs):  # each in a fresh process: the malloc settings and the heap are per process
        result = subprocess.run([sys.executable, __file__, "--one", "--pods", str(args.pods), "--changes",
                                 str(args.changes), "--malloc", args.malloc, "--frameworks", args.frameworks],
                                capture_output=True, text=True, check=True)
        runs.append(json.loads(result.stdout))
        print(f"run {run + 1}: {result.stdout.strip()}", flush=True)
    print(f"### {args.pods} pods, {args.runs} runs, malloc {args.malloc}, frameworks {args.frameworks or 'none'}: "
          "medians (min-max)")
    for key in runs[0]:
        values = [r[key] for r in runs]
        print(f"- {key}: {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    main()
