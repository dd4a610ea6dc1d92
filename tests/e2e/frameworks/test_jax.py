"""JAX from jax.env alone, 2 -> 3 pods, each its own address: jax cannot initialize again in a process, so the
launcher (``python -m agent.trainer run``) starts it again with the new files when the third pod joins."""

from __future__ import annotations

import pytest

from tests.e2e.frameworks.cluster import HERE, restarted_at_size_three, venv_fixture

pytestmark = [pytest.mark.consumer, pytest.mark.frameworks]
venv = venv_fixture("jax")


def test_jax_sums_across_every_pod_and_starts_again_at_size_three(make_job, venv):
    job = make_job("jax")
    restarted_at_size_three(job, venv, lambda pod: [venv.python, str(HERE / "worker_jax.py"), str(pod.record)],
                            framework="jax")
    for pod in job.pods:
        env = (pod.out / "jax.env").read_text()
        assert "export JAX_COORDINATOR_ADDRESS='10.99.0.1:55527'" in env and "JAX_NUM_PROCESSES='3'" in env
        assert pod.last() == {"world": "3", "rank": str(pod.index), "sum": "6"}  # 1 + 2 + 3, on every process
    assert {line for pod in job.pods[:2] for line in pod.lines()} >= {
        "world=2 rank=0 sum=3", "world=2 rank=1 sum=3"}
