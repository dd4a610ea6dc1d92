"""Volcano's pytorch and mpi plugins, read as Volcano reads them: each plugin's ``addFlags`` parses its arguments
with Go's flag package (volcano-sh/volcano ed72c7c81, pkg/controllers/job/plugins/distributed-framework/pytorch/
pytorch.go and mpi/mpi.go), and the flags name the tasks that play each role. The pytorch plugin's master and
worker tasks train, in that order, on its ``--port``; the mpi plugin's master runs mpiexec over the worker task's
hosts (its MPI_HOST), so it is MPI's launcher: it holds the workers' hostfile and ``mpi.env``, and no rank."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest
import yaml

from agent import examples
from agent.cli import main
from agent.core import Options, render_pod
from agent.core.files.explaining import format_explanation
from tests.core.test_framework_fidelity import _vcjob, read

PYTORCH = "volcano-sh/volcano pkg/controllers/job/plugins/distributed-framework/pytorch/pytorch.go addFlags"
DEFAULT = "the pytorch plugin's default 23456 (Job 'pt')"


def _pods(job: str, tasks: tuple[tuple[str, int], ...], *, port: int = 23456,
          port_name: str = "pytorchjob-port") -> list[dict[str, Any]]:
    """A Volcano job's pods; ``port_name``: the name of the trainer's port. The pytorch plugin adds
    ``pytorchjob-port`` only where no port of its number is declared, so a template that declares the port under
    a name of its own keeps that name, and MASTER_PORT is the plugin's ``--port`` whatever the pod declares."""
    pods = examples.volcano_job(job, tasks=tasks, plugins=("svc", "env"), master_port=port)
    for pod in pods:
        for container in pod["spec"]["containers"]:
            for entry in container.get("ports", []):
                entry["name"] = port_name
    return pods


def _torch_env(pods: list[dict[str, Any]], me: str, options: Options) -> dict[str, str]:
    text = render_pod(pods, me, options).files["torch.env"].decode()
    return {k: v.strip("'") for line in text.splitlines() if line.startswith("export ")
            for k, _, v in [line[len("export "):].partition("=")]}


# (id, tasks, the plugin's arguments, the training roles in rank order, MASTER_PORT, its source)
PYTORCH_FLAGS = [
    ("defaults", (("master", 1), ("worker", 2)), [], ("master", "worker"), 23456, DEFAULT),
    ("--master=x", (("lead", 1), ("worker", 2)), ["--master=lead"], ("lead", "worker"), 23456, DEFAULT),
    ("-master x -worker y -port n", (("lead", 1), ("node", 2)),
     ["-master", "lead", "-worker", "node", "-port", "30000"], ("lead", "node"), 30000,
     "--port 30000 of the pytorch plugin of Job 'pt'"),
    ("an unknown flag stops parsing", (("lead", 1), ("node", 2)),
     ["--master=lead", "--nproc=2", "--worker=node", "--port=30000"], ("lead",), 23456, DEFAULT),
    ("a bool flag takes no value", (("lead", 1), ("worker", 2)), ["--wait-master-enabled", "--port=30000",
                                                                  "--master=lead"],
     ("lead", "worker"), 30000, "--port 30000 of the pytorch plugin of Job 'pt'"),
    ("a bool flag with =false", (("master", 1), ("worker", 2)), ["-wait-master-enabled=false", "--port", "30000"],
     ("master", "worker"), 30000, "--port 30000 of the pytorch plugin of Job 'pt'"),
    ("a bool value Go refuses stops parsing", (("master", 1), ("worker", 2)),
     ["--wait-master-enabled=yes", "--port=30000"], ("master", "worker"), 23456, DEFAULT),
    ("Go's int syntax: hex", (("master", 1), ("worker", 2)), ["--port=0x7530"], ("master", "worker"), 30000,
     "--port 30000 of the pytorch plugin of Job 'pt'"),
    ("Go's int syntax: a leading 0 is octal", (("master", 1), ("worker", 2)), ["--port=070000"],
     ("master", "worker"), 28672, "--port 28672 of the pytorch plugin of Job 'pt'"),
    ("Go's int syntax: underscores between digits", (("master", 1), ("worker", 2)), ["--port=30_000"],
     ("master", "worker"), 30000, "--port 30000 of the pytorch plugin of Job 'pt'"),
    ("an int Go refuses stops parsing", (("lead", 1), ("worker", 2)), ["--port=30k", "--master=lead"],
     ("worker",), 23456, DEFAULT),
    ("-- ends the flags", (("lead", 1), ("worker", 2)), ["--", "--master=lead"], ("worker",), 23456, DEFAULT),
    ("a word that is no flag ends them", (("lead", 1), ("worker", 2)), ["train.py", "--master=lead"], ("worker",),
     23456, DEFAULT),
    ("three dashes are bad syntax", (("lead", 1), ("worker", 2)), ["---master=lead"], ("worker",), 23456, DEFAULT),
    ("a flag without its value ends them", (("lead", 1), ("worker", 2)), ["--master"], ("worker",), 23456,
     DEFAULT),
]


@pytest.mark.parametrize(("tasks", "args", "roles", "port", "source"), [c[1:] for c in PYTORCH_FLAGS],
                         ids=[c[0] for c in PYTORCH_FLAGS])
def test_the_pytorch_plugins_flags_name_the_training_tasks_and_master_port(tasks, args, roles, port, source):
    """The trainer's port is declared under a name of its own (so the plugin added no ``pytorchjob-port``):
    MASTER_PORT is the plugin's ``--port`` (its default where Go's parser stopped before it), as Volcano writes it
    into every container, and the master task is rank 0."""
    pods = _pods("pt", tasks, port=port, port_name="dist")
    view = read(pods[0], [_vcjob("pt", tasks, {"pytorch": args, "svc": []})], Options())
    assert view.options.roles == roles, PYTORCH
    first = f"pt-{roles[0]}-0"
    env = _torch_env(pods, first, view.options)
    assert env["MASTER_PORT"] == str(port)
    assert env["MASTER_ADDR"] == f"{first}.pt" and env["NODE_RANK"] == "0"
    assert env["NNODES"] == str(sum(n for t, n in tasks if t in roles))
    explained = format_explanation(render_pod(pods, first, view.options))
    assert f"MASTER_PORT={port}" in explained and source in explained


def test_the_pytorch_plugins_worker_follows_its_master_whatever_the_job_orders():
    """Volcano's rule: the master is RANK 0, a worker its index + 1, whichever task the job lists first."""
    tasks = (("node", 2), ("lead", 1))
    pods = _pods("pt", tasks)
    view = read(pods[0], [_vcjob("pt", tasks, {"pytorch": ["--master=lead", "--worker=node"]})], Options())
    ranks = {p["metadata"]["name"]: _torch_env(pods, p["metadata"]["name"], view.options)["NODE_RANK"]
             for p in pods}
    assert ranks == {"pt-lead-0": "0", "pt-node-0": "1", "pt-node-1": "2"}


# --- mpi: the master launches, the workers are the ranks --------------------------------------------------------

MPI = "volcano-sh/volcano pkg/controllers/job/plugins/distributed-framework/mpi/mpi.go addFlags, OnPodCreate"
MPI_CASES = [
    # (id, tasks, the plugin's arguments, the launcher task, the worker task)
    ("the issue's job", (("mpimaster", 1), ("mpiworker", 2)), ["--master=mpimaster", "--worker=mpiworker"],
     "mpimaster", "mpiworker"),
    ("defaults", (("master", 1), ("worker", 2)), [], "master", "worker"),
    ("-master x -worker y, the sshd port ignored", (("launch", 1), ("rank", 3)),
     ["-master", "launch", "-worker", "rank", "-port", "2022"], "launch", "rank"),
    ("an unknown flag stops parsing", (("master", 1), ("worker", 2)), ["--np=2", "--master=launch"], "master",
     "worker"),
]


@pytest.mark.parametrize(("tasks", "args", "launcher", "worker"), [c[1:] for c in MPI_CASES],
                         ids=[c[0] for c in MPI_CASES])
def test_the_mpi_plugins_master_is_the_launcher_of_the_workers_hostfile(tasks, args, launcher, worker):
    job = "mj"
    pods = _pods(job, tasks)
    objects = [_vcjob(job, tasks, {"mpi": args, "ssh": [], "svc": []})]
    workers = dict(tasks)[worker]
    hostfile = "".join(f"{job}-{worker}-{i}.{job} slots=1\n" for i in range(workers))
    for pod in pods:
        me = pod["metadata"]["name"]
        view = read(pod, objects, Options())
        assert view.options.roles == (worker,), MPI
        rendered = render_pod(pods, me, view.options, files_dir="/shared")
        assert rendered.files["hostfile"].decode() == hostfile, me
        env = _torch_env(pods, me, view.options)
        if me.startswith(f"{job}-{launcher}-"):
            mpi = rendered.files["mpi.env"].decode()
            assert "export OMPI_MCA_orte_default_hostfile='/shared/hostfile'" in mpi
            assert "export PRTE_MCA_prte_default_hostfile='/shared/hostfile'" in mpi
            assert rendered.files["hydra_hostfile"].decode() == hostfile.replace(" slots=", ":")
            assert "NODE_RANK" not in env and "RANK" not in env  # the launcher runs no rank
        else:
            assert "mpi.env" not in rendered.files
            assert env["NODE_RANK"] == me.rsplit("-", 1)[1] and env["NNODES"] == str(workers)


def test_explain_says_the_mpi_plugins_master_gets_mpi_env_and_why():
    tasks = (("mpimaster", 1), ("mpiworker", 2))
    pods = _pods("mj", tasks)
    view = read(pods[0], [_vcjob("mj", tasks, {"mpi": ["--master=mpimaster", "--worker=mpiworker"]})], Options())
    assert view.notes == ("Volcano mpi plugin: training roles mpiworker",)
    launcher = format_explanation(render_pod(pods, "mj-mpimaster-0", view.options))
    assert "OMPI_MCA_orte_default_hostfile=hostfile" in launcher and "Job 'mj'" in launcher
    worker = format_explanation(render_pod(pods, "mj-mpiworker-0", view.options))
    assert "role 'mpiworker' is not the launcher" in worker


# --- inject: a Volcano job with no training task --------------------------------------------------------------

def _vcjob_manifest(tasks: tuple[str, ...], plugins: dict[str, list[str]],
                    annotations: dict[str, str] | None = None) -> str:
    doc = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
           "metadata": {"name": "lm-mpi-job", **({"annotations": annotations} if annotations else {})},
           "spec": {"minAvailable": 3, "plugins": plugins,
                    "tasks": [{"name": t, "replicas": 1 if i == 0 else 2, "template": {"spec": {"containers": [
                        {"name": t, "image": "volcanosh/example-mpi:0.0.3"}]}}} for i, t in enumerate(tasks)]}}
    return yaml.safe_dump(doc)


NAMED = {"mpi": ["--master=mpimaster", "--worker=mpiworker"], "ssh": [], "svc": []}
ROLES = {"topology-agent.io/roles": "mpiworker"}
INJECT_REFUSED = [
    # (id, plugins, roles setting, what the line says, the job fixed: plugins, annotations)
    ("the mpi plugin without its flags", {"mpi": [], "ssh": [], "svc": []}, None,
     "the training roles are the mpi plugin's worker (its --worker), else master, worker", NAMED, None),
    ("no plugin that names a task", {"ssh": [], "svc": []}, None,
     "the training roles are master, worker (the pytorch plugin's defaults)", {"ssh": [], "svc": []}, ROLES),
    ("roles given that are no task", NAMED, "worker", "is a training role given (worker)", NAMED, ROLES),
]


@pytest.mark.parametrize(("plugins", "roles", "says", "fixed", "annotations"), [c[1:] for c in INJECT_REFUSED],
                         ids=[c[0] for c in INJECT_REFUSED])
def test_inject_refuses_a_volcano_job_whose_tasks_none_trains_in_one_line(plugins, roles, says, fixed,
                                                                           annotations, capsys, monkeypatch):
    """Such a job would run with an empty hostfile and no rank: inject says so, names the tasks and the setting
    that fixes it, exits 2 and writes nothing; the job with its tasks named (the plugin's flags or the roles
    setting) gets the agent."""
    text = _vcjob_manifest(("mpimaster", "mpiworker"), plugins,
                           {"topology-agent.io/roles": roles} if roles else None)
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    assert main(["inject"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("topology-agent inject: error: Job lm-mpi-job: none of its tasks (mpimaster, "
                               "mpiworker)")
    assert says in lines[0] and "topology-agent.io/roles" in lines[0] and "--roles" in lines[0]

    monkeypatch.setattr(sys, "stdin", io.StringIO(_vcjob_manifest(("mpimaster", "mpiworker"), fixed, annotations)))
    assert main(["inject"]) == 0
    captured = capsys.readouterr()
    assert "added the agent to 2 pod template(s)" in captured.err
    assert len([d for d in yaml.safe_load_all(captured.out) if d]) == 1
