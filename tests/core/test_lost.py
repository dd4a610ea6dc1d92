"""Which pod conditions make a member lost (core/pods/lost.py), read the same from the pod, its published row and the
compact pod the sidecars hold: the publisher and a small job's sidecar apply one rule, and a follower applies it
to the rows."""

from __future__ import annotations

import copy
import json

import pytest

from agent import examples
from agent.core.model import Options
from agent.core.plan.facts import Memo, why_not_member
from agent.core.pods.lost import (
    DISRUPTION_REASONS,
    NODE_TAINTS,
    lost_nodes,
    node_state,
    why_lost,
    why_node_lost,
    with_node_lost,
)
from agent.core.pods.validation import check_pod
from agent.core.publication.published import Compactor, _pod_of, _row, check_row

OPTIONS = Options(address="ip")
POD = examples.volcano_job("demo", (("master", 1), ("worker", 1)))[1]
NODE_LOST = ("lost: not Ready and no kubelet said why: the node lifecycle controller marked it (its node stopped "
             "reporting)")


def condition(kind: str, status: str, reason: str | None = None) -> dict:
    return {"type": kind, "status": status, **({"reason": reason} if reason is not None else {}),
            "lastTransitionTime": "2026-11-22T01:00:00Z", "message": "as the control plane writes it"}


KUBELET_READY = [condition("PodScheduled", "True"), condition("Initialized", "True"),
                 condition("ContainersReady", "True"), condition("Ready", "True")]

CASES = [
    *(pytest.param([*KUBELET_READY, condition("DisruptionTarget", "True", row.reason)],
                   f"lost: DisruptionTarget ({row.reason}: {row.meaning})", id=row.reason)
      for row in DISRUPTION_REASONS),
    pytest.param([condition("DisruptionTarget", "True", "SomeFutureReason")],
                 "lost: DisruptionTarget (SomeFutureReason)", id="a-reason-not-in-the-table"),
    pytest.param([condition("DisruptionTarget", "True")], "lost: DisruptionTarget (no reason given)",
                 id="no-reason"),
    pytest.param([condition("DisruptionTarget", "False", "EvictionByEvictionAPI")], None,
                 id="cleared-by-the-disruption-controller"),
    pytest.param([*KUBELET_READY[:3], condition("Ready", "False")], NODE_LOST, id="marked-by-the-node-controller"),
    pytest.param([condition("Ready", "False", "")], NODE_LOST, id="empty-reason"),
    pytest.param([condition("Ready", "False", "ContainersNotReady")], None, id="readiness-probe-failing"),
    pytest.param([condition("Ready", "False", "ReadinessGatesNotReady")], None, id="readiness-gate"),
    pytest.param([condition("Ready", "False", "ContainersNotInitialized")], None, id="still-initializing"),
    pytest.param([condition("Ready", "Unknown")], None, id="ready-unknown"),
    pytest.param(KUBELET_READY, None, id="ready"),
    pytest.param("not a list", None, id="conditions-not-a-list"),
    pytest.param([7, {"type": 1, "status": "True"}, {"type": "DisruptionTarget"}], None, id="odd-entries"),
]


def forms(conditions: object) -> list:
    """The pod as the API gives it, as a published row gives it, and as the sidecars hold it."""
    pod = copy.deepcopy(POD)
    pod["metadata"]["resourceVersion"] = "7"
    pod["status"]["conditions"] = conditions
    index: dict[str, int] = {}
    row = json.loads(json.dumps(_row(pod, OPTIONS, index)))
    check_row(row, len(index))
    shapes = [json.loads(text) for text in sorted(index, key=index.__getitem__)]
    return [pod, _pod_of(row, shapes, "default"), Compactor(OPTIONS).pod(pod)]


@pytest.mark.parametrize(("conditions", "why"), CASES)
def test_a_pods_conditions_say_whether_it_is_lost_in_every_form(conditions, why):
    for form in forms(conditions):
        assert why_not_member(form) == why
        check_pod(form)


@pytest.mark.parametrize(("conditions", "why"), CASES)
def test_a_row_keeps_only_the_conditions_that_say_lost(conditions, why):
    """A readiness flap changes no published row: followers hear nothing of it."""
    _, from_row, compact = forms(conditions)
    plain = forms(KUBELET_READY)[1]
    if why is None:
        assert from_row == plain and compact == plain
    else:
        assert from_row["status"]["conditions"] and compact == from_row


def test_terminating_and_finished_say_so_before_a_condition():
    pod = copy.deepcopy(POD)
    pod["status"]["conditions"] = [condition("DisruptionTarget", "True", "EvictionByEvictionAPI")]
    pod["metadata"]["deletionTimestamp"] = "2026-11-22T01:00:05Z"
    assert why_not_member(pod) == "terminating (deletionTimestamp is set)"


def node(ready: str | None, *taints: tuple[str, str], name: str = "n3") -> dict:
    """A Node as the API server gives it (the fields around those read included)."""
    conditions = [{"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready, "reason": "KubeletReady",
                           "lastHeartbeatTime": "2026-11-22T01:00:00Z"})
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {"taints": [{"key": k, "effect": e, "timeAdded": "2026-11-22T01:00:00Z"} for k, e in taints]},
            "status": {"conditions": conditions, "images": [{"names": ["x"], "sizeBytes": 1}]}}


UNREACHABLE, NOT_READY = (taint.key for taint in NODE_TAINTS)
NODE_CASES = [
    pytest.param(node("True"), None, id="ready"),
    pytest.param(node("False"), "node n3 NotReady", id="kubelet-says-not-ready"),
    pytest.param(node("Unknown"), "node n3 Unknown (its kubelet stopped reporting)", id="stopped-reporting"),
    pytest.param(node("Unknown", (UNREACHABLE, "NoExecute"), (UNREACHABLE, "NoSchedule")),
                 "node n3 Unknown (its kubelet stopped reporting)", id="unknown-and-tainted: the condition first"),
    pytest.param(node("True", (UNREACHABLE, "NoExecute")), "node n3 tainted node.kubernetes.io/unreachable:NoExecute",
                 id="unreachable-noexecute"),
    pytest.param(node("True", (UNREACHABLE, "NoSchedule")),
                 "node n3 tainted node.kubernetes.io/unreachable:NoSchedule", id="unreachable-noschedule"),
    pytest.param(node("True", (NOT_READY, "NoExecute")), "node n3 tainted node.kubernetes.io/not-ready:NoExecute",
                 id="not-ready-noexecute"),
    pytest.param(node("True", (NOT_READY, "NoSchedule")), "node n3 tainted node.kubernetes.io/not-ready:NoSchedule",
                 id="not-ready-noschedule"),
    pytest.param(node("True", (NOT_READY, "PreferNoSchedule")), None, id="prefer-no-schedule"),
    pytest.param(node("True", ("node.kubernetes.io/unschedulable", "NoSchedule")), None, id="cordoned"),
    pytest.param(node("True", ("node.kubernetes.io/memory-pressure", "NoSchedule")), None, id="memory-pressure"),
    pytest.param(node(None), None, id="no-ready-condition-yet"),
    pytest.param({"metadata": {"name": "n3"}, "spec": None, "status": {"conditions": "odd"}}, None, id="odd-fields"),
]


@pytest.mark.parametrize(("raw", "why"), NODE_CASES)
def test_a_nodes_ready_condition_and_taints_say_whether_its_pods_are_lost(raw, why):
    state = node_state(raw)
    assert state is not None and state.name == "n3"
    assert why_node_lost(state) == why
    assert lost_nodes([state]) == ({"n3": why} if why else {})


@pytest.mark.parametrize("raw", [None, [], {"metadata": {}}, {"metadata": {"name": ""}}, {"metadata": "n3"}])
def test_an_object_without_a_nodes_name_is_no_node(raw):
    assert node_state(raw) is None


@pytest.mark.parametrize(("raw", "why"), [case for case in NODE_CASES if case.values[1] is not None])
def test_a_pod_on_a_lost_node_is_lost_in_every_form_and_back_when_its_node_is(raw, why):
    """The sidecar that watches the Nodes marks the pod (Compactor.lost_nodes); its published row carries the mark
    and a follower's pod from the row says the same; the mark taken off, the pod is a member again."""
    pod = copy.deepcopy(POD)
    pod["metadata"]["resourceVersion"] = "7"
    pod["spec"]["nodeName"] = "n3"
    compactor = Compactor(OPTIONS)
    compactor.lost_nodes = lost_nodes([node_state(raw)])
    held = compactor.pod(pod)
    index: dict[str, int] = {}
    row = json.loads(json.dumps(_row(held, OPTIONS, index)))
    check_row(row, len(index))
    shapes = [json.loads(text) for text in sorted(index, key=index.__getitem__)]
    for form in (held, _pod_of(row, shapes, "default")):
        assert why_not_member(form) == f"lost: {why}"
        check_pod(form)
    assert why_not_member(held.with_conditions(with_node_lost(held.conditions, None))) is None
    compactor.lost_nodes = {"another-node": "node another-node NotReady"}
    assert why_not_member(compactor.pod(pod)) is None


def test_a_disruption_target_says_more_than_the_node():
    conditions = with_node_lost([["DisruptionTarget", "True", "DeletionByTaintManager"]], "node n3 NotReady")
    assert why_lost(conditions).startswith("lost: DisruptionTarget (DeletionByTaintManager")
    assert why_lost(with_node_lost([], "node n3 NotReady")) == "lost: node n3 NotReady"


def test_the_facts_of_a_pod_its_node_marks_are_not_those_remembered_for_its_resource_version():
    """The mark comes at the same resourceVersion: the planner's memo must not answer with the facts before it."""
    pod = copy.deepcopy(POD)
    pod["metadata"]["resourceVersion"] = "7"
    pod["spec"]["nodeName"] = "n3"
    held = Compactor(OPTIONS).pod(pod)
    marked = held.with_conditions(with_node_lost((), "node n3 NotReady"))
    assert Memo.key(held) != Memo.key(marked) and Memo.key(marked)[0] == Memo.key(held)[0]
    as_dict = copy.deepcopy(pod)
    as_dict["status"]["conditions"] = marked["status"]["conditions"]
    assert Memo.key(as_dict) == Memo.key(marked)
