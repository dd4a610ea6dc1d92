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


# --- training-operator v1.9's other kinds, Trainer v2's jax and xgboost plugins, Volcano's tensorflow plugin ------

TO_JAX = "kubeflow/training-operator v1.9.4 pkg/controller.v1/jax/envvar_test.go TestSetPodEnv"


def test_jaxjob_rows_match_its_envvar_test():
    # "successful environment variable setup": one worker, container port jaxjob-port 6666, index "0".
    got = injected_env("jaxjob", "v1.9.0", set(), {"port": 6666, "job": "test-jaxjob", "replicas": 1, "index": 0})
    assert got == [{"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "COORDINATOR_PORT", "value": "6666"},
                   {"name": "COORDINATOR_ADDRESS", "value": "test-jaxjob-worker-0"},
                   {"name": "NUM_PROCESSES", "value": "1"}, {"name": "PROCESS_ID", "value": "0"}], TO_JAX


TO_TF = "kubeflow/training-operator v1.9.4 pkg/controller.v1/tensorflow/pod_test.go \"Test ClusterSpec\""
NAME = "test-tfjob"  # tftestutil.TestTFJobName
TF_CASES = [
    # (workers, ps, evaluators, namespace, CUSTOM_CLUSTER_DOMAIN, the TF_CONFIG of worker 0; "" for none)
    (1, 0, 0, "ns0", "", ""),
    (1, 0, 0, "ns1", "tf.training.com", ""),
    (1, 1, 0, "ns2", "tf.training.org",
     '{"cluster":{"ps":["' + NAME + '-ps-0.ns2.svc.tf.training.org:2222"],"worker":["' + NAME
     + '-worker-0.ns2.svc.tf.training.org:2222"]},"task":{"type":"worker","index":0},"environment":"cloud"}'),
    (1, 1, 1, "ns3", "tf.training.io",
     '{"cluster":{"evaluator":["' + NAME + '-evaluator-0.ns3.svc.tf.training.io:2222"],"ps":["' + NAME
     + '-ps-0.ns3.svc.tf.training.io:2222"],"worker":["' + NAME + '-worker-0.ns3.svc.tf.training.io:2222"]},'
     '"task":{"type":"worker","index":0},"environment":"cloud"}'),
    (1, 1, 1, "ns3", "",
     '{"cluster":{"evaluator":["' + NAME + '-evaluator-0.ns3.svc:2222"],"ps":["' + NAME + '-ps-0.ns3.svc:2222"],'
     '"worker":["' + NAME + '-worker-0.ns3.svc:2222"]},"task":{"type":"worker","index":0},"environment":"cloud"}'),
]


@pytest.mark.parametrize(("workers", "ps", "evaluators", "namespace", "domain", "expected"), TF_CASES,
                         ids=[f"{c[3]}-{c[4] or 'no domain'}-{c[0]}w{c[1]}ps{c[2]}ev" for c in TF_CASES])
def test_the_tfjob_fixture_writes_what_tfjobs_test_expects(workers, ps, evaluators, namespace, domain, expected):
    from agent import examples

    specs = tuple((t, n) for t, n in (("worker", workers), ("ps", ps), ("evaluator", evaluators)) if n)
    pods = examples.tfjob(NAME, specs, namespace=namespace, domain=domain)
    env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env.get("TF_CONFIG", "") == expected, TO_TF


VOLCANO_TF = ("volcano-sh/volcano v1.15.0 pkg/controllers/job/plugins/distributed-framework/tensorflow/"
              "tensorflow_test.go TestTensorflow")
VOLCANO_TF_CLUSTER = ('{"cluster":{"ps":["train-123-ps-0.train-123:5000","train-123-ps-1.train-123:5000"],"worker":'
                      '["train-123-worker-0.train-123:5000","train-123-worker-1.train-123:5000"],"chief":'
                      '["train-123-chief-0.train-123:5000"]},')
VOLCANO_TF_CASES = [("ps case", "ps"), ("worker case", "worker"), ("chief case", "chief")]


@pytest.mark.parametrize(("case", "task"), VOLCANO_TF_CASES, ids=[c[0] for c in VOLCANO_TF_CASES])
def test_the_volcano_tensorflow_fixture_writes_what_volcanos_test_expects(case, task):
    from agent import examples

    pods = examples.volcano_job("train-123", tasks=(("ps", 2), ("worker", 2), ("chief", 1)), plugins=("tensorflow",),
                                tf_port=5000)
    pod = next(p for p in pods if p["metadata"]["name"] == f"train-123-{task}-0")
    assert pod["spec"]["containers"][0]["env"] == [
        {"name": "TF_CONFIG", "value": VOLCANO_TF_CLUSTER + f'"task":{{"type":"{task}","index":0}}}}'}], \
        f"{VOLCANO_TF}: {case}"


TRAINER_JAX = "kubeflow/trainer v2.3.0 pkg/runtime/framework/plugins/jax/jax_test.go TestJAXEnforceMLPolicy"
TRAINER_JAX_CASES = [("single node JAX training", "test-job", 1), ("multi-node JAX training", "multi-node-job", 4),
                     ("trainJob numNodes is respected", "trainJob", 3)]


@pytest.mark.parametrize(("case", "name", "nodes"), TRAINER_JAX_CASES, ids=[c[0] for c in TRAINER_JAX_CASES])
def test_trainer_jax_rows_match_trainers_test(case, name, nodes):
    got = injected_env("trainjob", "v2.3.0", {"mlPolicy jax"}, {"nnodes": nodes, "trainjob": name, "plugins": ("jax",)})
    assert got == [
        {"name": "JAX_NUM_PROCESSES", "value": str(nodes)},
        {"name": "JAX_PROCESS_ID", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
        {"name": "JAX_COORDINATOR_ADDRESS", "value": f"{name}-node-0-0.{name}:29500"},
    ], f"{TRAINER_JAX}: {case}"


TRAINER_XGB = "kubeflow/trainer v2.3.0 pkg/runtime/framework/plugins/xgboost/xgboost_test.go TestXGBoostEnforceMLPolicy"
TRAINER_XGB_CASES = [
    # (case, TrainJob name, numNodes, GPUs per node from the resolved resources, DMLC_NUM_WORKER)
    ("single node XGBoost training (CPU)", "test-job", 1, 0, 1),
    ("multi-node XGBoost training (CPU)", "multi-node-job", 4, 0, 4),
    ("XGBoost training with GPU resources", "gpu-job", 2, 4, 8),
    ("trainJob numNodes is respected", "trainJob", 3, 0, 3),
    ("resources not set - defaults to 1 worker per node", "no-res-job", 2, 0, 2),
    ("resources set in Runtime only", "runtime-res-job", 3, 2, 6),
    ("resources set in TrainJob only", "trainjob-res", 2, 4, 8),
    ("resources set in both Runtime and TrainJob", "both-res-job", 2, 3, 6),
]


@pytest.mark.parametrize(("case", "name", "nodes", "gpus", "workers"), TRAINER_XGB_CASES,
                         ids=[c[0] for c in TRAINER_XGB_CASES])
def test_trainer_xgboost_rows_match_trainers_test(case, name, nodes, gpus, workers):
    got = injected_env("trainjob", "v2.3.0", {"mlPolicy xgboost"},
                       {"trainjob": name, "workers": nodes * max(gpus, 1), "plugins": ("xgboost",)})
    assert got == [
        {"name": "DMLC_TRACKER_URI", "value": f"{name}-node-0-0.{name}"},
        {"name": "DMLC_TRACKER_PORT", "value": "29500"},
        {"name": "DMLC_TASK_ID", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
        {"name": "DMLC_NUM_WORKER", "value": str(workers)},
    ], f"{TRAINER_XGB}: {case}"
