"""A real torch gloo job survives a lost Node: the survivors continue in a new world, from the last step, within
seconds, and take the member back when its Node is.

An elastic PyTorchJob (minReplicas 2, maxReplicas 3) in the sandbox API server, each pod on a Node of its own and
at a loopback address of its own. Each pod runs the agent's init, its sidecar (``--trainer-pid-file``) and the
launcher, ``python -m agent.trainer run -- python worker_resume.py``: the worker joins the world torch.env gives,
resumes from the job's checkpoint and steps. The third pod's Node is then marked NotReady with real ``kubectl``
(``kubectl patch node --subresource=status``, as the kubelet reports it), and its processes are stopped (SIGSTOP):
a Node gone silent, its trainer still holding the collective, as a partition leaves it. The pod itself is not
touched: it stays Running, as on a cluster for the taints' toleration (300 s). The two survivors' sidecars write a
world of 2 and signal their launchers, which restart the workers from the checkpoint. The Node Ready again and the
pod's processes resumed, the member rejoins: a world of 3 again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import examples
from agent.sandbox.threaded import SandboxThread
from tests.e2e.frameworks.cluster import wait_for
from tests.jobs import create_elastic_pytorchjob

pytestmark = [pytest.mark.consumer, pytest.mark.xdist_group("e2e-lost-node")]
HERE = Path(__file__).resolve().parent
JOB = "lostnode"
ADDRESSES = ("127.78.0.1", "127.78.0.2", "127.78.0.3")  # the job's own: the other torch tests use others


class Pod:
    """One pod's agent (init, then the sidecar) and its trainer container (the launcher and its worker)."""

    def __init__(self, sandbox: SandboxThread, spec: dict, tmp: Path, checkpoint: Path) -> None:
        self.sandbox, self.name = sandbox, spec["metadata"]["name"]
        self.dir = tmp / self.name
        self.out, self.record = self.dir / "shared", self.dir / "record"
        self.out.mkdir(parents=True)
        self.checkpoint = checkpoint
        self.env = {**os.environ, **sandbox.client_env(), "POD_NAME": self.name, "POD_NAMESPACE": "default"}
        self.env.pop("KUBECONFIG", None)
        self.procs: list[subprocess.Popen[bytes]] = []
        sandbox.create_pod(spec)

    def agent(self, command: str, *extra: str) -> subprocess.Popen[bytes]:
        with (self.dir / f"{command}.log").open("w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "agent.cli", command, "--out", str(self.out), "--address",
                                     "ip", "--nproc-per-node", "1", *extra], env=self.env, stdout=log, stderr=log)
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        """The sidecar, then the trainer container: the launcher, with a container's environment."""
        self.agent("sidecar", "--health-port", "0", "--trainer-pid-file", str(self.out / "trainer.pid"))
        wait_for(lambda: "following" in (self.dir / "sidecar.log").read_text(), f"{self.name}'s sidecar", 30,
                 dump=self.logs)
        with (self.dir / "trainer.log").open("w") as log:
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "agent.trainer", "run", "--out", str(self.out), "--grace", "5", "--poll",
                 "0.5", "--", sys.executable, str(HERE / "worker_resume.py"), str(self.record),
                 str(self.checkpoint)],
                env={"PATH": os.environ["PATH"], "HOME": str(self.dir), "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                     "GLOO_SOCKET_IFNAME": "lo"},
                stdout=log, stderr=log, start_new_session=True))

    def starts(self) -> list[dict[str, str]]:
        try:
            return [dict(w.split("=", 1) for w in line.split()) for line in self.record.read_text().splitlines()]
        except OSError:
            return []

    def world(self) -> int:
        starts = self.starts()
        return int(starts[-1]["world"]) if starts else 0

    def pids(self) -> list[int]:
        """The sidecar, the launcher and the worker running now."""
        starts = self.starts()
        return [proc.pid for proc in self.procs] + ([int(starts[-1]["pid"])] if starts else [])

    def signal_all(self, signum: int) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def logs(self) -> str:
        parts = []
        for name in ("init.log", "sidecar.log", "trainer.log", "record"):
            with contextlib.suppress(OSError):
                parts.append(f"--- {self.name} {name}\n{(self.dir / name).read_text()[-3000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        self.signal_all(signal.SIGCONT)
        for proc in reversed(self.procs):  # the launcher first: it ends its worker
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def kubectl(sandbox: SandboxThread, *args: str) -> str:
    done = subprocess.run(["kubectl", "--kubeconfig", str(sandbox.sandbox.kubeconfig), *args], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def ready_patch(status: str, reason: str) -> str:
    return json.dumps({"status": {"conditions": [{"type": "Ready", "status": status, "reason": reason}]}})


def test_a_real_torch_job_continues_without_the_member_on_a_lost_node_and_takes_it_back(tmp_path):
    pytest.importorskip("torch", reason="torch is installed by scripts/test (pip install torch==2.13.0)")
    if subprocess.run(["kubectl", "version", "--client"], capture_output=True).returncode != 0:
        pytest.fail("kubectl is not on PATH (.ci/run provides it)")
    checkpoint = tmp_path / "checkpoint"
    with SandboxThread(tmp_path / "sandbox", bookmark_interval=0.5) as sandbox:
        specs = create_elastic_pytorchjob(sandbox, JOB, low=2, high=3, replicas=3)
        for k, (spec, address) in enumerate(zip(specs, ADDRESSES, strict=True)):
            sandbox.create_node(examples.node(f"node-{k}", {}))
            spec["spec"]["nodeName"] = f"node-{k}"
            spec["status"].update(podIP=address, podIPs=[{"ip": address}])
        pods = [Pod(sandbox, spec, tmp_path, checkpoint) for spec in specs]
        survivors, lost = pods[:2], pods[2]

        def dump() -> str:
            return "\n".join(pod.logs() for pod in pods)

        try:
            inits = [pod.agent("init", "--timeout", "60") for pod in pods]
            for pod, init in zip(pods, inits, strict=True):
                assert init.wait(90) == 0, pod.logs()
                pod.procs.remove(init)
            for pod in pods:
                pod.start()
            wait_for(lambda: all(pod.world() == 3 for pod in pods), "a world of 3", 120, dump=dump)
            wait_for(lambda: checkpoint.exists() and int(checkpoint.read_text()) >= 20, "20 steps in the world of 3",
                     60, dump=dump)

            lost.signal_all(signal.SIGSTOP)  # the Node goes silent: its trainer holds the collective
            before = int(checkpoint.read_text())
            marked = time.time()
            kubectl(sandbox, "patch", "node", "node-2", "--subresource=status", "--type=merge",
                    "-p", ready_patch("False", "KubeletNotReady"))
            wait_for(lambda: all(pod.world() == 2 for pod in survivors), "the survivors in a world of 2", 60, dump=dump)
            restarted = [pod.starts()[-1] for pod in survivors]
            seconds = max(float(start["at"]) for start in restarted) - marked
            print(json.dumps({"what": "node NotReady -> survivors' new world", "seconds": round(seconds, 2)}))
            assert sorted(start["rank"] for start in restarted) == ["0", "1"]
            assert restarted[0]["start"] == restarted[1]["start"] and int(restarted[0]["start"]) >= before
            wait_for(lambda: int(checkpoint.read_text()) >= int(restarted[0]["start"]) + 20,
                     "20 steps in the world of 2", 60, dump=dump)
            events = json.loads(kubectl(sandbox, "get", "events", "-o", "json"))["items"]
            notes = [event.get("message") or event.get("note") or "" for event in events]
            assert any(f"left out: {lost.name}: lost: node node-2 NotReady" in note for note in notes), notes
            pod_now = json.loads(kubectl(sandbox, "get", "pod", lost.name, "-o", "json"))
            assert pod_now["status"]["phase"] == "Running"  # the pod was never touched: its Node said it

            kubectl(sandbox, "patch", "node", "node-2", "--subresource=status", "--type=merge",
                    "-p", ready_patch("True", "KubeletReady"))
            lost.signal_all(signal.SIGCONT)
            wait_for(lambda: all(pod.world() == 3 for pod in pods), "the member back: a world of 3", 120, dump=dump)
            back = [pod.starts()[-1] for pod in pods]
            assert sorted(start["rank"] for start in back) == ["0", "1", "2"]
            assert len({start["start"] for start in back}) == 1 and int(back[0]["start"]) >= int(
                restarted[0]["start"]) + 20
            assert any(f"back: {lost.name}" in (event.get("message") or event.get("note") or "")
                       for event in json.loads(kubectl(sandbox, "get", "events", "-o", "json"))["items"])
        finally:
            for pod in pods:
                pod.stop()
