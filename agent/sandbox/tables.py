"""``kubectl get`` tables: the API server prints them (``Accept: application/json;as=Table;g=meta.k8s.io;v=v1``).

Columns per kind as kube-apiserver's printers give them (kubernetes pkg/printers/internalversion/printers.go;
priority 1 columns show with ``-o wide``); any other kind gets NAME and AGE, as a CRD without printer columns
does. Ages use apimachinery's HumanDuration (pkg/util/duration/duration.go).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

from agent.core.report.status import human_duration

Obj = dict[str, Any]
Column = tuple[str, str, int, Callable[[Obj], Any]]  # name, type, priority, cell


def _age(obj: Obj, now: datetime.datetime | None = None) -> str:
    created = (obj.get("metadata") or {}).get("creationTimestamp")
    if not created:
        return "<unknown>"
    try:
        when = datetime.datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return "<unknown>"
    return human_duration(((now or datetime.datetime.now(datetime.UTC)) - when).total_seconds())


def _since(stamp: Any, now: datetime.datetime | None = None) -> str:
    """The age of an RFC 3339 time, with or without microseconds (an Event's eventTime is a MicroTime)."""
    if not isinstance(stamp, str) or not stamp:
        return "<unknown>"
    try:
        when = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    return human_duration(((now or datetime.datetime.now(datetime.UTC)) - when).total_seconds())


def _event_seen(event: Obj) -> str:
    """When an Event was last seen: its series' last observation, else its lastTimestamp, else its eventTime."""
    series = event.get("series") or {}
    stamp = series.get("lastObservedTime") or event.get("lastTimestamp") or event.get("deprecatedLastTimestamp") \
        or event.get("eventTime")
    return _since(stamp)


def _event_object(event: Obj) -> str:
    ref = event.get("involvedObject") or event.get("regarding") or {}
    return f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}"


def _none(value: Any) -> str:
    return str(value) if value not in (None, "", []) else "<none>"


def _pod_status(pod: Obj) -> str:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    return (pod.get("status") or {}).get("phase") or "Unknown"


def _pod_ready(pod: Obj) -> str:
    containers = (pod.get("spec") or {}).get("containers") or []
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return f"{sum(1 for s in statuses if s.get('ready'))}/{len(containers)}"


def _restarts(pod: Obj) -> int:
    return sum(int(s.get("restartCount", 0)) for s in (pod.get("status") or {}).get("containerStatuses") or [])


def _node_status(node: Obj) -> str:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return "Ready" if condition.get("status") == "True" else "NotReady"
    return "Unknown"


def _node_roles(node: Obj) -> str:
    prefix = "node-role.kubernetes.io/"
    roles = sorted(k[len(prefix):] for k in ((node.get("metadata") or {}).get("labels") or {}) if k.startswith(prefix))
    return ",".join(roles) or "<none>"


def _name(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("name", "")


NAME: Column = ("Name", "string", 0, _name)
AGE: Column = ("Age", "string", 0, _age)
COLUMNS: dict[str, list[Column]] = {
    "Pod": [NAME, ("Ready", "string", 0, _pod_ready), ("Status", "string", 0, _pod_status),
            ("Restarts", "string", 0, lambda p: str(_restarts(p))), AGE,
            ("IP", "string", 1, lambda p: _none((p.get("status") or {}).get("podIP"))),
            ("Node", "string", 1, lambda p: _none((p.get("spec") or {}).get("nodeName"))),
            ("Nominated Node", "string", 1, lambda p: _none((p.get("status") or {}).get("nominatedNodeName"))),
            ("Readiness Gates", "string", 1, lambda p: _none((p.get("spec") or {}).get("readinessGates")))],
    "Namespace": [NAME, ("Status", "string", 0, lambda n: (n.get("status") or {}).get("phase") or "Active"), AGE],
    "Node": [NAME, ("Status", "string", 0, _node_status), ("Roles", "string", 0, _node_roles), AGE,
             ("Version", "string", 0, lambda n: ((n.get("status") or {}).get("nodeInfo") or {}).get(
                 "kubeletVersion", ""))],
    "ConfigMap": [NAME, ("Data", "integer", 0, lambda c: len(c.get("data") or {}) + len(c.get("binaryData") or {})),
                  AGE],
    "Secret": [NAME, ("Type", "string", 0, lambda s: s.get("type") or "Opaque"),
               ("Data", "integer", 0, lambda s: len(s.get("data") or {})), AGE],
    "Service": [NAME, ("Type", "string", 0, lambda s: (s.get("spec") or {}).get("type") or "ClusterIP"),
                ("Cluster-IP", "string", 0, lambda s: _none((s.get("spec") or {}).get("clusterIP"))),
                ("External-IP", "string", 0, lambda s: "<none>"),
                ("Port(s)", "string", 0, lambda s: ",".join(
                    f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in (s.get("spec") or {}).get("ports") or [])
                 or "<none>"), AGE],
    "Event": [("Last Seen", "string", 0, _event_seen), ("Type", "string", 0, lambda e: e.get("type") or ""),
              ("Reason", "string", 0, lambda e: e.get("reason") or ""), ("Object", "string", 0, _event_object),
              ("Message", "string", 0, lambda e: (e.get("message") or e.get("note") or "").strip())],
    "Lease": [NAME, ("Holder", "string", 0, lambda lease: (lease.get("spec") or {}).get("holderIdentity") or ""),
              AGE],
}


def table(kind: str, objects: Sequence[Obj], meta: dict[str, Any], *, partial: Callable[[Obj], Obj],
          include: str = "Metadata") -> Obj:
    """A ``meta.k8s.io/v1`` Table of ``objects``, with the list's metadata (``meta``: its resourceVersion, and a
    page's continue token). Each row carries what ``include`` (the request's ``includeObject``) asks: the
    object's metadata by default, the whole object, or nothing (``None``: the cells alone)."""
    columns = COLUMNS.get(kind, [NAME, AGE])
    rows = []
    for obj in objects:
        row: Obj = {"cells": [cell(obj) for _, _, _, cell in columns]}
        if include != "None":
            row["object"] = obj if include == "Object" else partial(obj)
        rows.append(row)
    return {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
        "columnDefinitions": [{"name": name, "type": type_, "format": "name" if name == "Name" else "",
                               "description": "", "priority": priority} for name, type_, priority, _ in columns],
        "rows": rows,
    }


def wants_table(accept: str) -> bool:
    return "as=Table" in accept
