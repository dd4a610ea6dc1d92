"""The sandbox's API in memory (agent/sandbox/memory.py) as the agent's own clients see it through the mock
transports (tests/fakeapi.py): the API's semantics are the HTTPS sandbox's (one implementation), and what a socket
would raise reaches the agent as its own errors."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass

import pytest

from agent import examples
from agent.errors import ApiConflict, ApiGone, ApiNotFound, ApiStalled, ApiUnavailable
from agent.k8s import core

PODS = "/api/v1/namespaces/default/pods"


def test_list_then_watch_from_its_resource_version_sees_only_later_changes(memory, api):
    client = api.client("test")
    for pod in examples.volcano_job(tasks=(("master", 1), ("worker", 1))):
        memory.create_pod(pod)
    items, rv = client.list_pods("default", "volcano.sh/job-name=demo")
    assert len(items) == 2 and rv
    seen = []

    def watch():
        for event in client.watch_pods("default", "volcano.sh/job-name=demo", rv, timeout=1):
            seen.append((event.type, event.object["metadata"].get("name")))

    thread = threading.Thread(target=watch)
    thread.start()
    memory.set_pod_ip("default", "demo-worker-0", "127.1.0.7")
    memory.update_pod("default", "demo-master-0", lambda p: p["metadata"]["labels"].pop("volcano.sh/job-name"))
    thread.join(10)
    assert [e for e in seen if e[0] != "BOOKMARK"] == [("MODIFIED", "demo-worker-0"), ("DELETED", "demo-master-0")]
    assert ("BOOKMARK", None) in seen  # bookmarks every 0.5 s in the fixture, a watch of 1 s


def test_a_paged_list_continues_the_snapshot_of_its_first_page(memory, api):
    for pod in examples.volcano_job(tasks=(("master", 1), ("worker", 4))):
        memory.create_pod(pod)
    client = api.client("test")
    pager = core.Pager(PODS, limit=2)
    request = pager.request()
    assert pager.take(request, client.send(request))
    memory.create_pod(examples.volcano_job(tasks=(("master", 1), ("worker", 6)))[-1])  # after the first page
    while True:
        request = pager.request()
        if not pager.take(request, client.send(request)):
            break
    assert [p["metadata"]["name"] for p in pager.kept] == ["demo-master-0"] + [f"demo-worker-{i}" for i in range(4)]


def test_a_watch_from_a_compacted_version_gets_410_and_statuses_are_the_agents_errors(memory, api):
    client = api.client("test")
    memory.create_pod(examples.indexed_job(completions=1)[0])
    _, rv = client.list_pods("default", "")
    memory.create_pod(examples.indexed_job("other", completions=1)[0])
    memory.faults(compact=True)
    with pytest.raises(ApiGone):
        list(client.watch_pods("default", "", rv, timeout=2))
    with pytest.raises(ApiNotFound):
        client.get_pod("default", "nope")
    with pytest.raises(ApiConflict):
        client.create(PODS, examples.indexed_job(completions=1)[0])
    memory.faults(status=503, count=1, retry_after=2)
    with pytest.raises(ApiUnavailable) as info:
        client.get_pod("default", "nope")
    assert info.value.retry_after == 2.0


@dataclass(frozen=True)
class Patch(core.Request):
    content_type: str = "application/merge-patch+json"


def test_patch_and_delete_change_the_store_as_the_api_server_does(memory, api):
    client = api.client("test")
    pod = memory.create_pod(examples.indexed_job(completions=1)[0])
    path = core.pods_path("default", pod["metadata"]["name"])
    patched = client.call(Patch("PATCH", path, body=json.dumps({"metadata": {"labels": {"x": "y"}}}).encode()))
    assert patched["metadata"]["labels"]["x"] == "y"
    assert int(patched["metadata"]["resourceVersion"]) > int(pod["metadata"]["resourceVersion"])
    client.call(core.Request("DELETE", path))
    with pytest.raises(ApiNotFound):
        client.get_object(path)


def test_what_a_socket_would_raise_is_the_agents_error(memory, api):
    client = api.client("test")
    memory.faults(status=503, count=1, reset=True)
    with pytest.raises(ApiUnavailable, match=r"unreachable during get pod 'x'.*ConnectionResetError"):
        client.get_pod("default", "x")
    memory.faults(watch="hang", path="/pods")
    with pytest.raises(ApiStalled, match="no event or bookmark for 1 s"):
        list(client.watch_pods("default", "", "", timeout=30, idle=1))


async def test_a_dropped_watch_is_cut_for_the_async_client_too(memory, api):
    async with api.async_client("sidecar") as client:
        memory.create_pod(examples.indexed_job(completions=1)[0])
        _, rv = await client.list_objects(PODS)
        events = client.watch_objects(PODS, rv, timeout=30)
        first = asyncio.ensure_future(anext(events))
        await api.notice.until(lambda: memory.watching("sidecar", PODS), what="the watch open")
        memory.faults(drop_watches=True)
        with pytest.raises(ApiUnavailable, match=r"unreachable during watch pods.*ConnectionResetError"):
            await first


def test_a_paged_table_of_nodes_without_their_objects_reads_as_rows_of_cells(memory, api):
    """``Accept: ...;as=Table`` with ``includeObject=None``, as ``kubectl get`` pages it: each page carries the
    continue token, and each row its cells alone; the client reads the rows by column name."""
    for k in range(5):
        node = examples.node(f"node-{k}", {})
        node["status"]["conditions"] = [{"type": "Ready", "status": "False" if k == 3 else "True"}]
        memory.create_node(node)
    client = api.client("test")
    rows, rv = client.list_objects("/api/v1/nodes", limit=2, table=True)
    assert rv and [(row["Name"], row["Status"]) for row in rows] == [
        ("node-0", "Ready"), ("node-1", "Ready"), ("node-2", "Ready"), ("node-3", "NotReady"), ("node-4", "Ready")]
    asked = [request for who, request in api.requests if who == "test"]
    assert len(asked) == 3 and all(("includeObject", "None") in r.query for r in asked)
    page = json.loads(memory.send(asked[0], agent="check", timeout=5).encoded)  # the first page as written
    assert page["kind"] == "Table" and page["metadata"]["continue"] and "object" not in page["rows"][0]
