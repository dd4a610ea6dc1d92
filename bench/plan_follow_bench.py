"""Benchmark: init's plan during the wait, in process (no API server): ``Planner.follow`` per IP event, then
``plan`` once the last IP is in, against ``build_plan`` from scratch over the same pods.

A Volcano job of --pods pods (master + workers), every worker created without its IP; the planner lays the job
out from that LIST, then each worker's IP arrives as a new pod object (new resourceVersion) and is followed,
its facts computed first as init's gang tracker does (through the shared memo). ``--burst k``: the IPs arrive k
at a time, in a random order, one ``follow`` per burst (init lets events pile up for 0.1 s while many pods are
awaited: ~80 at a time when 16384 pods get their IPs over 20 s). Prints the medians of --runs.

    python bench/plan_follow_bench.py --pods 16384 --runs 3
    python bench/plan_follow_bench.py --pods 16384 --runs 3 --burst 80
"""

from __future__ import annotations

import argparse
import copy
import gc
import random
import statistics
import time

from agent import examples
from agent.core.model import Options
from agent.core.plan.facts import Memo, facts_of
from agent.core.plan.layout import build_plan
from agent.core.plan.planner import Planner


def one_run(n: int, burst: int = 1) -> tuple[float, float, float]:
    options = Options(address="ip", view="own")
    full = examples.volcano_job("demo", (("master", 1), ("worker", n - 1)))
    held = {}
    for k, pod in enumerate(full):
        pod["metadata"]["resourceVersion"] = str(10 + k)
        bare = copy.deepcopy(pod)
        bare["metadata"]["resourceVersion"] = str(100000 + k)
        if k:
            bare["status"].pop("podIP", None)
            bare["status"].pop("podIPs", None)
        held[bare["metadata"]["name"]] = bare
    memo = Memo(options)
    planner = Planner(options, "demo-master-0", checked=True, memo=memo)
    planner.follow(held)
    layout = planner._layout
    assert layout is not None
    controller = layout.found.controller
    following = 0.0
    arriving = full[1:]
    if burst > 1:
        random.Random(n).shuffle(arriving)
    for at in range(0, len(arriving), burst):
        names = []
        for pod in arriving[at:at + burst]:
            names.append(pod["metadata"]["name"])
            held[names[-1]] = pod
            facts_of(pod, controller, options, None, memo, checked=True)  # the gang tracker's share
        started = time.perf_counter()
        planner.follow(held, names)
        following += time.perf_counter() - started
    started = time.perf_counter()
    plan = planner.plan(held)
    planned = time.perf_counter() - started
    assert planner.incremental == 1 and planner.followed == -(-(n - 1) // burst)
    started = time.perf_counter()
    scratch = build_plan(list(held.values()), "demo-master-0", options, memo=memo, checked=True)
    from_scratch = time.perf_counter() - started
    assert plan == scratch
    return following / -(-(n - 1) // burst) * 1e6, planned * 1e3, from_scratch * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=16384)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--burst", type=int, default=1, help="IPs per follow call")
    args = parser.parse_args()
    gc.disable()  # as init runs (cli.main: one-shot commands)
    runs = [one_run(args.pods, args.burst) for _ in range(args.runs)]

    def med(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

    print(f"### {args.pods} pods, {args.runs} runs: medians (min-max)\n")
    print(f"- follow, per call ({args.burst} IP{'s' if args.burst > 1 else ''}): {med([r[0] for r in runs])} us")
    print(f"- plan after the last IP, from the followed layout: {med([r[1] for r in runs])} ms")
    print(f"- build_plan from scratch over the same pods (same memo): {med([r[2] for r in runs])} ms")


if __name__ == "__main__":
    main()
