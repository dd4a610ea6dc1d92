"""Pods as each controller release really writes them (agent.core.injected): the agent replaces what the
controller wrote and keeps what the user wrote. Each case names the issue-11 bug it pins."""

from __future__ import annotations

import json
import re

import pytest

from agent import examples
from agent.core import Options, render_pod
from agent.core.files.variables import warnings_for
from agent.core.injected import RELEASES, ROWS, controller_entries, injected_env
from agent.core.model import Ports
from tests.conftest import env_of


def _render(pods, name, **options):
    return render_pod(pods, name, Options(**options))


@pytest.mark.parametrize("release", ["v1.7.0", "v1.8.0", "v1.9.0"])
def test_pytorchjob_pet_master_vars_follow_address_ip_and_master_port(release):
    # PET_MASTER_ADDR/PET_MASTER_PORT, injected since v1.7, are the operator's, not the user's.
    pods = examples.pytorchjob(release=release)
    env = env_of(_render(pods, "mnist-worker-1", address="ip", ports=Ports(master=12345)))
    master_ip = examples.loopback_ip(0)
    assert (env["MASTER_ADDR"], env["PET_MASTER_ADDR"]) == (master_ip, master_ip)
    assert (env["MASTER_PORT"], env["PET_MASTER_PORT"]) == ("12345", "12345")


@pytest.mark.parametrize("release", ["v1.7.0", "v1.9.0"])
def test_pytorchjob_node_rank_after_a_worker_left_is_below_nnodes(release):
    # The injected PET_NODE_RANK (index + 1) is the operator's: kept as user-set it would give NODE_RANK=3 of 3.
    pods = [p for p in examples.pytorchjob(release=release) if p["metadata"]["name"] != "mnist-worker-1"]
    env = env_of(_render(pods, "mnist-worker-2"))
    assert (env["NODE_RANK"], env["PET_NODE_RANK"], env["NNODES"], env["PET_NNODES"]) == ("2", "2", "3", "3")


def test_a_user_variable_just_before_the_operators_block_stays_the_users():
    pods = examples.pytorchjob(release="v1.6.0")
    trainer = pods[2]["spec"]["containers"][0]
    block = controller_entries("pytorchjob", trainer["env"])
    trainer["env"].insert(min(block), {"name": "PET_NODE_RANK", "value": "7"})  # v1.6 writes no PET_NODE_RANK
    rendered = _render(pods, pods[2]["metadata"]["name"])
    node_rank = next(v for v in rendered.variables if v.name == "PET_NODE_RANK")
    assert not node_rank.written and "set by user" in node_rank.source


def test_a_users_own_copy_of_an_injected_name_is_kept():
    pods = examples.pytorchjob(release="v1.9.0")
    trainer = pods[1]["spec"]["containers"][0]
    trainer["env"].insert(0, {"name": "MASTER_PORT", "value": "31000"})  # the template's, before the block
    env = env_of(_render(pods, pods[1]["metadata"]["name"]))
    assert "MASTER_PORT" not in env and env["PET_MASTER_PORT"] == "31000"


def test_trainjob_master_port_is_trainers_29500_and_its_auto_is_not_called_the_users():
    # Trainer's ContainerTrainerPort is 29500 in every v2 release; its injected 'auto' is Trainer's.
    pods = examples.trainjob(num_nodes=2)
    rendered = _render(pods, "llm-node-0-1-8mkv7")
    env = env_of(rendered)
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "29500"
    nproc = next(v for v in rendered.variables if v.name == "PET_NPROC_PER_NODE")
    assert "user" not in nproc.source and "injected by Kubeflow TrainJob" in nproc.source


def test_an_elastic_pytorchjob_stays_elastic_without_the_elastic_option():
    # PET_NNODES=MIN:MAX and PET_RDZV_* are injected by the operator: the job stays elastic without --elastic.
    pods = examples.pytorchjob("elastic", workers=3, master=False, elastic=(2, 4))
    env = env_of(_render(pods, "elastic-worker-1"))
    assert env["PET_NNODES"] == "2:4" and env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"].startswith("elastic-worker-0")
    assert "NNODES" not in env or env["NNODES"] == "3"


def test_a_user_world_size_that_contradicts_the_world_is_kept_and_warned_about():
    # The user wins, and explain and init say so.
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2)), cpu="2")
    # The user wrote the processes (3 pods x cpu 2); torch.env's WORLD_SIZE counts the pods.
    pods[1]["spec"]["containers"][0]["env"].insert(0, {"name": "WORLD_SIZE", "value": "6"})
    pods[1]["spec"]["containers"][0]["env"].append({"name": "WORLD_SIZE", "value": "6"})
    rendered = _render(pods, "demo-worker-0")
    assert "WORLD_SIZE" not in env_of(rendered)
    assert any("WORLD_SIZE=6" in w and "WORLD_SIZE=3" in w for w in warnings_for(rendered.plan, rendered.variables))


@pytest.mark.parametrize("controller", sorted(RELEASES))
def test_every_release_of_the_table_has_rows_with_a_cited_source(controller):
    for release in RELEASES[controller]:
        rows = [r for r in ROWS if r.controller == controller and release in r.releases]
        assert rows and all(re.match(r"[\w.-]+/[\w.-]+ pkg/\S+\.go", r.source) for r in rows), release


@pytest.mark.parametrize("release", RELEASES["pytorchjob"])
def test_the_whole_operator_block_is_recognised_in_every_release(release):
    features = {"master", "nprocPerNode"}
    facts = {"port": 1, "master": "m", "replicas": 2, "world": 2, "rank": 1, "nproc": "1"}
    block = injected_env("pytorchjob", release, features, facts)
    env = [{"name": "USER_A", "value": "1"}, *block]
    assert controller_entries("pytorchjob", env) == set(range(1, len(env)))


PLUGIN_ORDERS = [("pytorch", "svc", "env"), ("env", "svc", "pytorch"), ("svc", "pytorch", "env"),
                 ("svc", "env", "pytorch"), ("env", "pytorch", "svc"), ("pytorch", "env", "svc")]


@pytest.mark.parametrize("order", PLUGIN_ORDERS, ids=["-".join(o) for o in PLUGIN_ORDERS])
def test_volcano_svc_host_lists_are_volcanos_and_replaced_in_any_plugin_order(order):
    # VC_<TASK>_HOSTS/_NUM come from the svc plugin's ConfigMap: they are Volcano's, not the user's.
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2), ("extras", 1)), plugins=order)
    rendered = _render(pods, "demo-worker-1")
    env = env_of(rendered)
    assert env["VC_WORKER_HOSTS"] == "demo-worker-0.demo,demo-worker-1.demo" and env["VC_WORKER_NUM"] == "2"
    hosts = next(v for v in rendered.variables if v.name == "VC_WORKER_HOSTS")
    assert "replaces VC_WORKER_HOSTS=(valueFrom) injected by Volcano Job" in hosts.source
    assert (env["RANK"], env["WORLD_SIZE"]) == ("2", "3")


@pytest.mark.parametrize("plugins", [("svc", "env"), ("env",), ()])
def test_a_users_single_rank_in_a_volcano_job_without_the_pytorch_plugin_is_kept(plugins):
    # Without the pytorch plugin, a single RANK is the user's: it is kept, not overwritten.
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2)), plugins=plugins,
                                user_env=[{"name": "RANK", "value": "5"}])
    rendered = _render(pods, "demo-worker-0")
    rank = next(v for v in rendered.variables if v.name == "RANK")
    assert not rank.written and rank.value == "5" and "set by user" in rank.source


def test_a_users_rank_before_the_pytorch_block_is_kept_and_volcanos_replaced_elsewhere():
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2)), user_env=[{"name": "WORLD_SIZE", "value": "6"}])
    rendered = _render(pods, "demo-worker-0")
    assert "WORLD_SIZE" not in env_of(rendered) and env_of(rendered)["RANK"] == "1"


def test_volcano_injected_training_variables_are_unset_in_a_non_training_task():
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 1), ("extras", 1)), plugins=("env", "pytorch", "svc"))
    rendered = _render(pods, "demo-extras-0")
    unset = {v.name for v in rendered.variables if v.unset}
    assert unset == {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE"}


@pytest.mark.parametrize("release", RELEASES["lws"])
def test_lws_variables_are_the_webhooks_in_every_release(release):
    pods = examples.leaderworkerset(size=2, groups=1, release=release)
    trainer = pods[1]["spec"]["containers"][0]
    assert controller_entries("lws", trainer["env"]) == set(range(len(trainer["env"])))


def test_a_trainjob_on_an_mpi_runtime_is_one_world_from_every_pod():
    # The launcher (container "node" in replicated job "launcher") is the TrainJob's, like its 2 node pods: taken
    # for a plain JobSet it would make its own 3-node world on port 29500.
    pods = examples.trainjob_mpi(num_nodes=3)
    views = {}
    for pod in pods:
        rendered = _render(pods, pod["metadata"]["name"])
        assert rendered.plan.controller.key == "trainjob"
        env = env_of(rendered)
        views[pod["metadata"]["name"]] = (env["NNODES"], env["MASTER_ADDR"], env["MASTER_PORT"], env["NODE_RANK"])
    assert {v[:3] for v in views.values()} == {("3", "ds-node-0-0.ds", "29500")}
    assert sorted(v[3] for v in views.values()) == ["0", "1", "2"]
    launcher = next(n for n in views if "launcher" in n)
    assert views[launcher][3] == "2"  # after the node pod set, as Trainer's hostfile lists it


@pytest.mark.slow
def test_torch_env_of_a_4096_plus_4096_pod_job_stays_small_and_bash_sources_and_execs_it(tmp_path):
    # Volcano's VC_WORKER_HOSTS alone would be ~180 KB at 4096 pods with --cluster-domain, past what
    # ". torch.env && exec torchrun" can pass ("Argument list too long").
    import subprocess

    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 4095), ("extras", 4096)))
    rendered = render_pod(pods, "demo-worker-7", Options(cluster_domain="cluster.local"),
                          files_dir=str(tmp_path))
    text = rendered.files["torch.env"]
    assert len(text) <= 64 * 1024
    for name, data in rendered.files.items():
        (tmp_path / name).write_bytes(data)
    run = subprocess.run(["bash", "-c", f". {tmp_path}/torch.env && exec env"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    env = dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)
    assert env["WORLD_SIZE"] == "4096" and env["VC_EXTRAS_NUM"] == "4096"
    assert "VC_WORKER_HOSTS" not in env
    workers = (tmp_path / "worker.host").read_text().splitlines()
    assert env["VC_WORKER_HOSTS_FILE"] == str(tmp_path / "worker.host") and len(workers) == 4095
    assert workers[0] == "demo-worker-0.demo.default.svc.cluster.local"
    assert env["VC_MASTER_HOSTS"] == "demo-master-0.demo.default.svc.cluster.local"  # short lists stay


ACCELERATOR_CASES = [
    ("nvidia.com/mig-3g.20gb", "2", 2), ("nvidia.com/mig-1g.5gb", "7", 7), ("amd.com/gpu", "8", 8),
    ("habana.ai/gaudi", "8", 8), ("gpu.intel.com/i915", "2", 2), ("gpu.intel.com/xe", "4", 4),
    ("aws.amazon.com/neuroncore", "32", 32), ("google.com/tpu", "4", 4), ("nvidia.com/gpu.shared", "1", 1),
]


@pytest.mark.parametrize(("resource", "quantity", "nproc"), ACCELERATOR_CASES, ids=[c[0] for c in ACCELERATOR_CASES])
def test_processes_follow_the_accelerator_not_the_cpu_limit(resource, quantity, nproc):
    # A Gaudi pod with cpu 32 runs a process per accelerator, not per CPU; MIG, Intel, Neuron and TPU likewise.
    pods = examples.indexed_job(completions=2)
    for pod in pods:
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        limits.update({"cpu": "32", resource: quantity})
    rendered = _render(pods, pods[1]["metadata"]["name"])
    assert env_of(rendered)["NPROC_PER_NODE"] == str(nproc)
    assert env_of(rendered)["WORLD_SIZE"] == "2"  # two pods: a trainer without a launcher runs one process each
    assert json.loads(rendered.files["topology.json"])["processes"] == 2 * nproc


def test_an_unknown_extended_resource_is_named_in_explain_never_silently_ignored():
    pods = examples.indexed_job(completions=2)
    for pod in pods:
        pod["spec"]["containers"][0]["resources"]["limits"].update({"cpu": "4", "example.com/npu": "2"})
    rendered = _render(pods, pods[0]["metadata"]["name"])
    nproc = next(v for v in rendered.variables if v.name == "NPROC_PER_NODE")
    assert nproc.value == "4" and "example.com/npu not counted: not a known accelerator" in nproc.source


def test_docs_variables_md_holds_the_injection_table_made_from_the_rows():
    from pathlib import Path

    from agent.core.injected import injection_table_markdown

    doc = (Path(__file__).resolve().parents[2] / "docs" / "variables.md").read_text()
    assert injection_table_markdown() in doc, (
        "regenerate: python -c 'from agent.core.injected import injection_table_markdown as t; print(t())'")


def test_with_address_ip_a_non_training_pod_without_ip_is_left_out_until_it_has_one():
    # Decided (docs/variables.md): listed once addressed; the same pods always give the same files.
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 1), ("extras", 2)))
    extras = pods[3]
    ip = extras["status"].pop("podIP")
    extras["status"].pop("podIPs")
    rendered = _render(pods, "demo-worker-0", address="ip")
    assert env_of(rendered)["VC_EXTRAS_NUM"] == "1"
    assert [e.reason for e in rendered.plan.topology.excluded] == ["no IP yet (--address ip), not a training pod"]
    extras["status"].update(podIP=ip, podIPs=[{"ip": ip}])
    env = env_of(_render(pods, "demo-worker-0", address="ip"))
    assert env["VC_EXTRAS_NUM"] == "2" and ip in env["VC_EXTRAS_HOSTS"]
