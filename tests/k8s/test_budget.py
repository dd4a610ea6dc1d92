"""Every object of a LIST answer and of a watch stream is read within a budget of bytes: one over it (a pod of a
megabyte that anyone allowed to create pods can make) is dropped unread as its bytes arrive, said once, and the
objects after it are read as usual; no page is held whole. The real clients run over the mock transports, so
what is measured (tracemalloc's peak) is what the clients hold."""

from __future__ import annotations

import json
import logging
import random
import re
import tracemalloc
from typing import Any

import pytest

from agent import examples
from agent.errors import ApiError
from agent.k8s import core
from agent.k8s.async_client import AsyncClient
from agent.k8s.client import Client
from agent.k8s.config import ApiConfig
from agent.k8s.core import OBJECT_BUDGET, POD_BUDGET, ListReader, Pager, Request, Response, WatchLines, budget_for
from agent.k8s.mock import AsyncMockTransport, MockTransport

CONFIG = ApiConfig(server="https://127.0.0.1:1")
PODS = "/api/v1/namespaces/default/pods"
ROGUES = 40
READ = 64 * 1024


def rogue(index: int) -> dict[str, Any]:
    """A pod of about 1 MB (four env values of 250,000 characters), with the job's labels and no owner."""
    pod = examples.volcano_job("demo", (("master", 1), ("worker", 1)))[1]
    pod["metadata"]["name"] = f"rogue-{index}"
    pod["metadata"].pop("ownerReferences")
    pod["spec"]["containers"][0]["env"] += [{"name": f"BLOB_{n}", "value": f"{n}" * 250_000} for n in range(4)]
    return pod


def members() -> list[dict[str, Any]]:
    """A small job, one of its pods as large as a controller makes them: annotations at the API server's cap
    (256 KiB in all), 500 env vars and managedFields listing them."""
    pods = examples.volcano_job("demo", (("master", 1), ("worker", 2)))
    big = pods[1]
    big["metadata"]["annotations"]["example.com/template"] = "t" * (256 * 1024 - 1024)
    big["spec"]["containers"][0]["env"] += [{"name": f"VAR_{i}", "value": "v" * 100} for i in range(500)]
    big["metadata"]["managedFields"] = [{"manager": "controller", "operation": "Update", "fieldsType": "FieldsV1",
                                         "fieldsV1": {f"f:VAR_{i}": {".": {}, "f:value": {}} for i in range(500)}}]
    assert 300_000 < len(json.dumps(big)) < POD_BUDGET
    return pods


def page(items: list[Any], **meta: str) -> bytes:
    """A LIST answer as the API server writes it: its metadata, then its items."""
    return json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "9", **meta},
                       "items": items}, separators=(",", ":")).encode()


def reads(body: bytes, size: int = READ) -> list[bytes]:
    return [body[i:i + size] for i in range(0, len(body), size)]


def names(items: list[Any]) -> list[str]:
    return [item["metadata"]["name"] for item in items]


def dropped_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "dropped unread" in r.getMessage()]


@pytest.fixture(scope="module")
def forty_rogues() -> tuple[bytes, list[str]]:
    pods = members()
    mixed = [pods[0], *(rogue(i) for i in range(ROGUES // 2)), pods[1], *(rogue(i) for i in range(ROGUES // 2,
                                                                                                   ROGUES)), pods[2]]
    return page(mixed), names(pods)


def peak_of(run: Any) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        result = run()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("whole", [True, False], ids=["answer held whole by the transport", "answer in reads"])
def test_inits_list_of_forty_pods_of_a_megabyte_keeps_the_members_and_holds_a_few_megabytes(forty_rogues, whole,
                                                                                               caplog):
    body, wanted = forty_rogues
    answer = Response(200, body) if whole else reads(body)
    client = Client(CONFIG, transport=MockTransport(lambda request: answer))
    with caplog.at_level(logging.WARNING):
        (items, rv), peak = peak_of(lambda: client.list_pods("default", "volcano.sh/job-name=demo"))
    assert peak < 4_000_000, peak  # a budget and a read, not 40 MB of page (parsed: twice that)
    assert names(items) == wanted and rv == "9"  # the member of 300 KB too
    lines = dropped_lines(caplog)
    assert [re.search(r"pod 'default/(rogue-\d+)'", line).group(1) for line in lines] == [  # type: ignore[union-attr]
        f"rogue-{i}" for i in range(ROGUES)]
    assert all("over the 524288 bytes a pod may take" in line for line in lines)


@pytest.mark.parametrize("whole", [True, False], ids=["answer held whole by the transport", "answer in reads"])
async def test_the_sidecars_list_of_forty_pods_of_a_megabyte_keeps_the_members_and_holds_a_few_megabytes(
        forty_rogues, whole, caplog):
    body, wanted = forty_rogues
    answer = Response(200, body) if whole else reads(body)
    client = AsyncClient(CONFIG, transport=AsyncMockTransport(lambda request: answer))
    with caplog.at_level(logging.WARNING):
        tracemalloc.start()
        try:
            items, rv = await client.list_pods("default", "volcano.sh/job-name=demo")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 4_000_000, peak
    assert names(items) == wanted and rv == "9"
    assert len(dropped_lines(caplog)) == ROGUES


def test_a_paged_list_drops_a_rogue_on_either_page_and_asks_the_next_page_ahead(caplog):
    pods = members()
    first = page([pods[0], rogue(1)], **{"continue": "2:2"})
    second = page([rogue(2), pods[1], pods[2]])
    asked: list[str] = []

    def handler(request: Request) -> Any:
        token = dict(request.query).get("continue", "")
        asked.append(token)
        return reads(second if token else first)

    client = Client(CONFIG, transport=MockTransport(handler))
    with caplog.at_level(logging.WARNING):
        items, _ = client.list_objects(PODS, limit=2)
    assert names(items) == names(pods) and asked == ["", "2:2"]
    assert [("rogue-1" in line, "rogue-2" in line) for line in dropped_lines(caplog)] == [(True, False),
                                                                                          (False, True)]


def event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"


def watch_stream() -> bytes:
    pods = members()
    big = rogue(3)
    return b"".join([event("ADDED", pods[0]), event("ADDED", big), event("MODIFIED", pods[1]),
                     event("MODIFIED", big), event("DELETED", pods[2])])


def test_inits_watch_drops_an_event_of_a_megabyte_says_so_once_and_reads_on(caplog):
    stream = reads(watch_stream())
    client = Client(CONFIG, transport=MockTransport(lambda request: stream))
    with caplog.at_level(logging.WARNING):
        seen, peak = peak_of(lambda: [(e.type, e.object["metadata"]["name"])
                                      for e in client.watch_pods("default", "", "1", timeout=5)])
    assert peak < 2_500_000, peak  # the member of 300 KB parsed, never the rogue's megabyte
    assert seen == [("ADDED", "demo-master-0"), ("MODIFIED", "demo-worker-0"), ("DELETED", "demo-worker-1")]
    [line] = dropped_lines(caplog)
    assert "pod 'default/rogue-3'" in line and "1002" in line


async def test_the_sidecars_watch_drops_an_event_of_a_megabyte_says_so_once_and_reads_on(caplog):
    stream = reads(watch_stream())
    client = AsyncClient(CONFIG, transport=AsyncMockTransport(lambda request: stream))
    with caplog.at_level(logging.WARNING):
        seen = [(e.type, e.object["metadata"]["name"])
                async for e in client.watch_pods("default", "", "1", timeout=5)]
    assert seen == [("ADDED", "demo-master-0"), ("MODIFIED", "demo-worker-0"), ("DELETED", "demo-worker-1")]
    assert len(dropped_lines(caplog)) == 1


def test_a_watch_line_over_the_budget_is_never_held_whole():
    lines = WatchLines(1000, what="pods")
    head = b'{"type":"ADDED","object":{"metadata":{"name":"big","namespace":"ns"},"x":"'
    assert lines.feed(head) == []
    for _ in range(100):
        assert lines.feed(b"y" * 100) == []
        assert sum(map(len, lines._parts)) + len(lines._head) <= 1000
    assert lines.feed(b'"}}\n{"type":"BOOKMARK","object":{}}\n') == [b'{"type":"BOOKMARK","object":{}}']
    [dropped] = lines.take_dropped()
    assert (dropped.namespace, dropped.name, dropped.size) == ("ns", "big", len(head) + 10_000 + 3)
    lines.finish()


def test_a_list_reader_never_holds_more_than_a_budget_and_a_read():
    budget = 20_000
    body = page([{"metadata": {"name": f"p{i}"}, "v": "x" * (50_000 if i % 3 == 0 else 5_000)} for i in range(30)])
    reader = ListReader(budget, what="pods")
    kept = []
    for chunk in reads(body, 1000):
        kept += reader.feed(chunk)
        assert len(reader._text) <= budget + core.STEP
    last, envelope = reader.finish()
    assert names(kept + last) == [f"p{i}" for i in range(30) if i % 3]
    assert [d.name for d in reader.take_dropped()] == [f"p{i}" for i in range(0, 30, 3)]
    assert envelope["metadata"] == {"resourceVersion": "9"} and envelope["items"] == []


def _value(rand: random.Random, depth: int = 0) -> Any:
    roll = rand.random()
    if depth > 3 or roll < 0.3:
        return rand.choice([0, -2.5e3, 12345678901234567890, True, False, None, "", 'a"b\\c\n', "é ü ☃ 𝄞",
                            "]},[{", "x" * rand.randint(0, 200), "\\u0041"])
    if roll < 0.65:
        return {f"k{i}\"]": _value(rand, depth + 1) for i in range(rand.randint(0, 4))}
    return [_value(rand, depth + 1) for _ in range(rand.randint(0, 4))]


@pytest.mark.parametrize("seed", range(40))
def test_a_list_read_as_it_comes_gives_what_json_gives_but_the_objects_over_the_budget(seed):
    rand = random.Random(seed)
    budget = 3000
    items = [{"metadata": {"name": f"p{i}", "namespace": "ns"}, "data": _value(rand)}
             for i in range(rand.randint(0, 8))]
    big = {"metadata": {"name": "big", "namespace": "ns"}, "data": [_value(rand) for _ in range(40)],
           "pad": "z" * budget}
    for at in sorted(rand.sample(range(len(items) + 1), k=min(2, len(items) + 1)), reverse=True):
        items.insert(at, big)
    answer = {"kind": "PodList", "metadata": {"resourceVersion": "7", "continue": "c"}, "items": items}
    if rand.random() < 0.3:
        answer = {"items": items, "metadata": answer["metadata"], "kind": "PodList"}  # items first
    body = json.dumps(answer, ensure_ascii=rand.random() < 0.5, indent=rand.choice([None, 1])).encode()
    reader = ListReader(budget, what="pods")
    got = []
    at = 0
    while at < len(body):
        size = rand.choice([1, 7, 100, 4096, 70_000])
        got += reader.feed(body[at:at + size])
        at += size
    last, envelope = reader.finish()
    assert got + last == [item for item in items if item is not big]
    assert [d.name for d in reader.take_dropped()] == ["big"] * items.count(big)
    assert envelope["metadata"] == answer["metadata"]


DEEP_BUDGET = 400_000
BROKEN = [
    ("an item cut", b'{"items":[{"a":1}'),
    ("a trailing comma", b'{"items":[{"a":1},]}'),
    ("two items without a comma", b'{"items":[{"a":1} {"b":2}]}'),
    ("NaN in an item", b'{"items":[{"a":NaN}]}'),
    ("1e9999 in an item", b'{"items":[{"a":1e9999}]}'),
    ("invalid UTF-8", b'{"items":[{"a":"\xff"}]}'),
    # within the budget (DEEP_BUDGET), so that every Python's parser meets the depth: over the budget the item
    # would be dropped unread, and how deep a parse of its first budget's characters goes differs by version
    ("nesting deeper than the stack", b'{"items":[' + b"[" * 100_000 + b"]" * 100_000 + b"]}"),
    ("items not a list", b'{"items":"x"}'),
    ("metadata a list", b'{"items":[],"metadata":[]}'),
    ("null", b"null"),
    ("a closing brace in an item dropped", b'{"items":[{"a":"' + b"x" * 5000 + b'"}}]}'),
    ("the envelope over the budget", b'{"metadata":{"x":"' + b"y" * 5000 + b'"},"items":[]}'),
]


@pytest.mark.parametrize("body", [b for _, b in BROKEN], ids=[n for n, _ in BROKEN])
@pytest.mark.parametrize("size", [7, 1 << 20])
def test_a_broken_list_answer_read_as_it_comes_is_an_api_error(body, size):
    pager = Pager(PODS, budget=DEEP_BUDGET if len(body) > DEEP_BUDGET // 2 else 1000)
    request = pager.request()
    reading = pager.reading(request, Response(200))
    with pytest.raises(ApiError):
        for chunk in reads(body, size):
            reading.feed(chunk)
        reading.finish()


def test_pods_get_the_pod_budget_and_every_other_kind_the_object_budget():
    assert budget_for(PODS) == budget_for("/api/v1/pods") == POD_BUDGET == 512 * 1024
    assert budget_for("/api/v1/namespaces/default/configmaps") == budget_for("/api/v1/nodes") == OBJECT_BUDGET
    assert OBJECT_BUDGET >= 6 * 1536 * 1024  # any object etcd holds, every byte escaped by Go's encoder


def test_a_dropped_object_is_said_once_and_at_most_so_many_are_remembered():
    drops = core.Drops()
    first = core.Oversized("pods", "default", "rogue-1", 2_000_000)
    assert drops.say(first) is not None and drops.say(first) is None
    said = [drops.say(core.Oversized("pods", "default", f"r-{i}", 600_000)) for i in range(drops.NAMED + 50)]
    assert sum(line is not None for line in said) == drops.NAMED  # the last one: "more than ... not named"
    assert "not named" in [line for line in said if line is not None][-1]
    assert len(drops.named) == drops.NAMED + 1 and drops.count == drops.NAMED + 52


def test_a_dropped_objects_name_is_read_only_when_it_is_a_dns_name():
    hostile = '{"metadata":{"name":"x\\u001b]8;;evil","namespace":"default"}'
    assert core.Oversized.from_head("pods", hostile, 10).name == ""
    assert core.Oversized.from_head("pods", '{"metadata":{"name":"ok-1","namespace":"ns"}', 10).name == "ok-1"
