"""PaddlePaddle from paddle.env alone, 2 -> 3 pods, each its own address: ``paddle.distributed.launch`` fixes
--nnodes with its HTTP master, so the launcher starts it again with the new files when the third pod joins; the
ranks are the agent's (PADDLE_RANK), not the order in which pods reached the master."""

from __future__ import annotations

import pytest

from tests.e2e.frameworks.cluster import HERE, restarted_at_size_three, venv_fixture

pytestmark = [pytest.mark.consumer, pytest.mark.frameworks]
venv = venv_fixture("paddle")


def test_paddle_all_reduces_across_every_pod_and_starts_again_at_size_three(make_job, venv):
    job = make_job("paddle")
    restarted_at_size_three(
        job, venv, lambda pod: [venv.python, "-m", "paddle.distributed.launch", str(HERE / "worker_paddle.py"),
                                str(pod.record)], framework="paddle")
    for pod in job.pods:
        env = (pod.out / "paddle.env").read_text()
        assert f"export PADDLE_RANK='{pod.index}'" in env and "export PADDLE_NNODES='3'" in env
        assert pod.last() == {"world": "3", "rank": str(pod.index), "sum": "6"}
    assert {line for pod in job.pods[:2] for line in pod.lines()} >= {
        "world=2 rank=0 sum=3", "world=2 rank=1 sum=3"}
