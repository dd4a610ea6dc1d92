"""Which pod conditions make a member lost (core/lost.py), read the same from the pod, its published row and the
compact pod the sidecars hold: the publisher and a small job's sidecar apply one rule, and a follower applies it
to the rows."""

from __future__ import annotations

import copy
import json

import pytest

from agent import examples
from agent.core.facts import why_not_member
from agent.core.lost import DISRUPTION_REASONS
from agent.core.model import Options
from agent.core.published import Compactor, _pod_of, _row, check_row
from agent.core.validation import check_pod

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
