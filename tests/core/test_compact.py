"""A peer held as a CompactPod reads as the pod dict the published row gives, to every reader."""

from __future__ import annotations

import json

import pytest

from agent import examples
from agent.core.compact import CompactPod, node_of, phase_of, same_but_version
from agent.core.model import Options
from agent.core.pods.pod import object_name, pod_ip
from agent.core.pods.validation import check_pod
from agent.core.publication.published import Compactor, _pod_of, _row, compact_of
from agent.errors import InputError

OPTIONS = Options(address="ip")
JOBS = {
    "volcano": examples.volcano_job("demo", (("master", 1), ("worker", 3))),
    "pytorchjob": examples.pytorchjob(),
    "jobset": examples.jobset(),
    "lws": examples.leaderworkerset(),
    "trainjob-mpi": examples.trainjob_mpi(),
}


def _rows(pods: list[dict]) -> tuple[list[list], list[dict]]:
    index: dict[str, int] = {}
    rows = [json.loads(json.dumps(_row(pod, OPTIONS, index))) for pod in pods]
    shapes = [json.loads(text) for text in sorted(index, key=index.__getitem__)]
    return rows, shapes


def _terminating(pods: list[dict]) -> list[dict]:
    """The last pod terminating, without an IP: the optional fields both ways."""
    last = json.loads(json.dumps(pods[-1]))
    last["metadata"]["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    last["status"].pop("podIP", None)
    last["status"].pop("podIPs", None)
    return [*pods[:-1], last]


@pytest.mark.parametrize("key", sorted(JOBS))
def test_a_compact_pod_reads_as_its_row_as_a_dict(key):
    rows, shapes = _rows(_terminating(JOBS[key]))
    lists = [[s] if s else [] for s in shapes]
    for row in rows:
        pod, compact = _pod_of(row, shapes, "team"), compact_of(row, lists, "team")
        assert type(compact) is CompactPod
        assert compact == pod and pod == compact
        assert json.dumps(dict(compact), sort_keys=True) == json.dumps(pod, sort_keys=True)
        for part in ("metadata", "spec", "status"):
            assert compact.get(part) == pod[part] == compact[part]
        assert compact.get("kind") is None and "kind" not in compact and "spec" in compact
        with pytest.raises(KeyError):
            compact["kind"]
        assert object_name(compact) == row[0] and pod_ip(compact) == pod_ip(pod)
        assert node_of(compact) == node_of(pod) == (pod["spec"].get("nodeName") or "")
        assert phase_of(compact) == phase_of(pod) == (pod["status"].get("phase") or "")
        assert check_pod(compact) is compact


def test_the_compactor_gives_compact_pods_that_share_their_containers():
    compactor = Compactor(OPTIONS)
    held = [compactor.pod(pod) for pod in JOBS["volcano"]]
    assert all(type(pod) is CompactPod for pod in held)
    assert len({id(pod.containers) for pod in held}) == 1  # one shape: one list for every pod
    rows, shapes = _rows(JOBS["volcano"])
    assert held == [_pod_of(row, shapes, "default") for row in rows]


@pytest.mark.parametrize("field,value", [
    ("name", "other"), ("namespace", "other"), ("labels", {"a": "b"}), ("annotations", {"a": "b"}),
    ("containers", []), ("hostname", "other"), ("subdomain", "other"), ("node", "node-9"), ("phase", "Failed"),
    ("ip", "127.9.9.9"), ("deleted", "2026-11-27T00:00:00Z"), ("created", "2026-11-28T00:00:00Z"),
    ("conditions", [["DisruptionTarget", "True", "DeletionByTaintManager"]]),
])
def test_a_compact_pod_is_the_same_but_for_its_version_only_when_nothing_else_differs(field, value):
    rows, shapes = _rows(JOBS["volcano"])
    lists = [[s] if s else [] for s in shapes]
    held, again = compact_of(rows[1], lists, "default"), compact_of([*rows[1]], lists, "default")
    again.version = "999"
    assert same_but_version(held, again) and same_but_version(held, _pod_of(rows[1], shapes, "default"))
    setattr(again, field, value)
    assert not same_but_version(held, again)
    assert not same_but_version(held, dict(again))  # the generic comparison agrees


def test_a_compact_pod_marked_lost_keeps_its_creation_time():
    """A pod whose Node is lost (or back) is the same pod with other conditions: hot spares still tell it, by its
    creationTimestamp, from a pod made again in its place."""
    rows, shapes = _rows(JOBS["volcano"])
    held = compact_of(rows[1], [[s] if s else [] for s in shapes], "default")
    held.created = "2026-11-27T00:00:00Z"
    lost = held.with_conditions([["Ready", "Unknown", "NodeLost"]])
    assert lost.created == held.created and lost["metadata"]["creationTimestamp"] == "2026-11-27T00:00:00Z"
    assert lost.with_conditions([]).created == held.created and same_but_version(held, lost.with_conditions([]))


BAD_ROWS = [  # (place in the row, value): what check_pod refuses in a pod, in the row's fields
    (0, "Not_A_Name"), (0, 7), (1, 9), (2, {"a": 1}), (2, ["a"]), (3, {"a": None}), (4, "Not_A_Label"),
    (5, "a.b"), (7, 3), (8, ["127.0.0.1"]), (9, 5), (10, "Node With Spaces"),
]


@pytest.mark.parametrize("at,value", BAD_ROWS)
def test_a_compact_pod_with_a_field_of_the_wrong_shape_is_refused_as_its_dict_is(at, value):
    rows, shapes = _rows(JOBS["volcano"])
    lists = [[s] if s else [] for s in shapes]
    seen: set[int] = set()
    check_pod(compact_of(rows[0], lists, "default"), seen=seen)  # the shape is checked once: the slots alone after
    assert seen
    row = [*rows[1]]
    row[at] = value
    with pytest.raises(InputError) as dict_error:
        check_pod(_pod_of(row, shapes, "default"))
    for checked in (seen, None):
        with pytest.raises(InputError) as compact_error:
            check_pod(compact_of(row, lists, "default"), seen=checked)
        assert str(compact_error.value) == str(dict_error.value)


def test_a_compact_pod_in_a_bad_namespace_is_refused():
    rows, shapes = _rows(JOBS["volcano"])
    with pytest.raises(InputError, match=r"metadata\.namespace"):
        check_pod(compact_of(rows[1], [[s] for s in shapes], "Bad_Namespace"), seen=set())


@pytest.mark.parametrize(("read", "section", "key", "value"), [(node_of, "spec", "nodeName", "node-7"),
                                                             (phase_of, "status", "phase", "Running")],
                         ids=["node", "phase"])
def test_a_pods_node_and_phase_read_alike_from_either_form(read, section, key, value):
    pod = json.loads(json.dumps(JOBS["volcano"][1]))
    pod[section][key] = value
    rows, shapes = _rows([pod])
    compact = compact_of(rows[0], [[s] if s else [] for s in shapes], "team")
    assert read(compact) == read(pod) == value
    assert read({section: {key: 7}}) == read({section: None}) == read({}) == ""
