"""Ray from ray.env alone, 2 -> 3 pods, each its own address: the head pod starts the GCS, the others join
RAY_ADDRESS, and a third pod's node joins the running cluster by itself; the launcher (``--frameworks ray``) sees
that ray.env did not change and restarts nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.frameworks.cluster import HERE, grow, report, venv_fixture, wait_for

pytestmark = [pytest.mark.consumer, pytest.mark.frameworks]
venv = venv_fixture("ray")


def test_the_ray_cluster_grows_by_itself_when_a_third_pod_joins(make_job, venv):
    started = time.monotonic()
    Path("/tmp/ray").mkdir(exist_ok=True)  # each pod mounts its own over it, as each pod has its own /tmp
    job = make_job("ray")
    pods = job.first_pods()
    head = pods[0]

    def driver(expected: int) -> None:
        proc = head.exec([venv.python, "-m", "agent.trainer", "run", "--out", str(head.out), "--frameworks", "ray",
                          "--pid-file", "none", "--", venv.python, str(HERE / "worker_ray_driver.py"),
                          str(expected), str(head.record)], venv, log=f"driver-{expected}.log",
                         binds=(f"{head.dir / 'ray'}:/tmp/ray",))
        head.procs.append(proc)

    def start(pod):
        pod.sidecar("--trainer-pid-file", str(pod.out / "trainer.pid"))
        (pod.dir / "ray").mkdir()
        pod.launch([venv.python, str(HERE / "worker_ray.py")], venv, frameworks="ray",
                   binds=(f"{pod.dir / 'ray'}:/tmp/ray",))
        if pod.index == 2:
            driver(3)

    for pod in pods:
        start(pod)
    driver(2)
    wait_for(lambda: head.worlds() == [2], "a Ray cluster of 2 nodes", 240, dump=job.logs)
    nodes = [p.trainer.pid for p in pods]
    third, seconds = grow(job, start, lambda: head.worlds() == [2, 3])
    assert head.lines() == ["world=2 nodes=10.99.0.1,10.99.0.2 sum=3",
                            "world=3 nodes=10.99.0.1,10.99.0.2,10.99.0.3 sum=6"]
    for pod, pid in zip(pods, nodes, strict=True):  # the first two nodes ran on, never restarted
        assert pod.trainer.pid == pid and pod.trainer.poll() is None
        log = (pod.dir / "trainer.log").read_text()
        assert log.count("agent.trainer: generation") == 2 and "files are unchanged; not restarted" in log, log
    for pod in job.pods:
        assert (pod.out / "ray.env").read_text().count("RAY_ADDRESS") == 1
    assert "export RAY_ADDRESS='127.0.0.1:6379'" in (head.out / "ray.env").read_text()
    assert "export RAY_ADDRESS='10.99.0.1:6379'" in (third.out / "ray.env").read_text()
    report(framework="ray", what="2->3", seconds=round(seconds, 2))
    report(framework="ray", what="test", seconds=round(time.monotonic() - started, 1))
