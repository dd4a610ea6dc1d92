"""The published topology: the same files from the compact form, and who leads, per controller."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import examples
from agent.core import Options, render_pod
from agent.core.controllers import CONTROLLERS
from agent.core.jsonstream import decode_streamed
from agent.core.plan.gang import Expectation
from agent.core.publication.journal import PublishedState, Publisher
from agent.core.publication.leading import is_rank_zero, rank_zero_identity
from agent.core.publication.published import SCHEMA, configmap_name, decode, pack, pack_text
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
def test_rank_zero_is_predicted_from_the_jobs_objects(key, per_role, owner, roles, expected):
    expectation = Expectation(total=sum((per_role or {}).values()), per_role=per_role, source="test")
    assert rank_zero_identity(CONTROLLERS[key], expectation, (owner,) if owner else (), roles) == expected


def test_the_predicted_rank_zero_agrees_with_the_ranks():
    pods = examples.jobset()
    rendered = render_pod(pods, pods[0]["metadata"]["name"], Options())
    rank0 = rendered.plan.topology.training[0]
    owner = {"spec": {"replicatedJobs": [{"name": "driver", "replicas": 1}, {"name": "workers", "replicas": 2}]}}
    leader = rank_zero_identity(CONTROLLERS["jobset"], Expectation(5, {"driver": 1, "workers": 4}, "t"), (owner,), None)
    ident = CONTROLLERS["jobset"].identify(next(p for p in pods if p["metadata"]["name"] == rank0.name), Options())
    assert is_rank_zero(ident, leader)


@pytest.mark.parametrize(("job", "name"), [("demo", "demo-topology"), ("vllm/1", "vllm-1-topology"),
                                           ("Big_Job", "big-job-topology")])
def test_configmap_names_are_valid_object_names(job, name):
    assert configmap_name(job) == name


def test_every_label_a_controller_reads_is_published():
    """The MPI operator's labels were missing from the compact form: every follower of a 256+ pod MPIJob failed."""
    import importlib
    import pkgutil

    from agent.core import controllers as c
    from agent.core.publication.published import _row

    modules = [c, *(importlib.import_module(f"{c.__name__}.{m.name}") for m in pkgutil.iter_modules(c.__path__))]
    keys = {v for module in modules for k, v in vars(module).items()
            if k.isupper() and isinstance(v, str) and "/" in v and not v.endswith("/")}
    assert keys - c.ALL_LABELS == set()
    pod = examples.volcano_job()[0]
    pod["metadata"]["labels"] = {key: "x" for key in keys} | {"unrelated.example.com/label": "y"}
    assert set(_row(pod, Options(), {})[2]) == keys


def test_a_forged_schema_is_shown_on_one_line():
    """The refusal of a bad schema value quotes it escaped, never raw (a case bench/fuzz.py --published found)."""
    with pytest.raises(InputError) as refused:
        decode(pack({"schema": "worker\nHost *\n ProxyCommand x"}))
    assert "\n" not in str(refused.value) and 'has schema "worker\\nHost *' in str(refused.value)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                                 max_size=4), max_leaves=12)
HEAD = {"schema": SCHEMA, "job": "j", "namespace": "default", "generation": 3, "containers": [], "nodeLabels": []}


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(extra=st.dictionaries(st.text(max_size=6), JSON, max_size=4), rows=st.lists(JSON, max_size=5),
       indent=st.sampled_from([None, 0, 2]), order=st.randoms(), cut=st.integers(min_value=0))
def test_the_document_decodes_as_json_loads_reads_it_streamed_or_not(extra, rows, indent, order, cut):
    """decode reads the top-level object key by key (to stream the rows): whatever the key order and spacing, it
    makes what ``json.loads`` makes, and refuses what it refuses (cut short anywhere)."""
    items = [*HEAD.items(), *((k, v) for k, v in extra.items() if k not in HEAD and k != "pods"), ("pods", rows)]
    order.shuffle(items)
    text = json.dumps(dict(items), indent=indent)
    assert decode(pack_text(text)) == json.loads(text)
    seen: list = []
    headers: list = []
    header = decode(pack_text(text), lambda h: headers.append(dict(h)) or seen.append)
    assert seen == rows and header == {k: v for k, v in json.loads(text).items() if k != "pods"}
    # called once, before the rows, with at least the keys a row's check needs (the keys before the rows)
    assert len(headers) == 1 and headers[0].items() <= header.items() and set(HEAD) <= set(headers[0])
    short = text[:cut % len(text)]
    with pytest.raises(ValueError):
        json.loads(short)  # a JSON object cut short is never JSON
    with pytest.raises(InputError):
        decode(pack_text(short))
    with pytest.raises(InputError):
        decode(pack_text(short), lambda h: seen.append)


@pytest.mark.parametrize(("text", "says"), [
    ('{"schema":%s,"pods":[],"pods":[]}', "does not decode"),
    ('{"schema":%s,"job":"j","namespace":"n","generation":1,"containers":[],"nodeLabels":[],"pods":[],'
     '"generation":2}',
     "repeated after the rows"),
    ('{"schema":%s,"job":"j","namespace":"n","generation":1,"containers":[],"pods":[1 2]}', "does not decode"),
    ('{"schema":%s,"job":"j","namespace":"n","generation":1,"containers":[],"pods":[]} x', "does not decode"),
    ('{"schema":%s,"pods":{}}', "wrong type"),
])
def test_what_a_parser_would_read_two_ways_is_refused(text, says):
    with pytest.raises(InputError, match=says):
        decode(pack_text(text % json.dumps(SCHEMA)), lambda h: (lambda row: None))


STREAMED = [
    '{"a": 1, "members": [{"x": 1}, [2], "3"], "b": {"c": [4]}}',
    ' { "members" : [ ] , "a" : null } ',
    '{"a": [1, {"members": [9]}]}',  # a nested key of that name is a value like any other
    '{}',
    '{"a": 1, "a": 2, "members": [1]}',  # a key given twice keeps its last value, as json.loads
]


@pytest.mark.parametrize("text", STREAMED)
def test_a_streamed_document_reads_as_json_loads_does(text):
    got: list[object] = []
    document = decode_streamed(text, "members", got.append)
    whole = json.loads(text)
    assert got == whole.pop("members", [])
    assert document == whole


@pytest.mark.parametrize("text", ['{"members": [1], "members": [2]}', '{"members": {"a": 1}}', '[1]',
                                  '{"members": [1]} x', '{"members": [1,]}', '{"a" 1}', '{"a": NaN}',
                                  '{"a": 1,}'])
def test_a_streamed_document_refuses_what_a_parser_would_read_otherwise(text):
    with pytest.raises(ValueError):
        decode_streamed(text, "members", lambda _: None)
