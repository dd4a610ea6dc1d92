"""Benchmark: init's and the sidecar's peak RSS (VmHWM) beside pods of about 1 MB that someone else made with the
job's labels and no ownerReference (big env values, under etcd's 1.5 MiB), against ``inject``'s 128Mi limit.

For each count of rogue pods: a Volcano job of 3 pods in the sandbox (a thread of this benchmark, over HTTPS),
the rogue pods, then init of the master (the peak it logs), then init and the sidecar of a worker; each rogue
pod is modified (an event of 1 MB in the sidecar's watch), the store compacted and the watches cut (a 410: the
sidecar lists again), and a worker added; the sidecar's VmHWM is read once it has written generation 2.

    python bench/rogue_bench.py --rogues 40 256
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent import examples
from agent.runtime.demo import volcano_owner
from agent.sandbox.threaded import SandboxThread

LIMIT_MIB = 128
AGENT_PATH: str | None = None


def rogue(index: int) -> dict[str, Any]:
    pod = examples.volcano_job("demo", (("master", 1), ("worker", 1)))[1]
    pod["metadata"]["name"] = f"rogue-{index}"
    pod["metadata"]["labels"]["volcano.sh/task-index"] = str(100 + index)
    pod["metadata"].pop("ownerReferences")
    pod["spec"]["containers"][0]["env"] += [{"name": f"BLOB_{n}", "value": f"{n}" * 250_000} for n in range(4)]
    return pod


def agent_env(sandbox: SandboxThread, pod: str) -> dict[str, str]:
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": pod, "POD_NAMESPACE": "default"}
    env.pop("KUBECONFIG", None)
    if AGENT_PATH:  # another checkout's agent beside the same rogue pods (its processes run outside this one)
        env["PYTHONPATH"] = AGENT_PATH
    return env


def init(sandbox: SandboxThread, pod: str, out: Path) -> int:
    done = subprocess.run([sys.executable, "-m", "agent.cli", "init", "--out", str(out), "--address", "ip"],
                          env=agent_env(sandbox, pod), cwd=out.parent, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise SystemExit(f"init of {pod} failed: {done.stderr[-2000:]}")
    return int(re.findall(r"peak RSS (\d+) MB", done.stderr)[-1])


def wait_for(predicate: Any, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"no VmHWM for {pid}")


def run(rogues: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, SandboxThread(Path(tmp) / "sandbox", bookmark_interval=0.5) as sandbox:
        owner = volcano_owner()
        owner["spec"]["tasks"] = [{"name": "master", "replicas": 1, "template": {}},
                                  {"name": "worker", "replicas": 2, "template": {}}]
        created = sandbox.create("batch.volcano.sh/v1alpha1/jobs", "default", owner)
        for pod in examples.volcano_job("demo", (("master", 1), ("worker", 2))):
            pod["metadata"]["ownerReferences"][0]["uid"] = created["metadata"]["uid"]
            sandbox.create_pod(pod)
        for index in range(rogues):
            sandbox.create_pod(rogue(index))
        init_peak = init(sandbox, "demo-master-0", Path(tmp) / "master")
        out = Path(tmp) / "worker"
        init(sandbox, "demo-worker-0", out)
        log = Path(tmp) / "sidecar.log"
        with log.open("w") as handle:
            sidecar = subprocess.Popen([sys.executable, "-m", "agent.cli", "sidecar", "--out", str(out), "--address",
                                        "ip", "--debounce", "0", "--trainer-match", "no-such-trainer-here"],
                                       env=agent_env(sandbox, "demo-worker-0"), cwd=tmp, stderr=handle)
        try:
            wait_for(lambda: "following" in log.read_text(), "the sidecar to follow")
            for index in range(rogues):
                sandbox.update_pod("default", f"rogue-{index}", lambda pod: pod["metadata"]["labels"].update(
                    {"changed": "yes"}))
            sandbox.faults(drop_watches=True, compact=True)
            wait_for(lambda: "listing again" in log.read_text(), "a relist")
            pod = examples.volcano_job("demo", (("master", 1), ("worker", 3)))[-1]
            pod["metadata"]["ownerReferences"][0]["uid"] = created["metadata"]["uid"]
            sandbox.create_pod(pod)
            wait_for(lambda: (out / "generation").exists() and (out / "generation").read_text().strip() == "2",
                     "generation 2")
            sidecar_peak = hwm_mib(sidecar.pid)
            world = json.loads((out / "topology.json").read_text())["env"]["WORLD_SIZE"]
        finally:
            sidecar.send_signal(signal.SIGTERM)
            sidecar.wait(30)
    return {"rogue pods": rogues, "init peak MiB": init_peak, "sidecar peak MiB": round(sidecar_peak),
            "limit MiB": LIMIT_MIB, "WORLD_SIZE after the scale-up": world}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rogues", type=int, nargs="+", default=[40, 256])
    parser.add_argument("--agent-path", help="run the agent processes from this checkout (their PYTHONPATH)")
    args = parser.parse_args()
    global AGENT_PATH
    AGENT_PATH = args.agent_path
    for count in args.rogues:
        print(json.dumps(run(count)), flush=True)


if __name__ == "__main__":
    main()
