"""A TrainJob on an MPI runtime: which pods are hosts, in which order, with how many slots, as Trainer decides.

Cases from kubeflow/trainer's own table, TestMPI in pkg/runtime/framework/plugins/mpi/mpi_test.go at v2.3.0
(commit 658725bdae5c7e3a0854d93ac6ff492e109a22ab): each names the runtime's MPI policy, the TrainJob's trainer
settings and the pod sets (replicated jobs) in the runtime's order, and the hostfile Trainer writes
(buildHostFileConfigMap). Names are lower-cased: Trainer's fixtures say "trainJob", which no object can be named.
The agent reads the same objects through the same steps as init (``job_reads``), then renders the launcher pod.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent import examples
from agent.core import Options, render_pod
from agent.core.controllers import JOBSET_GLOBAL_INDEX, JOBSET_JOB_INDEX, JOBSET_NAME, JOBSET_RJOB
from agent.core.model import Processes
from agent.core.plan.gang import JobView, job_reads

NAME = "trainjob"


def _pod(rjob: str, global_index: int, completion: int, hostname: str, container: str,
         resources: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {JOBSET_NAME: NAME, JOBSET_RJOB: rjob, JOBSET_JOB_INDEX: "0", JOBSET_GLOBAL_INDEX: str(global_index),
              "batch.kubernetes.io/job-completion-index": str(completion)}
    trainer = examples.trainer_container(container, cpu="4")  # 4 CPUs: Trainer's slots never follow the CPUs
    if resources:
        trainer["resources"] = {"limits": dict(resources), "requests": dict(resources)}
    pod = examples.make_pod(f"{hostname}-x{completion}", labels=labels, hostname=hostname, subdomain=NAME,
                            ip=examples.loopback_ip(global_index * 10 + completion), containers=[trainer])
    if rjob == "launcher":  # Trainer's MPI plugin mounts its hostfile in the launcher (plugins/mpi/mpi.go)
        pod["spec"]["volumes"].append(examples.trainer_hostfile_volume(NAME))
    return pod


def _objects(pod_sets: list[tuple[str, int]], mpi: dict[str, Any], trainer: dict[str, Any]) -> list[dict[str, Any]]:
    """The JobSet Trainer made (owned by the TrainJob), the TrainJob, and its ClusterTrainingRuntime."""
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
              "metadata": {"name": NAME, "namespace": "default", "ownerReferences": [
                  {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": NAME, "uid": "u",
                   "controller": True}]},
              "spec": {"replicatedJobs": [{"name": n, "replicas": 1, "template": {"spec": {"parallelism": count,
                                                                                         "completions": count}}}
                                          for n, count in pod_sets]}}
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"name": NAME, "namespace": "default"},
                "spec": {"runtimeRef": {"name": "mpi-runtime"}, "trainer": trainer}}
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
               "metadata": {"name": "mpi-runtime"},
               "spec": {"mlPolicy": {"mpi": {"mpiImplementation": "OpenMPI", **mpi}}}}
    return [jobset, trainjob, runtime]


def read(me: dict[str, Any], objects: list[dict[str, Any]], options: Options) -> tuple[list[str], JobView]:
    """Run ``job_reads`` as init does, answering each path with the object the API would return."""
    reads = job_reads(me, options)
    paths = [next(reads)]
    try:
        for obj in objects:
            paths.append(reads.send(obj))
    except StopIteration as done:
        return paths, done.value
    raise AssertionError(f"job_reads asked for more than {len(objects)} objects: {paths}")


LAUNCHER_NODE = ("launcher", 0, 0, "trainjob-launcher-0-0", "node")
LAUNCHER_OWN = ("launcher", 0, 0, "trainjob-launcher-0-0", "launcher")
CASES = [
    # (Trainer's case name, runtime mpi policy, TrainJob trainer, replicated jobs, pods, Trainer's hostfile)
    ("trainJob numNodes is respected rather than mlPolicy one",
     {"numProcPerNode": 1}, {"numNodes": 2}, [("launcher", 1), ("node", 2)],
     [LAUNCHER_OWN, ("node", 1, 0, "trainjob-node-1-0", "node"), ("node", 1, 1, "trainjob-node-1-1", "node")],
     "trainjob-node-1-0.trainjob slots=1\ntrainjob-node-1-1.trainjob slots=1\n"),
    ("trainJob numProcPerNode is respected rather than mlPolicy one",
     {"numProcPerNode": 1}, {"numNodes": 1, "numProcPerNode": 2}, [("launcher", 1), ("node", 1)],
     [LAUNCHER_OWN, ("node", 1, 0, "trainjob-node-1-0", "node")],
     "trainjob-node-1-0.trainjob slots=2\n"),
    ("numProcPerNode is set to number of GPUs in TrainJob",
     {"numProcPerNode": 1}, {"numNodes": 1}, [("launcher", 1), ("node", 1)],
     [LAUNCHER_OWN, ("node", 1, 0, "trainjob-node-1-0", "node", {"custom.com/gpu": "5"})],
     "trainjob-node-1-0.trainjob slots=5\n"),
    ("runLauncherAsNode is true",
     {"numProcPerNode": 1, "runLauncherAsNode": True}, {"numNodes": 10}, [("launcher", 1), ("node", 1)],
     [LAUNCHER_NODE, ("node", 1, 0, "trainjob-node-1-0", "node")],
     "trainjob-launcher-0-0.trainjob slots=1\ntrainjob-node-1-0.trainjob slots=1\n"),
    ("sshAuth secret already has existed in the cluster (the launcher alone is the node)",
     {"numProcPerNode": 1, "runLauncherAsNode": True}, {}, [("launcher", 1)], [LAUNCHER_NODE],
     "trainjob-launcher-0-0.trainjob slots=1\n"),
]


@pytest.mark.parametrize(("mpi", "trainer", "pod_sets", "pods", "hostfile"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_the_hostfile_lists_the_hosts_trainer_lists(mpi, trainer, pod_sets, pods, hostfile):
    built = [_pod(*p) for p in pods]
    launcher = built[0]
    paths, view = read(launcher, _objects(pod_sets, mpi, trainer), Options())
    assert paths == ["/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/trainjob",
                     "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/trainjob",
                     "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/mpi-runtime"]
    assert view.controller.key == "trainjob"
    rendered = render_pod(built, launcher["metadata"]["name"], view.options)
    assert rendered.files["hostfile"].decode() == hostfile


def test_without_runlauncherasnode_the_launcher_gets_host_lists_but_is_no_rank():
    pods = [_pod(*p) for p in CASES[0][4]]
    _, view = read(pods[0], _objects(CASES[0][3], CASES[0][1], CASES[0][2]), Options())
    env = render_pod(pods, pods[0]["metadata"]["name"], view.options).files["torch.env"].decode()
    assert "export WORLD_SIZE=" not in env and "export RANK=" not in env
    assert "export VC_NODE_HOSTS='trainjob-node-1-0.trainjob,trainjob-node-1-1.trainjob'" in env


def test_a_runtime_that_cannot_be_read_leaves_the_trainjob_defaults():
    """No RBAC for ClusterTrainingRuntimes: the runtime's GET answers None, and the launcher stays a node, as in
    Trainer's shipped DeepSpeed runtime (and offline, where nothing is read)."""
    pods = [_pod(*p) for p in CASES[3][4]]
    objects = [*_objects(CASES[3][3], CASES[3][1], CASES[3][2])[:2], None]
    _, view = read(pods[0], objects, Options())  # type: ignore[arg-type]
    assert view.options.roles is None and view.controller.training_roles(view.options) == ("node", "launcher")


def test_the_users_roles_and_slots_win_over_the_runtime():
    pods = [_pod(*p) for p in CASES[0][4]]
    _, view = read(pods[0], _objects(CASES[0][3], CASES[0][1], CASES[0][2]),
                   Options(roles=("launcher", "node"), processes=Processes(per_node=3)))
    hostfile = render_pod(pods, pods[0]["metadata"]["name"], view.options).files["hostfile"].decode()
    assert hostfile.splitlines()[0] == "trainjob-launcher-0-0.trainjob slots=3"


def test_a_plain_jobset_is_not_read_further():
    pods = examples.jobset()
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "trainer"},
              "spec": {"replicatedJobs": [{"name": "driver"}, {"name": "workers", "replicas": 2}]}}
    paths, view = read(pods[0], [jobset], Options())
    assert paths == ["/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/trainer"]
    assert view.controller.key == "jobset" and view.options == Options()


OFFLINE = [c for c in CASES if c[4][0] == LAUNCHER_OWN]


@pytest.mark.parametrize(("pods", "hostfile"), [(c[4], c[5]) for c in OFFLINE], ids=[c[0] for c in OFFLINE])
def test_offline_a_launcher_whose_container_is_launcher_is_no_host(pods, hostfile):
    """render/explain from the pods alone (no runtime read): Trainer names the launcher's container 'node' exactly
    when runLauncherAsNode is true (pkg/constants/constants.go Launcher), so a launcher running container
    'launcher' is no node, from its own pod and from every node pod. Slots follow the containers offline (the
    runtime's numProcPerNode is not read): the hosts are compared."""
    built = [_pod(*p) for p in pods]
    wanted = [line.split()[0] for line in hostfile.splitlines()]
    for pod in built:
        rendered = render_pod(built, pod["metadata"]["name"], Options())
        assert rendered.plan.controller.key == "trainjob"
        assert [line.split()[0] for line in rendered.files["hostfile"].decode().splitlines()] == wanted
        assert rendered.plan.topology.me.training == (pod is not built[0])


def test_offline_a_launcher_running_container_node_stays_a_node():
    pods = examples.trainjob_mpi(num_nodes=3)
    launcher = pods[-1]["metadata"]["name"]
    assert render_pod(pods, launcher, Options()).plan.topology.me.training


@pytest.mark.parametrize("as_node", [True, False], ids=["container node", "container launcher"])
def test_the_sidecars_planner_decides_again_when_the_launcher_arrives_after_the_nodes(as_node):
    """JobSet creates the launcher once the nodes are Ready (the runtimes' dependsOn): a node's planner that laid
    the job out without it plans from scratch, and says what build_plan says over the same pods."""
    from agent.core.plan.layout import build_plan
    from agent.core.plan.planner import Planner

    pods = examples.trainjob_mpi(num_nodes=3 if as_node else 2, launcher_as_node=as_node)
    node = pods[0]["metadata"]["name"]
    planner = Planner(Options(), node)
    nodes = {p["metadata"]["name"]: p for p in pods[:-1]}
    planner.plan(nodes)
    after = planner.plan({**nodes, pods[-1]["metadata"]["name"]: pods[-1]})
    scratch = build_plan(pods, node, Options())
    assert after.topology.training_roles == scratch.topology.training_roles
    assert [(m.name, m.training, m.node_rank) for m in after.topology.members] == \
        [(m.name, m.training, m.node_rank) for m in scratch.topology.members]
    assert ("launcher" in after.topology.training_roles) == as_node
