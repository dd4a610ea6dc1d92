"""The agent's framework files against the controllers' own unit tests: each case is one upstream test case (file,
release and case named), its inputs made into the pods (and job objects) that controller creates, and its expected
values compared with what the agent writes for the same pod. Where the agent differs, the case asserts the
difference and names why (each one is in docs/frameworks.md, "Where the agent differs from the controllers").
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent import examples
from agent.core import Options, Rendered, render_pod
from agent.core.files.frameworks import Rendition
from agent.core.model import FrameworkOptions
from agent.core.plan.gang import JobView, job_reads
from tests.core.test_controller_tests import NAME, TF_CASES, TRAINER_JAX_CASES, TRAINER_XGB_CASES, VOLCANO_TF_CLUSTER


def read(me: dict[str, Any], objects: list[dict[str, Any]], options: Options) -> JobView:
    """``job_reads`` as init runs it, each path answered with the object the API would return."""
    reads = job_reads(me, options)
    next(reads)
    try:
        for obj in objects:
            reads.send(obj)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise AssertionError("job_reads asked for more objects")


def part(rendered: Rendered, key: str) -> Rendition:
    return next(r for r in rendered.frameworks if r.key == key)


def written(rendition: Rendition) -> dict[str, str]:
    return {v.name: v.value for v in rendition.variables if v.written and not v.unset}


# --- TFJob: pod_test.go "Test ClusterSpec" -----------------------------------------------------------------------

@pytest.mark.parametrize(("workers", "ps", "evaluators", "namespace", "domain", "expected"), TF_CASES,
                         ids=[f"{c[3]}-{c[4] or 'no domain'}-{c[0]}w{c[1]}ps{c[2]}ev" for c in TF_CASES])
def test_tfjobs_tf_config_is_the_agents(workers, ps, evaluators, namespace, domain, expected):
    """The same cluster, task and environment, and none for a one-pod job (the JSON's key order aside: TFJob
    marshals a Go map, sorted; the agent writes chief, worker, ps, evaluator)."""
    specs = tuple((t, n) for t, n in (("worker", workers), ("ps", ps), ("evaluator", evaluators)) if n)
    pods = examples.tfjob(NAME, specs, namespace=namespace, domain=domain)
    rendered = render_pod(pods, pods[0]["metadata"]["name"], Options(cluster_domain=domain or None))
    env = written(part(rendered, "tf"))
    if not expected:
        assert "TF_CONFIG" not in env
    else:
        assert json.loads(env["TF_CONFIG"]) == json.loads(expected)


TF_SPARSE = "kubeflow/training-operator v1.9.4 pkg/controller.v1/tensorflow/tensorflow_test.go " \
            "TestConvertClusterSpecToSparseClusterSpec"


def test_tfjobs_sparse_cluster_is_not_written_the_chief_is_in_its_own_cluster():
    """Difference: with enableDynamicWorker TFJob writes a sparse cluster (a worker: itself and the ps; a ps:
    itself; the chief: nothing, which TF refuses: kubeflow/trainer#1763). The agent writes every live member to
    every pod and rewrites the files when members change."""
    pods = examples.tfjob(NAME, (("chief", 1), ("worker", 2), ("ps", 2)))
    chief = written(part(render_pod(pods, f"{NAME}-chief-0", Options()), "tf"))
    config = json.loads(chief["TF_CONFIG"])
    assert config["task"] == {"type": "chief", "index": 0}
    assert config["cluster"]["chief"] == [f"{NAME}-chief-0.default.svc:2222"], TF_SPARSE
    worker = json.loads(written(part(render_pod(pods, f"{NAME}-worker-0", Options()), "tf"))["TF_CONFIG"])
    assert worker["cluster"]["worker"] == [f"{NAME}-worker-{i}.default.svc:2222" for i in range(2)]  # not {"0":..}


def test_a_tfjob_master_is_tfs_chief():
    """Difference: TFJob writes the key 'master' for a Master replica; TF 2's MultiWorkerMirroredStrategy raises
    'Disallowed task type' (tensorflow/tensorflow#27058, no plans to support it)."""
    pods = examples.tfjob("m", (("master", 1), ("worker", 1)))
    controller = json.loads(next(e["value"] for e in pods[0]["spec"]["containers"][0]["env"]))
    assert set(controller["cluster"]) == {"master", "worker"}
    agent = json.loads(written(part(render_pod(pods, "m-master-0", Options()), "tf"))["TF_CONFIG"])
    assert set(agent["cluster"]) == {"chief", "worker"} and agent["task"] == {"type": "chief", "index": 0}
    assert agent["cluster"]["chief"] == controller["cluster"]["master"]


# --- Volcano's tensorflow and ray plugins ------------------------------------------------------------------------

def _vcjob(name: str, tasks: tuple[tuple[str, int], ...], plugins: dict[str, list[str]]) -> dict[str, Any]:
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": name, "namespace": "default", "uid": examples.owner_uid("vcjob", "default", name)},
            "spec": {"plugins": plugins, "tasks": [{"name": t, "replicas": n} for t, n in tasks]}}


@pytest.mark.parametrize("task", ["ps", "worker", "chief"])
def test_volcanos_tensorflow_plugin_test_is_the_agents_tf_config(task):
    """TestTensorflow (volcano v1.15.0): tasks ps 2, worker 2, chief 1, ``--port=5000``; the job object's plugin
    gives the agent the tasks' roles and the port."""
    tasks = (("ps", 2), ("worker", 2), ("chief", 1))
    pods = examples.volcano_job("train-123", tasks=tasks, plugins=("tensorflow",), tf_port=5000)
    me = next(p for p in pods if p["metadata"]["name"] == f"train-123-{task}-0")
    view = read(me, [_vcjob("train-123", tasks, {"tensorflow": ["--port=5000"]})], Options())
    assert dict(view.options.frameworks.implied) == {"tf": "Job 'train-123'"}
    assert view.options.roles == ("chief", "worker", "ps")  # every task TF_CONFIG names is waited for
    tf = part(render_pod(pods, me["metadata"]["name"], view.options), "tf")
    expected = json.loads(VOLCANO_TF_CLUSTER + f'"task":{{"type":"{task}","index":0}}}}')
    assert json.loads(written(tf)["TF_CONFIG"]) == expected
    assert tf.port is not None and tf.port.source == "--port 5000 of the tensorflow plugin of Job 'train-123'"


def test_volcanos_tensorflow_plugin_names_its_tasks_by_flags():
    tasks = (("trainer", 2), ("server", 1))
    pods = examples.volcano_job("nm", tasks=tasks, plugins=("svc",))
    view = read(pods[2], [_vcjob("nm", tasks, {"tensorflow": ["--worker", "trainer", "--ps=server"]})], Options())
    config = json.loads(written(part(render_pod(pods, "nm-server-0", view.options), "tf"))["TF_CONFIG"])
    assert config == {"cluster": {"worker": ["nm-trainer-0.nm:2222", "nm-trainer-1.nm:2222"],
                                  "ps": ["nm-server-0.nm:2222"]}, "task": {"type": "ps", "index": 0}}


VOLCANO_RAY = "volcano-sh/volcano v1.15.0 pkg/controllers/job/plugins/distributed-framework/ray/ray_test.go"
RAY_CASES = [
    # (case, job, tasks, plugin arguments, pod, the address Volcano's command gives (head: its --port))
    ("ray cluster test with only head task", "ray-cluster-test", (("test-head", 1),),
     ["--port=1234", "--dashboardPort=3456", "--clientPort=4567", "--head=test-head"], "ray-cluster-test-test-head-0",
     "127.0.0.1:1234"),
    ("ray cluster test with worker task", "ray-cluster-worker", (("head", 1), ("worker", 1)), [],
     "ray-cluster-worker-worker-0", "ray-cluster-worker-head-0.ray-cluster-worker:6379"),
]


def _ray_plugin_pods(job: str, tasks: tuple[tuple[str, int], ...], head: str = "head",
                     containers: dict[str, str] | None = None, gcs: int | None = 6379) -> list[dict[str, Any]]:
    """A Volcano job's pods as the ray plugin leaves them: each task's container named as in ray_test.go (the head
    task's ``head``, the others' ``worker``; ``containers``: task -> another name), and on the head task's container
    the GCS port named ``gcs`` that OnPodCreate opens there (openHeadContainerPort; None: none)."""
    pods = examples.volcano_job(job, tasks=tasks, plugins=("svc",))
    for pod in pods:
        task = pod["metadata"]["labels"]["volcano.sh/task-spec"]
        container = pod["spec"]["containers"][0]
        container["name"] = (containers or {}).get(task, "head" if task == head else "worker")
        if task == head and gcs is not None:
            container["ports"] = [{"name": "gcs", "containerPort": gcs}]
    return pods


@pytest.mark.parametrize(("job", "tasks", "args", "me", "address"), [c[1:] for c in RAY_CASES],
                         ids=[c[0] for c in RAY_CASES])
def test_volcanos_ray_plugin_test_is_the_agents_ray_address(job, tasks, args, me, address):
    """A worker reaches the head where Volcano's ``ray start --address`` does; the head listens on the plugin's
    ``--port`` (as KubeRay's head, RAY_ADDRESS names it on 127.0.0.1)."""
    pods = _ray_plugin_pods(job, tasks, tasks[0][0], gcs=int(address.rpartition(":")[2]))
    pod = next(p for p in pods if p["metadata"]["name"] == me)
    view = read(pod, [_vcjob(job, tasks, {"ray": args})], Options())
    env = written(part(render_pod(pods, me, view.options), "ray"))
    assert env["RAY_ADDRESS"] == address, VOLCANO_RAY
    assert env["RAY_PORT"] == address.rpartition(":")[2]


def test_the_ray_plugins_client_task_gets_no_ray_env():
    """A client task beside the plugin's head and workers (a driver that submits to the cluster) is no Ray node:
    the plugin's tasks are the job's training roles, and no framework's files go to a pod that does not train."""
    tasks = (("head", 1), ("worker", 2), ("client", 1))
    pods = _ray_plugin_pods("rc", tasks, containers={"client": "client"})
    view = read(pods[-1], [_vcjob("rc", tasks, {"ray": []})], Options())
    assert view.options.roles == ("head", "worker")
    client = part(render_pod(pods, "rc-client-0", view.options), "ray")
    assert client.files == {} and "role 'client' is not a training role (head, worker)" in client.notes[0]
    worker = written(part(render_pod(pods, "rc-worker-1", view.options), "ray"))
    assert worker["RAY_ADDRESS"] == "rc-head-0.rc:6379"


@pytest.mark.parametrize(("args", "containers", "gcs", "port", "source"), [
    (["--headContainer=ray", "--port=1234"], {"head": "ray"}, 1234, "1234",
     "port 'gcs' of container 'ray' in pod 'rh-head-0', where Volcano Job's ray plugin starts the head"),
    (["--headContainer", "ray", "--port", "1234"], {"head": "main"}, None, "6379",
     "Ray's GCS port 6379 (KubeRay DefaultGcsServerPort): Volcano Job's ray plugin starts the head only in "
     "container 'ray', which pod 'rh-head-0' has not"),
], ids=["the head container's gcs port", "a head pod without the plugin's container: Ray's default"])
def test_the_ray_plugins_head_container_holds_the_heads_port(args, containers, gcs, port, source):
    """ray.go OnPodCreate starts ``ray start --head --port=<--port>`` and opens the port, named gcs, only in the head
    task's container named ``--headContainer`` (default head); a head pod without it is left alone, and its Ray
    listens where Ray's own default puts it."""
    tasks = (("head", 1), ("worker", 1))
    pods = _ray_plugin_pods("rh", tasks, containers=containers, gcs=gcs)
    pods[0]["spec"]["containers"].insert(0, {"name": "log-shipper", "image": "busybox", "ports": [
        {"name": "gcs", "containerPort": 9}]})  # not the plugin's container: its ports are not read
    view = read(pods[1], [_vcjob("rh", tasks, {"ray": args})], Options())
    ray = part(render_pod(pods, "rh-worker-0", view.options), "ray")
    assert written(ray)["RAY_ADDRESS"] == f"rh-head-0.rh:{port}"
    assert ray.port is not None and ray.port.source == source


def test_offline_the_ray_heads_port_is_the_gcs_port_the_plugin_opened():
    """``render`` without the job object: the head pod's container ``head`` shows the port the plugin opened."""
    pods = _ray_plugin_pods("ro", (("head", 1), ("worker", 2)), gcs=1234)
    options = Options(roles=("head", "worker"), frameworks=FrameworkOptions(names=("ray",)))
    assert written(part(render_pod(pods, "ro-worker-1", options), "ray"))["RAY_ADDRESS"] == "ro-head-0.ro:1234"
    assert written(part(render_pod(pods, "ro-head-0", options), "ray"))["RAY_ADDRESS"] == "127.0.0.1:1234"


# --- JAXJob: envvar_test.go TestSetPodEnv -------------------------------------------------------------------------

def test_jaxjobs_variables_are_the_agents_and_jax_gets_its_address_with_the_port():
    """"successful environment variable setup": one worker, port 6666. JAXJob's names agree; JAX_COORDINATOR_ADDRESS
    adds the port (JAXJob's COORDINATOR_ADDRESS copied there fails in jax with IndexError)."""
    pods = examples.jaxjob("test-jaxjob", workers=1)
    env = written(part(render_pod(pods, "test-jaxjob-worker-0", Options()), "jax"))
    assert {k: env[k] for k in ("COORDINATOR_PORT", "COORDINATOR_ADDRESS", "NUM_PROCESSES", "PROCESS_ID")} == {
        "COORDINATOR_PORT": "6666", "COORDINATOR_ADDRESS": "test-jaxjob-worker-0", "NUM_PROCESSES": "1",
        "PROCESS_ID": "0"}
    assert env["JAX_COORDINATOR_ADDRESS"] == "test-jaxjob-worker-0:6666"


@pytest.mark.parametrize("cpu", ["2", "8"])
def test_jaxjob_counts_one_process_per_pod_whatever_the_cpu_limit(cpu):
    pods = examples.jaxjob("j", workers=3, cpu=cpu)
    env = written(part(render_pod(pods, "j-worker-2", Options()), "jax"))
    assert (env["NUM_PROCESSES"], env["PROCESS_ID"]) == ("3", "2")  # JAXJob: replicas, the index


# --- PaddleJob: paddlepaddle_controller_test.go ----------------------------------------------------------------

def test_paddlejobs_master_endpoint_is_the_agents():
    """"Should get the corresponding resources successfully": a Master and 2 workers, port 'master' 8080; the
    master pod's PADDLE_MASTER is $(POD_IP_DUMMY):8080, its own IP. The agent writes that IP itself."""
    pods = examples.paddlejob("test-job", workers=2, masters=1, port=8080)
    injected = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
    assert injected["PADDLE_MASTER"] == "$(POD_IP_DUMMY):8080"
    ip = pods[0]["status"]["podIP"]
    env = written(part(render_pod(pods, "test-job-master-0", Options()), "paddle"))
    assert env["PADDLE_MASTER"] == injected["PADDLE_MASTER"].replace("$(POD_IP_DUMMY)", ip)
    assert (env["PADDLE_NNODES"], env["PADDLE_JOB_ID"], env["PADDLE_SERVER_NUM"]) == ("3", "test-job", "1")
    worker = written(part(render_pod(pods, "test-job-worker-1", Options()), "paddle"))
    assert (worker["PADDLE_MASTER"], worker["PADDLE_TRAINER_NUM"]) == ("test-job-master-0:8080", "1")
    assert "PADDLE_SERVER_NUM" not in worker


def test_paddlejob_writes_no_rank_the_agent_does():
    """Difference: PaddleJob writes no PADDLE_RANK, so ranks follow whichever pod reaches the master first
    (research, measured: Paddle honours PADDLE_RANK)."""
    pods = examples.paddlejob("p", workers=3)
    assert all("PADDLE_RANK" not in {e["name"] for e in p["spec"]["containers"][0]["env"]} for p in pods)
    assert [written(part(render_pod(pods, p["metadata"]["name"], Options()), "paddle"))["PADDLE_RANK"]
            for p in pods] == ["0", "1", "2"]


# --- XGBoostJob: xgboost.go SetPodEnv (its tests check no variable) ------------------------------------------------

def test_xgboostjobs_variables_are_the_agents_and_its_first_membership_its_port():
    """XGBoostJob's own tests check ports only; its SetPodEnv (v1.9.4) writes RANK master 0, worker index + 1,
    WORLD_SIZE the replicas, MASTER_ADDR <job>-master-0, WORKER_ADDRS the workers, MASTER_PORT xgboostjob-port
    (9999). The job's first membership (as many pods as WORLD_SIZE says) keeps that port; a later one moves it by a
    hash of its members, new with each membership (docs/frameworks.md)."""
    pods = examples.xgboostjob("xgb", workers=2)
    for pod in pods:
        name = pod["metadata"]["name"]
        injected = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        rendition = part(render_pod(pods, name, Options()), "xgboost")
        env = written(rendition)
        same = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "WORKER_ADDRS")
        assert {k: env[k] for k in same} == {k: injected[k] for k in same}, name
        assert env["DMLC_TRACKER_PORT"] == env["WORKER_PORT"] == "9999"
        assert rendition.port is not None and rendition.port.source.startswith("port 'xgboostjob-port'")
    shrunk = written(part(render_pod(pods[:2], "xgb-master-0", Options()), "xgboost"))  # worker 1 has gone
    assert shrunk["WORLD_SIZE"] == "2" and 9999 < int(shrunk["DMLC_TRACKER_PORT"]) < 9999 + 1024
    job = {"apiVersion": "kubeflow.org/v1", "kind": "XGBoostJob", "metadata": {"name": "xgb", "namespace": "default"},
           "spec": {"xgbReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 2}}}}
    view = read(pods[0], [job], Options())  # init and the sidecar: the job object says it
    assert view.options.frameworks.first == (3, "the replicas of master, worker in XGBoostJob 'xgb'")
    assert part(render_pod(pods, "xgb-worker-1", view.options), "xgboost").port.number == 9999  # type: ignore


def test_the_first_membership_of_a_job_read_from_its_objects_keeps_the_port_a_later_one_moves_it():
    """The elastic PyTorchJob the frameworks' end-to-end test runs (minReplicas 2, maxReplicas 3) with --frameworks
    xgboost: the two pods it starts with get the base port; when a third joins, every pod (the third's init, the
    others' sidecars, all reading the same object) names another, which XGBoost's new tracker takes."""
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "fw", "namespace": "default"},
           "spec": {"elasticPolicy": {"minReplicas": 2, "maxReplicas": 3}, "pytorchReplicaSpecs": {
               "Worker": {"replicas": 2}}}}
    pods = examples.pytorchjob("fw", workers=3, master=False, elastic=(2, 3))
    options = Options(frameworks=FrameworkOptions(names=("xgboost",)))
    view = read(pods[0], [job], options)
    assert view.options.frameworks.first == (2, "the elastic minimum of PyTorchJob 'fw'")
    ports = {len(members): {part(render_pod(members, p["metadata"]["name"], view.options), "xgboost").port
                            for p in members} for members in (pods[:2], pods)}
    (first,), (later,) = ports[2], ports[3]
    assert first is not None and first.number == 9999 and "the job's first membership" in first.source
    assert later is not None and 9999 < later.number < 9999 + 1024 and "not the job's first membership" in later.source


# --- Trainer v2: jax_test.go, xgboost_test.go, mpi_test.go --------------------------------------------------------

def _runtime(name: str, framework: str, policy: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
            "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": framework}},
            "spec": {"mlPolicy": {"numNodes": 1, **policy}}}


def _trainjob_objects(name: str, runtime: dict[str, Any]) -> list[dict[str, Any]]:
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
              "metadata": {"name": name, "namespace": "default", "ownerReferences": [
                  {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": name, "uid": "u",
                   "controller": True}]}, "spec": {"replicatedJobs": []}}
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"runtimeRef": {"name": runtime["metadata"]["name"]}}}
    return [jobset, trainjob, runtime]


@pytest.mark.parametrize(("case", "name", "nodes"), TRAINER_JAX_CASES, ids=[c[0] for c in TRAINER_JAX_CASES])
def test_trainers_jax_values_are_the_agents(case, name, nodes):
    name = name.lower()  # no object can be named trainJob
    pods = [p for p in examples.trainjob(name, num_nodes=nodes, plugin="jax") if p["metadata"]["name"].startswith(
        f"{name}-node-")]
    view = read(pods[0], _trainjob_objects(name, _runtime("jax-distributed", "jax", {"jax": {}})), Options())
    assert dict(view.options.frameworks.implied) == {"jax": "ClusterTrainingRuntime 'jax-distributed'"}
    for index, pod in enumerate(pods):
        env = written(part(render_pod(pods, pod["metadata"]["name"], view.options), "jax"))
        assert env["JAX_NUM_PROCESSES"] == str(nodes) and env["JAX_PROCESS_ID"] == str(index)  # completion index
        assert env["JAX_COORDINATOR_ADDRESS"] == f"{name}-node-0-0.{name}:29500"


def _xgboost_pods(name: str, nodes: int, gpus: int) -> list[dict[str, Any]]:
    pods = [p for p in examples.trainjob(name, num_nodes=nodes, plugin="xgboost", workers=nodes * max(gpus, 1))
            if p["metadata"]["name"].startswith(f"{name}-node-")]
    for pod in pods:
        if gpus:
            pod["spec"]["containers"][0]["resources"]["limits"]["example.com/gpu"] = str(gpus)
    return pods


@pytest.mark.parametrize(("case", "name", "nodes", "gpus", "workers"), TRAINER_XGB_CASES,
                         ids=[c[0] for c in TRAINER_XGB_CASES])
def test_trainers_xgboost_values_are_the_agents_but_the_task_ids_with_gpus_and_the_port(case, name, nodes, gpus,
                                                                                      workers):
    """DMLC_TRACKER_URI and DMLC_NUM_WORKER agree (a worker per GPU, else one per pod). Differences: with GPUs
    Trainer's DMLC_TASK_ID is the pod's index while DMLC_NUM_WORKER counts GPUs, and the group never forms
    (measured); the agent's is the pod's first worker's id. DMLC_TRACKER_PORT is Trainer's 29500 for the job's
    first membership (as many workers as DMLC_NUM_WORKER says), and only a later one moves it by a hash of
    the members (a new tracker port with each membership)."""
    name = name.lower()
    pods = _xgboost_pods(name, nodes, gpus)
    view = read(pods[0], _trainjob_objects(name, _runtime("xgboost-distributed", "xgboost", {"xgboost": {}})),
                Options())
    for index, pod in enumerate(pods):
        rendition = part(render_pod(pods, pod["metadata"]["name"], view.options), "xgboost")
        env = written(rendition)
        assert env["DMLC_TRACKER_URI"] == f"{name}-node-0-0.{name}" and env["DMLC_NUM_WORKER"] == str(workers)
        assert env["DMLC_TASK_ID"] == str(index * max(gpus, 1))  # Trainer's: str(index)
        assert env["DMLC_TRACKER_PORT"] == "29500"  # the job's first membership: Trainer's port
        assert rendition.port is not None and "Kubeflow TrainJob (via JobSet) convention 29500" in rendition.port.source


MLX_RUNTIME = _runtime("mlx-distributed", "mlx", {"mpi": {"numProcPerNode": 1, "mpiImplementation": "OpenMPI",
                                                          "runLauncherAsNode": True}})


def test_an_mlx_runtime_implies_mlx_and_mpi_and_deepspeeds_mpi():
    pods = examples.trainjob_mpi("ds", num_nodes=3)
    view = read(pods[0], _trainjob_objects("ds", MLX_RUNTIME), Options())
    assert [name for name, _ in view.options.frameworks.implied] == ["mlx", "mpi"]
    deepspeed = _runtime("deepspeed-distributed", "deepspeed", {"mpi": {"runLauncherAsNode": True}})
    view = read(pods[0], _trainjob_objects("ds", deepspeed), Options())
    assert [name for name, _ in view.options.frameworks.implied] == ["mpi"]


def test_with_a_framework_named_the_trainjob_port_is_trainers_29500_for_jax():
    pods = examples.trainjob("llm", num_nodes=2)
    rendered = render_pod(pods, pods[1]["metadata"]["name"], Options(frameworks=FrameworkOptions(names=("jax",))))
    jax = part(rendered, "jax")
    assert jax.port is not None and jax.port.number == 29500
