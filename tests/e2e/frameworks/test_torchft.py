"""torchft (PyPI, CPU, gloo) with two replica groups and its lighthouse, configured by the agent's files alone.

A JobSet of replicated job ``lighthouse`` (1 pod) and ``trainer`` (2 Jobs of 1 pod: replica groups 0 and 1), with
``--replica-groups jobset-job``; each pod its own network namespace and address. The lighthouse pod runs
``torchft_lighthouse``; each trainer pod runs ``worker_torchft.py`` under ``python -m agent.trainer run``, its
sidecar signalling the launcher. Both groups step together; then group 1's pod is lost (deleted, or marked
DisruptionTarget, through kubectl, and its trainer ended) and group 0 keeps stepping without a restart: its
torch.env is byte-identical, its generation stays, and its launcher's trainer is the same process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent import examples
from agent.sandbox.threaded import SandboxThread
from tests.e2e.frameworks.cluster import HERE, Venv, report, wait_for

pytestmark = [pytest.mark.consumer, pytest.mark.frameworks]
JOBSET = "ft"


def create_jobset(sandbox: SandboxThread, count: int) -> list[dict[str, Any]]:
    sandbox.create("jobset.x-k8s.io/v1alpha2/jobsets", "default", {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": JOBSET},
        "spec": {"replicatedJobs": [
            {"name": "lighthouse", "replicas": 1, "template": {"spec": {"parallelism": 1, "completions": 1}}},
            {"name": "trainer", "replicas": count - 1, "template": {"spec": {"parallelism": 1, "completions": 1}}},
        ]}})
    specs = examples.jobset(JOBSET, (("lighthouse", 1, 1), ("trainer", count - 1, 1)))
    for spec in specs:  # Pending with no IP: Pod.schedule gives each its namespace's
        spec["status"] = {"phase": "Pending"}
    return specs


def steps(pod: Any) -> list[dict[str, str]]:
    return [dict(word.split("=", 1) for word in line.split()) for line in pod.lines()]


# How group 1's pod is lost, as kubectl says it: deleted, or marked for eviction (the DisruptionTarget condition the
# eviction API, preemption and the taint manager write) before its container is stopped.
DISRUPTION = json.dumps({"status": {"conditions": [
    {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]}})
LOSSES = {"deleted": ("delete", "pod", "{name}", "--wait=false"),
          "DisruptionTarget": ("patch", "pod", "{name}", "--subresource", "status", "--type", "merge", "-p",
                               DISRUPTION)}


@pytest.mark.parametrize("loss", list(LOSSES))
def test_torchft_keeps_stepping_in_one_group_when_the_other_groups_pod_is_lost(make_job, loss):
    pytest.importorskip("torchft", reason="torchft is installed by scripts/test (requirements-consumers.lock)")
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl is on PATH (.ci/run)"
    venv = Venv(Path(sys.prefix))  # torch and torchft are the main interpreter's consumers
    job = make_job("", agent_args=("--replica-groups", "jobset-job"), create=create_jobset, size=3)
    lighthouse, first, second = job.first_pods(3)
    # torchft's checkpoint server names itself by the host name, which cluster DNS resolves in every pod
    names = "".join(f"{pod.ip}\t{pod.name}\n" for pod in job.pods)
    for pod in job.pods:
        pod.hosts.write_text(f"127.0.0.1\tlocalhost\n{names}")
    lighthouse.start([str(venv.bin / "torchft_lighthouse"), "--min_replicas", "1", "--join_timeout_ms", "1000",
                      "--quorum_tick_ms", "100", "--heartbeat_timeout_ms", "2000"], venv)
    for pod in (first, second):
        env = (pod.out / "torch.env").read_text()
        assert f"export MASTER_ADDR='{pod.ip}'" in env and "export WORLD_SIZE='1'" in env
        assert f"export TORCHFT_LIGHTHOUSE='http://{lighthouse.ip}:29510'" in env
        assert "export NUM_REPLICA_GROUPS='2'" in env
        pod.sidecar("--trainer-pid-file", str(pod.out / "trainer.pid"))
        pod.launch([venv.python, str(HERE / "worker_torchft.py"), str(pod.record)], venv)
    together = [first, second]
    wait_for(lambda: all(sum(s["participants"] == "2" for s in steps(p)) >= 3 for p in together),
             "both replica groups stepping together, three steps", 240, dump=job.logs)
    env_before = (first.out / "torch.env").read_bytes()
    generation = (first.out / "generation").read_text()
    assert first.trainer is not None
    pids = {s["pid"] for s in steps(first)}
    stepped = len(steps(first))

    argv = [second.name if part == "{name}" else part for part in LOSSES[loss]]
    result = subprocess.run([kubectl, "--kubeconfig", str(job.sandbox.sandbox.kubeconfig), *argv],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    second.terminate()  # the kubelet ends its container
    lost_at = steps(first)[-1]["step"]
    seconds = wait_for(lambda: any(s["participants"] == "1" and int(s["step"]) > int(lost_at) + 5
                                   for s in steps(first)), "group 0 stepping alone", 120, dump=job.logs)
    report(framework="torchft", what="group 0 stepping alone after group 1's loss", seconds=round(seconds, 2))
    assert len(steps(first)) > stepped
    assert (first.out / "torch.env").read_bytes() == env_before  # its world did not change
    assert (first.out / "generation").read_text() == generation
    assert {s["pid"] for s in steps(first)} == pids, job.logs()  # never started again
    assert first.trainer.poll() is None, job.logs()
    assert "trainer signalled" not in (first.dir / "sidecar.log").read_text()
