"""TrainJobs in the sandbox: the job's objects (JobSet, TrainJob, runtime) decide the roles, and a replicated job
that others depend on never waits for them.

The runtime has the shape of Trainer v2.3.0's shipped DeepSpeed runtime (kubeflow/trainer
manifests/base/runtimes/deepspeed_distributed.yaml at v2.3.0): mlPolicy.mpi with runLauncherAsNode true, replicated
job ``node`` (sshd), then ``launcher`` with ``dependsOn: [{name: node, status: Ready}]``, so JobSet creates the
launcher's pod only once every node pod is Ready, which needs their init containers to finish first.
"""

from __future__ import annotations

import json
from pathlib import Path

from agent import examples
from tests.integration.conftest import finish, start_init
from tests.jobs import name_of


def test_a_trainjob_on_the_shipped_runtime_changes_only_its_runtime_ref(sandbox, kubectl, tmp_path):
    """manifests/trainer's runtime applied with kubectl; a TrainJob names it and nothing else of the agent; its
    pods, made by Trainer and JobSet from the runtime's template, run init as the runtime injects it."""
    import yaml

    root = Path(__file__).resolve().parents[2]
    kubectl("apply", "-f", str(root / "manifests" / "trainer" / "torch-distributed-topology.yaml"))
    runtime = json.loads(kubectl("get", "clustertrainingruntime", "torch-distributed-topology", "-o",
                                 "json").stdout)
    template = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "llm"},
                "spec": {"runtimeRef": {"name": "torch-distributed-topology"},  # the one line
                         "trainer": {"numNodes": 3, "image": "trainer:1", "command": ["torchrun", "train.py"]}}}
    kubectl("apply", "-f", "-", input=yaml.safe_dump(trainjob))
    uid = json.loads(kubectl("get", "trainjob", "llm", "-o", "json").stdout)["metadata"]["uid"]
    sandbox.create("jobset.x-k8s.io/v1alpha2/jobsets", "default", {  # what Trainer makes of the two
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "llm", "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1",
                                                         "kind": "TrainJob", "name": "llm", "uid": uid,
                                                         "controller": True}]},
        "spec": {"replicatedJobs": [{"name": "node", "replicas": 1,
                                     "template": {"spec": {"parallelism": 3, "completions": 3,
                                                           "template": template}}}]}})
    pods = [p for p in examples.trainjob("llm", 3) if p["metadata"]["labels"][
        "jobset.sigs.k8s.io/replicatedjob-name"] == "node"]
    for pod in pods:  # the runtime's pod spec, with Trainer's node container (image, command, PET_* env)
        node = {**pod["spec"]["containers"][0], "volumeMounts": template["spec"]["containers"][0]["volumeMounts"]}
        pod["spec"] = {**template["spec"], "containers": [node], "hostname": pod["spec"].get("hostname"),
                       "subdomain": pod["spec"].get("subdomain")}
        pod["metadata"]["annotations"].update(template["metadata"]["annotations"])
        sandbox.create_pod(pod)
    init_args = template["spec"]["initContainers"][0]["args"]
    assert init_args[:3] == ["init", "--out", "/shared"]
    extra = [a for a in init_args[3:] if a != "--wait-dns"]  # no cluster DNS here: peers are found by IP
    procs = {name_of(p): start_init(sandbox, name_of(p), tmp_path / name_of(p), *extra, "--address", "ip",
                                    "--timeout", "30") for p in pods}
    for name, proc in procs.items():
        code, err = finish(proc, timeout=60)
        assert code == 0, err
        env = (tmp_path / name / "torch.env").read_text()
        assert "export WORLD_SIZE=" in env and "export NNODES='3'" in env
    ranks = sorted(int(dict(line.split("=", 1) for line in (tmp_path / n / "torch.env").read_text()
                            .replace("export ", "").replace("'", "").splitlines() if "=" in line)["NODE_RANK"])
                   for n in procs)
    assert ranks == [0, 1, 2]
