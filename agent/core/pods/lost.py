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

A third signal is the pod's Node, where the agent may read Nodes: its Ready condition False or Unknown, or a
``node.kubernetes.io/unreachable`` or ``not-ready`` taint. The node lifecycle controller's marks on the pods come
after its grace period and the taint manager's eviction after the taints' toleration (300 s by default); the Node
says it first. The sidecar that watches the pods also watches the Nodes, and gives each pod on a lost node one
more condition of its own (``NODE_LOST``, never written to the API): from there it travels as the pod's conditions
do, in the published rows to every follower, and the same ``why_lost`` reads it. The Node back (Ready True, the
taints gone) takes the condition off, and the pod is a member again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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

NODE_MARKED = ("not Ready and no kubelet said why: the node lifecycle controller marked it (its node stopped "
             "reporting)")  # kubernetes pkg/controller/util/node/controller_utils.go MarkPodsNotReady


NODE_LOST = "topology-agent.io/NodeLost"  # the condition the agent gives a pod on a lost Node (reason: why)


class NodeTaint(NamedTuple):
    """A taint that says a Node cannot run its pods, as the node lifecycle controller sets it."""

    key: str
    meaning: str
    source: str


NODE_TAINTS: tuple[NodeTaint, ...] = (
    NodeTaint("node.kubernetes.io/unreachable", "unreachable",
              "k8s.io/api core/v1/well_known_taints.go TaintNodeUnreachable (v1.18+)"),
    NodeTaint("node.kubernetes.io/not-ready", "not ready",
              "k8s.io/api core/v1/well_known_taints.go TaintNodeNotReady (v1.18+)"),
)
LOST_TAINT_EFFECTS = ("NoExecute", "NoSchedule")  # PreferNoSchedule says nothing of the node's health
_TAINTS = frozenset(taint.key for taint in NODE_TAINTS)


class NodeState(NamedTuple):
    """What the agent keeps of a Node: its name, its Ready condition's status ("" when it has none) and the
    taints of ``NODE_TAINTS`` it carries (key, effect)."""

    name: str
    ready: str
    taints: tuple[tuple[str, str], ...] = ()


def node_state(raw: Any) -> NodeState | None:
    """A Node object as ``NodeState`` (None: no Node's shape, no name to know it by)."""
    if not isinstance(raw, dict):
        return None
    meta, spec, status = raw.get("metadata"), raw.get("spec"), raw.get("status")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        return None
    ready = next((entry[1] for entry in conditions_of((status or {}).get("conditions") if isinstance(status, dict)
                                                       else None) if entry[0] == READY), "")
    taints = (spec or {}).get("taints") if isinstance(spec, dict) else None
    kept = tuple(sorted({(t["key"], t.get("effect") or "") for t in taints or () if isinstance(t, dict)
                         and t.get("key") in _TAINTS and isinstance(t.get("effect", ""), str)}))
    return NodeState(name, ready, kept)


def why_node_lost(node: NodeState) -> str | None:
    """Why no pod on ``node`` can train (None: nothing the Node says). The Ready condition first: a kubelet that
    says NotReady, or a node controller that heard nothing for its grace period (Unknown); then the taints the
    node controller puts on such a node (one set by hand counts the same). No Ready condition yet is no news."""
    if node.ready == "False":
        return f"node {node.name} NotReady"
    if node.ready == "Unknown":
        return f"node {node.name} Unknown (its kubelet stopped reporting)"
    for key, effect in node.taints:
        if effect in LOST_TAINT_EFFECTS:
            return f"node {node.name} tainted {key}:{effect}"
    return None


def lost_nodes(nodes: Iterable[NodeState]) -> dict[str, str]:
    """The lost Nodes among ``nodes``, each with why."""
    found = {}
    for node in nodes:
        why = why_node_lost(node)
        if why is not None:
            found[node.name] = why
    return found


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
    return (kind == DISRUPTION_TARGET and status == "True") or (kind == READY and status == "False" and not reason) \
        or (kind == NODE_LOST and status == "True")


def lost_conditions(raw: Any) -> list[Condition]:
    """The conditions of ``status.conditions`` that say the pod is lost: all a compact pod keeps of them (the others
    change nothing any reader computes, and a readiness flap then changes no published row)."""
    return [condition for condition in conditions_of(raw) if is_lost_condition(condition)]


def why_lost(conditions: Iterable[Sequence[str]]) -> str | None:
    """Why the pod cannot train, from its conditions (None: they say nothing of the kind)."""
    node_lost = False
    node = None
    for condition in conditions:
        if not is_lost_condition(condition):
            continue
        kind, _, reason = condition
        if kind == NODE_LOST:
            node = reason or "its node lost"
            continue
        if kind == DISRUPTION_TARGET:
            meaning = _MEANINGS.get(reason)
            shown = f"{reason}: {meaning}" if meaning else (reason or "no reason given")
            return f"{LOST}DisruptionTarget ({shown})"
        node_lost = True
    if node is not None:
        return f"{LOST}{node}"
    return f"{LOST}{NODE_MARKED}" if node_lost else None


def with_node_lost(conditions: Iterable[Sequence[str]], why: str | None) -> list[list[str]]:
    """A pod's lost conditions ([type, status, reason]) with its Node's: ``why`` the node is lost, or None (the
    node is not, or not known: the agent's condition taken off)."""
    kept = [list(condition) for condition in conditions if condition[0] != NODE_LOST]
    if why is not None:
        kept.append([NODE_LOST, "True", why])
    return kept


def on_lost_nodes(pods: Iterable[Any], lost: Mapping[str, str], *, own: str = "") -> list[Any]:
    """``pods`` as the API gives them, each on a lost Node (``lost``: each with why) given the agent's condition,
    as the sidecar that watches the Nodes holds them: what ``status``, ``render`` and ``explain`` plan from. The
    own pod is not marked: its own sidecar never leaves it out. The pods are copied where marked, never changed."""
    if not lost:
        return list(pods)
    marked = []
    for pod in pods:
        node = ((pod.get("spec") or {}).get("nodeName") or "") if isinstance(pod, dict) else ""
        name = ((pod.get("metadata") or {}).get("name") or "") if isinstance(pod, dict) else ""
        why = lost.get(node) if node and name != own else None
        if why is not None:
            status = pod.get("status") if isinstance(pod.get("status"), dict) else {}
            conditions = [c for c in status.get("conditions") or () if not (isinstance(c, dict)
                                                                          and c.get("type") == NODE_LOST)]
            pod = {**pod, "status": {**status, "conditions": [
                *conditions, {"type": NODE_LOST, "status": "True", "reason": why}]}}
        marked.append(pod)
    return marked


def node_lost_of(conditions: Iterable[Sequence[str]] | None) -> str | None:
    """The reason of the agent's Node condition among ``conditions`` (None: it has none)."""
    for condition in conditions or ():
        if condition[0] == NODE_LOST:
            return condition[2]
    return None
