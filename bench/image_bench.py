"""Benchmark: the agent's image, built with scripts/image and run as tests/e2e/test_image.py runs it.

Measures the base's making (mmdebstrap, skipped when DIR holds it), the build of the Dockerfile on it, the sizes
of both images, and per run, in a fresh sandbox with a 3-pod job: init in the image from `podman run` to its exit
(its peak RSS as init logs it), and the sidecar from `podman run` to its first 200 on /readyz. Prints a Markdown
table: medians over the runs (min-max). Needs root and podman, buildah, runc and mmdebstrap.

    python bench/image_bench.py --dir /tmp/image --runs 3
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.sandbox.threaded import SandboxThread  # noqa: E402
from tests.e2e.test_image import JOB, SCRIPT, Image, as_kubelet, pod_volumes, wait_for_ready  # noqa: E402
from tests.jobs import create_volcano_job  # noqa: E402


def build(cache: Path) -> tuple[Image, str]:
    started = time.monotonic()
    result = subprocess.run([str(SCRIPT), str(cache), "build"], capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        sys.exit(f"scripts/image build failed:\n{result.stderr[-4000:]}")
    took = time.monotonic() - started
    summary = result.stderr.strip().splitlines()[-1]  # scripts/image: base N s, build N s, image N MB
    return Image(cache, result.stdout.strip().splitlines()[-1]), f"{summary} ({took:.0f} s in all)"


def size_mb(image: Image, name: str) -> float:
    return int(image.podman("image", "inspect", "--format", "{{.Size}}", name).stdout) / 1e6


def one_run(image: Image, where: Path, port: int) -> tuple[float, float, float]:
    with SandboxThread(where / "sandbox", bookmark_interval=0.5) as sandbox:
        create_volcano_job(sandbox, JOB)
        _, volumes = pod_volumes(sandbox, where)
        options = as_kubelet(sandbox, volumes)
        started = time.monotonic()
        init = image.podman("run", "--rm", *options, image.name, "init", "--out", "/shared")
        init_s = time.monotonic() - started
        if init.returncode != 0:
            sys.exit(init.stderr)
        rss = float(re.search(r"peak RSS (\d+) MB", init.stderr).group(1))  # type: ignore[union-attr]
        name = f"topology-sidecar-bench-{os.getpid()}"
        started = time.monotonic()
        run = image.podman("run", "--detach", "--name", name, *options, image.name, "sidecar", "--out", "/shared",
                           "--health-host", "127.0.0.1", "--health-port", str(port))
        try:
            if run.returncode != 0:
                sys.exit(run.stderr)
            wait_for_ready(image, name, port)
            sidecar_s = time.monotonic() - started
        finally:
            image.podman("rm", "--force", name)
    return init_s, rss, sidecar_s


def spread(values: list[float], unit: str, digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} {unit} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, help="scripts/image's DIR (default: a new temp directory)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--port", type=int, default=18090, help="the sidecar's health port on 127.0.0.1")
    args = parser.parse_args()
    cache = args.dir or Path(tempfile.mkdtemp(prefix="image-bench-"))
    image, summary = build(cache)
    print(summary)
    runs = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as where:
            runs.append(one_run(image, Path(where), args.port))
        print(f"run {i + 1}: init {runs[-1][0]:.2f} s, peak RSS {runs[-1][1]:.0f} MB, sidecar ready "
              f"{runs[-1][2]:.2f} s", file=sys.stderr)
    init_s, rss, sidecar_s = (list(column) for column in zip(*runs, strict=True))
    print("| figure | value |\n|---|---|")
    print(f"| image (uncompressed) | {size_mb(image, image.name):.0f} MB |")
    print(f"| its base, made with mmdebstrap | {size_mb(image, 'localhost/topology-agent-base:bookworm'):.0f} MB |")
    print(f"| init in the image, `podman run` to exit | {spread(init_s, 's')} |")
    print(f"| init's peak RSS in the image | {spread(rss, 'MB', 0)} |")
    print(f"| sidecar in the image, `podman run` to /readyz 200 | {spread(sidecar_s, 's')} |")


if __name__ == "__main__":
    main()
