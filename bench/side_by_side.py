"""Two commits' published_bench.py figures in one run, side by side.

The machine's speed drifts within a day, so two versions are compared by running both in turn, on the same IP
orders (``--seed``), in one sitting, never against a figure measured earlier. Each commit runs from a worktree of
its own (made here, detached, removed at the end) with its own benchmark and its own agent; the runs alternate
(base, head, base, head, ...), each ``--runs 1`` with seed ``--seed + k``. Every summary line each benchmark prints
("- <figure>: <values>") becomes a row: the figure, the base's value, the head's.

    python bench/side_by_side.py --base 4d6c225 --pods 4096 --runs 1 -- --spread 20
    python bench/side_by_side.py --base 4d6c225 --pods 16384 --runs 1 -- --spread 20 --max-load 1.3

Arguments after ``--`` go to both benchmarks as given (both must know them).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^(?:- |(?=Takeover))(?P<figure>(?:[^:(]|\([^)]*\))+): (?P<value>.*)$")  # ":" in () stays
SAME = re.compile(r" \((?P<v>[\d.]+)-(?P=v)\)")  # "(x-x)": the range of one run
DETAIL = re.compile(r" \([^()]*(?:credited|the pod that got|the leader's pod)[^()]*(?:\([^()]*\)[^()]*)*\)")


def worktree(ref: str, where: Path) -> Path:
    path = where / ref.replace("/", "_")
    subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", "-q", str(path), ref], check=True)
    return path


def run_bench(tree: Path, pods: int, seed: int, extra: Sequence[str]) -> str:
    """One ``--runs 1`` run of the tree's own benchmark on its own agent; its printed summary."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "bench/published_bench.py", "--pods", str(pods), "--runs", "1", "--seed", str(seed),
               *extra]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{tree.name}: published_bench.py failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return done.stdout


def figures(out: str) -> dict[str, str]:
    rows: dict[str, str] = {}
    for line in out.splitlines():
        found = LINE.match(line)
        if found:
            rows[found["figure"]] = DETAIL.sub("", SAME.sub("", found["value"]))
    return rows


def table(base: str, head: str, runs: list[tuple[dict[str, str], dict[str, str]]]) -> str:
    order: list[str] = []
    for base_rows, head_rows in runs:
        order += [f for f in dict.fromkeys([*base_rows, *head_rows]) if f not in order]
    lines = [f"| figure | {base} | {head} |", "|---|---|---|"]
    for figure in order:
        for k, (base_rows, head_rows) in enumerate(runs):
            label = figure if len(runs) == 1 else f"{figure} (run {k + 1})"
            lines.append(f"| {label} | {base_rows.get(figure, '-')} | {head_rows.get(figure, '-')} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--head", default="HEAD")
    parser.add_argument("--pods", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=1, help="runs of each commit, alternating")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("extra", nargs="*", help="after --: arguments for both benchmarks")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as tmp:
        trees = {ref: worktree(ref, Path(tmp)) for ref in (args.base, args.head)}
        try:
            runs = []
            for k in range(args.runs):
                outs = [run_bench(trees[ref], args.pods, args.seed + k, args.extra) for ref in (args.base, args.head)]
                runs.append((figures(outs[0]), figures(outs[1])))
                print(f"run {k + 1} of {args.runs} done", file=sys.stderr)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(HERE), "worktree", "remove", "--force", str(tree)], check=False)
    print(f"### {args.pods} pods, {args.base} / {args.head}, {args.runs} run(s) each, alternating, "
          f"seed {args.seed}+k\n")
    print(table(args.base, args.head, runs))


if __name__ == "__main__":
    main()
