"""A hot spare takes a lost member's place in a real static torch job, from the last step.

An Indexed Job of three pods in the sandbox API server, each pod one loopback address, every pod's agent given
``--world-size 2``: pods 0 and 1 train, pod 2 is the spare. Each pod runs its init, its sidecar (signalling the
trainer launcher by its pid file) and ``python -m agent.trainer run -- torchrun worker_spare.py``: static torchrun
(no rendezvous option, every value from torch.env), gloo, a checkpoint in a shared directory. Pod 1 is then marked
lost the way the control plane marks it, a ``DisruptionTarget`` condition written through real kubectl, and its
trainer stopped as the kubelet stops an evicted pod's: the spare continues in rank 1 of a world of 2 from the
checkpoint's step, and pod 0's trainer is started again in the same world.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import examples
from agent.sandbox.threaded import SandboxThread
from tests.e2e.frameworks.cluster import wait_for

pytestmark = [pytest.mark.consumer, pytest.mark.xdist_group("e2e-spares")]
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
JOB = "spares"
IP_BASE = 120  # addresses of their own: 127.1.0.121-123
LOST = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
        "lastTransitionTime": "2026-11-22T01:00:00Z"}


def agent_env(sandbox: SandboxThread, pod: str) -> dict[str, str]:
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": pod, "POD_NAMESPACE": "default"}
    env.pop("KUBECONFIG", None)
    return env


def env_of(out: Path) -> dict[str, str]:
    values = {}
    for line in (out / "torch.env").read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            values[key] = value.strip("'")
    return values


def records(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def test_a_spare_continues_in_the_lost_members_rank_from_the_last_step(tmp_path):
    pytest.importorskip("torch", reason="torch is installed by scripts/test (pip install torch==2.13.0)")
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl is not on PATH (.ci/run provides it)"
    checkpoint, record = tmp_path / "checkpoint.json", tmp_path / "record.jsonl"
    processes: list[subprocess.Popen] = []
    launchers: dict[str, subprocess.Popen] = {}
    with SandboxThread(tmp_path / "sandbox", bookmark_interval=0.5) as sandbox:
        owner = sandbox.create("batch/v1/jobs", "default", {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": JOB},
            "spec": {"completions": 3, "parallelism": 3, "completionMode": "Indexed"}})
        specs = examples.indexed_job(JOB, 3, ip_base=IP_BASE)
        names = [spec["metadata"]["name"] for spec in specs]
        outs = {name: tmp_path / name for name in names}

        def dump() -> str:
            logs = [f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("*.log"))]
            return "\n".join(logs) + "\n--- record\n" + "\n".join(map(str, records(record)[-10:]))

        def kube(*args: str) -> None:
            result = subprocess.run([kubectl, "--kubeconfig", str(sandbox.sandbox.kubeconfig), *args],
                                    capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, result.stderr

        try:
            inits = []
            for spec in specs:
                spec["metadata"]["ownerReferences"][0]["uid"] = owner["metadata"]["uid"]
                sandbox.create_pod(spec)
            for name in names:
                inits.append(subprocess.Popen(
                    [sys.executable, "-m", "agent.cli", "init", "--out", str(outs[name]), "--address", "ip",
                     "--nproc-per-node", "1", "--world-size", "2", "--timeout", "60"],
                    env=agent_env(sandbox, name), stderr=subprocess.PIPE, text=True))
            for init in inits:
                _, err = init.communicate(timeout=90)
                assert init.returncode == 0, err
            spare = env_of(outs[names[2]])
            assert spare["TOPOLOGY_SPARE"] == "1" and not {"RANK", "WORLD_SIZE", "MASTER_ADDR", "PET_NNODES"} & set(
                spare)
            assert examples.loopback_ip(IP_BASE + 2) not in (outs[names[0]] / "hostfile").read_text()

            for name in names:
                with (tmp_path / f"{name}-sidecar.log").open("w") as log:
                    processes.append(subprocess.Popen(
                        [sys.executable, "-m", "agent.cli", "sidecar", "--out", str(outs[name]), "--address", "ip",
                         "--nproc-per-node", "1", "--world-size", "2", "--health-port", "0", "--debounce", "0.2",
                         "--trainer-pid-file", str(outs[name] / "trainer.pid")],
                        env=agent_env(sandbox, name), stderr=log))
                with (tmp_path / f"{name}-trainer.log").open("w") as log:
                    launchers[name] = subprocess.Popen(
                        [sys.executable, "-m", "agent.trainer", "run", "--out", str(outs[name]), "--grace", "3",
                         "--poll", "0.5", "--", sys.executable, "-m", "torch.distributed.run",
                         str(HERE / "worker_spare.py"), str(checkpoint), str(record)],
                        env={"PATH": os.environ["PATH"], "HOME": str(outs[name]), "PYTHONPATH": str(ROOT),
                             "GLOO_SOCKET_IFNAME": "lo", "POD": name},
                        stdout=log, stderr=log, start_new_session=True)
                    processes.append(launchers[name])

            wait_for(lambda: sum(1 for r in records(record) if r.get("step", 0) >= 5) >= 2,
                     "the world of 2 at step 5", 120, dump=dump)
            assert {r["pod"] for r in records(record)} == {names[0], names[1]}
            assert all(r["world"] == 2 for r in records(record))
            assert "hot spare" in (tmp_path / f"{names[2]}-trainer.log").read_text()

            marked = time.time()
            kube("patch", "pod", names[1], "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": {"conditions": [LOST]}}))
            os.killpg(launchers[names[1]].pid, signal.SIGTERM)  # the kubelet stops the evicted pod's trainer
            launchers[names[1]].wait(30)
            before = [r for r in records(record) if "step" in r and r["at"] < marked]

            def spare_stepping() -> bool:
                return any(r["pod"] == names[2] and r.get("step", 0) >= 2 for r in records(record))

            wait_for(spare_stepping, "the spare stepping in rank 1", 120, dump=dump)
            seen = records(record)
            start = next(r for r in seen if r["pod"] == names[2] and "start" in r)
            took = start["at"] - marked
            rank0_last = max(r["step"] for r in seen if r["pod"] == names[0] and "step" in r and r["at"] < start["at"])
            print(f"spare took over in {took:.1f} s (marked lost -> its trainer in the world), "
                  f"from step {start['start']}", file=sys.stderr)
            assert start["rank"] == 1 and start["world"] == 2
            assert start["start"] in (rank0_last, rank0_last + 1) and start["start"] >= max(r["step"] for r in before)
            steps = [r for r in seen if r["pod"] == names[2] and "step" in r]
            assert steps[0]["step"] == start["start"] + 1 and all(r["sum"] == 2.0 for r in steps)
            promoted = env_of(outs[names[2]])
            assert (promoted["TOPOLOGY_SPARE"], promoted["RANK"], promoted["NODE_RANK"], promoted["WORLD_SIZE"]) == \
                ("0", "1", "1", "2")
            document = json.loads((outs[names[0]] / "topology.json").read_text())
            assert document["takeovers"] == [{"name": names[2], "nodeRank": 1, "replaced": names[1]}]
            assert took < 60, dump()
            assert f"hot spare {names[2]} took node rank 1 in place of {names[1]}" in \
                (tmp_path / f"{names[0]}-sidecar.log").read_text()
        finally:
            for process in processes:
                if process.poll() is None:
                    try:
                        os.killpg(process.pid, signal.SIGTERM)
                    except (ProcessLookupError, PermissionError):
                        process.terminate()
            for process in processes:
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
