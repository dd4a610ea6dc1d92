"""The table of what controllers write (agent.core.injected), checked against cases from the controllers' own
unit tests: each case names the test file, release and case; inputs and expected entries are transcribed."""

from __future__ import annotations

import pytest

from agent.core.injected import injected_env

VOLCANO_PT = "volcano-sh/volcano v1.15.0 pkg/controllers/job/plugins/distributed-framework/pytorch/pytorch_test.go"
VOLCANO_CASES = [
    ("test pod without master", {"worker": 1}, "worker", 0, []),
    # (case, tasks in job order with replicas, pod's task, pod index, expected env the plugin appends)
    ("test master pod without port", {"master": 1, "worker": 1}, "master", 0,
     [("MASTER_ADDR", "test-pytorch-master-0.test-pytorch"), ("MASTER_PORT", "23456"), ("WORLD_SIZE", "2"),
      ("RANK", "0")]),
    ("test master pod env", {"master": 1, "worker": 2, "extra": 2}, "master", 0,
     [("MASTER_ADDR", "test-pytorch-master-0.test-pytorch"), ("MASTER_PORT", "23456"), ("WORLD_SIZE", "3"),
      ("RANK", "0")]),
    ("test worker-1 pod env", {"master": 1, "worker": 2, "extra": 2}, "worker", 0,
     [("MASTER_ADDR", "test-pytorch-master-0.test-pytorch"), ("MASTER_PORT", "23456"), ("WORLD_SIZE", "3"),
      ("RANK", "1")]),
]


@pytest.mark.parametrize(("case", "tasks", "task", "index", "expected"), VOLCANO_CASES,
                         ids=[c[0] for c in VOLCANO_CASES])
def test_volcano_pytorch_plugin_rows_match_volcanos_test(case, tasks, task, index, expected):
    world = sum(n for t, n in tasks.items() if t in ("master", "worker"))
    features = {"plugin pytorch"} | ({"training task"} if task in ("master", "worker") else set())
    facts = {"plugin_order": ("pytorch",), "tasks": list(tasks), "job": "test-pytorch", "index": index, "port": 23456,
             "replicas": world, "rank": index + 1 if task == "worker" else 0}
    got = [(e["name"], e["value"]) for e in injected_env("volcano", "v1.15.0", features, facts)]
    assert got == expected, f"{VOLCANO_PT}: {case}"


TO_ELASTIC = "kubeflow/training-operator v1.9.0 pkg/controller.v1/pytorch/elastic_test.go"


def test_training_operator_elastic_rows_match_its_elastic_generator_test():
    # The case with every elastic field set: min 1, max 3, c10d, host localhost, port 1234, id rdzv-id, two conf
    # entries, maxRestarts 3. Its test compares with ConsistOf (any order).
    expected = {("PET_MAX_RESTARTS", "3"), ("PET_RDZV_BACKEND", "c10d"), ("PET_RDZV_ENDPOINT", "localhost:1234"),
                ("PET_RDZV_ID", "rdzv-id"), ("PET_NNODES", "1:3"),
                ("PET_RDZV_CONF", "rdzv-conf-name=rdzv-conf-value,rdzv-conf-name-1=rdzv-conf-value-1")}
    facts = {"rdzv_host": "localhost", "rdzv_port": 1234, "min": 1, "max": 3, "max_restarts": 3,
             "rdzv_id": "rdzv-id", "rdzv_conf": "rdzv-conf-name=rdzv-conf-value,rdzv-conf-name-1=rdzv-conf-value-1",
             "replicas": 1}
    features = {"elastic", "elastic.maxRestarts", "elastic.rdzvId", "elastic.rdzvConf"}
    got = {(e["name"], e["value"]) for e in injected_env("pytorchjob", "v1.9.0", features, facts)
           if e["name"].startswith("PET_")}
    assert got == expected, TO_ELASTIC


LWS_TEST = "kubernetes-sigs/lws v0.10.0 pkg/utils/pod/pod_utils_test.go TestAddLWSVariables"
LWS_CASES = [
    ("Leader pod", "test-sample", 0, 0, "default", 3, "test-sample-0.test-sample.default"),
    ("Worker pod", "test-sample", 0, 1, "default", 3, "test-sample-0.test-sample.default"),
    ("Worker pod, group 1", "test-sample", 1, 3, "default", 2, "test-sample-1.test-sample.default"),
    ("Worker pod, group 1, non-default namespace", "test-sample", 1, 3, "lws", 2, "test-sample-1.test-sample.lws"),
]


@pytest.mark.parametrize(("case", "lws", "group", "worker", "namespace", "size", "leader"), LWS_CASES,
                         ids=[c[0] for c in LWS_CASES])
def test_lws_rows_match_lws_test(case, lws, group, worker, namespace, size, leader):
    facts = {"lws": lws, "group": group, "subdomain": lws, "namespace": namespace, "size": size, "worker": worker}
    got = [(e["name"], e["value"]) for e in injected_env("lws", "v0.10.0", set(), facts)]
    assert got == [("LWS_LEADER_ADDRESS", leader), ("LWS_GROUP_SIZE", str(size)),
                   ("LWS_WORKER_INDEX", str(worker))], f"{LWS_TEST}: {case}"


TRAINER_TORCH = ("kubeflow/trainer v2.3.0 pkg/runtime/framework/plugins/torch/torch_test.go "
                 "\"trainJob numNodes is respected rather than mlPolicy one\"")


def test_trainer_torch_rows_match_trainers_test():
    got = injected_env("trainjob", "v2.3.0", set(), {"nnodes": 2, "nproc": "1", "trainjob": "trainJob"})
    assert got == [
        {"name": "PET_NNODES", "value": "2"},
        {"name": "PET_NPROC_PER_NODE", "value": "1"},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
        {"name": "PET_MASTER_ADDR", "value": "trainJob-node-0-0.trainJob"},
        {"name": "PET_MASTER_PORT", "value": "29500"},  # constants.ContainerTrainerPort
    ], TRAINER_TORCH
