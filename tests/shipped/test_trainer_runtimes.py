"""The shipped Trainer runtimes (manifests/trainer): for a TrainJob of two nodes on each, the pods Trainer makes
from the runtime, read as init reads them (the JobSet, the TrainJob, the runtime), give the values docs/adopt.md
documents, runtime by runtime."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.core import render_pod
from agent.core.plan.gang import job_reads
from agent.flags.common import options_from_args
from agent.flags.parser import build_parser
from tests.manifest_pods import pods_for

ROOT = Path(__file__).resolve().parents[2]
RUNTIMES = sorted((ROOT / "manifests" / "trainer").glob("*.yaml"))
NAME = "t"  # the TrainJob
SHOWN = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "DMLC_TRACKER_URI", "DMLC_TASK_ID",
         "DMLC_NUM_WORKER", "MLX_RANK", "MLX_WORLD_SIZE", "PRTE_MCA_prte_default_hostfile")


def documented() -> dict[str, dict[str, tuple[str, ...]]]:
    text = (ROOT / "docs" / "adopt.md").read_text()
    tables: dict[str, dict[str, tuple[str, ...]]] = {}
    current = None
    for line in text.splitlines():
        heading = re.match(r"^#+ .*`manifests/trainer/([\w-]+\.yaml)`", line)
        if heading:
            current = tables.setdefault(heading.group(1), {})
        row = re.match(r"^\| ([\w-]+) \| (\w+) \| ([\d-]+) \| ([^|]*) \|$", line)
        if row and current is not None and row.group(1) != "pod":
            current[row.group(1)] = (row.group(2), row.group(3), row.group(4).strip())
    return tables


def trainers_objects(runtime: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The JobSet Trainer makes for a TrainJob of two nodes on ``runtime`` (node takes numNodes, or numNodes - 1
    beside a launcher that runs as a node: pkg/runtime/framework/plugins/mpi/mpi.go), and what init reads."""
    rjobs = copy.deepcopy(runtime["spec"]["template"]["spec"]["replicatedJobs"])
    as_node = (runtime["spec"]["mlPolicy"].get("mpi") or {}).get("runLauncherAsNode") is True
    for rjob in rjobs:
        count = 1 if rjob["name"] == "launcher" or as_node else 2
        rjob["template"]["spec"].update(parallelism=count, completions=count)
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
              "metadata": {"name": NAME, "namespace": "default", "ownerReferences": [
                  {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": NAME, "uid": "u",
                   "controller": True}]}, "spec": {"replicatedJobs": rjobs}}
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"name": NAME, "namespace": "default"},
                "spec": {"runtimeRef": {"name": runtime["metadata"]["name"]}, "trainer": {"numNodes": 2}}}
    return jobset, [jobset, trainjob, runtime]


@pytest.mark.parametrize("path", RUNTIMES, ids=[p.name for p in RUNTIMES])
def test_each_runtime_gives_the_documented_values(path):
    runtime = yaml.safe_load(path.read_text())
    jobset, objects = trainers_objects(runtime)
    pods = pods_for(jobset)
    args = next(c["args"] for c in pods[0]["spec"]["initContainers"] if c["name"] == "topology-agent")
    reads = job_reads(pods[0], options_from_args(build_parser().parse_args(args)))
    next(reads)
    with pytest.raises(StopIteration) as done:
        for obj in objects:
            reads.send(obj)
    options = done.value.value.options
    got = {}
    for pod in pods:
        rendered = render_pod(pods, pod["metadata"]["name"], options, files_dir="/shared")
        env = {v.name: v.value for v in rendered.variables if v.written and not v.unset}
        values = {v.name: v.value for r in rendered.frameworks for v in r.variables if v.written}
        shown = " ".join(f"{k}={values[k]}" for k in SHOWN if k in values) \
            or " ".join(f"{k}={env[k]}" for k in ("MASTER_ADDR", "MASTER_PORT"))  # torch.env alone
        shown_name = re.sub(r"-[a-z0-9]{5}$", "-abcde", pod["metadata"]["name"])  # a Job pod's random suffix
        got[shown_name] = (rendered.plan.topology.me.role, env.get("NODE_RANK", "-"), shown)
    assert got == documented()[path.name]
