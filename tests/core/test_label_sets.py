"""The Node labels the published rows carry, said once per distinct set: what a reader reads back is what the
leader published, with levels and without, through the snapshot and through the journal; a 16384-pod job with
levels stays within the decoder's bounds; a forged table or index is refused in one line."""

from __future__ import annotations

import base64
import gzip
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import examples
from agent.core import Options
from agent.core.pods.placement import DEFAULT_LEVELS
from agent.core.publication.journal import PublishedState, Publisher, read_journal
from agent.core.publication.published import MAX_LABEL_SETS, SCHEMA, Col, configmap_body, decode
from agent.errors import InputError

LEVELS = DEFAULT_LEVELS[:2]


def _job(n: int, nodes: int) -> dict[str, dict]:
    pods = examples.volcano_job("demo", (("master", 1), ("worker", n - 1)))
    for i, pod in enumerate(pods):
        pod["metadata"]["resourceVersion"] = str(1000 + i)
        pod["spec"]["nodeName"] = f"node-{i % nodes}"
    return {p["metadata"]["name"]: p for p in pods}


def _as_configmap(packed: bytes) -> dict:
    return json.loads(json.dumps(configmap_body("demo-topology", packed, generation=1, leader="demo-master-0",
                                                owner=None)))


def _read_back(publisher: Publisher) -> PublishedState:
    """The snapshot as a reader reads it from the API: its bytes, its rows streamed one at a time."""
    state = PublishedState.from_configmap(_as_configmap(publisher.snapshot_packed()), pods=False)
    assert state is not None
    return state


NODE_LABELS = st.dictionaries(st.sampled_from([level.label for level in LEVELS]), st.sampled_from(["a", "b", "c"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(levels=st.booleans(), labels=st.lists(st.none() | NODE_LABELS, min_size=4, max_size=4),
       changes=st.lists(st.tuples(st.sampled_from(["move", "relabel", "leave"]), st.integers(0, 100),
                                  st.none() | NODE_LABELS), max_size=8))
def test_what_is_read_back_is_what_was_published(levels, labels, changes):
    """Snapshot (streamed, and whole) and journal: every row read equals the row published, its Node labels
    included, whatever the Nodes' labels (none, empty, shared by Nodes, changed)."""
    options = Options(address="ip", levels=LEVELS if levels else None)
    pods = _job(7, 4)
    nodes: dict[str, dict[str, str] | None] = {f"node-{i}": labels[i] for i in range(4)}
    leader = Publisher(PublishedState(job="demo", namespace="default"), options, leader="demo-master-0")
    leader.change(pods, pods, nodes, journal=False)
    leader.start_from_snapshot()
    leader.snapshot_written(leader.state.seq)
    follower = _read_back(leader)
    assert follower.rows == leader.state.rows
    assert any(row[Col.NODE_LABELS] is not None for row in follower.rows.values()) == \
        (levels and any(x is not None for x in labels))
    for what, k, new in changes:
        name = sorted(pods)[k % len(pods)]
        if what == "move" and name in pods:
            pods[name]["spec"]["nodeName"] = f"node-{k % 5}"  # node-4: a Node never read (no labels)
        elif what == "relabel":
            nodes[f"node-{k % 4}"] = new
            name = ""
        elif what == "leave":
            pods.pop(name, None)
        touched = {n for n, p in pods.items() if p["spec"]["nodeName"] == f"node-{k % 4}"} | ({name} - {""})
        leader.change(pods, touched, nodes)
        journal = read_journal({"data": json.loads(json.dumps(leader.journal_data()))})
        assert journal is not None
        if follower.apply(journal) is None:
            follower = _read_back(leader)
        assert follower.rows == leader.state.rows
        assert _read_back(leader).rows == leader.state.rows
        whole = PublishedState.from_document(decode(leader.snapshot_packed()), pods=False)
        assert whole.rows == leader.state.rows


@pytest.mark.slow
def test_a_16384_pod_snapshot_with_two_levels_is_read_back():
    """Every pod's row names its Node's labels: said per row, two levels took the snapshot past the decoder's
    bound on values, and no pod could read a topology-ordered job's publication at this size."""
    pods = _job(16384, 4096)
    nodes = {f"node-{i}": {LEVELS[0].label: f"r{i // 1024}", LEVELS[1].label: f"z{i // 64}"} for i in range(4096)}
    leader = Publisher(PublishedState(job="demo", namespace="default"), Options(address="ip", levels=LEVELS),
                       leader="demo-master-0")
    leader.change(pods, pods, nodes, journal=False)
    state = PublishedState.from_configmap(_as_configmap(leader.snapshot_packed()), pods=False, compare_only=True)
    assert state is not None and len(state.rows) == 16384


def _snapshot(table: object, index: object) -> dict:
    row = ["demo-master-0", "1", {}, {}, "", "", 0, "Running", "10.0.0.1", "", "node-0", index, [], ""]
    document = {"schema": SCHEMA, "job": "demo", "namespace": "default", "generation": 1, "containers": [{}],
                "nodeLabels": table, "pods": [row]}
    return _as_configmap(gzip.compress(json.dumps(document).encode()))


FORGED = [
    ("an index out of range", [{"zone": "a"}], 1, "Node labels index (1) is not one of the 1 in nodeLabels"),
    ("a negative index", [{"zone": "a"}], -1, "Node labels index (-1) is not one of the 1"),
    ("a boolean index", [{"zone": "a"}], True, "Node labels index (not a whole number)"),
    ("the labels in the row", [], {"zone": "a"}, "Node labels index (not a whole number)"),
    ("a huge table", [{}] * (MAX_LABEL_SETS + 1), 0, f"nodeLabels is not a list of at most {MAX_LABEL_SETS}"),
    ("a table of another type", {"0": {}}, 0, "nodeLabels is not a list"),
    ("a label set of numbers", [{"zone": 1}], 0, "nodeLabels holds a label set that is not an object of strings"),
]


@pytest.mark.parametrize(("table", "index", "says"), [f[1:] for f in FORGED], ids=[f[0] for f in FORGED])
def test_a_forged_label_table_or_index_is_refused_in_one_line(table, index, says):
    with pytest.raises(InputError, match=r"^the published topology is not valid \(.*" + says.replace("(", r"\(")
                       .replace(")", r"\)")) as refused:
        PublishedState.from_configmap(_snapshot(table, index))
    assert "\n" not in str(refused.value)
    if isinstance(table, list) and len(table) < MAX_LABEL_SETS:  # the journal's entries read them alike
        row = json.loads(json.dumps(_snapshot(table, index)))
        entry = {"gone": [], "nodeLabels": table, "seq": 1, "shapes": {},
                 "put": [json.loads(gzip.decompress(base64.b64decode(row["binaryData"]["topology.json.gz"])))
                         ["pods"][0]]}
        with pytest.raises(InputError, match=says.replace("(", r"\(").replace(")", r"\)")):
            read_journal({"data": {"changes.json": json.dumps([entry]), "base": "0", "seq": "1"}})


def test_a_valid_table_and_index_are_read():
    state = PublishedState.from_configmap(_snapshot([{"zone": "a"}], 0), pods=False)
    assert state is not None and state.node_labels() == {"node-0": {"zone": "a"}}


def test_the_leaders_table_is_cut_again_once_mostly_sets_no_row_names():
    """The leader's table only grows while its packed blocks hold indices into it; Nodes relabelled again and
    again would grow it without end. Past twice the rows it starts again (every block packed again), and what is
    read back is still what was published."""
    from unittest import mock

    from agent.core.publication import journal as journal_module

    pods = _job(7, 4)
    leader = Publisher(PublishedState(job="demo", namespace="default"), Options(address="ip", levels=LEVELS),
                       leader="demo-master-0")
    with mock.patch.object(journal_module, "BLOCK_ROWS", 2):
        for round_ in range(30):
            nodes = {f"node-{i}": {LEVELS[0].label: f"r{round_}-{i}"} for i in range(4)}
            leader.change(pods, pods, nodes)
            document = decode(leader.snapshot_packed())
            assert len(document["nodeLabels"]) <= 2 * len(pods) + 2 + 4
            assert PublishedState.from_document(document, pods=False).rows == leader.state.rows
