"""``topology-agent status`` as a user runs it, against a running job over real HTTPS: real init processes, a
real sidecar that writes a new generation when a pod joins; the command's table, its JSON, and ``-w`` printing
the change. The reading and the rows are tested in process: tests/runtime/test_status.py, tests/core."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

from tests.integration.conftest import finish, start_init
from tests.jobs import add_worker, create_volcano_job


def status(sandbox, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "TOPOLOGY_"))}
    return subprocess.Popen([sys.executable, "-m", "agent.cli", "status", "demo", "--kubeconfig",
                             str(sandbox.sandbox.kubeconfig), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def lines_of(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    """The process's stdout, line by line, as it comes."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        while line := proc.stdout.readline():  # ends at EOF, once the process is gone
            lines.put(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    proc.reader = reader  # type: ignore[attr-defined]  # joined before the pipes are closed
    return lines


def until(lines: queue.Queue[str], test, *, timeout: float = 30.0) -> list[str]:
    """The lines read until those read pass ``test``."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        seen.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
        if test(seen):
            return seen


def test_status_of_a_running_job_as_a_table_as_json_and_following_a_change(sandbox, tmp_path):
    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 2)))
    names = [p["metadata"]["name"] for p in pods]
    inits = [start_init(sandbox, name, tmp_path / name, "--address", "ip") for name in names]
    for proc in inits:
        code, err = finish(proc)
        assert code == 0, err
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": "demo-worker-0", "POD_NAMESPACE": "default"}
    env.pop("KUBECONFIG", None)
    sidecar = subprocess.Popen([sys.executable, "-m", "agent.cli", "sidecar", "--out", str(tmp_path / "demo-worker-0"),
                                "--address", "ip", "--debounce", "0"], env=env, stderr=subprocess.DEVNULL)
    watching = None
    try:
        proc = status(sandbox, "-o", "json")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        doc = json.loads(out)
        print(out)  # the report quotes it
        assert (doc["kind"], doc["job"], doc["trainingPods"], doc["worldSize"]) == ("JobStatus", "demo", 3, 3)
        assert [(m["name"], m["role"], m["rank"], m["nodeRank"], m["generation"]) for m in doc["members"]] == [
            ("demo-master-0", "master", 0, 0, 1), ("demo-worker-0", "worker", 1, 1, 1),
            ("demo-worker-1", "worker", 2, 2, 1)]
        proc = status(sandbox)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        print(out)
        assert out.splitlines()[0] == "Volcano Job 'demo' in namespace default: 3 of 3 training pods placed, " \
                                      "world size 3"
        watching = status(sandbox, "-w")
        lines = lines_of(watching)
        until(lines, lambda seen: seen[-1].startswith("demo-worker-1"))
        add_worker(sandbox, 2, 12)  # a pod joins: the sidecar of demo-worker-0 writes generation 2
        printed = until(lines, lambda seen: any(line.startswith("demo-worker-2   worker   3      3") for line in seen)
                        and any(line.startswith("demo-worker-0") and line.split()[6] == "2" for line in seen))
        print("\n".join(printed))  # the new pod, and the generation demo-worker-0's sidecar wrote for it
    finally:
        for running in (sidecar, watching):
            if running is not None:
                running.kill()
                if hasattr(running, "reader"):
                    running.reader.join(30)
                running.communicate(timeout=30)  # its pipes read to the end and closed
