"""XGBoost and LightGBM from the agent's files alone, 2 -> 3 pods, each pod its own address.

XGBoost keeps its process: ``agent.trainer.xgboost.Group`` forms the collective from ``xgboost.json`` (rank 0
starts the tracker) and forms it again at a round boundary when the third pod joins, the model carried over.
LightGBM's ``num_machines`` is fixed for a ``train()``: the launcher starts it again with the new files.
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from tests.e2e.frameworks.cluster import HERE, grow, report, restarted_at_size_three, venv_fixture, wait_for

pytestmark = [pytest.mark.consumer, pytest.mark.frameworks]
venv = venv_fixture("xgboost")


def test_xgboost_forms_its_group_again_in_the_same_process_when_a_third_pod_joins(make_job, venv):
    started = time.monotonic()
    job = make_job("xgboost")
    pods = job.first_pods()

    def start(pod):
        pod.sidecar("--trainer-pid-file", str(pod.out / "trainer.pid"))
        pod.start([venv.python, str(HERE / "worker_xgboost.py"), str(pod.out), str(pod.record), "3"], venv)

    for pod in pods:
        start(pod)
    wait_for(lambda: all(2 in p.worlds() for p in pods), "both pods training in a world of 2", 120, dump=job.logs)
    third, seconds = grow(job, start, lambda: all(3 in p.worlds() for p in job.pods))
    wait_for(lambda: all(p.trainer.poll() is not None for p in job.pods), "training to end", 120, dump=job.logs)
    for pod in job.pods:
        assert pod.trainer.returncode == 0, job.logs()
    models: dict[int, set[str]] = defaultdict(set)
    for pod in job.pods:
        for line in pod.lines():
            fields = dict(w.split("=", 1) for w in line.split())
            models[int(fields["rounds"])].add(fields["model"])
    assert all(len(hashes) == 1 for hashes in models.values()), models  # every rank, every round: one model
    for pod in pods:  # the first two kept their process and their model: world 2, then 3, rounds never reset
        worlds, rounds = pod.worlds(), [int(line.split()[2].split("=")[1]) for line in pod.lines()]
        assert worlds[0] == 2 and worlds[-1] == 3 and sorted(set(worlds)) == [2, 3]
        assert rounds == sorted(rounds) and len(set(rounds)) == len(rounds)
    joined = third.lines()
    assert joined and joined[0].startswith("world=3 rank=2 ") and int(joined[0].split()[2].split("=")[1]) > 1
    ports = {world: {line.split()[-1] for pod in job.pods for line in pod.lines() if line.startswith(f"world={world}")}
             for world in (2, 3)}  # the job's first membership: the controller's port; the next: another
    assert ports[2] == {"port=9999"} and len(ports[3]) == 1 and ports[3] != ports[2], ports
    report(framework="xgboost", what="2->3", seconds=round(seconds, 2))
    report(framework="xgboost", what="test", seconds=round(time.monotonic() - started, 1))


def test_lightgbm_grows_the_same_trees_on_every_pod_and_starts_again_at_size_three(make_job, venv):
    job = make_job("xgboost")
    restarted_at_size_three(job, venv, lambda pod: [venv.python, str(HERE / "worker_lightgbm.py"), str(pod.record)],
                            framework="lightgbm", launcher_frameworks="xgboost")
    models = {world: {line.split()[2] for pod in job.pods for line in pod.lines() if line.startswith(f"world={world}")}
              for world in (2, 3)}
    assert len(models[2]) == 1 and len(models[3]) == 1 and models[2] != models[3], models
    for pod in job.pods:
        assert pod.lines()[-1].startswith(f"world=3 rank={pod.index} ")
