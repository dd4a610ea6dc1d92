"""Real torchrun scales an elastic job 2 -> 3 -> 2 pods, configured by torch.env alone.

An elastic PyTorchJob (elasticPolicy minReplicas 2, maxReplicas 3) in the sandbox API server; each "pod" is one
loopback address on this machine. Each pod's init writes torch.env, and the pod runs ``. torch.env && exec
torchrun worker_elastic.py``: no torchrun option and no variable is set by hand. A third pod joins, then leaves
(SIGTERM to its torchrun, as the kubelet sends, and the pod deleted): every torchrun process sees each world
(gloo all_reduce), and the sidecar of the first pod, set up as docs/sidecar.md says for torchrun, follows the
members without ever ending torchrun, even when told to signal it.

A second job puts its pods at addresses whose string order is not their index order: the ranks torchrun's c10d
rendezvous gives each worker are the agent's (NODE_RANK, topology.json).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.sandbox.threaded import SandboxThread
from tests.jobs import create_elastic_pytorchjob

# A worker of its own (xdist): two minutes of torchrun restarts, and --trainer-match names any torchrun.
pytestmark = [pytest.mark.consumer, pytest.mark.xdist_group("e2e-elastic")]
HERE = Path(__file__).resolve().parent
JOB = "elastic"
NAMES = [f"{JOB}-worker-{i}" for i in range(3)]


def agent_env(sandbox: SandboxThread, pod: str) -> dict[str, str]:
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": pod, "POD_NAMESPACE": "default"}
    env.pop("KUBECONFIG", None)
    return env


def wait_for(predicate, what: str, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Pod:
    def __init__(self, sandbox: SandboxThread, pod: dict, tmp: Path, *, nproc: int = 1, extra: tuple[str, ...] = ()
                 ) -> None:
        self.sandbox, self.pod, self.name = sandbox, pod, pod["metadata"]["name"]
        self.out, self.worlds = tmp / self.name, tmp / f"{self.name}.worlds"
        self.log = tmp / f"{self.name}.log"
        self.torchrun: subprocess.Popen[bytes] | None = None
        sandbox.create_pod(pod)
        self.init = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "init", "--out", str(self.out), "--address", "ip",
             "--nproc-per-node", str(nproc), "--timeout", "60", *extra], env=agent_env(sandbox, self.name),
            stderr=subprocess.PIPE, text=True)

    def run(self, worker: str = "worker_elastic.py", *args: str) -> None:
        _, err = self.init.communicate(timeout=90)
        assert self.init.returncode == 0, err
        args = args or (str(self.worlds),)
        with self.log.open("w") as log:  # a container's environment: nothing of the test's, then torch.env
            self.torchrun = subprocess.Popen(
                ["bash", "-c", f'. {self.out}/torch.env && exec "{sys.executable}" -m torch.distributed.run '
                               f'{HERE / worker} {" ".join(args)}'],
                env={"PATH": os.environ["PATH"], "HOME": str(self.out), "GLOO_SOCKET_IFNAME": "lo"},
                stdout=log, stderr=log, start_new_session=True)

    def seen(self) -> list[str]:
        try:
            return [line.split()[1] for line in self.worlds.read_text().splitlines()]
        except OSError:
            return []

    def stop(self) -> None:
        if self.torchrun is not None and self.torchrun.poll() is None:
            os.killpg(self.torchrun.pid, signal.SIGTERM)  # the kubelet's SIGTERM to the container
            self.torchrun.wait(60)


def start_sidecar(sandbox: SandboxThread, pod: Pod, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    with log.open("w") as handle:
        return subprocess.Popen([sys.executable, "-m", "agent.cli", "sidecar", "--out", str(pod.out), "--address",
                                 "ip", "--nproc-per-node", "1", "--health-port", "0", *extra],
                                env=agent_env(sandbox, pod.name), stderr=handle)


def generation(pod: Pod) -> int:
    try:
        return int((pod.out / "generation").read_text())
    except (OSError, ValueError):
        return 0


def test_real_torchrun_scales_from_two_to_three_and_back_to_two_pods(tmp_path):
    pytest.importorskip("torch", reason="torch is installed by scripts/test (pip install torch==2.13.0)")
    with SandboxThread(tmp_path / "sandbox", bookmark_interval=0.5) as sandbox:
        specs = create_elastic_pytorchjob(sandbox, JOB, low=2, high=3, replicas=2)
        pods = [Pod(sandbox, spec, tmp_path) for spec in specs[:2]]
        sidecars = []
        try:
            for pod in pods:
                pod.run()
            env = (pods[0].out / "torch.env").read_text()
            assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE='1'" in env and "export PET_NNODES='2:3'" in env
            sidecars = [
                start_sidecar(sandbox, pods[0], tmp_path / "sidecar.log"),  # docs/sidecar.md: no trainer named
                start_sidecar(sandbox, pods[1], tmp_path / "sidecar-told.log", "--trainer-match",
                              "torch.distributed.run", "--signal", "SIGUSR1"),  # told to signal torchrun
            ]
            wait_for(lambda: all(p.seen() == ["world=2"] for p in pods), "the first world of 2 pods", 150)

            pods.append(Pod(sandbox, specs[2], tmp_path))
            pods[2].run()
            wait_for(lambda: all(p.seen()[-1:] == ["world=3"] for p in pods), "every pod in a world of 3", 150)
            wait_for(lambda: generation(pods[0]) >= 2, "the sidecar's files with the third pod", 30)

            pods[2].stop()
            sandbox.delete_pod("default", NAMES[2])
            wait_for(lambda: all(p.seen()[-1:] == ["world=2"] and len(p.seen()) >= 3 for p in pods[:2]),
                     "the two pods left in a world of 2", 150)
            wait_for(lambda: generation(pods[0]) >= 3, "the sidecar's files without it", 30)

            assert pods[0].seen() == pods[1].seen() == ["world=2", "world=3", "world=2"]
            assert pods[2].seen() == ["world=3"]
            assert "sum=3" in pods[0].worlds.read_text()  # the all_reduce of the world of 3 reached every pod
            for pod in pods[:2]:
                assert pod.torchrun is not None and pod.torchrun.poll() is None, pod.log.read_text()[-2000:]
            told = (tmp_path / "sidecar-told.log").read_text()
            assert "is torchrun, which SIGUSR1 would end" in told and "sent SIGUSR1" not in told
            assert "rewrites signal nobody (no trainer named" in (tmp_path / "sidecar.log").read_text()
        finally:
            for process in sidecars:
                process.terminate()
            for pod in pods:
                pod.stop()
            for process in sidecars:
                process.wait(15)
        assert all(process.returncode == 0 for process in sidecars)


# Index 0, 1, 2; as strings .101 < .12 < .3, so c10d ranks them 1, 2, 0 (torch 2.13 dynamic_rendezvous.py:
# sorted(state.participants), each a _NodeDesc whose addr is torchrun's --local-addr, the agent's PET_LOCAL_ADDR)
SORTED_UNLIKE_INDEX = ("127.77.0.12", "127.77.0.3", "127.77.0.101")


def test_real_torchruns_c10d_ranks_are_the_agents(tmp_path):
    """Three pods of an elastic PyTorchJob (3:3, so c10d's round holds all three) at addresses that sort unlike
    their index, two processes each: every worker's GROUP_RANK is its pod's NODE_RANK and topology.json's
    nodeRank, and its RANK the member's rank plus LOCAL_RANK."""
    pytest.importorskip("torch", reason="torch is installed by scripts/test (pip install torch==2.13.0)")
    job = "sorted"
    with SandboxThread(tmp_path / "sandbox", bookmark_interval=0.5) as sandbox:
        specs = create_elastic_pytorchjob(sandbox, job, low=3, high=3, replicas=3)
        for spec, address in zip(specs, SORTED_UNLIKE_INDEX, strict=True):
            spec["status"].update(podIP=address, podIPs=[{"ip": address}])
        # a rendezvous port of its own: the other test's store may still be closing
        pods = [Pod(sandbox, spec, tmp_path, nproc=2, extra=("--rdzv-port", "29471")) for spec in specs]
        records = tmp_path / "ranks.jsonl"
        try:
            for pod in pods:
                pod.run("worker_ranks.py", str(pod.out / "topology.json"), str(records))
            for pod in pods:
                assert pod.torchrun is not None and pod.torchrun.wait(180) == 0, pod.log.read_text()[-3000:]
        finally:
            for pod in pods:
                pod.stop()
        seen = [json.loads(line) for line in records.read_text().splitlines()]
        assert len(seen) == 6, seen
        for worker in seen:
            assert worker["group_rank"] == worker["node_rank"] == worker["member_node_rank"], worker
            assert worker["rank"] == worker["member_rank"] + worker["local_rank"], worker
            assert worker["pet_node_rank"] is None, worker  # c10d ignores it: torch.env does not write it
        by_pod = {w["pod"]: w["group_rank"] for w in seen}
        assert [by_pod[name] for name in (f"{job}-worker-{i}" for i in range(3))] == [1, 2, 0]
        assert sorted(w["rank"] for w in seen) == list(range(6))
        for pod in pods:  # torchrun 2.13 warns so on every pod given a node rank but 0 under c10d
            assert "node_rank is only used for static rdzv_backend" not in pod.log.read_text()
