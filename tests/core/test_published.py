"""The published topology: the same files from the compact form, and who leads, per controller."""

from __future__ import annotations

import pytest

from agent import examples
from agent.core import Options, render_pod
from agent.core.controllers import CONTROLLERS
from agent.core.gang import Expectation
from agent.core.journal import PublishedState, Publisher
from agent.core.published import configmap_name, decode, is_leader, leader_identity, pack
from agent.errors import InputError

JOBS = [
    ("volcano", examples.volcano_job, "demo-worker-2"),
    ("pytorchjob", examples.pytorchjob, "mnist-worker-1"),
    ("trainjob", examples.trainjob, "llm-node-0-2-f59jk"),
    ("jobset", examples.jobset, "trainer-workers-1-0-5q6rr"),
    ("lws", examples.leaderworkerset, "vllm-1-2"),
    ("indexed-job", examples.indexed_job, "sweep-1-h9q5m"),
    ("mpijob", examples.mpijob, "allreduce-worker-1"),
    ("trainjob-mpi", examples.trainjob_mpi, None),
]


@pytest.mark.parametrize(("key", "build", "me"), JOBS, ids=[j[0] for j in JOBS])
@pytest.mark.parametrize("address", ["dns", "ip"])
def test_the_compact_form_renders_the_same_files(key, build, me, address):
    pods = build()
    me = me or pods[-1]["metadata"]["name"]
    for i, pod in enumerate(pods):
        pod["metadata"]["resourceVersion"] = str(100 + i)
    options = Options(address=address)
    publisher = Publisher(PublishedState(job="job", namespace="default"), options, leader=pods[0]["metadata"]["name"])
    publisher.change({p["metadata"]["name"]: p for p in pods}, [p["metadata"]["name"] for p in pods])
    data = pack(publisher.snapshot_document())
    document = decode(data)
    assert document["generation"] == 1
    compact = list(PublishedState.from_document(document).pods.values())
    mine = next(p for p in pods if p["metadata"]["name"] == me)
    from_compact = [mine if p["metadata"]["name"] == me else p for p in compact]
    assert render_pod(from_compact, me, options).files == render_pod(pods, me, options).files
    assert len(data) < 40 * len(pods) + 600  # tens of bytes per pod


def test_only_the_changed_pod_is_published_again():
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 3)))
    for i, pod in enumerate(pods):
        pod["metadata"]["resourceVersion"] = str(i + 1)
    by_name = {p["metadata"]["name"]: p for p in pods}
    publisher = Publisher(PublishedState(job="demo", namespace="default"), Options(), leader="demo-master-0")
    publisher.change(by_name, by_name)
    pods[2]["metadata"]["resourceVersion"] = "99"
    pods[2]["status"]["podIP"] = "127.1.9.9"
    entry = publisher.change(by_name, by_name)  # every name offered: only the changed row goes out
    assert entry is not None and [row[0] for row in entry.put] == [pods[2]["metadata"]["name"]]
    assert entry.put[0][8] == "127.1.9.9" and entry.gone == ()


LEADERS = [
    ("volcano", {"master": 1, "worker": 3}, None, None, ("master", (0,))),
    ("volcano", {"master": 0, "worker": 3}, None, None, ("worker", (0,))),
    ("pytorchjob", {"worker": 4}, None, ("master", "worker"), ("worker", (0,))),
    ("jobset", {"driver": 1, "workers": 4}, {"spec": {"replicatedJobs": [{"name": "driver", "replicas": 1},
                                                                         {"name": "workers", "replicas": 2}]}},
     None, ("driver", (0, 0))),
    ("jobset", {"workers": 4}, {"spec": {"replicatedJobs": [{"name": "driver", "replicas": 1},
                                                            {"name": "workers", "replicas": 2}]}},
     ("workers",), ("workers", (1, 0))),
    ("lws", {"leader": 1, "worker": 3}, None, ("leader", "worker"), ("leader", (0,))),
    ("indexed-job", None, None, None, None),
]


@pytest.mark.parametrize(("key", "per_role", "owner", "roles", "expected"), LEADERS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(LEADERS)])
def test_the_leader_is_the_pod_that_will_be_node_rank_0(key, per_role, owner, roles, expected):
    expectation = Expectation(total=sum((per_role or {}).values()), per_role=per_role, source="test")
    assert leader_identity(CONTROLLERS[key], expectation, (owner,) if owner else (), roles) == expected


def test_the_leader_agrees_with_the_ranks():
    pods = examples.jobset()
    rendered = render_pod(pods, pods[0]["metadata"]["name"], Options())
    rank0 = rendered.plan.topology.training[0]
    owner = {"spec": {"replicatedJobs": [{"name": "driver", "replicas": 1}, {"name": "workers", "replicas": 2}]}}
    leader = leader_identity(CONTROLLERS["jobset"], Expectation(5, {"driver": 1, "workers": 4}, "t"), (owner,), None)
    ident = CONTROLLERS["jobset"].identify(next(p for p in pods if p["metadata"]["name"] == rank0.name), Options())
    assert is_leader(ident, leader)


@pytest.mark.parametrize(("job", "name"), [("demo", "demo-topology"), ("vllm/1", "vllm-1-topology"),
                                           ("Big_Job", "big-job-topology")])
def test_configmap_names_are_valid_object_names(job, name):
    assert configmap_name(job) == name


def test_every_label_a_controller_reads_is_published():
    """The MPI operator's labels were missing from the compact form: every follower of a 256+ pod MPIJob failed."""
    from agent.core import controllers as c
    from agent.core.published import _row

    keys = {v for k, v in vars(c).items() if k.isupper() and isinstance(v, str) and "/" in v and not v.endswith("/")}
    assert keys - c.ALL_LABELS == set()
    pod = examples.volcano_job()[0]
    pod["metadata"]["labels"] = {key: "x" for key in keys} | {"unrelated.example.com/label": "y"}
    assert set(_row(pod, Options(), {})[2]) == keys


def test_a_forged_schema_is_shown_on_one_line():
    """Found by bench/fuzz.py --published (issue 23): the schema value was echoed raw into the refusal."""
    with pytest.raises(InputError) as refused:
        decode(pack({"schema": "worker\nHost *\n ProxyCommand x"}))
    assert "\n" not in str(refused.value) and 'has schema "worker\\nHost *' in str(refused.value)
