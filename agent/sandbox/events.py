"""Events as the API server keeps them: one store for ``v1`` Events and ``events.k8s.io/v1`` Events, each read
and written in the version its request names, so an Event the agent writes through events.k8s.io/v1 is the one
``kubectl describe`` lists through v1.

The API server stores one internal Event and converts at each request (kubernetes pkg/apis/events/v1/
conversion.go, release 1.32): ``regarding`` is ``involvedObject``, ``note`` is ``message``, ``deprecatedSource``,
``deprecatedFirstTimestamp``, ``deprecatedLastTimestamp`` and ``deprecatedCount`` are ``source``,
``firstTimestamp``, ``lastTimestamp`` and ``count``; ``eventTime``, ``series``, ``action``, ``related`` and
``reportingInstance`` pass through, and ``reportingController`` is v1's ``reportingComponent``. The sandbox keeps
the v1 form. Field selectors are the ones the API server accepts for Events (pkg/apis/core/v1/conversion.go
AddFieldLabelConversionsForEvent): ``involvedObject.*``, ``reason``, ``reportingComponent``, ``source`` (the source
component, else the reporting controller), ``type``, ``metadata.name`` and ``metadata.namespace``; through
events.k8s.io ``regarding.*`` and ``reportingController`` name the same fields.

An events.k8s.io/v1 write is validated as the API server validates it (pkg/apis/core/pods/validation/events.go): a
create needs ``eventTime``, ``reportingController``, ``reportingInstance``, ``action``, ``reason`` and a type of
Normal or Warning, with the deprecated fields unset; an update may change ``series`` only (the note is
immutable). v1 writes are checked for nothing more, as there.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from agent.sandbox.selectors import SelectorError, parse_field_selector

Obj = dict[str, Any]
CORE = "/v1/events"  # the store's key for both versions
GROUP = "events.k8s.io"

# events.k8s.io/v1 field -> v1 field, for the fields whose names differ
_RENAMED = {"regarding": "involvedObject", "note": "message", "deprecatedSource": "source",
            "deprecatedFirstTimestamp": "firstTimestamp", "deprecatedLastTimestamp": "lastTimestamp",
            "deprecatedCount": "count", "reportingController": "reportingComponent"}
_BACK = {core: events for events, core in _RENAMED.items()}
_OBJECT_FIELDS = ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
CORE_FIELDS = (*(f"involvedObject.{f}" for f in _OBJECT_FIELDS), "reason", "reportingComponent", "source", "type",
               "metadata.namespace", "metadata.name")
# what an events.k8s.io/v1 field selector names, in v1's words
EVENTS_FIELDS = {**{f"regarding.{f}": f"involvedObject.{f}" for f in _OBJECT_FIELDS}, "reason": "reason",
                 "reportingController": "reportingComponent", "type": "type", "metadata.namespace":
                 "metadata.namespace", "metadata.name": "metadata.name"}
IMMUTABLE = ("involvedObject", "reason", "message", "source", "firstTimestamp", "lastTimestamp", "count", "type",
             "eventTime", "action", "related", "reportingComponent", "reportingInstance")
LIMITS = {"reportingInstance": 128, "action": 128, "reason": 128, "note": 1024}


def to_core(event: Obj) -> Obj:
    """An events.k8s.io/v1 Event in the v1 form the store keeps."""
    out = {_RENAMED.get(key, key): copy.deepcopy(value) for key, value in event.items()}
    out["apiVersion"], out["kind"] = "v1", "Event"
    return out


def to_events(event: Obj) -> Obj:
    """A stored (v1) Event as events.k8s.io/v1 gives it."""
    out = {_BACK.get(key, key): copy.deepcopy(value) for key, value in event.items()}
    out["apiVersion"], out["kind"] = f"{GROUP}/v1", "Event"
    return out


def _selectable(event: Obj) -> Obj:
    """The fields a selector may name, on a stored Event: ``source`` is the source's component, else the
    reporting controller (the API server's selectable fields)."""
    source = (event.get("source") or {}).get("component") or event.get("reportingComponent") or ""
    return {**event, "source": source}


def matcher(field_selector: str | None, *, group: str) -> Callable[[Obj], bool]:
    """A field selector on Events, in the request's version's names, as a test of a stored Event (SelectorError
    for a field the API server does not select Events by)."""
    names: Mapping[str, str] = EVENTS_FIELDS if group == GROUP else {f: f for f in CORE_FIELDS}
    translated = []
    for part in (field_selector or "").split(","):
        if not part.strip():
            continue
        for op in ("!=", "==", "="):
            field, found, value = part.partition(op)
            if found:
                break
        else:
            raise SelectorError(f"invalid field selector {field_selector!r}")
        name = names.get(field.strip())
        if name is None:
            raise SelectorError(f'"{field.strip()}" is not a known field selector: only '
                                f'"{", ".join(sorted(names))}"')
        translated.append(f"{name}{op}{value.strip()}")
    test = parse_field_selector(",".join(translated))
    return lambda event: test(_selectable(event))


def invalid_create(event: Obj) -> str | None:
    """Why the API server refuses to create this events.k8s.io/v1 Event, or None."""
    missing = [f for f in ("eventTime", "reportingController", "reportingInstance", "action", "reason")
               if not event.get(f)]
    if missing:
        return f"{', '.join(missing)}: Required value"
    if event.get("type") not in ("Normal", "Warning"):
        return f"type: Invalid value: {str(event.get('type'))[:40]!r}: has invalid value"
    long = [f for f, limit in LIMITS.items() if len(str(event.get(f) or "")) > limit]
    if long:
        return f"{long[0]}: Invalid value: can have at most {LIMITS[long[0]]} characters"
    set_ = [f for f in ("deprecatedCount", "deprecatedFirstTimestamp", "deprecatedLastTimestamp", "deprecatedSource")
            if event.get(f)]
    if set_:
        return f"{set_[0]}: Invalid value: needs to be unset"
    return _invalid_series(event)


def _invalid_series(event: Obj) -> str | None:
    series = event.get("series")
    if series is None:
        return None
    if not isinstance(series, dict) or not isinstance(series.get("count"), int) or series["count"] < 2:
        return "series.count: Invalid value: should be at least 2"
    if not series.get("lastObservedTime"):
        return "series.lastObservedTime: Required value"
    return None


def invalid_update(new: Obj, old: Obj) -> str | None:
    """Why the API server refuses this events.k8s.io/v1 update of a stored Event (both in v1 form), or None:
    everything but ``series`` (and the metadata) is immutable."""
    for field in IMMUTABLE:
        if new.get(field) != old.get(field):
            return f"{_BACK.get(field, field)}: Invalid value: field is immutable"
    if new.get("series") != old.get("series"):
        return _invalid_series(to_events(new))
    return None
