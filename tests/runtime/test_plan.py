"""`topology-agent plan`: for each shipped example manifest (and each shipped Trainer runtime), the files plan
renders for every pod are byte for byte the files init writes for that pod, init running for real over the
sandbox's API in memory with the same emulated pods and objects; and the command's outputs and refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.cli import run
from agent.core.controllers import job_resources
from agent.core.emulation import emulate
from agent.runtime.planning import placed_pods, plan_job, read_job
from tests.fakeapi import init_pod
from tests.jobs import ssh_secret

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
RUNTIMES = sorted((ROOT / "manifests" / "trainer").glob("*.yaml"))
PLURALS = {r.kind: f"{r.api_version.split('/')[0]}/{r.plural}" for r in job_resources()}


def trainjob_file(tmp_path: Path, runtime: Path, nodes: int = 3) -> Path:
    name = yaml.safe_load(runtime.read_text())["metadata"]["name"]
    path = tmp_path / "trainjob.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                    "metadata": {"name": "llm"},
                                    "spec": {"runtimeRef": {"name": name}, "trainer": {"numNodes": nodes}}}))
    return path


def resource(obj: dict[str, Any]) -> str:
    group_version = obj["apiVersion"]
    plural = {"Job": "jobs", "StatefulSet": "statefulsets", "Service": "services"}.get(obj["kind"]) or \
        PLURALS[obj["kind"]].split("/")[1]
    return f"{group_version}/{plural}" if "/" in group_version else f"/{group_version}/{plural}"


def init_argv(pod: dict[str, Any], secret: Path) -> list[str]:
    """The pod's own init command line but its --out (the test's directory) and SSH Secret path."""
    args = next(c["args"] for c in pod["spec"]["initContainers"] if c["name"] == "topology-agent")[1:]
    out = []
    skip = False
    for position, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == "--out":
            skip = True
        elif arg == "--ssh-secret-dir":
            out += [arg, str(secret)]
            skip = True
        elif position and args[position - 1] == "--ssh-owner":
            out.append(f"{os.getuid()}:{os.getgid()}")  # the test's own user owns the keys
        else:
            out.append(arg)
    return out


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.relative_to(directory).parts[0] != "ssh"}


CASES = [pytest.param(path, None, id=path.name) for path in EXAMPLES] + \
    [pytest.param(None, path, id=f"trainjob:{path.name}") for path in RUNTIMES]


@pytest.mark.parametrize(("manifest", "runtime"), CASES)
def test_plan_writes_what_init_writes_on_the_same_pods(manifest, runtime, memory, api, logs, tmp_path):
    filename = manifest or trainjob_file(tmp_path, runtime)
    job, runtimes = read_job(str(filename), [str(runtime)] if runtime else [], version="0.1.0")
    emulation = emulate(job, runtimes=runtimes)
    outs = tmp_path / "out"
    planned = plan_job(emulation, runtimes, files_dir=lambda pod: str(outs / "plan" / pod))
    for obj in (*runtimes, emulation.job, *emulation.owners):
        memory.create(resource(obj), "" if obj["kind"] == "ClusterTrainingRuntime" else "default", obj)
    for subdomain in {p["spec"].get("subdomain") for p in emulation.pods} - {None}:
        memory.create("/v1/services", "default", {"apiVersion": "v1", "kind": "Service",
                                                  "metadata": {"name": subdomain},
                                                  "spec": {"clusterIP": "None", "publishNotReadyAddresses": True}})
    for pod in placed_pods(emulation):
        memory.create_pod(pod)
    secret = ssh_secret(tmp_path / "secret", "ds")
    compared = 0
    for plan in planned:
        name = plan.pod["metadata"]["name"]
        assert plan.rendered is not None, name
        out = outs / "plan" / name
        ran = init_pod(api, logs, name, out, *init_argv(plan.pod, secret), resolver=lambda host: True)
        assert ran.code == 0, ran.err
        written = files_of(out)
        assert written == plan.rendered.files, name  # byte for byte, every file
        compared += 1
    assert compared == len(emulation.pods) > 0


def cli(*argv: str, capsys) -> tuple[int, str, str]:
    code = run(list(argv)).code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_plan_prints_one_row_per_pod_with_its_ranks(capsys):
    code, out, _ = cli("plan", "-f", str(ROOT / "manifests" / "examples" / "pytorchjob.yaml"), capsys=capsys)
    assert code == 0
    rows = [line.split() for line in out.splitlines()[2:6]]
    assert [tuple(r[:8]) for r in rows] == [
        ("mnist-master-0", "master", "0", "0", "4", "1", "0", "mnist-master-0"),
        ("mnist-worker-0", "worker", "1", "1", "4", "1", "1", "mnist-worker-0"),
        ("mnist-worker-1", "worker", "2", "2", "4", "1", "2", "mnist-worker-1"),
        ("mnist-worker-2", "worker", "3", "3", "4", "1", "3", "mnist-worker-2")]  # the per-pod Services' names
    assert "placeholder" not in out


def test_an_ip_address_is_marked_a_placeholder(capsys):
    code, out, _ = cli("plan", "-f", str(ROOT / "manifests" / "examples" / "elastic-pytorchjob.yaml"),
                       capsys=capsys)  # its init says --address ip
    assert code == 0
    assert "127.1.0.1*" in out and "* a placeholder: the pod's IP" in out


def test_plan_json_gives_the_same_rows(capsys):
    code, out, _ = cli("plan", "-f", str(ROOT / "manifests" / "examples" / "volcano-job.yaml"), "-o", "json",
                       capsys=capsys)
    assert code == 0
    document = json.loads(out)
    assert document["job"] == {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "demo",
                               "namespace": "default"}
    worker = next(r for r in document["pods"] if r["pod"] == "demo-worker-2")
    assert (worker["role"], worker["node_rank"], worker["rank"], worker["world_size"], worker["processes"],
            worker["process_ranks"], worker["address"], worker["placeholder"]) == \
        ("worker", 3, 3, 4, 2, [6, 7], "demo-worker-2.demo", False)
    assert "torch.env" in worker["files"] and "hostfile" in worker["files"]


def test_plan_out_writes_each_pods_files_as_init_would(tmp_path, capsys):
    manifest = ROOT / "manifests" / "examples" / "jobset.yaml"
    code, _, err = cli("plan", "-f", str(manifest), "--out", str(tmp_path / "plan"), capsys=capsys)
    assert code == 0 and "wrote the files of 5 pods" in err
    job, _ = read_job(str(manifest), [], version="0.1.0")
    plans = plan_job(emulate(job))
    assert sorted(p.name for p in (tmp_path / "plan").iterdir()) == sorted(p.pod["metadata"]["name"] for p in plans)
    for plan in plans:
        assert plan.rendered is not None
        folder = tmp_path / "plan" / plan.pod["metadata"]["name"]
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == plan.rendered.files
        assert (folder / "discover_hosts.sh").stat().st_mode & 0o111  # executable, as init writes it


def test_plan_self_prints_that_pods_explain(capsys):
    code, out, _ = cli("plan", "-f", str(ROOT / "manifests" / "examples" / "volcano-job.yaml"), "--self",
                       "demo-worker-0", capsys=capsys)
    assert code == 0
    assert out.startswith("pod 'demo-worker-0' of Volcano Job 'demo' in namespace 'default': role 'worker'")
    assert "options from its init container: init --out /shared --timeout 900" in out
    assert "replaces VC_WORKER_HOSTS=(valueFrom) injected by Volcano Job" in out  # the emulated plugin env


def test_plan_injects_a_manifest_without_the_agent_as_inject_does(tmp_path, capsys):
    from tests.runtime.test_inject import reduce_to_users_job

    job = yaml.safe_load((ROOT / "manifests" / "examples" / "jaxjob.yaml").read_text())
    bare = tmp_path / "jax.yaml"
    bare.write_text(yaml.safe_dump(reduce_to_users_job(job)))
    code, out, _ = cli("plan", "-f", str(bare), capsys=capsys)
    assert code == 0
    assert "jax-worker-2  worker  2" in out and "jax.env" in out


@pytest.mark.parametrize(("argv", "said"), [
    (["-f", "nope.yaml"], "-f nope.yaml: cannot read it"),
    (["-f", "@service"], "no job of a kind the agent knows (found Service 'x')"),
    (["-f", "@deployment"], "no job of a kind the agent knows (found Deployment 'x')"),
    (["-f", str(ROOT / "manifests" / "examples" / "pytorchjob.yaml"), "--self", "mnist-worker-9"],
     "--self mnist-worker-9: no such pod in PyTorchJob 'mnist' (its pods: mnist-master-0, mnist-worker-0"),
    (["-f", str(ROOT / "manifests" / "examples" / "pytorchjob.yaml"), "-o", "yaml"],
     "--output 'yaml' must be one of: table, json"),
], ids=["missing file", "no job", "unknown kind", "pod not in the job", "bad output"])
def test_bad_input_is_one_line_and_a_non_zero_exit(argv, said, tmp_path, capsys):
    service = tmp_path / "service.yaml"
    service.write_text("apiVersion: v1\nkind: Service\nmetadata: {name: x}\n")
    deployment = tmp_path / "deployment.yaml"
    deployment.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {}\n")
    files = {"@service": str(service), "@deployment": str(deployment)}
    code, out, err = cli("plan", *[files.get(a, a) for a in argv], capsys=capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and said in err, err


def test_a_trainjob_alone_runs_on_the_shipped_runtime_it_names(tmp_path, capsys):
    path = trainjob_file(tmp_path, ROOT / "manifests" / "trainer" / "jax-distributed-topology.yaml", nodes=2)
    code, out, _ = cli("plan", "-f", str(path), capsys=capsys)
    assert code == 0
    assert "llm-node-0-1-" in out and "jax.env" in out
    path.write_text(path.read_text().replace("jax-distributed-topology", "my-runtime"))
    code, _, err = cli("plan", "-f", str(path), capsys=capsys)
    assert code == 2 and "ClusterTrainingRuntime 'my-runtime' is not given" in err
