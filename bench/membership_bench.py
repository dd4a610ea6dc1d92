"""Benchmark: what a worker that leaves or comes back costs the publisher, in one process (no API server).

The pods of a Volcano job are built in memory; the leader's ``Planner`` lays them out once, then each step
removes one worker and puts back the one the previous step removed (a membership change each way, in one plan,
as a sidecar evaluates a burst). Per step: the plan (``Planner.plan``: every member after the change is placed
again), the own view of it (``own_view``: what the leader's files say) and the publisher's journal entry
(``Publisher.change``). Medians over the steps, min-max; the first step is reported apart. The pods are frozen
out of the cyclic collector as the sidecar freezes them after its LIST. ``--told``: the planner is told which pods
changed, as the publisher is, instead of comparing every pod.

    python bench/membership_bench.py --pods 16384 --steps 20
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from agent import examples
from agent.core.model import Options
from agent.core.plan.planner import Planner
from agent.core.publication.journal import PublishedState, Publisher
from agent.core.publication.summary import own_view


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--told", action="store_true",
                        help="tell the planner which pods changed (Planner.plan's touched), as a caller that follows "
                             "the watch can; by default it compares every pod by identity")
    args = parser.parse_args()
    pods = {p["metadata"]["name"]: p for p in examples.volcano_job("demo", (("master", 1), ("worker", args.pods - 1)))}
    options = Options(address="ip")
    gc.collect()
    gc.freeze()  # as the sidecar does after its LIST (runtime/memory.freeze): the collector skips the pods held
    planner = Planner(options, "demo-master-0", checked=True)
    publisher = Publisher(PublishedState(job="demo", namespace="default"), options, leader="demo-master-0")
    planner.plan(pods)
    publisher.change(pods, list(pods), {}, journal=False)
    publisher.snapshot_written(publisher.state.seq)
    publisher.start_from_snapshot()
    rng = random.Random(args.seed)
    away: tuple[str, dict] | None = None
    times: dict[str, list[float]] = {"plan": [], "own view": [], "journal entry": []}
    for _ in range(args.steps + 1):
        name = f"demo-worker-{rng.randrange(args.pods - 1)}"
        touched = {name}
        if away is not None:
            pods[away[0]] = away[1]
            touched.add(away[0])
        away = (name, pods.pop(name)) if name in pods else None
        t0 = time.perf_counter()
        plan = planner.plan(pods, touched=touched if args.told else None)
        t1 = time.perf_counter()
        own_view(plan, options, ssh=False, published=True)
        t2 = time.perf_counter()
        publisher.change(pods, touched, {})
        t3 = time.perf_counter()
        for key, took in zip(times, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            times[key].append(took * 1000)
    told = ", the planner told which pods changed" if args.told else ""
    print(f"### {args.pods} pods, {args.steps} steps (a worker leaves, the previous one comes back{told}): ms, "
          f"median (min-max)\n")
    for key, values in times.items():
        first, rest = values[0], values[1:]
        print(f"- {key}: {statistics.median(rest):.1f} ({min(rest):.1f}-{max(rest):.1f}); first step {first:.1f}")


if __name__ == "__main__":
    main()
