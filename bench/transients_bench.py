"""Benchmark: the publisher's memory at the moments that set its peak, in-process.

The publisher's sidecar at 16384 pods sets its peak while the kubelet's writes come in (bench/
published_bench.py, a VmHWM trace of it). Each moment is measured here alone, with tracemalloc (Python's
allocations: the peak over what was held before, and what is held after), on pods the size of real ones
(bench/kubelet.py), held as a sidecar holds them (``PodView.keep``):

1. read-back: a new leader's sidecar reads back the snapshot it published (rows decoded one at a time, kept as
   content keys, with each row's pod): held after, peak.
2. watch read: one 256 KiB read of the kubelet's writes (whole pods), parsed and taken event by event.
3. plan from scratch: a third of the job changes at once (the kubelet's Running writes), more than a quarter,
   so the planner lays the job out again; the caller holds its last plan through it (as the sidecar did) or
   lets it go first (as it does now).
4. journal entry: one entry of 4096 rows encoded (a burst of the kubelet's writes in one change).
5. TF render: a TF worker's files in its own view (``--frameworks tf``: TF_CONFIG names every member), rendered
   as at a change (the view's addresses made already).

    python bench/transients_bench.py --pods 16384 --runs 3

Another commit's code: ``PYTHONPATH=<its tree> python bench/transients_bench.py`` (this file, that code).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import examples
from agent.core import render_plan
from agent.core.model import FrameworkOptions, Options
from agent.core.plan.planner import Planner
from agent.core.publication.journal import PublishedState, Publisher, state_from
from agent.core.publication.published import configmap_body
from agent.core.publication.summary import own_view
from agent.k8s.core import WatchLines, parse_event
from agent.runtime.views import PodView

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kubelet

MB = 2**20
ME = "demo-worker-1"


def raw_pods(n: int) -> list[dict[str, Any]]:
    """The job's pods as the API serves them once running (~9.6 KB each), with IPs and resourceVersions."""
    pods = []
    for i, pod in enumerate(examples.volcano_job("demo", (("master", 1), ("worker", n - 1)))):
        pod = kubelet.real_pod(pod, node=f"node-{i}")
        pod["metadata"]["resourceVersion"] = str(100 + i)
        kubelet.kubelet_started(pod, examples.loopback_ip(i + 2))
        pods.append(pod)
    return pods


def traced(make: Callable[[], Any]) -> tuple[float, float, Any]:
    """(peak over the memory held before, held after minus before, the result), in MB."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    result = make()
    gc.collect()
    now, peak = tracemalloc.get_traced_memory()
    return (peak - before) / MB, (now - before) / MB, result


def read_back(raw: list[dict[str, Any]]) -> tuple[float, float]:
    view = PodView(ME, Options())
    pods = {p["metadata"]["name"]: view.keep(p) for p in raw}
    publisher = Publisher(PublishedState(job="demo", namespace="default", snapshot_seq=-1), Options(), leader=ME)
    publisher.change(pods, set(pods), journal=False)
    configmap = configmap_body("demo-topology", publisher.snapshot_packed(), generation=1, leader=ME, owner=None)
    del pods, view, publisher
    peak, held, _ = traced(lambda: state_from([configmap], "demo-topology", compare_only=True))
    return peak, held


def watch_read(raw: list[dict[str, Any]]) -> tuple[float, float]:
    chunk = b"".join(json.dumps({"type": "MODIFIED", "object": p}).encode() + b"\n" for p in raw[:64])[:256 << 10]

    def take() -> int:
        taken = 0
        for item in WatchLines().feed(chunk):  # events (older code) or lines, each parsed as it is taken
            _ = parse_event(item) if isinstance(item, bytes) else item
            taken += 1
        return taken

    peak, held, _ = traced(take)
    return peak, held


def from_scratch(raw: list[dict[str, Any]], *, let_go: bool) -> tuple[float, float]:
    view = PodView(ME, Options())
    pods = {p["metadata"]["name"]: view.keep(p) for p in raw}
    planner = Planner(Options(), ME, checked=True)
    holder = {"plan": planner.plan(pods)}
    for i, pod in enumerate(raw[: len(raw) // 3]):
        changed = json.loads(json.dumps(pod))
        kubelet.kubelet_initialized(changed)
        changed["metadata"]["resourceVersion"] = str(10**6 + i)
        pods[pod["metadata"]["name"]] = view.keep(changed)

    def plan() -> int:
        if let_go:
            holder["plan"] = None
        holder["plan"] = planner.plan(pods)
        return planner.incremental

    peak, held, incremental = traced(plan)
    assert incremental == 0, "the burst was carried over: no layout from scratch measured"
    return peak, held


def entry(raw: list[dict[str, Any]]) -> tuple[float, float]:
    view = PodView(ME, Options())
    pods = {p["metadata"]["name"]: view.keep(p) for p in raw[:4096]}
    made = Publisher(PublishedState(job="demo", namespace="default"), Options(), leader=ME).change(pods, set(pods))
    assert made is not None
    peak, held, _ = traced(made.encoded)
    return peak, held


def tf_render(raw: list[dict[str, Any]]) -> tuple[float, float]:
    options = Options(frameworks=FrameworkOptions(names=("tf",)))
    view = PodView(ME, options)
    pods = {p["metadata"]["name"]: view.keep(p) for p in raw}
    own, why = own_view(Planner(options, ME, checked=True).plan(pods), options, ssh=False, published=True)
    assert own is not None, why
    render_plan(own, options, generation=2, files_dir="/shared")  # the view's addresses, as at the first change
    peak, held, _ = traced(lambda: render_plan(own, options, generation=3, files_dir="/shared"))
    return peak, held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=16384)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    raw = raw_pods(args.pods)
    tracemalloc.start()
    cases: dict[str, Callable[[], tuple[float, float]]] = {
        "read-back (rows as keys, with their pods)": lambda: read_back(raw),
        "watch read of 256 KiB": lambda: watch_read(raw),
        "plan from scratch, last plan held": lambda: from_scratch(raw, let_go=False),
        "plan from scratch, last plan let go": lambda: from_scratch(raw, let_go=True),
        "journal entry of 4096 rows encoded": lambda: entry(raw),
        "TF render, own view": lambda: tf_render(raw),
    }
    print(f"### {args.pods} pods, {args.runs} runs: MB of Python allocations, medians (min-max)\n")
    print("| moment | peak over what was held | held after |\n|---|---|---|")
    for name, case in cases.items():
        got = [case() for _ in range(args.runs)]
        cols = []
        for k in (0, 1):
            values = [g[k] for g in got]
            cols.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
        print(f"| {name} | {cols[0]} | {cols[1]} |", flush=True)


if __name__ == "__main__":
    main()
