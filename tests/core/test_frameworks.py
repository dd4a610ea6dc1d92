"""Every framework's spelling of the plan, one table per framework (agent/core/frameworks, docs/frameworks.md).

Each row is a job as its controller makes it (agent.examples), the pod that renders, the options, and the values
its file must hold (None: the variable is not written). The values are the research's
(../shared/research/frameworks.md) where the controller is right: JAXJob's COORDINATOR_ADDRESS without the
port and COORDINATOR_PORT beside it, XGBoostJob's RANK (master 0, worker index + 1) and WORLD_SIZE, the MPI
operator's ORTE names, Trainer v2's one-process ids; and they differ where a consumer rejects the controller's
value (each such row says so).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent import examples
from agent.core import Options, Rendered, build_plan, render_pod
from agent.core.files.frameworks import FRAMEWORKS, Rendition, published_ports
from agent.core.files.frameworks.xgboost import TRACKER_PORTS
from agent.core.model import ControllerChoice, FrameworkOptions, Processes
from agent.core.publication.view_choice import every_member_needed

ALL = tuple(FRAMEWORKS)


def rendered_with(pods: list[dict[str, Any]], me: str, names: tuple[str, ...] = ALL,
                  ports: tuple[tuple[str, int], ...] = (), files_dir: str | None = None, **options: Any) -> Rendered:
    choice = ControllerChoice(**{k: options.pop(k) for k in ("controller", "selector", "index_label") if k in options})
    return render_pod(pods, me, Options(frameworks=FrameworkOptions(names=names, ports=ports), choice=choice,
                                        **options), files_dir=files_dir)


def part(rendered: Rendered, key: str) -> Rendition:
    return next(r for r in rendered.frameworks if r.key == key)


def written(rendition: Rendition) -> dict[str, str]:
    return {v.name: v.value for v in rendition.variables if v.written and not v.unset}


def check(rendition: Rendition, expected: dict[str, str | None]) -> None:
    env = written(rendition)
    assert rendition.withheld is None, rendition.withheld
    for name, value in expected.items():
        if value is None:
            assert name not in env, (name, env.get(name))
        else:
            assert env.get(name) == value, (name, env.get(name), value)


def volcano(cpu: str = "1", tasks: tuple[tuple[str, int], ...] = (("master", 1), ("worker", 3), ("extras", 1))):
    return examples.volcano_job(tasks=tasks, cpu=cpu)


def selector_pods() -> list[dict[str, Any]]:
    return [examples.make_pod(f"w-{i}", labels={"app": "train", "idx": str(i)}, ip=examples.loopback_ip(i))
            for i in (2, 0, 1)]


SELECTOR = {"selector": "app=train", "index_label": "idx", "address": "ip"}


def _with_env(pods: list[dict[str, Any]], name: str, value: str) -> list[dict[str, Any]]:
    for pod in pods:
        pod["spec"]["containers"][0]["env"].insert(0, {"name": name, "value": value})
    return pods


def ipv6(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for i, pod in enumerate(pods):
        pod["status"]["podIP"] = f"fd00::{i + 1}"
        pod["status"]["podIPs"] = [{"ip": f"fd00::{i + 1}"}]
    return pods


# --- JAX -------------------------------------------------------------------------------------------------------

JAX_CASES = [
    ("volcano worker, one process per pod", volcano, "demo-worker-1", {},
     {"JAX_COORDINATOR_ADDRESS": "demo-master-0.demo:55527", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "2",
      "COORDINATOR_ADDRESS": "demo-master-0.demo", "COORDINATOR_PORT": "55527", "NUM_PROCESSES": "4",
      "PROCESS_ID": "2"}),
    ("NPROC_PER_NODE 2 set explicitly: processes counted, the id is the pod's first", lambda: volcano("2"),
     "demo-worker-1", {"processes": Processes(per_node=2)},
     {"JAX_NUM_PROCESSES": "8", "JAX_PROCESS_ID": "4", "NUM_PROCESSES": "8", "PROCESS_ID": "4"}),
    ("a CPU limit of 2 is no JAX process count: one process per pod (Trainer v2's and JAXJob's count)",
     lambda: volcano("2"), "demo-worker-1", {},
     {"JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "2", "NUM_PROCESSES": "4", "PROCESS_ID": "2"}),
    ("GPUs are no JAX process count either: one process drives the pod's devices",
     lambda: examples.pytorchjob(workers=1, gpus=2), "mnist-worker-0", {},
     {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}),
    ("pytorchjob: rank 0 is the master's Service; its CPU limit of 4 is not counted",
     lambda: examples.pytorchjob(workers=2), "mnist-worker-1", {},
     {"JAX_COORDINATOR_ADDRESS": "mnist-master-0:55527", "JAX_NUM_PROCESSES": "3", "JAX_PROCESS_ID": "2"}),
    ("jobset: the first replicated job holds rank 0", examples.jobset, "trainer-workers-1-0-5q6rr", {},
     {"JAX_COORDINATOR_ADDRESS": "trainer-driver-0-0.trainer:55527", "JAX_NUM_PROCESSES": "5",
      "JAX_PROCESS_ID": "3"}),
    ("indexed job, 3 processes per pod set by the container's NPROC_PER_NODE",
     lambda: _with_env(examples.indexed_job(completions=3), "NPROC_PER_NODE", "3"), "sweep-2-dl25p", {},
     {"JAX_COORDINATOR_ADDRESS": "sweep-0.sweep:55527", "JAX_NUM_PROCESSES": "9", "JAX_PROCESS_ID": "6"}),
    ("Trainer v2's ids with one process per pod: completion index, numNodes",
     lambda: examples.trainjob(num_nodes=3), "llm-node-0-2-f59jk", {"processes": Processes(per_node=1)},
     {"JAX_NUM_PROCESSES": "3", "JAX_PROCESS_ID": "2"}),
    ("selector with --address ip: rank 0's IP", selector_pods, "w-2", SELECTOR,
     {"JAX_COORDINATOR_ADDRESS": "127.1.0.1:55527", "COORDINATOR_ADDRESS": "127.1.0.1", "JAX_PROCESS_ID": "2"}),
    ("IPv6: bracketed where a port follows, bare in JAXJob's COORDINATOR_ADDRESS",
     lambda: ipv6(examples.indexed_job(completions=2)), "sweep-1-h9q5m", {"address": "ip"},
     {"JAX_COORDINATOR_ADDRESS": "[fd00::1]:55527", "COORDINATOR_ADDRESS": "fd00::1"}),
]


@pytest.mark.parametrize(("pods", "me", "options", "expected"), [c[1:] for c in JAX_CASES],
                         ids=[c[0] for c in JAX_CASES])
def test_jax(pods, me, options, expected):
    rendered = rendered_with(pods(), me, ("jax",), **options)
    check(part(rendered, "jax"), expected)
    assert set(part(rendered, "jax").files) == {"jax.env"}


def test_jax_coordinator_address_always_has_a_port_which_jaxjobs_does_not():
    # JAXJob writes COORDINATOR_ADDRESS=<job>-worker-0 (no port): copied into JAX_COORDINATOR_ADDRESS, jax fails
    # with IndexError (measured). Both are written, each in its own spelling.
    env = written(part(rendered_with(volcano(), "demo-worker-0", ("jax",)), "jax"))
    host, _, port = env["JAX_COORDINATOR_ADDRESS"].rpartition(":")
    assert host == env["COORDINATOR_ADDRESS"] and port == env["COORDINATOR_PORT"] and ":" not in host


def test_a_users_jax_process_id_is_kept_and_jaxjobs_name_follows_it():
    pods = volcano()
    pods[2]["spec"]["containers"][0]["env"].insert(0, {"name": "JAX_PROCESS_ID", "value": "7"})
    rendition = part(rendered_with(pods, "demo-worker-1", ("jax",)), "jax")
    kept = next(v for v in rendition.variables if v.name == "JAX_PROCESS_ID")
    assert not kept.written and "set by user in container 'trainer'" in kept.source
    assert written(rendition)["PROCESS_ID"] == "7"
    assert "JAX_PROCESS_ID" not in rendition.files["jax.env"].decode()


def test_a_pod_that_does_not_train_gets_no_jax_file_and_explain_says_why():
    rendition = part(rendered_with(volcano(), "demo-extras-0", ("jax",)), "jax")
    assert rendition.files == {} and rendition.variables == ()
    assert "role 'extras' is not a training role (master, worker)" in rendition.notes[0]


# --- TensorFlow ------------------------------------------------------------------------------------------------

WORKERS = ["demo-worker-0.demo:2222", "demo-worker-1.demo:2222", "demo-worker-2.demo:2222"]


def tfjob_ports(ports: dict[str, int | None]) -> list[dict[str, Any]]:
    """A TFJob (chief 1, worker 2, ps 1) whose replica types' templates declare their own 'tfjob-port' (None: no
    such port), as TFJob reads it per type (util.go GetPortFromTFJob)."""
    pods = examples.tfjob(port=2345)
    for pod in pods:
        rtype = pod["metadata"]["labels"]["training.kubeflow.org/replica-type"]
        if rtype in ports:
            number = ports[rtype]
            container = pod["spec"]["containers"][0]
            container["ports"] = [] if number is None else [{"name": "tfjob-port", "containerPort": number}]
    return pods


TFJOB_CLUSTER = {"chief": ["mnist-tf-chief-0.default.svc:2345"],
                 "worker": ["mnist-tf-worker-0.default.svc:2346", "mnist-tf-worker-1.default.svc:2346"],
                 "ps": ["mnist-tf-ps-0.default.svc:2222"]}
TF_CASES = [
    ("volcano master is TF's chief (TFJob's 'master' key is refused by TF 2)", volcano, "demo-master-0", {},
     {"cluster": {"chief": ["demo-master-0.demo:2222"], "worker": WORKERS}, "task": {"type": "chief", "index": 0}}),
    ("a worker's index is its place in rank order within its role", volcano, "demo-worker-2", {},
     {"cluster": {"chief": ["demo-master-0.demo:2222"], "worker": WORKERS}, "task": {"type": "worker", "index": 2}}),
    ("pytorchjob Master replica: chief", lambda: examples.pytorchjob(workers=1), "mnist-worker-0", {},
     {"cluster": {"chief": ["mnist-master-0:2222"], "worker": ["mnist-worker-0:2222"]},
      "task": {"type": "worker", "index": 0}}),
    ("a parameter server is a TF task though it does not train",
     lambda: volcano(tasks=(("chief", 1), ("worker", 2), ("ps", 2), ("evaluator", 1))), "demo-ps-1", {},
     {"cluster": {"chief": ["demo-chief-0.demo:2222"], "worker": ["demo-worker-0.demo:2222", "demo-worker-1.demo:2222"],
                  "ps": ["demo-ps-0.demo:2222", "demo-ps-1.demo:2222"], "evaluator": ["demo-evaluator-0.demo:2222"]},
      "task": {"type": "ps", "index": 1}}),
    ("the chief is in its own cluster (TFJob's enableDynamicWorker left it out: kubeflow/trainer#1763)",
     lambda: volcano(tasks=(("chief", 1), ("worker", 1))), "demo-chief-0", {},
     {"cluster": {"chief": ["demo-chief-0.demo:2222"], "worker": ["demo-worker-0.demo:2222"]},
      "task": {"type": "chief", "index": 0}}),
    ("IPv6 addresses in brackets", lambda: ipv6(volcano(tasks=(("master", 1), ("worker", 1)))), "demo-worker-0",
     {"address": "ip"}, {"cluster": {"chief": ["[fd00::1]:2222"], "worker": ["[fd00::2]:2222"]},
                         "task": {"type": "worker", "index": 0}}),
    ("--tf-port", lambda: volcano(tasks=(("master", 1), ("worker", 1))), "demo-master-0", {"ports": (("tf", 3000),)},
     {"cluster": {"chief": ["demo-master-0.demo:3000"], "worker": ["demo-worker-0.demo:3000"]},
      "task": {"type": "chief", "index": 0}}),
    ("TFJob: each replica type at its own tfjob-port, 2222 for a type that declares none (GetPortFromTFJob)",
     lambda: tfjob_ports({"worker": 2346, "ps": None}), "mnist-tf-worker-1", {},
     {"cluster": TFJOB_CLUSTER, "task": {"type": "worker", "index": 1}, "environment": "cloud"}),
    ("TFJob: the chief lists the workers at their port too", lambda: tfjob_ports({"worker": 2346, "ps": None}),
     "mnist-tf-chief-0", {}, {"cluster": TFJOB_CLUSTER, "task": {"type": "chief", "index": 0}, "environment": "cloud"}),
    ("TFJob with --tf-port: one port for every type", lambda: tfjob_ports({"worker": 2346}), "mnist-tf-ps-0",
     {"ports": (("tf", 3000),)},
     {"cluster": {k: [a.rpartition(":")[0] + ":3000" for a in v] for k, v in TFJOB_CLUSTER.items()},
      "task": {"type": "ps", "index": 0}, "environment": "cloud"}),
]


def test_a_job_of_one_tf_task_gets_no_tf_config_as_under_tfjob_and_volcano():
    # TFJob (util.go isDistributed) and Volcano's plugin set none for one pod: TF's Estimator takes a TF_CONFIG of
    # one worker for a distributed job (kubeflow/trainer#1078).
    rendition = part(rendered_with(volcano(tasks=(("master", 1),)), "demo-master-0", ("tf",)), "tf")
    assert rendition.withheld is None and "TF_CONFIG" not in written(rendition)
    assert rendition.files["tf_config.json"] == b"{}\n" and "export" not in rendition.files["tf.env"].decode()
    assert "kubeflow/trainer#1078" in next(v.source for v in rendition.variables if v.name == "TF_CONFIG")


@pytest.mark.parametrize(("pods", "me", "options", "expected"), [c[1:] for c in TF_CASES],
                         ids=[c[0] for c in TF_CASES])
def test_tf(pods, me, options, expected):
    rendition = part(rendered_with(pods(), me, ("tf",), **options), "tf")
    assert rendition.withheld is None
    assert json.loads(rendition.files["tf_config.json"]) == expected
    assert rendition.files["tf_config.json"] == json.dumps(expected, separators=(",", ":")).encode() + b"\n"
    assert written(rendition)["TF_CONFIG"] == rendition.files["tf_config.json"].decode().strip()


def test_tf_roles_at_different_ports_publish_no_port_so_their_own_view_is_not_taken():
    """A pod in its own view knows the one port the leader publishes: where the TF roles listen on their own ports,
    none is published, so the view choice gives the TF pods every member."""
    options = Options(frameworks=FrameworkOptions(names=("tf",)))
    apart = build_plan(tfjob_ports({"worker": 2346}), "mnist-tf-worker-0", options)
    assert "tf" not in published_ports(apart, options)
    assert "TensorFlow files (tf.env) name every member" in (every_member_needed(apart, options, ssh=False) or "")
    together = build_plan(tfjob_ports({}), "mnist-tf-worker-0", options)
    assert published_ports(together, options)["tf"][0] == 2345
    assert every_member_needed(together, options, ssh=False) is None


def test_a_role_that_is_no_tf_task_type_gets_no_tf_file():
    rendition = part(rendered_with(volcano(), "demo-extras-0", ("tf",)), "tf")
    assert rendition.files == {} and "no TensorFlow task type" in rendition.notes[0]


def test_two_chiefs_write_the_files_without_values_and_say_why():
    rendition = part(rendered_with(volcano(tasks=(("master", 1), ("chief", 1), ("worker", 1))), "demo-worker-0",
                                   ("tf",)), "tf")
    assert rendition.withheld and "TF allows one" in rendition.withheld
    assert rendition.files["tf_config.json"] == b"null\n"
    assert "export" not in rendition.files["tf.env"].decode()


# --- XGBoost / LightGBM ----------------------------------------------------------------------------------------

XGBOOST_CASES = [
    ("volcano worker: XGBoostJob's RANK is master 0, worker index + 1", volcano, "demo-worker-1", {},
     {"DMLC_TRACKER_URI": "demo-master-0.demo", "DMLC_TASK_ID": "2", "DMLC_NUM_WORKER": "4",
      "MASTER_ADDR": "demo-master-0.demo", "WORLD_SIZE": "4", "RANK": "2",
      "WORKER_ADDRS": "demo-worker-0.demo,demo-worker-1.demo,demo-worker-2.demo"}),
    ("two GPUs per pod: a worker per GPU; the worker count and the task ids agree (Trainer v2's ids count pods)",
     lambda: examples.pytorchjob(workers=2, gpus=2), "mnist-worker-1", {},
     {"DMLC_NUM_WORKER": "6", "DMLC_TASK_ID": "4", "WORLD_SIZE": "3", "RANK": "2"}),
    ("CPU pods: one worker per pod, whatever the CPU limit (Trainer v2's rule)", lambda: volcano("2"),
     "demo-worker-1", {}, {"DMLC_NUM_WORKER": "4", "DMLC_TASK_ID": "2", "WORLD_SIZE": "4", "RANK": "2"}),
    ("NPROC_PER_NODE set explicitly: its processes are workers", lambda: volcano("2"), "demo-worker-1",
     {"processes": Processes(per_node=2)},
     {"DMLC_NUM_WORKER": "8", "DMLC_TASK_ID": "4", "WORLD_SIZE": "4", "RANK": "2"}),
    ("every worker is listed (XGBoostJob lists replicas - 1 names, assuming one master)",
     lambda: examples.pytorchjob(workers=3), "mnist-master-0", {},
     {"WORKER_ADDRS": "mnist-worker-0,mnist-worker-1,mnist-worker-2", "RANK": "0", "DMLC_TASK_ID": "0"}),
    ("a one-pod job writes no worker list (as XGBoostJob)", lambda: volcano(tasks=(("master", 1),)),
     "demo-master-0", {}, {"WORKER_ADDRS": None, "WORKER_PORT": None, "DMLC_NUM_WORKER": "1"}),
    ("selector with --address ip", selector_pods, "w-1", SELECTOR,
     {"DMLC_TRACKER_URI": "127.1.0.1", "WORKER_ADDRS": "127.1.0.2,127.1.0.3", "DMLC_TASK_ID": "1"}),
    ("IPv6: the tracker URI is a bare host", lambda: ipv6(examples.indexed_job(completions=2)), "sweep-1-h9q5m",
     {"address": "ip"}, {"DMLC_TRACKER_URI": "fd00::1", "WORKER_ADDRS": "fd00::2"}),
]


@pytest.mark.parametrize(("pods", "me", "options", "expected"), [c[1:] for c in XGBOOST_CASES],
                         ids=[c[0] for c in XGBOOST_CASES])
def test_xgboost(pods, me, options, expected):
    rendition = part(rendered_with(pods(), me, ("xgboost",), **options), "xgboost")
    check(rendition, expected)
    env = written(rendition)
    port = env["DMLC_TRACKER_PORT"]
    assert env["MASTER_PORT"] == port and env.get("WORKER_PORT", port) == port
    assert 9999 <= int(port) < 9999 + TRACKER_PORTS
    assert json.loads(rendition.files["xgboost.json"]) == {"dmlc_tracker_uri": env["DMLC_TRACKER_URI"],
                                                           "dmlc_tracker_port": int(port),
                                                           "dmlc_task_id": env["DMLC_TASK_ID"]}


def _tracker_port(pods: list[dict[str, Any]], me: str, **options: Any) -> int:
    return part(rendered_with(pods, me, ("xgboost",), **options), "xgboost").port.number  # type: ignore[union-attr]


def test_the_tracker_port_is_new_with_each_membership_and_the_same_without_a_change():
    pods = volcano()
    before = _tracker_port(pods, "demo-worker-0")
    assert _tracker_port(volcano(), "demo-worker-2") == before  # another pod, the same members
    grown = volcano(tasks=(("master", 1), ("worker", 4), ("extras", 1)))
    assert _tracker_port(grown, "demo-worker-0") != before
    moved = volcano()
    moved[3]["status"]["podIP"] = "127.1.9.9"  # an address changes: dns names stay, the port stays
    assert _tracker_port(moved, "demo-worker-0") == before
    assert _tracker_port(moved, "demo-worker-0", address="ip") != _tracker_port(pods, "demo-worker-0", address="ip")


def test_the_tracker_port_stays_in_its_documented_range_near_the_top():
    for base in (40000, 65000, 65535):
        port = _tracker_port(volcano(), "demo-worker-0", ports=(("xgboost", base),))
        assert base <= port < min(base + TRACKER_PORTS, 65536)


# --- PaddlePaddle ----------------------------------------------------------------------------------------------

PADDLE_CASES = [
    ("volcano worker: rank 0's address; PADDLE_RANK is NODE_RANK (PaddleJob writes none)", volcano,
     "demo-worker-1", {}, {"PADDLE_MASTER": "demo-master-0.demo:36543", "PADDLE_NNODES": "4", "PADDLE_RANK": "2",
                           "PADDLE_JOB_ID": "demo",
                           "PADDLE_NPROC_PER_NODE": "1", "POD_IP": "127.1.0.3"}),
    ("rank 0 gets its own IP, where Paddle starts its master (as PaddleJob)", volcano, "demo-master-0", {},
     {"PADDLE_MASTER": "127.1.0.1:36543", "POD_IP": "127.1.0.1", "PADDLE_RANK": "0"}),
    ("pytorchjob with 4 GPUs per pod: the launcher starts one process per GPU",
     lambda: examples.pytorchjob(workers=2, gpus=4), "mnist-worker-0", {},
     {"PADDLE_MASTER": "mnist-master-0:36543", "PADDLE_NNODES": "3", "PADDLE_NPROC_PER_NODE": "4",
      "PADDLE_RANK": "1"}),
    ("CPU pods: one process per pod, whatever the CPU limit", lambda: examples.pytorchjob(workers=2),
     "mnist-worker-0", {}, {"PADDLE_NPROC_PER_NODE": "1", "PADDLE_SERVER_NUM": None, "PADDLE_TRAINER_NUM": None}),
    ("jobset: the job id is the JobSet's name (its pods' owner is a Job)", examples.jobset,
     "trainer-workers-0-0-kwhz6", {}, {"PADDLE_JOB_ID": "trainer", "PADDLE_RANK": "1"}),
    ("IPv6 rank 0: its own IP in brackets", lambda: ipv6(examples.indexed_job(completions=2)), "sweep-0-4vtwl",
     {"address": "ip"}, {"PADDLE_MASTER": "[fd00::1]:36543", "POD_IP": "fd00::1"}),
    ("--paddle-port", volcano, "demo-worker-0", {"ports": (("paddle", 4000),)},
     {"PADDLE_MASTER": "demo-master-0.demo:4000"}),
]


@pytest.mark.parametrize(("pods", "me", "options", "expected"), [c[1:] for c in PADDLE_CASES],
                         ids=[c[0] for c in PADDLE_CASES])
def test_paddle(pods, me, options, expected):
    check(part(rendered_with(pods(), me, ("paddle",), **options), "paddle"), expected)


def test_a_users_pod_ip_from_the_downward_api_is_kept():
    pods = volcano()
    pods[1]["spec"]["containers"][0]["env"].insert(0, {"name": "POD_IP", "valueFrom": {
        "fieldRef": {"fieldPath": "status.podIP"}}})
    rendition = part(rendered_with(pods, "demo-worker-0", ("paddle",)), "paddle")
    assert "POD_IP" not in written(rendition)
    assert "POD_IP" not in rendition.files["paddle.env"].decode()


# --- MLX (ring) ------------------------------------------------------------------------------------------------

MLX_CASES = [
    ("one entry per pod, IPs in rank order", volcano, "demo-worker-1", {},
     [["127.1.0.1:32323"], ["127.1.0.2:32323"], ["127.1.0.3:32323"], ["127.1.0.4:32323"]],
     {"MLX_RANK": "2", "MLX_WORLD_SIZE": "4", "MLX_HOSTFILE": "/shared/mlx_hostfile.json"}),
    ("two processes per pod (set explicitly): one entry each, port = base + local rank",
     lambda: volcano("2", (("master", 1), ("worker", 1))), "demo-worker-0", {"processes": Processes(per_node=2)},
     [["127.1.0.1:32323"], ["127.1.0.1:32324"], ["127.1.0.2:32323"], ["127.1.0.2:32324"]],
     {"MLX_RANK": "2", "MLX_WORLD_SIZE": "4"}),
    ("CPU pods: one ring rank per pod, whatever the CPU limit", lambda: volcano("2", (("master", 1), ("worker", 1))),
     "demo-worker-0", {}, [["127.1.0.1:32323"], ["127.1.0.2:32323"]],
     {"MLX_RANK": "1", "MLX_WORLD_SIZE": "2", "NCCL_HOST_IP": "127.1.0.1", "NCCL_PORT": "12345"}),
    ("IPs even with --address dns (the ring backend requires IPs)", examples.jobset, "trainer-driver-0-0-cht55",
     {"processes": Processes(per_node=1)}, [[f"127.1.0.{i}:32323"] for i in range(1, 6)], {"MLX_RANK": "0"}),
    ("IPv6 in brackets, --mlx-port", lambda: ipv6(examples.indexed_job(completions=2)), "sweep-0-4vtwl",
     {"address": "ip", "processes": Processes(per_node=1), "ports": (("mlx", 5000),)},
     [["[fd00::1]:5000"], ["[fd00::2]:5000"]], {"MLX_RANK": "0"}),
]


@pytest.mark.parametrize(("pods", "me", "options", "hosts", "expected"), [c[1:] for c in MLX_CASES],
                         ids=[c[0] for c in MLX_CASES])
def test_mlx(pods, me, options, hosts, expected):
    rendition = part(rendered_with(pods(), me, ("mlx",), files_dir="/shared", **options), "mlx")
    check(rendition, expected)
    assert json.loads(rendition.files["mlx_hostfile.json"]) == hosts


def test_a_training_pod_without_an_ip_holds_the_ring_back_and_says_which():
    pods = volcano()
    del pods[2]["status"]["podIP"], pods[2]["status"]["podIPs"]  # dns names: still a member
    rendition = part(rendered_with(pods, "demo-worker-0", ("mlx",)), "mlx")
    assert rendition.withheld == "training pod 'demo-worker-1' has no IP yet, and the ring backend needs IPs"
    assert rendition.files["mlx_hostfile.json"] == b"null\n" and "MLX_RANK" not in rendition.files["mlx.env"].decode()


# --- MPI -------------------------------------------------------------------------------------------------------

LAUNCHER = "allreduce-launcher-" + examples._suffix("allreduce", "launcher")
MPI_CASES = [
    ("MPIJob launcher: both OpenMPI spellings, Hydra's, slotsPerWorker", examples.mpijob, LAUNCHER, (), {},
     {"OMPI_MCA_orte_default_hostfile": "/shared/hostfile", "PRTE_MCA_prte_default_hostfile": "/shared/hostfile",
      "OMPI_MCA_orte_set_default_slots": "2", "PRTE_MCA_prte_set_default_slots": "2",
      "OMPI_MCA_orte_keep_fqdn_hostnames": "true", "PRTE_MCA_prte_keep_fqdn_hostnames": "false",
      "I_MPI_HYDRA_HOST_FILE": "/shared/hydra_hostfile", "HYDRA_HOST_FILE": "/shared/hydra_hostfile"},
     "allreduce-worker-0.allreduce:2\nallreduce-worker-1.allreduce:2\nallreduce-worker-2.allreduce:2\n"),
    ("--frameworks mpi: a volcano training pod", volcano, "demo-worker-0", ("mpi",), {},
     {"OMPI_MCA_orte_default_hostfile": "/shared/hostfile", "OMPI_MCA_orte_set_default_slots": "1"},
     "demo-master-0.demo:1\ndemo-worker-0.demo:1\ndemo-worker-1.demo:1\ndemo-worker-2.demo:1\n"),
    ("Trainer's MPI runtime: the launcher, a node too", lambda: examples.trainjob_mpi(num_nodes=3),
     "ds-launcher-0-0-" + examples._suffix("ds-launcher-0", 0), ("mpi",), {"processes": Processes(per_node=1)},
     {"OMPI_MCA_orte_default_hostfile": "/shared/hostfile"},
     "ds-node-0-0.ds:1\nds-node-0-1.ds:1\nds-launcher-0-0.ds:1\n"),
    ("pods of different sizes: no default slots, the hostfiles say each",
     lambda: [*volcano("1", (("master", 1),)), *examples.volcano_job(tasks=(("worker", 1),), cpu="3")],
     "demo-master-0", ("mpi",), {},
     {"OMPI_MCA_orte_set_default_slots": None, "PRTE_MCA_prte_set_default_slots": None},
     "demo-master-0.demo:1\ndemo-worker-0.demo:3\n"),
]


@pytest.mark.parametrize(("pods", "me", "names", "options", "expected", "hydra"), [c[1:] for c in MPI_CASES],
                         ids=[c[0] for c in MPI_CASES])
def test_mpi(pods, me, names, options, expected, hydra):
    rendered = rendered_with(pods(), me, names, files_dir="/shared", **options)
    rendition = part(rendered, "mpi")
    check(rendition, expected)
    assert rendition.files["hydra_hostfile"].decode() == hydra
    assert rendered.files["hostfile"].decode().split() == hydra.replace(":", " slots=").split()


def test_the_mpijob_launcher_replaces_the_operators_hostfile_and_keeps_what_the_user_set():
    pods = examples.mpijob()
    launcher = pods[0]["spec"]["containers"][0]
    launcher["env"].insert(0, {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "false"})  # the template's
    rendition = part(render_pod(pods, LAUNCHER, Options(), files_dir="/shared"), "mpi")
    by_name = {v.name: v for v in rendition.variables}
    hostfile = by_name["OMPI_MCA_orte_default_hostfile"]
    assert hostfile.written and "replaces OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile injected by MPIJob" \
        in hostfile.source
    assert not by_name["OMPI_MCA_orte_keep_fqdn_hostnames"].written
    assert "set by user in container 'launcher'" in by_name["OMPI_MCA_orte_keep_fqdn_hostnames"].source
    assert rendition.selected_by == "MPIJob (MPI operator v2) jobs"


TRAINER_LAUNCHER = "ds-launcher-0-0-" + examples._suffix("ds-launcher-0", 0)


def test_mlx_on_trainers_launcher_runs_over_mpirun_so_the_launcher_gets_mpi_env_too():
    """Trainer v2's mlx-distributed runtime runs mpirun from the launcher (mlPolicy.mpi, OpenMPI): MLX there needs
    the MPI launcher's variables, whatever selected MLX; the nodes, which mpirun reaches over SSH, get none."""
    pods = examples.trainjob_mpi(num_nodes=3)
    rendered = rendered_with(pods, TRAINER_LAUNCHER, ("mlx",), files_dir="/shared", processes=Processes(per_node=1))
    mpi = part(rendered, "mpi")
    check(mpi, {"OMPI_MCA_orte_default_hostfile": "/shared/hostfile", "OMPI_MCA_orte_set_default_slots": "1",
                "PRTE_MCA_prte_default_hostfile": "/shared/hostfile"})
    assert set(mpi.files) == {"mpi.env", "hydra_hostfile"} and "mpirun" in mpi.selected_by
    node = rendered_with(pods, "ds-node-0-1-" + examples._suffix("ds-node-0", 1), ("mlx",),
                         processes=Processes(per_node=1))
    assert [r.key for r in node.frameworks] == ["mlx"]


def test_mpijob_workers_get_no_mpi_file_and_explain_says_who_does():
    rendition = part(render_pod(examples.mpijob(), "allreduce-worker-0", Options()), "mpi")
    assert rendition.files == {}
    assert "goes to the pods of role 'launcher'" in rendition.notes[0]


# --- Ray -------------------------------------------------------------------------------------------------------

RAY_CASES = [
    ("a worker: the head is node rank 0", volcano, "demo-worker-1", {},
     {"RAY_ADDRESS": "demo-master-0.demo:6379", "RAY_PORT": "6379", "FQ_RAY_IP": "demo-master-0.demo"}),
    ("the head itself: 127.0.0.1, as KubeRay's head", volcano, "demo-master-0", {},
     {"RAY_ADDRESS": "127.0.0.1:6379", "FQ_RAY_IP": "demo-master-0.demo"}),
    ("role 'head' (Volcano's ray plugin) is the head", lambda: volcano(tasks=(("head", 1), ("worker", 2))),
     "demo-worker-1", {}, {"RAY_ADDRESS": "demo-head-0.demo:6379", "FQ_RAY_IP": "demo-head-0.demo"}),
    ("the head of role 'head' gets 127.0.0.1", lambda: volcano(tasks=(("head", 1), ("worker", 2))),
     "demo-head-0", {"roles": ("head", "worker")}, {"RAY_ADDRESS": "127.0.0.1:6379"}),
    ("IPv6 and --ray-port", lambda: ipv6(examples.indexed_job(completions=2)), "sweep-1-h9q5m",
     {"address": "ip", "ports": (("ray", 7000),)}, {"RAY_ADDRESS": "[fd00::1]:7000", "FQ_RAY_IP": "fd00::1"}),
]


@pytest.mark.parametrize(("pods", "me", "options", "expected"), [c[1:] for c in RAY_CASES],
                         ids=[c[0] for c in RAY_CASES])
def test_ray(pods, me, options, expected):
    check(part(rendered_with(pods(), me, ("ray",), **options), "ray"), expected)


def test_a_pod_that_does_not_train_gets_no_ray_file_and_explain_says_why():
    rendition = part(rendered_with(volcano(), "demo-extras-0", ("ray",)), "ray")
    assert rendition.files == {} and rendition.variables == ()
    assert "role 'extras' is not a training role (master, worker); ray.env goes to training pods" in rendition.notes[0]


@pytest.mark.parametrize("addresses, joined", [
    (["demo-worker-0.demo", "demo-worker-1.demo.default.svc.cluster.local"], True),
    (["10.0.0.1", "10.0.0.2", "10.0.0.3"], True),
    (["one"], True),
    ([], False),
    (["fe80::1", "10.0.0.1"], False),  # in brackets
    (['a","b', "c"], False), (['a"', "b"], False), (["a\\", "b"], False), (["\u00e9", "x"], False),
    (["a\x01", "b"], False), (["a\x7f", "b"], False), (["a:1", "b"], False),
])
def test_a_tf_clusters_hosts_are_the_encoders_json_byte_for_byte(addresses, joined):
    """Made by one join where each address is plain (a TF cluster of 16384 workers: 3.3 -> 1 MB at every change),
    by the encoder otherwise."""
    from agent.core.files.frameworks.base import host_ports, hosts_json

    parts = hosts_json(addresses, 2222)
    assert b"".join(parts) == json.dumps(host_ports(addresses, 2222), separators=(",", ":")).encode()
    assert (len(parts) == 3) == joined
