"""Under torchrun's c10d rendezvous the agent's ranks are torch's: c10d numbers its nodes in the sorted order of
their ``_NodeDesc(addr, pid, local_id)`` (torch 2.13, torch/distributed/elastic/rendezvous/dynamic_rendezvous.py,
``_mark_rendezvous_complete``), ``addr`` being torchrun's ``--local-addr``: the agent's ``PET_LOCAL_ADDR``. Pods
at 127.0.0.12, 127.0.0.3 and 127.0.0.101 (index 0, 1, 2) sort as strings to .101, .12, .3: torch's GROUP_RANK of
pod 0, 1, 2 is 1, 2, 0. The static rendezvous keeps the controller's order."""

from __future__ import annotations

import json

import pytest

from agent import examples
from agent.core.files.variables import warnings_for
from agent.core.model import Options, Processes
from agent.core.publication.view_choice import C10D_VIEW, choose_view
from agent.trainer import domain_groups
from tests.conftest import env_of, render

ADDRESSES = ("127.0.0.12", "127.0.0.3", "127.0.0.101")  # by index; as strings .101 < .12 < .3
TORCH_GROUP_RANK = (1, 2, 0)  # sorted(_NodeDesc(addr, ...)): what torchrun gives each pod, by index


def at_addresses(pods: list[dict], addresses=ADDRESSES) -> list[dict]:
    """The pods, the i-th training pod at ``addresses[i]`` (with --address ip, what the agent writes)."""
    for pod, address in zip(pods, addresses, strict=True):
        pod["status"].update(podIP=address, podIPs=[{"ip": address}])
    return pods


def elastic_pytorchjob() -> list[dict]:
    """An elastic PyTorchJob: training-operator wrote PET_NNODES=2:4 into every pod (no --elastic needed)."""
    return at_addresses(examples.pytorchjob("el", workers=3, master=False, elastic=(2, 4)))


def volcano_workers() -> list[dict]:
    return at_addresses(examples.volcano_job("vc", tasks=(("worker", 3),)))


def trainjob() -> list[dict]:
    """A TrainJob's node pods (its finished dataset initializer left out)."""
    return at_addresses([p for p in examples.trainjob("llm", num_nodes=3) if "-node-" in p["metadata"]["name"]])


def user_env(pods: list[dict], name: str, value: str) -> list[dict]:
    for pod in pods:
        pod["spec"]["containers"][0].setdefault("env", []).insert(0, {"name": name, "value": value})
    return pods


IP = {"address": "ip", "processes": Processes(per_node=1)}
C10D_CASES = [
    ("an elastic PyTorchJob's PET_NNODES=MIN:MAX", elastic_pytorchjob, IP),
    ("--elastic on a Volcano job", volcano_workers, {**IP, "elastic": (1, 4)}),
    ("--elastic on a TrainJob", trainjob, {**IP, "elastic": (2, 3)}),
    ("the user's PET_RDZV_BACKEND=c10d, fixed size", lambda: user_env(volcano_workers(), "PET_RDZV_BACKEND", "c10d"),
     IP),
    ("--rank-order topology asked for", elastic_pytorchjob, {**IP, "rank_order": "topology"}),
]
STATIC_CASES = [
    ("a fixed-size PyTorchJob", lambda: at_addresses(examples.pytorchjob("st", workers=3, master=False)), IP),
    ("a fixed-size Volcano job", volcano_workers, IP),
    ("the user's PET_RDZV_BACKEND=static under --elastic",
     lambda: user_env(volcano_workers(), "PET_RDZV_BACKEND", "static"), {**IP, "elastic": (1, 4)}),
]


def names(pods: list[dict]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


@pytest.mark.parametrize(("make", "options"), [c[1:] for c in C10D_CASES], ids=[c[0] for c in C10D_CASES])
def test_c10d_node_ranks_are_torchs_group_ranks(make, options):
    pods = make()
    for index, name in enumerate(names(pods)):
        env = env_of(render(pods, name, **options))
        torch_rank = TORCH_GROUP_RANK[index]
        assert (env["NODE_RANK"], env["RANK"]) == (str(torch_rank), str(torch_rank)), name
        assert env["MASTER_ADDR"] == "127.0.0.101"  # torchrun's workers get c10d rank 0's local address
        assert "PET_NODE_RANK" not in env  # c10d ignores --node-rank, and torchrun warns on every other pod
        assert env["PET_LOCAL_ADDR"] == ADDRESSES[index]  # what c10d sorts: what the agent ordered by


@pytest.mark.parametrize(("make", "options"), [c[1:] for c in C10D_CASES], ids=[c[0] for c in C10D_CASES])
def test_c10d_topology_json_lists_members_in_torchs_order(make, options):
    pods = make()
    document = json.loads(render(pods, names(pods)[0], **options).files["topology.json"])
    members = [(m["name"], m["nodeRank"], m["rank"]) for m in document["members"] if m["training"]]
    by_rank = sorted(range(3), key=TORCH_GROUP_RANK.__getitem__)
    assert members == [(names(pods)[i], TORCH_GROUP_RANK[i], TORCH_GROUP_RANK[i]) for i in by_rank]
    assert document["topology"]["rankOrder"] == "c10d"


@pytest.mark.parametrize(("make", "options"), [c[1:] for c in STATIC_CASES], ids=[c[0] for c in STATIC_CASES])
def test_static_rendezvous_keeps_the_controllers_order(make, options):
    pods = make()
    for index, name in enumerate(names(pods)):
        env = env_of(render(pods, name, **options))
        assert (env["NODE_RANK"], env["PET_NODE_RANK"]) == (str(index), str(index)), name
        assert env["MASTER_ADDR"] == ADDRESSES[0]


def test_the_rendezvous_endpoint_stays_on_the_first_pod_by_index():
    """c10d's rank 0 moves to any pod that joins with a lower address; an endpoint that moved with it would send
    the new pod to a store of its own. Every pod names the first pod by index, as in a static job."""
    pods = elastic_pytorchjob()
    for name in names(pods):
        assert env_of(render(pods, name, **IP))["PET_RDZV_ENDPOINT"] == "127.0.0.12:23456"


def test_a_controllers_pet_node_rank_is_unset_under_c10d():
    """Trainer v2 writes PET_NODE_RANK (the completion index) into every node pod: under c10d torch.env unsets it."""
    pods = trainjob()
    rendered = render(pods, names(pods)[1], **IP, elastic=(2, 3))
    unset = [v for v in rendered.variables if v.name == "PET_NODE_RANK"]
    assert [v.unset for v in unset] == [True]
    assert "unset PET_NODE_RANK\n" in rendered.files["torch.env"].decode()
    static = env_of(render(trainjob(), names(pods)[1], **IP))
    assert static["PET_NODE_RANK"] == "1"


def test_topology_order_under_c10d_warns_and_keeps_c10ds_order():
    pods = elastic_pytorchjob()
    rendered = render(pods, names(pods)[0], **IP, rank_order="topology")
    warnings = warnings_for(rendered.plan, rendered.variables)
    assert [w for w in warnings if w.startswith("--rank-order topology not applied: torchrun's c10d")], warnings
    assert env_of(rendered)["NODE_RANK"] == "1"


def test_pods_sharing_an_address_under_c10d_are_named():
    pods = at_addresses(examples.pytorchjob("el", workers=3, master=False, elastic=(2, 4)),
                        ("127.0.0.7", "127.0.0.7", "127.0.0.2"))
    rendered = render(pods, "el-worker-0", **IP)
    warnings = [w for w in warnings_for(rendered.plan, rendered.variables) if "c10d tells them apart" in w]
    assert len(warnings) == 1 and "'el-worker-0', 'el-worker-1'" in warnings[0]
    assert [m.name for m in rendered.plan.topology.training] == ["el-worker-2", "el-worker-0", "el-worker-1"]


def test_the_users_pet_local_addr_is_kept_with_a_warning():
    pods = user_env(elastic_pytorchjob(), "PET_LOCAL_ADDR", "10.0.0.9")
    rendered = render(pods, "el-worker-0", **IP)
    assert any(w.startswith("PET_LOCAL_ADDR=10.0.0.9 set by the user is kept: c10d orders")
               for w in warnings_for(rendered.plan, rendered.variables))


def test_groups_by_node_hold_torchs_global_ranks():
    """agent.trainer's groups from topology.json: two processes per pod, pods 0 and 1 on node-a, pod 2 on
    node-b. torch's global ranks: pod 2 (rank 0) holds 0-1, pod 0 holds 2-3, pod 1 holds 4-5."""
    pods = elastic_pytorchjob()
    for pod, node in zip(pods, ("node-a", "node-a", "node-b"), strict=True):
        pod["spec"]["nodeName"] = node
    rendered = render(pods, names(pods)[0], address="ip", processes=Processes(per_node=2))
    document = json.loads(rendered.files["topology.json"])
    assert domain_groups(document, "node") == [[0, 1], [2, 3, 4, 5]]


def test_a_c10d_job_writes_every_member():
    """The summary's runs are runs of consecutive indices; c10d's ranks are not: every pod writes every member."""
    pods = elastic_pytorchjob()
    plan = render(pods, names(pods)[0], **IP).plan
    assert choose_view(plan, Options(**IP), ssh=False, published=True) == C10D_VIEW
