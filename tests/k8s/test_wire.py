"""Hostile or broken watch streams and API bodies: every one is an ApiError (retried as a broken stream),
never another exception, never a hang."""

from __future__ import annotations

import json

import pytest

from agent.errors import ApiError, ApiGone, ApiUnavailable
from agent.k8s import core
from agent.k8s.async_client import AsyncClient
from agent.k8s.client import Client
from agent.k8s.config import ApiConfig
from agent.k8s.core import Response, list_items, parse_event, parse_json

POD = {"metadata": {"name": "p", "resourceVersion": "5"}}
BROKEN_LINES = [
    ("object null", json.dumps({"type": "ADDED", "object": None}).encode()),
    ("object a list", json.dumps({"type": "ADDED", "object": []}).encode()),
    ("no type", json.dumps({"object": POD}).encode()),
    ("type an int", json.dumps({"type": 3, "object": POD}).encode()),
    ("unknown type", json.dumps({"type": "EXPLODED", "object": POD}).encode()),
    ("ERROR with a non-numeric code", json.dumps({"type": "ERROR", "object": {"code": "x", "message": "m"}}).encode()),
    ("ERROR with a huge code", b'{"type": "ERROR", "object": {"code": ' + b"9" * 5000 + b"}}"),
    ("deep nesting", b"[" * 100000 + b"]" * 100000),
    ("invalid UTF-8", b'{"type": "ADDED", "object": {"metadata": {"name": "\xff\xfe"}}}'),
    ("NaN", b'{"type": "ADDED", "object": {"metadata": {"name": "p"}, "x": NaN}}'),
    ("1e9999", b'{"type": "ADDED", "object": {"metadata": {"name": "p"}, "x": 1e9999}}'),
    ("metadata a string", json.dumps({"type": "MODIFIED", "object": {"metadata": "p"}}).encode()),
    ("cut mid-event", b'{"type": "ADDED", "object": {"metad'),
    ("a JSON array", b"[1, 2, 3]"),
]


@pytest.mark.parametrize("line", [b for _, b in BROKEN_LINES], ids=[n for n, _ in BROKEN_LINES])
def test_a_broken_watch_line_is_an_api_error(line):
    with pytest.raises(ApiError):
        parse_event(line)


def test_error_events_map_410_to_gone_and_the_rest_to_unavailable():
    with pytest.raises(ApiGone):
        parse_event(json.dumps({"type": "ERROR", "object": {"code": 410, "message": "too old"}}).encode())
    with pytest.raises(ApiUnavailable):
        parse_event(json.dumps({"type": "ERROR", "object": {"code": 500, "message": "x\ny"}}).encode())


def test_a_good_event_passes():
    event = parse_event(json.dumps({"type": "ADDED", "object": POD}).encode())
    assert (event.type, event.resource_version) == ("ADDED", "5")


@pytest.mark.parametrize("body", [b'{"items": "x"}', b'{"items": [], "metadata": []}', b"null", b"\xff"])
def test_a_broken_list_answer_is_an_api_error(body):
    with pytest.raises(ApiError):
        list_items(parse_json(body, what="list pods"), what="pods")


@pytest.mark.parametrize("body", [
    b'{"kind": "Table", "columnDefinitions": [{"name": "Name"}], "rows": "x"}',
    b'{"kind": "Table", "columnDefinitions": [{"name": "Name"}], "rows": [{"object": {}}]}',
    b'{"kind": "Table", "rows": [{"cells": ["node-1"]}]}',
], ids=["rows", "no-cells", "no-columns"])
def test_a_table_that_is_not_rows_of_cells_is_an_api_error(body):
    with pytest.raises(ApiUnavailable, match="not a Table of rows"):
        list_items(parse_json(body, what="list nodes"), what="nodes")


def test_a_tables_rows_read_as_their_cells_by_column_name():
    body = {"kind": "Table", "metadata": {"resourceVersion": "7"},
            "columnDefinitions": [{"name": "Name"}, {"name": "Status"}],
            "rows": [{"cells": ["node-1", "Ready"]}, {"cells": ["node-2", "NotReady,SchedulingDisabled"]}]}
    assert list_items(body, what="nodes") == ([{"Name": "node-1", "Status": "Ready"},
                                               {"Name": "node-2", "Status": "NotReady,SchedulingDisabled"}], "7")


def _two_events_and_a_broken_line() -> bytes:
    good = [json.dumps({"type": "MODIFIED", "object": {"metadata": {"name": f"p{i}", "resourceVersion": str(i)}}})
            for i in (1, 2)]
    return "\n".join([*good, "{broken"]).encode() + b"\n"


class _Stream:
    """One watch answer: the head, then one read holding every line."""

    def stream(self, request, *, wait):
        return Response(200), iter([_two_events_and_a_broken_line()])


class _AsyncStream:
    async def stream(self, request, *, wait):
        yield Response(200)
        yield _two_events_and_a_broken_line()


def _counting(monkeypatch) -> list[int]:
    parsed: list[int] = []
    real = core.parse_event
    monkeypatch.setattr(core, "parse_event", lambda line: parsed.append(1) or real(line))
    return parsed


def test_a_watch_read_is_parsed_one_event_at_a_time_as_each_is_taken(monkeypatch):
    """A read of the kubelet's writes holds ~26 pods: parsed all at once they peaked at 1.6 MB, each in turn 0.4 MB
    (and the events before a broken line are still handed over)."""
    parsed = _counting(monkeypatch)
    client = Client(ApiConfig(server="https://127.0.0.1:1"), transport=_Stream())  # type: ignore[arg-type]
    seen = []
    with pytest.raises(ApiUnavailable):
        for event in client.watch_objects("/api/v1/pods", "1", timeout=5):
            seen.append((event.resource_version, len(parsed)))
    assert seen == [("1", 1), ("2", 2)] and len(parsed) == 3


async def test_the_sidecars_watch_read_is_parsed_one_event_at_a_time_as_each_is_taken(monkeypatch):
    parsed = _counting(monkeypatch)
    client = AsyncClient(ApiConfig(server="https://127.0.0.1:1"), transport=_AsyncStream())  # type: ignore[arg-type]
    seen = []
    with pytest.raises(ApiUnavailable):
        async for event in client.watch_objects("/api/v1/pods", "1", timeout=5):
            seen.append((event.resource_version, len(parsed)))
    assert seen == [("1", 1), ("2", 2)] and len(parsed) == 3
