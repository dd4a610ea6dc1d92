"""Benchmark: a hot spare's takeover (--world-size), from a member marked lost to the spare's files and signal.

A Volcano job of ``--pods`` pods in the sandbox API server, the world kept at ``--pods - --spares`` training pods:
the last ``--spares`` workers are hot spares. The first spare's sidecar follows the pods (debounce 0) and signals a
stub trainer. Each step marks a random member lost as the control plane does (a ``DisruptionTarget`` condition
written to its status) and, once the spare's files hold the member's NODE_RANK, clears the mark (the member has its
seat back: the spare waits again). Per takeover: the time from the mark's write to the spare's files renamed into
place (the sidecar's own log, CLOCK_MONOTONIC) and to the signal its trainer received; each is checked to carry the
lost member's NODE_RANK and the same WORLD_SIZE. Reports p50/p99/max of both, after ``--warmup`` takeovers that
are not measured (the sidecar's start at 16384 pods outlasts the settling wait).

    python bench/spares_bench.py --pods 4096 --steps 40
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent.sandbox.threaded import SandboxThread

sys.path.insert(0, str(Path(__file__).resolve().parent))
from init_bench import build_job
from published_bench import wait_until
from sidecar_bench import TRAINER, delays, percentile

LOST = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
        "lastTransitionTime": "2026-11-22T01:00:00Z"}


def env_of(out: Path) -> dict[str, str]:
    values = {}
    try:
        text = (out / "torch.env").read_text()
    except OSError:
        return {}
    for line in text.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            values[key] = value.strip("'")
    return values


def mark(sandbox: SandboxThread, name: str, status: str) -> int:
    def change(pod: dict) -> None:
        pod["status"]["conditions"] = [{**LOST, "status": status}]
    return int(sandbox.update_pod("default", name, change)["metadata"]["resourceVersion"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=4096)
    parser.add_argument("--spares", type=int, default=8)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=1,
                        help="takeovers first, not measured: the sidecar's start (its LIST of every pod) ends")
    args = parser.parse_args()
    world = args.pods - args.spares
    spare = f"demo-worker-{world - 1}"  # master-0 is node rank 0; workers 0..world-2 the other members
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp_name, SandboxThread(Path(tmp_name) / "sb",
                                                                  bookmark_interval=1.0) as sandbox:
        tmp = Path(tmp_name)
        build_job(sandbox, args.pods, 0)
        shared, state = tmp / "shared", tmp / "agent-state"
        state.mkdir()
        env = {**os.environ, **sandbox.client_env(), "POD_NAME": spare, "POD_NAMESPACE": "default"}
        env.pop("KUBECONFIG", None)
        common = ["--out", str(shared), "--state-dir", str(state), "--address", "ip", "--world-size", str(world)]
        subprocess.run([sys.executable, "-m", "agent.cli", "init", *common, "--source", "pods"], env=env, check=True,
                       stderr=subprocess.DEVNULL)
        assert env_of(shared)["TOPOLOGY_SPARE"] == "1", "the first spare's init did not make it a spare"
        record = tmp / "signals.txt"
        trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(record)])
        while not Path(str(record) + ".ready").exists():
            time.sleep(0.01)
        pid_file, log_path = tmp / "trainer.pid", tmp / "sidecar.log"
        pid_file.write_text(str(trainer.pid))
        with log_path.open("w") as log:
            sidecar = subprocess.Popen([sys.executable, "-m", "agent.cli", "sidecar", *common, "--debounce", "0",
                                        "--trainer-pid-file", str(pid_file), "--health-port", "0", "--log-format",
                                        "json"], env=env, stderr=log)
        time.sleep(3.0)  # list, watch, settle
        emitted, versions = [], []
        for step in range(args.warmup + args.steps):
            worker = rng.randrange(world - 1)
            name = f"demo-worker-{worker}"
            emitted.append(time.monotonic())
            versions.append(mark(sandbox, name, "True"))
            if step < args.warmup:  # the sidecar may still be listing the pods: not a takeover's cost
                emitted.pop()
                versions.pop()
            wait_until(lambda: env_of(shared).get("TOPOLOGY_SPARE") == "0", 60.0, f"the spare in {name}'s place")
            got = env_of(shared)
            if (got["NODE_RANK"], got["WORLD_SIZE"]) != (str(worker + 1), str(world)):
                raise SystemExit(f"the spare took NODE_RANK {got['NODE_RANK']} WORLD_SIZE {got['WORLD_SIZE']}, "
                                 f"not {worker + 1} and {world}")
            mark(sandbox, name, "False")
            wait_until(lambda: env_of(shared).get("TOPOLOGY_SPARE") == "1", 60.0, f"{name} back in its seat")
        time.sleep(1.0)
        sidecar.terminate()
        sidecar.wait(30)
        trainer.kill()
        trainer.wait()
        files, signals, _ = delays(emitted, versions, log_path, record)
    print("| pods (spares) | takeovers | spare's files p50 / p99 / max (s) | trainer signalled p50 / p99 / max (s) |")
    print("|---|---|---|---|")
    print(f"| {args.pods} ({args.spares}) | {args.steps} | {statistics.median(files):.3f} / "
          f"{percentile(files, 0.99):.3f} / {max(files):.3f} | {statistics.median(signals):.3f} / "
          f"{percentile(signals, 0.99):.3f} / {max(signals):.3f} |")


if __name__ == "__main__":
    main()
