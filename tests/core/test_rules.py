"""The rank, nproc, user-env, port, elastic and membership rules, one table each."""

from __future__ import annotations

import copy
import json
import subprocess

import pytest

from agent import examples
from agent.core import render_pod
from agent.core.files.rendering import shell_quote
from agent.core.model import Options, Ports, Processes
from agent.core.pods.containers import resolve_nproc
from tests.conftest import env_of, render


def one_pod_job(container, *, name="solo-0"):
    return [examples.make_pod(name, labels={"batch.kubernetes.io/job-name": "solo",
                                            "batch.kubernetes.io/job-completion-index": "0"},
                              hostname=name, subdomain="solo", ip="127.1.0.1", containers=[container])]


def container(limits=None, requests=None, env=None, ports=None, name="trainer"):
    c = {"name": name, "image": "trainer:1", "env": env or [], "resources": {}}
    if limits is not None:
        c["resources"]["limits"] = limits
    if requests is not None:
        c["resources"]["requests"] = requests
    if ports:
        c["ports"] = ports
    return c


NPROC_CASES = [
    ("flag beats everything", container({"nvidia.com/gpu": "8"}), 3, 3),
    ("user PET_NPROC_PER_NODE beats resources", container({"cpu": "16"}, env=[{"name": "PET_NPROC_PER_NODE",
                                                                              "value": "5"}]), None, 5),
    ("nvidia GPUs in limits", container({"nvidia.com/gpu": "4", "cpu": "32"}), None, 4),
    ("amd GPUs", container({"amd.com/gpu": 2}), None, 2),
    ("GPUs only in requests", container({"cpu": "8"}, {"nvidia.com/gpu": "2"}), None, 2),
    ("CPU limit 2500m rounds up to 3", container({"cpu": "2500m"}), None, 3),
    ("CPU limit 0.5 rounds up to 1", container({"cpu": "0.5"}), None, 1),
    ("CPU limit 250m is still 1", container({"cpu": "250m"}), None, 1),
    ("no limits: 1, never the host's CPU count", container(), None, 1),
    ("CPU request alone does not count", container(requests={"cpu": "8"}), None, 1),
    ("PET_NPROC_PER_NODE=auto falls through to resources", container({"cpu": "2"}, env=[
        {"name": "PET_NPROC_PER_NODE", "value": "auto"}]), None, 2),
    ("--nproc-per-node auto uses resources", container({"cpu": "6"}), "auto", 6),
]


@pytest.mark.parametrize(("c", "flag", "expected"), [x[1:] for x in NPROC_CASES], ids=[x[0] for x in NPROC_CASES])
def test_nproc_per_node(c, flag, expected):
    pod = one_pod_job(c)[0]
    count, _ = resolve_nproc(pod, c, Options(processes=Processes(per_node=flag)))
    assert count == expected
    rendered = render([pod], "solo-0", processes=Processes(per_node=flag))
    values = {v.name: v.value for v in rendered.variables}  # written or left to the user
    assert values["NPROC_PER_NODE"] == values["PET_NPROC_PER_NODE"] == values["LOCAL_WORLD_SIZE"] == str(expected)
    # one pod: the launcher-less world is that pod; the launchers' world its processes
    assert (env_of(rendered)["WORLD_SIZE"], env_of(rendered)["RANK"]) == ("1", "0")
    assert json.loads(rendered.files["topology.json"])["processes"] == expected


USER_ENV_CASES = [
    ("user MASTER_PORT is left alone and PET_MASTER_PORT follows",
     [{"name": "MASTER_PORT", "value": "12345"}], {"PET_MASTER_PORT": "12345"}, {"MASTER_PORT"}),
    ("user PET_MASTER_ADDR makes MASTER_ADDR follow",
     [{"name": "PET_MASTER_ADDR", "value": "rdzv.example"}], {"MASTER_ADDR": "rdzv.example"}, {"PET_MASTER_ADDR"}),
    ("user WORLD_SIZE is not written", [{"name": "WORLD_SIZE", "value": "99"}], {"RANK": "0"}, {"WORLD_SIZE"}),
    ("valueFrom MASTER_PORT: the alias is a shell reference",
     [{"name": "MASTER_PORT", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "port"}}}],
     {"PET_MASTER_PORT": "${MASTER_PORT}"}, {"MASTER_PORT"}),
]


@pytest.mark.parametrize(("env", "expected", "untouched"), [x[1:] for x in USER_ENV_CASES],
                         ids=[x[0] for x in USER_ENV_CASES])
def test_user_set_variables(env, expected, untouched):
    rendered = render(one_pod_job(container(env=env)), "solo-0")
    written = env_of(rendered)
    for key, value in expected.items():
        assert written[key] == value
    for key in untouched:
        assert key not in written
        var = next(v for v in rendered.variables if v.name == key)
        assert "set by user in container 'trainer': left alone" in var.source


def test_user_valuefrom_reference_expands_when_sourced(tmp_path):
    rendered = render(one_pod_job(container(env=[{"name": "MASTER_PORT", "valueFrom": {"fieldRef": {}}}])), "solo-0")
    (tmp_path / "torch.env").write_bytes(rendered.files["torch.env"])
    out = subprocess.run(["sh", "-c", f'. {tmp_path}/torch.env && echo "$PET_MASTER_PORT"'],
                         env={"MASTER_PORT": "4242", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "4242"


def test_controller_injected_variables_are_replaced_but_a_duplicated_name_is_the_users():
    pods = examples.pytorchjob(workers=1)
    env = pods[1]["spec"]["containers"][0]["env"]
    # The template had MASTER_PORT=7777; training-operator appended its own after it.
    env.insert(0, {"name": "MASTER_PORT", "value": "7777"})
    rendered = render(pods, "mnist-worker-0", processes=Processes(per_node=1))
    written = env_of(rendered)
    assert written["WORLD_SIZE"] == "2"  # injected WORLD_SIZE=2 replaced by ours (same number here)
    assert "MASTER_PORT" not in written and written["PET_MASTER_PORT"] == "7777"


MASTER_PORT_CASES = [
    ("port named pytorchjob-port", [{"name": "pytorchjob-port", "containerPort": 23456}], None, "23456"),
    ("--master-port beats the port name", [{"name": "pytorchjob-port", "containerPort": 23456}], 4000, "4000"),
    ("otherwise torchrun's 29500", [{"name": "http", "containerPort": 8080}], None, "29500"),
]


@pytest.mark.parametrize(("ports", "flag", "expected"), [x[1:] for x in MASTER_PORT_CASES],
                         ids=[x[0] for x in MASTER_PORT_CASES])
def test_master_port(ports, flag, expected):
    env = env_of(render(one_pod_job(container(ports=ports)), "solo-0", ports=Ports(master=flag)))
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == expected


def test_elastic_writes_c10d_rendezvous_at_rank0_with_own_local_addr():
    pods = examples.pytorchjob(workers=2)
    env = env_of(render(pods, "mnist-worker-1", elastic=(1, 4), ports=Ports(rdzv=29401), address="ip"))
    assert env["PET_NNODES"] == "1:4"
    assert env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"] == f"{pods[0]['status']['podIP']}:29401"
    assert env["PET_RDZV_ID"] == pods[0]["metadata"]["ownerReferences"][0]["uid"]
    assert env["PET_LOCAL_ADDR"] == pods[2]["status"]["podIP"]


def test_elastic_rdzv_id_is_the_same_on_every_pod_even_when_owners_differ():
    pods = examples.jobset()
    ids = {env_of(render(pods, p["metadata"]["name"], elastic=(2, 5)))["PET_RDZV_ID"] for p in pods}
    assert ids == {"trainer"}


def test_ipv6_master_addr_is_bare_and_rdzv_endpoint_bracketed():
    pods = examples.indexed_job(completions=2)
    for i, pod in enumerate(pods):
        pod["status"]["podIP"] = f"fd00::{i + 1}"
        pod["status"]["podIPs"] = [{"ip": f"fd00::{i + 1}"}, {"ip": f"127.1.0.{i + 1}"}]
    env = env_of(render(pods, pods[1]["metadata"]["name"], address="ip", elastic=(1, 2)))
    assert env["MASTER_ADDR"] == "fd00::1"
    assert env["PET_RDZV_ENDPOINT"] == "[fd00::1]:29400"


MEMBERSHIP_CASES = [
    ("terminating pod", {"metadata": {"deletionTimestamp": "2026-11-22T00:00:00Z"}}, "terminating"),
    ("Failed pod", {"status": {"phase": "Failed"}}, "phase Failed"),
    ("Succeeded pod", {"status": {"phase": "Succeeded"}}, "phase Succeeded"),
]


@pytest.mark.parametrize(("patch", "reason"), [x[1:] for x in MEMBERSHIP_CASES], ids=[x[0] for x in MEMBERSHIP_CASES])
def test_gone_pods_are_not_members_and_ranks_stay_contiguous(patch, reason):
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 3)))
    gone = pods[2]  # demo-worker-1
    for section, values in patch.items():
        gone[section].update(values)
    rendered = render(pods, "demo-worker-2")
    topo = rendered.plan.topology
    assert [m.name for m in topo.training] == ["demo-master-0", "demo-worker-0", "demo-worker-2"]
    assert [m.node_rank for m in topo.training] == [0, 1, 2]
    assert env_of(rendered)["WORLD_SIZE"] == "3"
    assert reason in topo.excluded[0].reason


def test_a_replacement_pod_with_the_same_index_is_no_duplicate_when_the_old_one_terminates():
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2)))
    old = copy.deepcopy(pods[1])
    old["metadata"]["name"] = "demo-worker-0-old"
    old["metadata"]["deletionTimestamp"] = "2026-11-22T00:00:00Z"
    env = env_of(render([*pods, old], "demo-worker-0"))
    assert env["NODE_RANK"] == "1"


def test_rank_order_ignores_list_order_creation_time_and_ip():
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 4)))
    shuffled = list(reversed(pods))
    for i, pod in enumerate(shuffled):
        pod["metadata"]["creationTimestamp"] = f"2026-11-22T00:00:{i:02d}Z"
        pod["status"]["podIP"] = f"127.1.0.{200 - i}"
    ranks = {p["metadata"]["name"]: env_of(render(shuffled, p["metadata"]["name"]))["NODE_RANK"] for p in pods}
    assert ranks == {"demo-master-0": "0", "demo-worker-0": "1", "demo-worker-1": "2", "demo-worker-2": "3",
                     "demo-worker-3": "4"}


def test_every_pod_agrees_on_the_topology():
    pods = examples.volcano_job()
    documents = []
    for pod in pods:
        doc = json.loads(render(pods, pod["metadata"]["name"]).files["topology.json"])
        documents.append((doc["members"], doc["masterAddr"], doc["nnodes"], doc["processes"]))
    assert all(d == documents[0] for d in documents)


def test_cluster_domain_gives_fully_qualified_names():
    env = env_of(render(examples.volcano_job(namespace="ml"), "demo-worker-0", cluster_domain="cluster.local"))
    assert env["MASTER_ADDR"] == "demo-master-0.demo.ml.svc.cluster.local"


def test_pytorchjob_dns_names_are_the_per_replica_services():
    rendered = render(examples.pytorchjob(workers=1, namespace="team"), "mnist-worker-0", cluster_domain="c.local")
    assert rendered.files["hostfile"].decode() == (
        "mnist-master-0.team.svc.c.local slots=4\nmnist-worker-0.team.svc.c.local slots=4\n"
    )


def test_hostfile_uses_slots_in_rank_order_for_training_pods_only():
    rendered = render(examples.volcano_job(), "demo-extras-0")
    assert rendered.files["hostfile"].decode() == (
        "demo-master-0.demo slots=1\ndemo-worker-0.demo slots=1\ndemo-worker-1.demo slots=1\n"
        "demo-worker-2.demo slots=1\n"
    )
    assert "slot=" not in rendered.files["hostfile"].decode().replace("slots=", "")


def test_role_host_files_follow_volcano_naming():
    pods = examples.volcano_job(tasks=(("master", 1), ("data-loader", 2)))
    files = render(pods, "demo-master-0").files
    assert files["data_loader.host"] == b"demo-data-loader-0.demo\ndemo-data-loader-1.demo\n"
    env = env_of(render(pods, "demo-master-0"))
    assert env["VC_DATA_LOADER_NUM"] == "2"


def test_heterogeneous_pods_sum_their_slots():
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 2)))
    pods[0]["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    pods[1]["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "4"}
    pods[2]["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "4"}
    rendered = render(pods, "demo-worker-1")
    env = env_of(rendered)
    assert (env["WORLD_SIZE"], env["RANK"], env["NODE_RANK"], env["NPROC_PER_NODE"]) == ("3", "2", "2", "4")
    document = json.loads(rendered.files["topology.json"])
    assert document["processes"] == 9 and [m["rank"] for m in document["members"]] == [0, 1, 5]
    assert rendered.files["hostfile"].decode().splitlines()[0].endswith("slots=1")


def test_generation_is_in_topology_json_and_torch_env():
    rendered = render_pod(examples.volcano_job(), "demo-master-0", Options(), generation=7)
    assert json.loads(rendered.files["topology.json"])["generation"] == 7
    assert "export TOPOLOGY_GENERATION='7'" in rendered.files["torch.env"].decode()


@pytest.mark.parametrize("value", ["$(rm -rf /)", "`id`", "a'b", 'x"y', "line\nbreak", "${HOME}", "; ls", "é✓"])
def test_shell_quoting_keeps_hostile_values_inert(value):
    out = subprocess.run(["sh", "-c", f"X={shell_quote(value)}; printf %s \"$X\""], capture_output=True, text=True,
                         check=True)
    assert out.stdout == value


def test_the_membership_key_projects_the_named_member_fields():
    from agent.core.files.rendering import _KEY_FIELDS
    from agent.core.model import Member

    member = Member("p", "worker", (3,), 3, "10.0.0.1", "p.svc", "10.0.0.1", True, 8, 2, 16, False, "node-a",
                    ("zone-a", "rack-1"))
    assert _KEY_FIELDS(member) == (member.name, member.role, member.address, member.training, member.slots,
                                   member.node_rank, member.running, member.node, member.domains)


@pytest.mark.parametrize("identities", [
    [(3, (3,)), (0, (0,)), (2, (2,)), (1, (1,))],  # one number per index: by the ordinals alone
    [(-1, (1, 0)), (-1, (0, 1)), (-1, (0, 0)), (-1, (1, 1))],  # a JobSet's: every ordinal -1, the index decides
    [(2, (0, 5)), (1, (1, 0)), (2, (0, 4)), (0, (9,))],  # equal ordinals among others
    [(0, (0,))],
    [],
], ids=["distinct", "jobset", "ties", "one", "none"])
def test_a_role_s_index_order_is_by_ordinal_then_index(identities):
    import random

    from agent.core.model import Member, index_order

    members = [Member(f"p-{i}", "worker", index, ordinal, f"p-{i}", None, None, True, 1)
               for i, (ordinal, index) in enumerate(identities)]
    random.Random(7).shuffle(members)
    assert index_order(members) == sorted(members, key=lambda m: (m.ordinal, m.index))
