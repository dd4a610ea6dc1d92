"""Whether a pod's own conditions say it cannot train any more: a member the API shows lost leaves the world at
once, instead of staying in it until its pod is deleted (about five minutes for a lost node: the toleration of the
``not-ready``/``unreachable`` taints) while the trainers wait in a collective.

Two signals, both written to the pod by the control plane, so they reach every reader of the pod (the sidecars that
watch the pods and, through the published rows, every follower):

- ``DisruptionTarget`` status True: the pod is about to be terminated (preempted, evicted, deleted by the taint
  manager or the pod garbage collector, or stopped by the kubelet). Any reason counts, the known ones are named.
- ``Ready`` False with no reason: the node lifecycle controller's mark on each pod of a node that stopped
  reporting (``MarkPodsNotReady`` copies the Ready condition and sets its status alone). The kubelet never writes
  Ready False without a reason (``ContainersNotReady``, ``ReadinessGatesNotReady``, ``PodCompleted``...), so a
  readiness probe failing while the trainer runs is not a lost member: the world is not reshaped, and every
  trainer restarted, because one probe flapped.

A condition cleared (DisruptionTarget False, the disruption controller's reset of a stale mark; Ready True again,
the kubelet back) makes the pod a member again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

DISRUPTION_TARGET = "DisruptionTarget"
READY = "Ready"


class DisruptionReason(NamedTuple):
    """One reason of the DisruptionTarget condition: who sets it, in plain words, and where it is defined."""

    reason: str
    meaning: str
    source: str


DISRUPTION_REASONS: tuple[DisruptionReason, ...] = (
    DisruptionReason("PreemptionByScheduler", "preempted by the scheduler",
                     "k8s.io/api core/v1/types.go PodReasonPreemptionByScheduler (v1.26+)"),
    DisruptionReason("DeletionByTaintManager", "evicted by the taint manager (a NoExecute taint on its node)",
                     "k8s.io/api core/v1/types.go PodReasonDeletionByTaintManager (v1.26+)"),
    DisruptionReason("EvictionByEvictionAPI", "evicted through the Eviction API (a drain)",
                     "k8s.io/api core/v1/types.go PodReasonEvictionByEvictionAPI (v1.26+)"),
    DisruptionReason("DeletionByPodGC", "deleted by the pod garbage collector (its node is gone)",
                     "k8s.io/api core/v1/types.go PodReasonDeletionByPodGC (v1.26+)"),
    DisruptionReason("TerminationByKubelet", "stopped by the kubelet (node pressure or node shutdown)",
                     "k8s.io/api core/v1/types.go PodReasonTerminationByKubelet (v1.26+)"),
)
_MEANINGS = {row.reason: row.meaning for row in DISRUPTION_REASONS}

NODE_LOST = ("not Ready and no kubelet said why: the node lifecycle controller marked it (its node stopped "
             "reporting)")  # kubernetes pkg/controller/util/node/controller_utils.go MarkPodsNotReady


Condition = tuple[str, str, str]  # type, status, reason
LOST = "lost: "  # how every reason of ``why_lost`` begins


def conditions_of(raw: Any) -> Iterable[Condition]:
    """A pod's ``status.conditions`` as (type, status, reason), skipping entries no reader could use (the API
    server validates them; a hand-written pod may not)."""
    if not isinstance(raw, list):
        return ()
    found = []
    for entry in raw:
        if not isinstance(entry, dict):
            continue
        kind, status, reason = entry.get("type"), entry.get("status"), entry.get("reason") or ""
        if isinstance(kind, str) and isinstance(status, str) and isinstance(reason, str):
            found.append((kind, status, reason))
    return found


def is_lost_condition(condition: Sequence[str]) -> bool:
    """A condition that, on its own, says the pod cannot train."""
    kind, status, reason = condition
    return (kind == DISRUPTION_TARGET and status == "True") or (kind == READY and status == "False" and not reason)


def lost_conditions(raw: Any) -> list[Condition]:
    """The conditions of ``status.conditions`` that say the pod is lost: all a compact pod keeps of them (the others
    change nothing any reader computes, and a readiness flap then changes no published row)."""
    return [condition for condition in conditions_of(raw) if is_lost_condition(condition)]


def why_lost(conditions: Iterable[Sequence[str]]) -> str | None:
    """Why the pod cannot train, from its conditions (None: they say nothing of the kind)."""
    node_lost = False
    for condition in conditions:
        if not is_lost_condition(condition):
            continue
        kind, _, reason = condition
        if kind == DISRUPTION_TARGET:
            meaning = _MEANINGS.get(reason)
            shown = f"{reason}: {meaning}" if meaning else (reason or "no reason given")
            return f"{LOST}DisruptionTarget ({shown})"
        node_lost = True
    return f"{LOST}{NODE_LOST}" if node_lost else None
