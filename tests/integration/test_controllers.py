"""The sandbox playing the controllers (``topology-agent sandbox --controllers``): a job applied with kubectl gets
the emulation's objects and pods, placed on the sandbox's Nodes and running at loopback IPs; a patch of its
replicas adds or removes pods and keeps the others; a delete removes everything it owned; ``topology-agent
status`` names every pod. One row per controller, each from its shipped example manifest."""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.core.emulation import emulate
from agent.sandbox.threaded import SandboxThread

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "manifests" / "examples"
NAMESPACE = "team-a"
PODS = "/v1/pods"
MADE = ("batch/v1/jobs", "jobset.x-k8s.io/v1alpha2/jobsets", "apps/v1/statefulsets")
TRAINJOB = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "llm"},
            "spec": {"runtimeRef": {"name": "torch-distributed-topology"},
                     "trainer": {"numNodes": 3, "image": "trainer:1", "command": ["torchrun", "train.py"]}}}


@dataclass(frozen=True)
class Row:
    manifest: str  # a file of manifests/examples, or "trainjob" (TRAINJOB on the shipped runtime)
    resource: str  # the job object's store key
    kubectl_kind: str
    name: str
    pods: int  # as applied
    scale: tuple[tuple[str, int], ...]  # the fields a scale sets: JSON pointer, what is added to the value there
    up: tuple[int, int]  # (value, pods) after scaling up
    down: tuple[int, int]  # (value, pods) after scaling down


ROWS = {
    "volcano": Row("volcano-job.yaml", "batch.volcano.sh/v1alpha1/jobs", "vcjob", "demo", 6,
                   (("/spec/tasks/1/replicas", 0), ("/spec/minAvailable", 3)), (5, 8), (1, 4)),
    "pytorchjob": Row("pytorchjob.yaml", "kubeflow.org/v1/pytorchjobs", "pytorchjob", "mnist", 4,
                      (("/spec/pytorchReplicaSpecs/Worker/replicas", 0),), (5, 6), (1, 2)),
    "tfjob": Row("tfjob.yaml", "kubeflow.org/v1/tfjobs", "tfjob", "mnist-tf", 4,
                 (("/spec/tfReplicaSpecs/Worker/replicas", 0),), (4, 6), (1, 3)),
    "xgboostjob": Row("xgboostjob.yaml", "kubeflow.org/v1/xgboostjobs", "xgboostjob", "xgb", 3,
                      (("/spec/xgbReplicaSpecs/Worker/replicas", 0),), (4, 5), (1, 2)),
    "paddlejob": Row("paddlejob.yaml", "kubeflow.org/v1/paddlejobs", "paddlejob", "paddle", 3,
                     (("/spec/paddleReplicaSpecs/Worker/replicas", 0),), (5, 5), (2, 2)),
    "jaxjob": Row("jaxjob.yaml", "kubeflow.org/v1/jaxjobs", "jaxjob", "jax", 3,
                  (("/spec/jaxReplicaSpecs/Worker/replicas", 0),), (4, 4), (2, 2)),
    "mpijob": Row("mpijob.yaml", "kubeflow.org/v2beta1/mpijobs", "mpijob", "allreduce", 4,
                  (("/spec/mpiReplicaSpecs/Worker/replicas", 0),), (5, 6), (1, 2)),
    "jobset": Row("jobset.yaml", "jobset.x-k8s.io/v1alpha2/jobsets", "jobset", "trainer", 5,
                  (("/spec/replicatedJobs/1/replicas", 0),), (3, 7), (1, 3)),
    "lws": Row("leaderworkerset.yaml", "leaderworkerset.x-k8s.io/v1/leaderworkersets", "leaderworkerset", "vllm", 8,
               (("/spec/replicas", 0),), (3, 12), (1, 4)),
    "indexed-job": Row("indexed-job.yaml", "batch/v1/jobs", "job.batch", "sweep", 3,
                       (("/spec/parallelism", 0), ("/spec/completions", 0)), (4, 4), (2, 2)),
    "trainjob": Row("trainjob", "trainer.kubeflow.org/v1alpha1/trainjobs", "trainjob", "llm", 3,
                    (("/spec/trainer/numNodes", 0),), (4, 4), (2, 2)),
}


@pytest.fixture
def played(tmp_path):
    with SandboxThread(tmp_path / "sandbox", bookmark_interval=0.5, controllers=True, nodes=4) as running:
        yield running


def _kubectl(sandbox: SandboxThread, *args: str, input: str | None = None) -> str:
    result = subprocess.run(["kubectl", "--kubeconfig", str(sandbox.sandbox.kubeconfig), *args],
                            capture_output=True, text=True, input=input, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _apply(sandbox: SandboxThread, row: Row) -> None:
    if row.manifest == "trainjob":
        _kubectl(sandbox, "apply", "-f", str(ROOT / "manifests" / "trainer" / "torch-distributed-topology.yaml"))
        _kubectl(sandbox, "apply", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump(TRAINJOB))
    else:
        _kubectl(sandbox, "apply", "-n", NAMESPACE, "-f", str(EXAMPLES / row.manifest))


def _snapshot(store: Any) -> dict[str, dict[tuple[str, str], dict[str, Any]]]:
    """Every object of the kinds the test reads, copied in the sandbox's thread."""
    keep = (PODS, "/v1/nodes", *MADE, *(r.resource for r in ROWS.values()),
            "trainer.kubeflow.org/v1alpha1/clustertrainingruntimes")
    found: dict[str, dict[tuple[str, str], dict[str, Any]]] = {resource: {} for resource in keep}
    for (resource, namespace, name), obj in store.objects.items():
        if resource in found:
            found[resource][(namespace, name)] = copy.deepcopy(obj)
    return found


def _controller(obj: dict[str, Any]) -> str | None:
    return next((r["uid"] for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")), None)


def _members(objects: dict[str, Any], job_uid: str) -> list[dict[str, Any]]:
    """The pods whose chain of controlling owners leads to the job."""
    by_uid = {o["metadata"]["uid"]: o for kind in objects.values() for o in kind.values()}
    members = []
    for pod in objects[PODS].values():
        uid = _controller(pod)
        while uid is not None and uid != job_uid:
            uid = _controller(by_uid[uid]) if uid in by_uid else None
        if uid == job_uid:
            members.append(pod)
    return sorted(members, key=lambda p: p["metadata"]["name"])


def _settled(sandbox: SandboxThread, row: Row, count: int, gone: str = "") -> dict[str, Any]:
    """The objects once the job has ``count`` pods, every one of them Running, none with uid ``gone`` (awaited on
    the store's events)."""
    def test(store: Any) -> dict[str, Any] | None:
        objects = _snapshot(store)
        job = objects[row.resource].get((NAMESPACE, row.name))
        if job is None:
            return None
        pods = _members(objects, job["metadata"]["uid"])
        if len(pods) == count and all(p["status"].get("phase") == "Running" and p["metadata"]["uid"] != gone
                                      for p in pods):
            return objects
        return None

    return sandbox.wait_for(PODS, test)  # type: ignore[no-any-return]


def _unplaced(pod: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A pod without what the API server, the scheduler and the kubelet add, keyed by its generateName (a Job's
    pods get a random suffix) or its name; its owners by kind and name (``_members`` follows their uids)."""
    pod = copy.deepcopy(pod)
    meta = pod["metadata"]
    for key in ("uid", "resourceVersion", "creationTimestamp", "namespace"):
        meta.pop(key, None)
    if meta.get("generateName"):
        meta.pop("name", None)
    for ref in meta.get("ownerReferences") or []:
        ref.pop("uid", None)
    pod["spec"].pop("nodeName", None)
    pod.pop("status", None)
    return meta.get("generateName") or meta["name"], pod


def _check(objects: dict[str, Any], row: Row, running: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The pods are the emulation's, each placed on a Node at a loopback IP of its podCIDR, Running and Ready; a
    pod of ``running`` (made before a scale) is kept as it was, as a controller leaves a running pod alone (its
    env may name the old size)."""
    job = objects[row.resource][(NAMESPACE, row.name)]
    runtimes = list(objects["trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"].values())
    made = emulate(job, runtimes=runtimes)
    pods = _members(objects, job["metadata"]["uid"])
    earlier = {p["metadata"]["uid"]: _unplaced(p) for p in running}
    wanted = dict(map(_unplaced, made.pods))
    assert {key for key, _ in map(_unplaced, pods)} == set(wanted)
    for pod in pods:
        key, shown = _unplaced(pod)
        assert shown == (earlier[pod["metadata"]["uid"]][1] if pod["metadata"]["uid"] in earlier else wanted[key])
    by_uid = {o["metadata"]["uid"]: o for kind in objects.values() for o in kind.values()}
    for owner in made.owners:  # the intermediate objects, each owned as the emulation says
        stored = next(o for resource in MADE for o in objects[resource].values()
                      if o["metadata"]["name"] == owner["metadata"]["name"] and o["kind"] == owner["kind"])
        assert [(r["kind"], r["name"]) for r in stored["metadata"]["ownerReferences"]] == \
            [(r["kind"], r["name"]) for r in owner["metadata"]["ownerReferences"]]
        assert all((by_uid[r["uid"]]["kind"], by_uid[r["uid"]]["metadata"]["name"]) == (r["kind"], r["name"])
                   for r in stored["metadata"]["ownerReferences"])
    nodes = {name: node for (_, name), node in objects["/v1/nodes"].items()}
    ips = set()
    for pod in pods:
        status = pod["status"]
        node = nodes[pod["spec"]["nodeName"]]
        host = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
        ip = ipaddress.ip_address(status["podIP"])
        assert ip.is_loopback and ip in ipaddress.ip_network(node["spec"]["podCIDR"])
        assert status["hostIP"] == host and ipaddress.ip_address(host).is_loopback
        assert status["podIPs"] == [{"ip": status["podIP"]}]
        assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
        assert [c["name"] for c in status["containerStatuses"]] == [c["name"] for c in pod["spec"]["containers"]]
        assert all(c["ready"] and "running" in c["state"] for c in status["containerStatuses"])
        ips.add(status["podIP"])
    assert len(ips) == len(pods)
    return pods


def _status(sandbox: SandboxThread, name: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "TOPOLOGY_"))}
    result = subprocess.run([sys.executable, "-m", "agent.cli", "status", name, "-n", NAMESPACE, "--kubeconfig",
                             str(sandbox.sandbox.kubeconfig)], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _scale(sandbox: SandboxThread, row: Row, value: int) -> None:
    patch = [{"op": "replace", "path": path, "value": value + offset} for path, offset in row.scale]
    _kubectl(sandbox, "patch", row.kubectl_kind, row.name, "-n", NAMESPACE, "--type=json", "-p", json.dumps(patch))


@pytest.mark.parametrize("key", list(ROWS))
def test_a_job_applied_with_kubectl_gets_its_controllers_pods_placed_replaced_scaled_and_deleted(played, key):
    row = ROWS[key]
    _kubectl(played, "create", "namespace", NAMESPACE)
    _apply(played, row)
    pods = _check(_settled(played, row, row.pods), row)
    shown = _status(played, row.name)
    assert all(p["metadata"]["name"] in shown for p in pods), shown
    described = _kubectl(played, "describe", "pod", pods[0]["metadata"]["name"], "-n", NAMESPACE)
    assert f"Node:             {pods[0]['spec']['nodeName']}/" in described and "Scheduled" in described

    lost = pods[-1]  # deleted: the controller makes it again, a new pod with a new uid
    _kubectl(played, "delete", "pod", lost["metadata"]["name"], "-n", NAMESPACE)
    pods = _check(_settled(played, row, row.pods, gone=lost["metadata"]["uid"]), row, pods[:-1])

    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    _scale(played, row, row.up[0])
    grown = _check(_settled(played, row, row.up[1]), row, pods)
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in grown}.items() >= before.items()  # kept as they run
    _scale(played, row, row.down[0])
    shrunk = _check(_settled(played, row, row.down[1]), row, grown)
    assert {p["metadata"]["name"] for p in shrunk} < {p["metadata"]["name"] for p in grown}

    _kubectl(played, "delete", row.kubectl_kind, row.name, "-n", NAMESPACE)

    def gone(store: Any) -> bool:
        return not any(res in (PODS, *MADE) and ns == NAMESPACE for res, ns, _ in store.objects)

    assert played.wait_for(PODS, gone)


def test_without_controllers_a_job_object_makes_no_pods_and_no_nodes(tmp_path):
    with SandboxThread(tmp_path / "sandbox", bookmark_interval=0.5) as plain:
        _kubectl(plain, "apply", "-f", str(EXAMPLES / "pytorchjob.yaml"))
        assert _kubectl(plain, "get", "pods", "-o", "name") == ""
        assert _kubectl(plain, "get", "nodes", "-o", "name") == ""


def test_the_command_plays_the_controllers_on_the_nodes_asked_for(tmp_path):
    """``topology-agent sandbox --controllers --nodes 3``: three Nodes with hostname, zone and rack labels, and a job
    applied to it runs spread over them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "TOPOLOGY_"))}
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "sandbox", "--controllers", "--nodes", "3",
                             "--state-dir", str(tmp_path / "state")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        kubeconfig = proc.stdout.readline().strip().removeprefix("export KUBECONFIG=")

        def kubectl(*args: str) -> str:
            result = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, *args], capture_output=True, text=True,
                                    timeout=60)
            assert result.returncode == 0, result.stderr
            return result.stdout

        nodes = kubectl("get", "nodes", "-L", "kubernetes.io/hostname,topology.kubernetes.io/zone,example.com/rack",
                        "--no-headers").split("\n")
        assert [line.split()[0::5][:1] + line.split()[-3:] for line in nodes if line] == [
            ["node-0", "node-0", "zone-a", "rack-a"], ["node-1", "node-1", "zone-a", "rack-a"],
            ["node-2", "node-2", "zone-a", "rack-b"]]
        kubectl("apply", "-f", str(EXAMPLES / "pytorchjob.yaml"))
        deadline = time.monotonic() + 30  # another process: its pods are read until all four run
        while len(placed := [p for p in json.loads(kubectl("get", "pods", "-o", "json"))["items"]
                             if p["status"].get("phase") == "Running"]) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sorted(p["spec"]["nodeName"] for p in placed) == ["node-0", "node-0", "node-1", "node-2"]
    finally:
        proc.terminate()
        proc.communicate(timeout=15)


def _walkthrough() -> list[str]:
    """docs/sandbox.md's block that starts a sandbox playing the controllers, line by line, comments dropped."""
    text = (ROOT / "docs" / "sandbox.md").read_text()
    block = next(b for b in re.findall(r"```sh\n(.*?)```", text, re.S)
                 if b.startswith("topology-agent sandbox --controllers"))
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_walkthrough_of_docs_sandbox_runs_as_written(tmp_path):
    """Each line of the walkthrough as a user types it (the state directory moved into the test's): the job's pods
    run on the Nodes, init writes one pod's files, status and describe show them, a patch adds two workers, and a
    delete leaves no pod."""
    lines = [line.replace("/tmp/played", str(tmp_path / "played")) for line in _walkthrough()]
    start, export, *commands = lines
    assert start.endswith("&") and export == f"export KUBECONFIG={tmp_path / 'played' / 'kubeconfig'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "TOPOLOGY_", "POD_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    proc = subprocess.Popen(["bash", "-c", "exec " + start.removesuffix("&")], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        printed = [proc.stdout.readline().strip(), proc.stdout.readline().strip()]
        assert printed[1] == export, printed
        env["KUBECONFIG"] = export.removeprefix("export KUBECONFIG=")
        outputs = []
        for command in commands:
            run = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=ROOT, env=env, capture_output=True,
                                 text=True, timeout=90)
            assert run.returncode == 0, f"{command}\n{run.stdout}{run.stderr}"
            outputs.append((command, run.stdout, run.stderr))
    finally:
        proc.terminate()
        proc.communicate(timeout=15)
    shown = dict((c, out) for c, out, _ in outputs)
    nodes = shown["kubectl get nodes -L topology.kubernetes.io/zone -L example.com/rack"]
    assert re.search(r"^node-3 +Ready .* zone-a +rack-b$", nodes, re.M), nodes
    pods = [c for c, _, _ in outputs if c == "kubectl get pods -n team-a"]
    assert len(pods) == 2
    wide = shown["kubectl get pods -n team-a -o wide"]
    assert len(re.findall(r"^mnist-\S+ +1/1 +Running +0 +\S+ +127\.10\.\d+\.1 +node-\d ", wide, re.M)) == 4, wide
    init = next(c for c, _, _ in outputs if " init " in c)
    assert "export WORLD_SIZE='4'" in (tmp_path / "played" / "mnist-worker-0" / "torch.env").read_text(), init
    status = shown["topology-agent status mnist -n team-a"]
    assert "4 of 4 training pods placed, world size 4" in status
    assert all(f"mnist-{p}" in status for p in ("master-0", "worker-0", "worker-1", "worker-2")), status
    described = shown["kubectl describe pod mnist-worker-0 -n team-a"]
    assert re.search(r"^Node: +node-\d/127\.0\.1\.\d$", described, re.M) and "GangComplete" in described, described
    after_patch, after_delete = (out for c, out, _ in outputs if c == "kubectl get pods -n team-a")
    assert len(re.findall(r"^mnist-worker-\d +1/1 +Running", after_patch, re.M)) == 5, after_patch
    assert after_delete == "" and "No resources found" in outputs[-1][2]


def test_nodes_made_by_hand_give_their_pods_loopback_addresses_from_one_pool(tmp_path):
    """A Node without a podCIDR, or with one outside 127.0.0.0/8 (a real cluster's), never gives its pods another
    address: they come from the pool, 127.1.0.1 and up, and the host's address is loopback too."""
    from agent import examples

    with SandboxThread(tmp_path / "sandbox", bookmark_interval=0.5, controllers=True, nodes=0) as sandbox:
        sandbox.create_node(examples.node("rack-node", {examples.RACK: "rack-a"}))
        sandbox.create_node({**examples.node("cloud-node", {examples.RACK: "rack-b"}),
                             "spec": {"podCIDR": "10.244.1.0/24"}})
        _kubectl(sandbox, "apply", "-f", str(EXAMPLES / "pytorchjob.yaml"))

        def placed(store: Any) -> list[dict[str, Any]] | None:
            pods = [copy.deepcopy(p) for p in store.list(PODS, "default")]
            return pods if len(pods) == 4 and all(p["status"].get("podIP") for p in pods) else None

        pods = sandbox.wait_for(PODS, placed)
    assert sorted((p["spec"]["nodeName"], p["status"]["podIP"], p["status"]["hostIP"]) for p in pods) == [
        ("cloud-node", "127.1.0.1", "127.0.0.1"), ("cloud-node", "127.1.0.3", "127.0.0.1"),
        ("rack-node", "127.1.0.2", "127.0.0.1"), ("rack-node", "127.1.0.4", "127.0.0.1")]


def test_an_emulation_with_new_uids_and_pod_suffixes_each_time_is_reconciled_without_duplicates(played, monkeypatch):
    """A controller's owners keep the uid they were stored with and a Job's pods carry a random suffix: a
    reconcile whose emulation gives new owner uids and new pod names (with the same generateName) keeps what
    runs, creates only what is missing, and the new pods name the stored owners."""
    import uuid

    from agent.sandbox import controllers

    def fresh(job: dict[str, Any], **kwargs: Any) -> Any:
        made = emulate(job, **kwargs)
        renamed = {o["metadata"]["uid"]: str(uuid.uuid4()) for o in made.owners}

        def redone(obj: dict[str, Any]) -> dict[str, Any]:
            obj = copy.deepcopy(obj)
            meta = obj["metadata"]
            meta["uid"] = renamed.get(meta.get("uid"), meta.get("uid"))
            for ref in meta.get("ownerReferences") or []:
                ref["uid"] = renamed.get(ref["uid"], ref["uid"])
            if obj["kind"] == "Pod":
                meta["generateName"] = meta["name"].rsplit("-", 1)[0] + "-"
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            return obj

        return dataclasses.replace(made, owners=tuple(map(redone, made.owners)), pods=tuple(map(redone, made.pods)))

    monkeypatch.setattr(controllers, "emulate", fresh)
    row = ROWS["jobset"]
    _kubectl(played, "create", "namespace", NAMESPACE)
    _apply(played, row)
    first = _members(_settled(played, row, 5), _job_uid(played, row))
    _scale(played, row, 3)
    settled = _settled(played, row, 7)
    grown = _members(settled, _job_uid(played, row))
    assert {p["metadata"]["uid"] for p in first} < {p["metadata"]["uid"] for p in grown}
    assert len(settled[PODS]) == 7  # no pod beside the job's, none owned by an owner that is not stored


def _job_uid(sandbox: SandboxThread, row: Row) -> str:
    return sandbox.wait_for(row.resource, lambda store: store.get(row.resource, NAMESPACE, row.name)["metadata"]["uid"])


def test_a_job_the_emulation_cannot_read_gets_a_warning_event_and_the_next_job_its_pods(played):
    """A TrainJob whose runtime is not there makes no pods: a Warning Event says why, and the controllers go on."""
    _kubectl(played, "apply", "-f", "-", input=yaml.safe_dump(TRAINJOB))
    _kubectl(played, "apply", "-f", str(EXAMPLES / "pytorchjob.yaml"))
    played.wait_for(PODS, lambda store: ("/v1/pods", "default", "mnist-worker-2") in store.objects)
    events = _kubectl(played, "get", "events", "--field-selector", "involvedObject.name=llm,type=Warning")
    assert re.search(r"FailedCreate +trainjob/llm +the sandbox cannot make this job's pods: \w+", events), events
    assert "llm" not in _kubectl(played, "get", "pods", "-o", "name")
