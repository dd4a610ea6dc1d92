"""How many ring hops cross each network level, with ranks in index order and with ``--rank-order topology``.

A simulated cluster (zones x blocks x racks x nodes, 8 GPUs per node, one pod per node using all 8) is partly
taken by other work; a job of N pods arrives in random order (the order pods are bound is not their index order)
and is placed by one of two schedulers:

- spread: each pod goes to the rack (then block, then zone) holding the fewest of the job's pods, as the default
  scheduler's topology spreading does;
- pack: each pod goes to the first free node in (zone, block, rack, node) order, as a bin-packing scheduler does
  on a fragmented cluster.

The job's pods and Nodes then go through the agent's own core (``render_pod``, Volcano pods, the Nodes' labels)
once with index order and once with topology order. For each level the table gives the ring edges (rank r ->
r+1, and the last back to 0, as NCCL's ring) whose ends are in different domains, beside the lower bound: the
number of domains of that level the job uses (0 when it uses one).

    python bench/rank_order.py                      # the table in docs/benchmarks.md, and docs/rank-order-ring.svg
    python bench/rank_order.py --sizes 16,64 --seeds 2
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import statistics
import sys
import time
from pathlib import Path

from agent import examples
from agent.core import Options, render_pod
from agent.core.model import Processes
from agent.core.pods.placement import Level, domains_used, ring_crossings

LEVELS = (Level("topology.kubernetes.io/zone", "ZONE"), Level("example.com/block", "BLOCK"),
          Level("example.com/rack", "RACK"))
NAMES = ("zone", "block", "rack", "node")
CLUSTER = (2, 8, 16, 32)  # zones, blocks per zone, racks per block, nodes per rack: 8192 nodes, 65536 GPUs
TAKEN = 0.3  # share of nodes busy with other work before the job arrives


def cluster(rng: random.Random) -> list[tuple[str, str, str, str]]:
    zones, blocks, racks, nodes = CLUSTER
    free = []
    for z in range(zones):
        for b in range(blocks):
            for r in range(racks):
                for n in range(nodes):
                    if rng.random() >= TAKEN:
                        free.append((f"z{z}", f"z{z}-b{b}", f"z{z}-b{b}-r{r}", f"z{z}-b{b}-r{r}-n{n}"))
    return free


def place(free: list[tuple[str, str, str, str]], count: int, how: str,
          rng: random.Random) -> list[tuple[str, str, str, str]]:
    """Nodes for the pods in the order they are bound."""
    if how == "pack":
        return free[:count]
    load: dict[tuple[str, ...], int] = {}
    tree: dict[tuple[str, ...], list] = {}  # domain -> free nodes below it
    for path in free:
        for depth in (0, 1, 2, 3):
            tree.setdefault(path[:depth], []).append(path)
    chosen = []
    for _ in range(count):
        # the zone holding the fewest of the job's pods, then the block within it, then the rack; ties at random
        prefix: tuple[str, ...] = ()
        for depth in (1, 2, 3):
            children = {p[:depth] for p in tree[prefix]}
            prefix = min(sorted(children), key=lambda c: (load.get(c, 0), rng.random()))  # sorted: no hash order
        best = tree[prefix][rng.randrange(len(tree[prefix]))]
        for depth in (0, 1, 2, 3):
            tree[best[:depth]].remove(best)
            if not tree[best[:depth]]:
                del tree[best[:depth]]
            if depth:
                load[best[:depth]] = load.get(best[:depth], 0) + 1
        chosen.append(best)
    return chosen


def job(count: int, how: str, seed: int) -> tuple[list[dict], dict[str, dict[str, str]]]:
    rng = random.Random(seed)
    pods = examples.volcano_job("bench", (("master", 1), ("worker", count - 1)), cpu="8")
    bound = place(cluster(rng), count, how, rng)
    arrival = list(range(count))
    rng.shuffle(arrival)  # pods are bound in the order they arrive, not by index
    nodes = {}
    for pod_position, path in zip(arrival, bound, strict=True):
        zone, block, rack, node = path
        pods[pod_position]["spec"]["nodeName"] = node
        nodes[node] = {"topology.kubernetes.io/zone": zone, "example.com/block": block, "example.com/rack": rack}
    return pods, nodes


def ring(pods: list[dict], nodes: dict[str, dict[str, str]], order: str) -> tuple[list[tuple[str, ...]], float]:
    options = Options(levels=LEVELS, rank_order=order, processes=Processes(per_node=8))  # type: ignore[arg-type]
    gc.collect()
    gc.disable()  # as the CLI's one-shot commands run (cli.main): the collector's passes are not the core's cost
    started = time.perf_counter()
    topo = render_pod(pods, "bench-master-0", options, nodes=nodes).plan.topology
    took = time.perf_counter() - started
    gc.enable()
    assert topo.rank_order == order, topo.order_note
    return [(*m.domains, m.node) for m in topo.training], took  # type: ignore[misc]


def svg(before: list[tuple[str, ...]], after: list[tuple[str, ...]], path: Path) -> None:
    """Two rings side by side: each pod a dot coloured by its rack, in rank order around the circle; an edge
    that leaves the rack is drawn thick and red."""
    racks = sorted({p[2] for p in before})
    palette = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#ff9da7", "#9c755f"]
    colour = {rack: palette[i % len(palette)] for i, rack in enumerate(racks)}
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="840" height="470" font-family="sans-serif" '
             'font-size="14">', '<rect width="840" height="470" fill="white"/>']
    for panel, (title, ring_) in enumerate((("index order", before), ("--rank-order topology", after))):
        cx, cy, radius = 210 + panel * 420, 250, 170
        crossings = ring_crossings(ring_, 3)
        parts.append(f'<text x="{cx}" y="34" text-anchor="middle" font-weight="bold">{title}: '
                     f'{crossings} of {len(ring_)} ring hops leave a rack</text>')
        points = [(cx + radius * math.sin(2 * math.pi * i / len(ring_)),
                   cy - radius * math.cos(2 * math.pi * i / len(ring_))) for i in range(len(ring_))]
        for i, (x, y) in enumerate(points):
            nx, ny = points[(i + 1) % len(points)]
            cross = ring_[i][2] != ring_[(i + 1) % len(ring_)][2]
            parts.append(f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{nx:.1f}" y2="{ny:.1f}" '
                         f'stroke="{"#d62728" if cross else "#999999"}" stroke-width="{3 if cross else 1}"/>')
        for i, (x, y) in enumerate(points):
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="7" fill="{colour[ring_[i][2]]}"/>')
        parts.append(f'<text x="{points[0][0]:.1f}" y="{points[0][1] - 12:.1f}" text-anchor="middle">rank 0</text>')
    for i, rack in enumerate(racks):
        parts.append(f'<circle cx="{30 + i * 135}" cy="455" r="6" fill="{colour[rack]}"/>'
                     f'<text x="{42 + i * 135}" y="460">{rack}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,64,256,1024,4096")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--svg", default=str(Path(__file__).resolve().parent.parent / "docs" / "rank-order-ring.svg"))
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"cluster {' x '.join(map(str, CLUSTER))} (zones x blocks x racks x nodes), {TAKEN:.0%} of nodes taken, "
          f"8 GPUs per node; worst of {args.seeds} seeds per row; lower bound = domains used (0 if one)")
    print()
    print("| pods | scheduler | " + " | ".join(f"{n}: index / topology / bound" for n in NAMES) +
          " | lower bound met | render, median: index / topology |")
    print("|---|---|" + "---|" * len(NAMES) + "---|---|")
    all_met = True
    for count in sizes:
        for how in ("spread", "pack"):
            worst: dict[str, list[int]] = {n: [0, 0, 0] for n in NAMES}
            met = True
            times: list[list[float]] = [[], []]
            for seed in range(args.seeds):
                pods, nodes = job(count, how, seed)
                before = ring(pods, nodes, "index")[0]
                after = ring(pods, nodes, "topology")[0]
                for _ in range(3):  # the core's time, for the cost of the feature: medians of 3 x seeds runs
                    times[0].append(ring(pods, nodes, "index")[1])
                    times[1].append(ring(pods, nodes, "topology")[1])
                for depth, name in enumerate(NAMES, start=1):
                    bound = domains_used(after, depth)
                    got = [ring_crossings(before, depth), ring_crossings(after, depth), bound]
                    met &= got[1] == bound
                    worst[name] = [max(a, b) for a, b in zip(worst[name], got, strict=True)]
            all_met &= met
            cells = " | ".join(f"{w[0]} / **{w[1]}** / {w[2]}" for w in worst.values())
            t_index, t_topology = statistics.median(times[0]), statistics.median(times[1])
            print(f"| {count} | {how} | {cells} | {'yes' if met else 'NO'} | "
                  f"{t_index * 1000:.0f} / {t_topology * 1000:.0f} ms ({t_topology / t_index:.2f}x) |", flush=True)
    pods, nodes = job(48, "pack", 0)
    svg(ring(pods, nodes, "index")[0], ring(pods, nodes, "topology")[0], Path(args.svg))
    print(f"\nwrote {args.svg} (48 pods, pack: one ring before and after)")
    return 0 if all_met else 1


if __name__ == "__main__":
    sys.exit(main())
