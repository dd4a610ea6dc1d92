"""MLX from the agent's files alone, 2 -> 3 pods, each its own address: the ring backend from mlx.env and
mlx_hostfile.json through the launcher, and MPI under OpenMPI 5 (mpirun from mpi.env and the hostfile, over
SSH between the pods' namespaces) with MLX's MPI backend."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.e2e.frameworks.cluster import HERE, JOB, grow, report, restarted_at_size_three, venv_fixture, wait_for

pytestmark = [pytest.mark.consumer, pytest.mark.frameworks]
venv = venv_fixture("mlx")


def test_mlx_ring_sums_across_every_pod_and_starts_again_at_size_three(make_job, venv):
    job = make_job("mlx")
    restarted_at_size_three(job, venv, lambda pod: [venv.python, str(HERE / "worker_mlx.py"), str(pod.record)],
                            framework="mlx")
    for pod in job.pods:
        hosts = json.loads((pod.out / "mlx_hostfile.json").read_text())
        assert hosts == [["10.99.0.1:32323"], ["10.99.0.2:32323"], ["10.99.0.3:32323"]]
        assert pod.last() == {"world": "3", "rank": str(pod.index), "sum": "6"}
    assert {line for pod in job.pods[:2] for line in pod.lines()} >= {
        "world=2 rank=0 sum=3", "world=2 rank=1 sum=3"}


def test_mpirun_from_mpi_env_puts_the_ranks_on_the_pods_and_starts_again_at_size_three(make_job, venv, home_tmp):
    """OpenMPI 5 reads PRTE_MCA_prte_default_hostfile (and ignores the ORTE name): mpirun on the first pod, with
    nothing but mpi.env, starts one rank on every pod over SSH (the agent's host certificates), and when the third
    pod joins the launcher starts mpirun again with the rewritten hostfile."""
    from tests.e2e.test_ssh import SSH, SSHD
    from tests.jobs import ssh_secret

    started = time.monotonic()
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    secret = ssh_secret(home_tmp / "secret", job=JOB)
    job = make_job("mpi", tmp=home_tmp, agent_args=("--ssh-secret-dir", str(secret), "--ssh-port", "2222"))
    pods = job.first_pods()
    launcher = pods[0]
    record = home_tmp / "ranks"

    def serve_ssh(pod):
        (pod.dir / "bin").mkdir()
        wrapper = pod.dir / "bin" / "ssh"  # as an image links ~/.ssh/config to the agent's ssh_config
        wrapper.write_text(f'#!/bin/sh\nexec {SSH} -F {pod.out / "ssh" / "ssh_config"} "$@"\n')
        wrapper.chmod(0o755)
        pod.procs.append(pod.exec([SSHD, "-D", "-e", "-f", str(pod.out / "ssh" / "sshd_config")], venv,
                                  log="sshd.log"))
        log = pod.dir / "sshd.log"  # mpirun's ssh to this pod finds its sshd listening, as a pod's readiness says
        wait_for(lambda: "Server listening on 0.0.0.0" in log.read_text(errors="replace"), f"{pod.name}'s sshd", 10,
                 dump=job.logs)
        pod.sidecar("--trainer-pid-file", str(pod.out / "trainer.pid"))

    def ranks(world):
        lines = [dict(w.split("=", 1) for w in line.split()) for line in record.read_text().splitlines()] \
            if record.exists() else []
        return sorted((int(r["rank"]), r["host"], r["ip"], r["sum"]) for r in lines if r["world"] == str(world))

    def expected(world):
        return [(k, f"{JOB}-worker-{k}", f"10.99.0.{k + 1}", str(world * (world + 1) // 2)) for k in range(world)]

    for pod in pods:
        serve_ssh(pod)
    launcher.launch(["mpirun", "--allow-run-as-root", venv.python, str(HERE / "worker_mpi.py"),
                     str(record)], venv, frameworks="mpi")
    wait_for(lambda: ranks(2) == expected(2), "one rank on each of the 2 pods", 120, dump=job.logs)
    pid = launcher.trainer.pid
    _, seconds = grow(job, serve_ssh, lambda: ranks(3) == expected(3), timeout=180)
    assert launcher.trainer.pid == pid and launcher.trainer.poll() is None
    env = (launcher.out / "mpi.env").read_text()
    assert f"export PRTE_MCA_prte_default_hostfile='{launcher.out / 'hostfile'}'" in env
    assert (launcher.out / "hostfile").read_text() == "".join(f"10.99.0.{k} slots=1\n" for k in (1, 2, 3))
    report(framework="mpi", what="2->3", seconds=round(seconds, 2))
    report(framework="mpi", what="test", seconds=round(time.monotonic() - started, 1))
