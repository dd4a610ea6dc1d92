"""Benchmark: a new leader's first publication under ``--rank-order topology``, in-process.

The leader's sidecar starts from the rows it published (read back as content keys, with their pods: the sidecar's
``_own_rows``), plans, then publishes every pod once (``JournalWriter.publish``: ``Publisher.change`` of every
name with the Nodes' labels, ``summary_data``, then the writes). The pods the size of real ones (bench/kubelet.py),
published Pending by init; ``--running`` of them Running since (the kubelet's writes after their init: each such
row's content changed), held as a sidecar holds them. Each pod runs on a Node of its own, placed at random in 4 zones
x 16 blocks x 4 racks (the Nodes' labels one dict per distinct set, as runtime/nodes.py reads them). The
publication and the pods are made in a process of their own, so the measured one never held the whole pods.

Measured after each step (``change``, ``summary_data``, the writes' bodies as the client sends them): with
tracemalloc, the peak over what was held before the first step and what is held after (``--top N``: the N
tracebacks that hold the most after ``change``), or with ``--rss`` VmRSS and its peak over VmRSS before.

    python bench/topolead_bench.py --pods 16384 --running 1
    python bench/topolead_bench.py --pods 16384 --running 1 --rss
    python bench/topolead_bench.py --pods 16384 --running 0 --top 10
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import re
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

from agent.core.model import Options
from agent.core.plan.planner import Planner
from agent.core.pods.placement import Level
from agent.core.pods.pod import slim_pod
from agent.core.publication.journal import (
    PODS_RV_KEY,
    ROWS_KEY,
    PublishedState,
    Publisher,
    journal_body,
    rows_options,
    state_from,
)
from agent.core.publication.published import configmap_body
from agent.core.publication.summary import own_view
from agent.runtime.memory import release_memory
from agent.runtime.publication.publishing import summary_data
from agent.runtime.views import PodView

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kubelet
from transients_bench import raw_pods, traced

MB = 2**20
ME = "demo-worker-1"
SNAPSHOT = "demo-topology"
LEVELS = (Level("topology.kubernetes.io/zone", "ZONE"), Level("example.com/block", "BLOCK"),
          Level("example.com/rack", "RACK"))


def node_labels(pods: int, seed: int) -> dict[str, dict[str, str] | None]:
    """``node-<i>`` -> its labels, in one of 4 x 16 x 4 domains at random, one dict per distinct set."""
    rng = random.Random(seed)
    distinct: dict[tuple[int, int, int], dict[str, str]] = {}
    nodes: dict[str, dict[str, str] | None] = {}
    for i in range(pods):
        at = (rng.randrange(4), rng.randrange(16), rng.randrange(4))
        nodes[f"node-{i}"] = distinct.setdefault(at, {
            LEVELS[0].label: f"zone-{at[0]}", LEVELS[1].label: f"block-{at[0]}-{at[1]}",
            LEVELS[2].label: f"rack-{at[0]}-{at[1]}-{at[2]}"})
    return nodes


def make(pods: int, running: float, seed: int, out: Path) -> None:
    """What the leader's sidecar starts from, in files (made in a process of its own, so that the measured one
    never held the job's whole pods): ``published.json``, the snapshot and journal its init published (the pods
    Pending, rows cut with the topology order's options), and ``running.jsonl``, the first ``running`` of the pods
    as the watch brings them once their init is done (phase Running: a row's content changed), slimmed."""
    options = Options(levels=LEVELS, rank_order="topology")
    nodes = node_labels(pods, seed)
    raw = raw_pods(pods)
    view = PodView(ME, options)
    held = {p["metadata"]["name"]: view.keep(p) for p in raw}
    publisher = Publisher(PublishedState(job="demo", namespace="default"), options, leader=ME)
    publisher.pods_rv = "99999"
    publisher.change(held, list(held), nodes, journal=False)
    snapshot = configmap_body(SNAPSHOT, publisher.snapshot_packed(), generation=publisher.state.seq, leader=ME,
                              owner=None)
    publisher.snapshot_written(publisher.state.seq)
    publisher.start_from_snapshot()
    data = publisher.journal_data()
    assert data[PODS_RV_KEY] and data[ROWS_KEY] == rows_options(options)
    (out / "published.json").write_text(json.dumps([snapshot, journal_body(SNAPSHOT, data, owner=None)]))
    with (out / "running.jsonl").open("w") as lines:
        for pod in raw[:int(running * len(raw))]:
            kubelet.kubelet_initialized(pod)
            pod["metadata"]["resourceVersion"] = str(int(pod["metadata"]["resourceVersion"]) + 10**6)
            lines.write(json.dumps(slim_pod(pod)) + "\n")


def start(out: Path, options: Options, nodes: dict[str, Any]) -> tuple[Publisher, dict[str, Any], Any]:
    """The leader's sidecar up to its first publication: its rows read back as content keys with their pods
    (``_own_rows``), the pods the watch brought since, its plan and own view (the plan's blocks made)."""
    items = json.loads((out / "published.json").read_text())
    state, journal = state_from(items, SNAPSHOT, compare_only=True)
    assert state is not None and journal is not None
    pods = state.hand_over_pods()
    del items
    view = PodView(ME, options)
    with (out / "running.jsonl").open() as lines:
        for line in lines:
            pod = view.keep(json.loads(line))
            pods[pod["metadata"]["name"]] = pod
    plan = Planner(options, ME, checked=True).plan(pods, nodes=nodes)
    own_view(plan, options, ssh=False, published=True)
    return Publisher(state, options, leader=ME, journal=journal.entries), pods, plan


def rss() -> tuple[float, float]:
    """VmRSS and VmHWM (since ``clear_peak``), in MB."""
    status = Path("/proc/self/status").read_text()
    found = (re.search(rf"{key}:\s+(\d+)", status) for key in ("VmRSS", "VmHWM"))
    return tuple(int(m.group(1)) / 1024 if m else 0.0 for m in found)  # type: ignore[return-value]


def clear_peak() -> None:
    """VmHWM from VmRSS now (Linux: ``clear_refs`` 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=16384)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--running", type=float, default=1.0, help="the fraction of pods whose phase is "
                        "Running by the first publication (Pending in the published rows)")
    parser.add_argument("--rss", action="store_true", help="VmRSS instead of tracemalloc")
    parser.add_argument("--top", type=int, default=0, help="tracebacks that hold the most after change")
    parser.add_argument("--make", metavar="DIR", help=argparse.SUPPRESS)  # the child's part
    args = parser.parse_args()
    if args.make:
        make(args.pods, args.running, args.seed, Path(args.make))
        return
    options = Options(levels=LEVELS, rank_order="topology")
    nodes = node_labels(args.pods, args.seed)
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, __file__, "--make", out, "--pods", str(args.pods), "--seed", str(args.seed),
                        "--running", str(args.running)], check=True)
        publisher, pods, plan = start(Path(out), options, nodes)
    if args.rss:
        measure_rss(publisher, pods, nodes, plan, options)
    else:
        measure_traced(publisher, pods, nodes, plan, options, top=args.top)

def steps(publisher: Publisher, pods: dict[str, Any], nodes: dict[str, Any], plan: Any,
          options: Options) -> list[tuple[str, Any]]:
    """``JournalWriter.publish``'s steps: the change of every pod, the summary, then the writes' bodies as the
    client sends them (the snapshot when due, and the journal)."""
    def write() -> list[bytes]:
        bodies = []
        if publisher.snapshot_due:
            seq = publisher.state.seq
            bodies.append(json.dumps(configmap_body(SNAPSHOT, publisher.snapshot_packed(), generation=seq,
                                                    leader=ME, owner=None)).encode())
            publisher.snapshot_written(seq)
        bodies.append(json.dumps(journal_body(SNAPSHOT, publisher.journal_data(), owner=None)).encode())
        return bodies

    return [("change", lambda: publisher.change(pods, set(pods), nodes)),
            ("summary_data", lambda: summary_data(publisher, plan, options)), ("writes", write)]


def measure_rss(publisher: Publisher, pods: dict[str, Any], nodes: dict[str, Any], plan: Any,
                options: Options) -> None:
    """VmRSS and its peak (VmHWM) after each step, over VmRSS before (the heap trimmed first, as the sidecar trims
    it after its read-back)."""
    gc.collect()
    release_memory()
    clear_peak()
    before = rss()[0]
    said = []
    for name, step in steps(publisher, pods, nodes, plan, options):
        step()
        now, peak = rss()
        said.append(f"{name} {now - before:+.1f} MB (peak {peak - before:+.1f})")
    print(f"{len(pods)} pods: VmRSS {before:.1f} MB before; after " + ", ".join(said))


def measure_traced(publisher: Publisher, pods: dict[str, Any], nodes: dict[str, Any], plan: Any,
                   options: Options, *, top: int) -> None:
    """tracemalloc's peak over what was held before each step, and what is held after it over what was held
    before the first; the ``top`` tracebacks held most after ``change``."""
    tracemalloc.start(12)
    first = tracemalloc.take_snapshot() if top else None
    after = None
    held = 0.0
    said = []
    for name, step in steps(publisher, pods, nodes, plan, options):
        peak, more, _ = traced(step)
        said.append(f"{name} peak {held + peak:.2f} MB, held {held + more:.2f} MB")
        held += more
        if after is None and top:
            after = tracemalloc.take_snapshot()
    print(f"{len(pods)} pods, over what was held before: " + "; ".join(said))
    if first is not None and after is not None:
        for stat in after.compare_to(first, "traceback")[:top]:
            print(f"{stat.size_diff / MB:+.2f} MB in {stat.count_diff:+d} blocks")
            for line in stat.traceback.format()[-8:]:
                print("   ", line)
    tracemalloc.stop()


if __name__ == "__main__":
    main()
