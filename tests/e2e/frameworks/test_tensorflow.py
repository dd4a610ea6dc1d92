"""TensorFlow from TF_CONFIG alone, 2 -> 3 pods, each its own address: TF reads TF_CONFIG once, when the
strategy is built, so the launcher starts it again with the new files when the third pod joins."""

from __future__ import annotations

import json

import pytest

from tests.e2e.frameworks.cluster import HERE, restarted_at_size_three, venv_fixture

pytestmark = [pytest.mark.consumer, pytest.mark.frameworks]
venv = venv_fixture("tensorflow")


def test_tensorflow_all_reduces_across_every_pod_and_starts_again_at_size_three(make_job, venv):
    job = make_job("tf")
    restarted_at_size_three(job, venv, lambda pod: [venv.python, str(HERE / "worker_tf.py"), str(pod.record)],
                            framework="tensorflow")
    for pod in job.pods:
        config = json.loads((pod.out / "tf_config.json").read_text())
        assert config == {"cluster": {"worker": ["10.99.0.1:2222", "10.99.0.2:2222", "10.99.0.3:2222"]},
                          "task": {"type": "worker", "index": pod.index}}
        assert pod.last() == {"world": "3", "rank": str(pod.index), "sum": "6"}
    assert {line for pod in job.pods[:2] for line in pod.lines()} >= {
        "world=2 rank=0 sum=3", "world=2 rank=1 sum=3"}
