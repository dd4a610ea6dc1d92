"""One table per controller: for a pod of an example job, the variables and addresses it must get."""

from __future__ import annotations

import json

import pytest

from agent import examples
from agent.core.model import ControllerChoice, Processes
from tests.conftest import env_of, render

TRAINING_KEYS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "NODE_RANK", "NNODES", "PET_NNODES",
                 "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_MASTER_ADDR", "PET_MASTER_PORT")


def check(pods, self_name, expected, options=None):
    """``expected``: torch.env's values (None: not written); ``processes``, topology.json's count of the
    training processes (the launchers' world)."""
    rendered = render(pods, self_name, **(options or {}))
    env = env_of(rendered)
    expected = dict(expected)
    if "processes" in expected:
        assert json.loads(rendered.files["topology.json"])["processes"] == expected.pop("processes")
    for key, value in expected.items():
        if value is None:
            assert key not in env, f"{key} must not be written for {self_name}"
        else:
            assert env.get(key) == value, f"{key}: {env.get(key)!r} != {value!r}"


VOLCANO = examples.volcano_job()  # master=1, worker=3, extras=4; one CPU each
VOLCANO_CASES = [
    ("master is node rank 0", "demo-master-0",
     {"MASTER_ADDR": "demo-master-0.demo", "MASTER_PORT": "23456", "WORLD_SIZE": "4", "RANK": "0",
      "NODE_RANK": "0", "NNODES": "4", "PET_NNODES": "4", "VC_TASK_INDEX": "0"}),
    ("worker-0 follows the master", "demo-worker-0", {"RANK": "1", "NODE_RANK": "1", "WORLD_SIZE": "4"}),
    ("worker-2 is last", "demo-worker-2", {"RANK": "3", "NODE_RANK": "3", "PET_NODE_RANK": "3"}),
    ("extras get hosts but no training variables", "demo-extras-3",
     {**dict.fromkeys(TRAINING_KEYS), "VC_EXTRAS_NUM": "4", "VC_WORKER_NUM": "3", "VC_MASTER_NUM": "1",
      "VC_TASK_INDEX": "3", "TOPOLOGY_TRAINING": "0",
      "VC_WORKER_HOSTS": "demo-worker-0.demo,demo-worker-1.demo,demo-worker-2.demo"}),
]


@pytest.mark.parametrize(("self_name", "expected"), [c[1:] for c in VOLCANO_CASES], ids=[c[0] for c in VOLCANO_CASES])
def test_volcano_job(self_name, expected):
    check(VOLCANO, self_name, expected)


def test_volcano_extras_unset_the_training_variables_volcano_injected():
    rendered = render(VOLCANO, "demo-extras-0")
    unset = {v.name for v in rendered.variables if v.unset}
    assert unset == {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE"}
    text = rendered.files["torch.env"].decode()
    assert "unset WORLD_SIZE\n" in text and "export WORLD_SIZE" not in text


PYTORCHJOB = examples.pytorchjob(workers=3)  # 4 CPUs per pod
PYTORCHJOB_CASES = [
    ("master on its per-replica Service", "mnist-master-0",
     {"MASTER_ADDR": "mnist-master-0", "MASTER_PORT": "23456", "NODE_RANK": "0", "RANK": "0",
      "WORLD_SIZE": "4", "NPROC_PER_NODE": "4", "LOCAL_WORLD_SIZE": "4", "processes": 16}, {}),
    ("worker RANK is its node rank, its processes in NPROC_PER_NODE", "mnist-worker-1",
     {"NODE_RANK": "2", "RANK": "2", "WORLD_SIZE": "4", "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "4"}, {}),
    ("one process per pod with --nproc-per-node 1", "mnist-worker-2",
     {"NODE_RANK": "3", "RANK": "3", "WORLD_SIZE": "4", "processes": 4}, {"processes": Processes(per_node=1)}),
]


@pytest.mark.parametrize(("self_name", "expected", "options"), [c[1:] for c in PYTORCHJOB_CASES],
                         ids=[c[0] for c in PYTORCHJOB_CASES])
def test_pytorchjob(self_name, expected, options):
    check(PYTORCHJOB, self_name, expected, options)


TRAINJOB = examples.trainjob(num_nodes=3)  # node pods 2 CPUs; a Succeeded dataset initializer
TRAINJOB_CASES = [
    # Port: Trainer's ContainerTrainerPort, 29500 in v2.0.0-v2.3.0 (pkg/constants/constants.go), not the 29400
    # of the design proposal that this row said before.
    ("node 0 is master on Trainer's port", "llm-node-0-0-cpc5v",
     {"MASTER_ADDR": "llm-node-0-0.llm", "MASTER_PORT": "29500", "NODE_RANK": "0", "NNODES": "3"}),
    ("completion index orders nodes", "llm-node-0-2-f59jk",
     {"NODE_RANK": "2", "RANK": "2", "WORLD_SIZE": "3", "NPROC_PER_NODE": "2", "processes": 6}),
]


@pytest.mark.parametrize(("self_name", "expected"), [c[1:] for c in TRAINJOB_CASES], ids=[c[0] for c in TRAINJOB_CASES])
def test_trainjob(self_name, expected):
    check(TRAINJOB, self_name, expected)


def test_trainjob_finished_initializer_is_not_a_member():
    rendered = render(TRAINJOB, "llm-node-0-1-8mkv7")
    assert [e.reason for e in rendered.plan.topology.excluded] == ["phase Succeeded"]
    assert rendered.plan.controller.key == "trainjob"


JOBSET = examples.jobset()  # driver 1x1, workers 2x2
JOBSET_CASES = [
    ("global index first: driver is rank 0", "trainer-driver-0-0-cht55",
     {"MASTER_ADDR": "trainer-driver-0-0.trainer", "NODE_RANK": "0", "NNODES": "5"}),
    ("then job-global-index and completion index", "trainer-workers-0-1-4g2nz", {"NODE_RANK": "2"}),
    ("last job, last completion", "trainer-workers-1-1-mpjsn",
     {"NODE_RANK": "4", "RANK": "4", "WORLD_SIZE": "5", "NPROC_PER_NODE": "2", "processes": 10}),
    ("--roles workers makes the driver a non-training pod", "trainer-workers-0-0-kwhz6",
     {"NODE_RANK": "0", "NNODES": "4", "MASTER_ADDR": "trainer-workers-0-0.trainer"}),
]


@pytest.mark.parametrize(("self_name", "expected"), [c[1:] for c in JOBSET_CASES], ids=[c[0] for c in JOBSET_CASES])
def test_jobset(self_name, expected):
    options = {"roles": ("workers",)} if expected.get("NNODES") == "4" else {}
    check(JOBSET, self_name, expected, options)


def _with_coordinator(pods, endpoint):
    for pod in pods:
        for section in ("labels", "annotations"):
            pod["metadata"][section]["jobset.sigs.k8s.io/coordinator"] = endpoint
    return pods


def test_jobset_coordinator_names_rank_zero():
    # JobSet >= v0.6.0 labels every pod with spec.coordinator's endpoint,
    # <jobset>-<rjob>-<jobIndex>-<podIndex>.<subdomain> (pkg/controllers/jobset_controller.go CoordinatorEndpoint).
    pods = _with_coordinator(examples.jobset(), "trainer-workers-1-0.trainer")
    check(pods, "trainer-driver-0-0-cht55", {"MASTER_ADDR": "trainer-workers-1-0.trainer", "NODE_RANK": "1"})
    check(pods, "trainer-workers-1-0-5q6rr", {"NODE_RANK": "0", "RANK": "0", "WORLD_SIZE": "5", "processes": 10})
    check(pods, "trainer-workers-1-1-mpjsn", {"NODE_RANK": "4"})


MPIJOB = examples.mpijob(workers=3)  # launcher + 3 workers, 2 CPUs per worker
MPIJOB_CASES = [
    ("worker 0 is node rank 0", "allreduce-worker-0",
     {"MASTER_ADDR": "allreduce-worker-0.allreduce", "NODE_RANK": "0", "NNODES": "3", "WORLD_SIZE": "3",
      "NPROC_PER_NODE": "2", "processes": 6}),
    ("workers follow replica-index", "allreduce-worker-2", {"NODE_RANK": "2", "RANK": "2"}),
    ("the launcher gets hosts, no rank", "allreduce-launcher-wt6j6",
     {"NODE_RANK": None, "WORLD_SIZE": None, "VC_WORKER_HOSTS":
      "allreduce-worker-0.allreduce,allreduce-worker-1.allreduce,allreduce-worker-2.allreduce"}),
]


@pytest.mark.parametrize(("self_name", "expected"), [c[1:] for c in MPIJOB_CASES], ids=[c[0] for c in MPIJOB_CASES])
def test_mpijob(self_name, expected):
    # MPIJob pods carry training-operator's job-name label too: they are an MPIJob's, not a PyTorchJob's.
    check(MPIJOB, self_name, expected)
    assert render(MPIJOB, self_name).plan.controller.key == "mpijob"


def test_mpijob_run_launcher_as_worker_puts_the_launcher_first_in_the_hostfile():
    rendered = render(MPIJOB, "allreduce-worker-0", roles=("launcher", "worker"))
    assert rendered.files["hostfile"].decode().splitlines() == [
        "allreduce-launcher.allreduce slots=1", "allreduce-worker-0.allreduce slots=2",
        "allreduce-worker-1.allreduce slots=2", "allreduce-worker-2.allreduce slots=2"]
    assert env_of(render(MPIJOB, "allreduce-launcher-wt6j6", roles=("launcher", "worker")))["NODE_RANK"] == "0"


def test_discover_hosts_lists_only_running_training_pods_and_itself():
    # As the MPI operator's discover_hosts.sh (updateDiscoverHostsInConfigMap) lists Running pods only.
    pods = examples.mpijob(workers=4, running=2)
    script = render(pods, "allreduce-worker-3").files["discover_hosts.sh"].decode()
    listed = [line for line in script.splitlines() if line.startswith("allreduce-")]
    assert listed == ["allreduce-worker-0.allreduce:2", "allreduce-worker-1.allreduce:2",
                      "allreduce-worker-3.allreduce:2"]


LWS = examples.leaderworkerset(size=4, groups=2)  # 2 GPUs per pod
LWS_CASES = [
    ("leader of group 0", "vllm-0", {"MASTER_ADDR": "vllm-0.vllm", "NODE_RANK": "0", "NNODES": "4",
                                     "NPROC_PER_NODE": "2", "WORLD_SIZE": "4", "processes": 8}),
    ("worker of group 1 sees only its own group", "vllm-1-2",
     {"MASTER_ADDR": "vllm-1.vllm", "NODE_RANK": "2", "RANK": "2", "NNODES": "4",
      "VC_WORKER_HOSTS": "vllm-1-1.vllm,vllm-1-2.vllm,vllm-1-3.vllm"}),
]


@pytest.mark.parametrize(("self_name", "expected"), [c[1:] for c in LWS_CASES], ids=[c[0] for c in LWS_CASES])
def test_leaderworkerset(self_name, expected):
    check(LWS, self_name, expected)


INDEXED = examples.indexed_job(completions=3)  # cpu 2500m -> 3 processes
INDEXED_CASES = [
    ("index 0 is master", "sweep-0-4vtwl", {"MASTER_ADDR": "sweep-0.sweep", "NODE_RANK": "0", "NPROC_PER_NODE": "3"}),
    ("index 2", "sweep-2-dl25p", {"NODE_RANK": "2", "RANK": "2", "WORLD_SIZE": "3", "processes": 9}),
]


@pytest.mark.parametrize(("self_name", "expected"), [c[1:] for c in INDEXED_CASES], ids=[c[0] for c in INDEXED_CASES])
def test_indexed_job(self_name, expected):
    check(INDEXED, self_name, expected)


def _generic_pods():
    pods = []
    for i in (2, 0, 1):  # list order must not matter
        pods.append(examples.make_pod(f"w-{i}", labels={"app": "train", "run": "r1", "idx": str(i)},
                                      ip=examples.loopback_ip(i)))
    pods.append(examples.make_pod("other", labels={"app": "train", "run": "r2", "idx": "0"}, ip="127.0.9.9"))
    return pods


GENERIC_CASES = [
    ("index label orders, list order does not", "w-0", {"NODE_RANK": "0", "MASTER_ADDR": "127.1.0.1",
                                                        "NNODES": "3"}),
    ("pods outside the selector are not peers", "w-2",
     {"NODE_RANK": "2", "NNODES": "3", "WORLD_SIZE": "3", "processes": 6}),
]


@pytest.mark.parametrize(("self_name", "expected"), [c[1:] for c in GENERIC_CASES], ids=[c[0] for c in GENERIC_CASES])
def test_generic_selector(self_name, expected):
    choice = ControllerChoice(selector="app=train,run=r1", index_label="idx")
    check(_generic_pods(), self_name, expected, {"choice": choice, "address": "ip"})


def test_no_module_but_controllers_knows_a_controller():
    """Controller knowledge was spread over gang.py (11 branches on the controller's key), topology.py and
    published.py, and the fixes of one place were missing in the others: now every answer comes from the
    controller's class in its module of core/controllers/, and other modules ask it."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "agent"
    branch = re.compile(r"\.key\s*(==|!=|in)\s*[\"(]|\bc\.(VOLCANO|PYTORCHJOB|MPI|JOBSET|TRAINJOB|LWS|COMPLETION|"
                        r"JOB_NAME|COORDINATOR)\w*|default_roles")
    found = [f"{path.relative_to(root)}:{n}: {line.strip()}"
             for path in root.rglob("*.py") if path.parent != root / "core" / "controllers"
             for n, line in enumerate(path.read_text().splitlines(), 1) if branch.search(line)]
    assert found == []


# --- training-operator's other kinds: told apart from PyTorchJob --------------------------------------------------

OPERATOR_KINDS = [("tfjob", examples.tfjob), ("xgboostjob", examples.xgboostjob), ("paddlejob", examples.paddlejob),
                  ("jaxjob", examples.jaxjob)]


@pytest.mark.parametrize(("key", "build"), OPERATOR_KINDS, ids=[k for k, _ in OPERATOR_KINDS])
def test_a_kinds_pods_are_its_own_not_a_pytorchjobs(key, build):
    """They carry PyTorchJob's label keys (training.kubeflow.org/job-name, replica-type, replica-index); the
    operator-name label, else the owner's kind, says whose they are."""
    from agent.core import Options
    from agent.core.controllers import CONTROLLERS, detect_controller

    pods = build()
    assert all(detect_controller(p, Options()).key == key for p in pods)
    assert not any(CONTROLLERS["pytorchjob"].claims(p) for p in pods)
    for pod in pods:  # a pod that lost its operator-name label: its owner's kind
        del pod["metadata"]["labels"]["training.kubeflow.org/operator-name"]
    assert all(detect_controller(p, Options()).key == key for p in pods)
    for pod in pods:  # and one that says neither is taken for a PyTorchJob's, as before
        del pod["metadata"]["ownerReferences"]
    assert all(detect_controller(p, Options()).key == "pytorchjob" for p in pods)


def test_a_pytorchjob_and_a_tfjob_of_one_name_are_two_jobs():
    tf = examples.tfjob("same", (("chief", 1), ("ps", 1)))
    pt = examples.pytorchjob("same", workers=0, ip_base=10)  # same-master-0: the job-name label "same" too
    rendered = render(tf + pt, "same-chief-0")
    assert rendered.plan.controller.key == "tfjob"
    assert [m.name for m in rendered.plan.topology.members] == ["same-chief-0", "same-ps-0"]
    other = render(tf + pt, "same-master-0")
    assert other.plan.controller.key == "pytorchjob"
    assert [m.name for m in other.plan.topology.members] == ["same-master-0"]


TFJOB = examples.tfjob()  # chief 1, worker 2, ps 1; 2 CPUs each
TFJOB_CASES = [
    ("the chief is rank 0, on TFJob's service name", "mnist-tf-chief-0",
     {"MASTER_ADDR": "mnist-tf-chief-0.default.svc", "NODE_RANK": "0", "NNODES": "4"}),
    ("the parameter server is waited for and ranked last", "mnist-tf-ps-0",
     {"NODE_RANK": "3", "RANK": "3", "WORLD_SIZE": "4", "processes": 8}),
]


@pytest.mark.parametrize(("self_name", "expected"), [c[1:] for c in TFJOB_CASES], ids=[c[0] for c in TFJOB_CASES])
def test_tfjob(self_name, expected):
    check(TFJOB, self_name, expected)


def test_tfjob_addresses_are_fully_qualified_under_a_cluster_domain():
    check(TFJOB, "mnist-tf-worker-1", {"MASTER_ADDR": "mnist-tf-chief-0.default.svc.cluster.local"},
          {"cluster_domain": "cluster.local"})


XGBOOSTJOB = examples.xgboostjob()  # master 1, worker 2
PADDLEJOB_PS = examples.paddlejob(workers=2, masters=1)
JAXJOB = examples.jaxjob()
RANK_CASES = [
    ("xgboostjob: the master is rank 0 (it runs the tracker)", XGBOOSTJOB, "xgb-master-0",
     {"NODE_RANK": "0", "MASTER_ADDR": "xgb-master-0"}),
    ("xgboostjob: worker i is node rank i + 1, as XGBoostJob's RANK", XGBOOSTJOB, "xgb-worker-1", {"NODE_RANK": "2"}),
    ("paddlejob with a Master spec: master 0 hosts Paddle's master", PADDLEJOB_PS, "paddle-worker-0",
     {"NODE_RANK": "1", "MASTER_ADDR": "paddle-master-0"}),
    ("jaxjob: worker 0 is the coordinator", JAXJOB, "jax-worker-2", {"NODE_RANK": "2", "MASTER_ADDR": "jax-worker-0"}),
]


@pytest.mark.parametrize(("pods", "self_name", "expected"), [c[1:] for c in RANK_CASES], ids=[c[0] for c in RANK_CASES])
def test_training_operator_kinds(pods, self_name, expected):
    check(pods, self_name, expected)
