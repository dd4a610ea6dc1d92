"""Benchmark: what a worker that leaves or comes back costs the publisher, in one process (no API server).

The pods of a Volcano job are built in memory; the leader's ``Planner`` lays them out once, then each step
removes one worker and puts back the one the previous step removed (a membership change each way, in one plan,
as a sidecar evaluates a burst). Per step: the plan (``Planner.plan``: every member after the change is placed
again), the own view of it (``own_view``: what the leader's files say) and the publisher's journal entry
(``Publisher.change``). Medians over the steps, min-max; the first step is reported apart. The pods are frozen
out of the cyclic collector as the sidecar freezes them after its LIST. ``--told``: the planner is told which pods
changed, as the publisher is, instead of comparing every pod.

    python bench/membership_bench.py --pods 16384 --steps 20
    python bench/membership_bench.py --pods 16384 --steps 20 --told --topology 4,16,4

``--topology Z,B,R``: ``--rank-order topology``, each pod on a Node of its own in Z zones x B blocks x R
sub-blocks at random, and one change a step (a worker leaves; at the next step it comes back); the own view makes
the blocks, and the steps add the summary (``summary_data``, with the same blocks) and the leader's own files
(``render_plan`` of its own view), as a publisher of that order does per change.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from typing import Any

from agent import examples
from agent.core import render_plan
from agent.core.model import Options
from agent.core.plan.planner import Planner
from agent.core.pods.placement import DEFAULT_LEVELS
from agent.core.publication.blocks import BlockMaker
from agent.core.publication.journal import PublishedState, Publisher
from agent.core.publication.summary import own_view
from agent.runtime.memory import collector_paused
from agent.runtime.publication.publishing import summary_data


def place(pods: dict[str, Any], shape: str, seed: int) -> dict[str, dict[str, str] | None]:
    """Each pod on a Node of its own, in one of ``shape`` (``Z,B,R``) domains at random: the Nodes' labels, one
    dict per distinct set (as runtime/nodes.py reads them)."""
    zones, blocks, racks = (int(k) for k in shape.split(","))
    rng = random.Random(seed)
    distinct: dict[tuple[int, int, int], dict[str, str]] = {}
    nodes: dict[str, dict[str, str] | None] = {}
    for i, pod in enumerate(pods.values()):
        at = (rng.randrange(zones), rng.randrange(blocks), rng.randrange(racks))
        pod["spec"]["nodeName"] = node = f"node-{i}"
        nodes[node] = distinct.setdefault(at, {
            DEFAULT_LEVELS[0].label: f"zone-{at[0]}", DEFAULT_LEVELS[1].label: f"block-{at[0]}-{at[1]}",
            DEFAULT_LEVELS[2].label: f"sub-{at[0]}-{at[1]}-{at[2]}"})
    return nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--told", action="store_true",
                        help="tell the planner which pods changed (Planner.plan's touched), as a caller that follows "
                             "the watch can; by default it compares every pod by identity")
    parser.add_argument("--topology", metavar="Z,B,R", help="--rank-order topology on Nodes in Z zones x B blocks "
                        "x R sub-blocks")
    args = parser.parse_args()
    pods = {p["metadata"]["name"]: p for p in examples.volcano_job("demo", (("master", 1), ("worker", args.pods - 1)))}
    nodes = place(pods, args.topology, args.seed) if args.topology else {}
    options = Options(levels=DEFAULT_LEVELS, rank_order="topology") if args.topology else Options(address="ip")
    blocks = BlockMaker() if args.topology else None
    gc.collect()
    gc.freeze()  # as the sidecar does after its LIST (runtime/memory.freeze): the collector skips the pods held
    planner = Planner(options, "demo-master-0", checked=True)
    publisher = Publisher(PublishedState(job="demo", namespace="default"), options, leader="demo-master-0")
    planner.plan(pods, nodes=nodes)
    publisher.change(pods, list(pods), nodes, journal=False)
    publisher.snapshot_written(publisher.state.seq)
    publisher.start_from_snapshot()
    rng = random.Random(args.seed)
    away: tuple[str, dict] | None = None
    times: dict[str, list[float]] = {"plan": [], "own view": [], "journal entry": [],
                                     **({"summary": [], "own files": []} if args.topology else {})}
    for _ in range(args.steps + 1):
        name = f"demo-worker-{rng.randrange(args.pods - 1)}"
        touched = {name}
        if away is not None:
            pods[away[0]] = away[1]
            touched.add(away[0])
        away = (name, pods.pop(name)) if name in pods and not (args.topology and away is not None) else None
        if args.topology:  # one change a step, as the published bench's: a worker leaves, then comes back
            touched.discard(name) if away is None else touched.intersection_update({name})
        with collector_paused():  # as the sidecar evaluates (runtime/memory.collector_paused)
            took = one_change(planner, publisher, pods, touched, nodes, options, blocks, told=args.told)
        for key, spent in zip(times, took, strict=True):
            times[key].append(spent * 1000)
    told = (", the planner told which pods changed" if args.told else "") + \
        (f", --rank-order topology on {args.topology}" if args.topology else "")
    step = "a worker leaves, or the one that left comes back" if args.topology else \
        "a worker leaves, the previous one comes back"
    print(f"### {args.pods} pods, {args.steps} steps ({step}{told}): ms, "
          f"median (min-max)\n")
    for key, values in times.items():
        first, rest = values[0], values[1:]
        print(f"- {key}: {statistics.median(rest):.1f} ({min(rest):.1f}-{max(rest):.1f}); first step {first:.1f}")


def one_change(planner: Planner, publisher: Publisher, pods: dict[str, Any], touched: set[str],
         nodes: dict[str, dict[str, str] | None], options: Options, blocks: BlockMaker | None, *,
         told: bool) -> list[float]:
    """One change as the publisher's sidecar makes it (``told``: the planner is told ``touched``): the seconds of
    each part."""
    t0 = time.perf_counter()
    plan = planner.plan(pods, touched=touched if told else None, nodes=nodes)
    t1 = time.perf_counter()
    own, _ = own_view(plan, options, ssh=False, published=True, blocks=blocks)
    t2 = time.perf_counter()
    publisher.change(pods, touched, nodes)
    took = [t1 - t0, t2 - t1, time.perf_counter() - t2]
    if blocks is not None:
        t3 = time.perf_counter()
        summary_data(publisher, plan, options, blocks=blocks)
        t4 = time.perf_counter()
        render_plan(own if own is not None else plan, options)
        took += [t4 - t3, time.perf_counter() - t4]
    return took


if __name__ == "__main__":
    main()
