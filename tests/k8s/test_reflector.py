"""The reflector and the client core under API faults, through the mock transport and a virtual clock: the real
clients, core and reflector run, only the socket and the clock are fake, so a minute of faults takes
milliseconds and every request can be counted. The same faults against real processes and real HTTP are in
tests/integration/test_faults.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from agent.errors import ApiGone, ApiStalled, ApiUnavailable
from agent.k8s.async_client import AsyncClient
from agent.k8s.blocking import Blocking
from agent.k8s.client import Client
from agent.k8s.config import ApiConfig
from agent.k8s.core import Request, Response, WatchEvent
from agent.k8s.mock import AsyncMockTransport, MockTransport
from agent.k8s.reflector import AsyncOps, Reflector, Settings, reflect

CONFIG = ApiConfig(server="https://127.0.0.1:1")
MINUTE = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.now += seconds


def pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}}


def line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def listing(rv: str = "10", items: Iterable[dict[str, Any]] = ()) -> Response:
    return Response(200, json.dumps({"metadata": {"resourceVersion": rv}, "items": list(items)}).encode())


def query(request: Request) -> dict[str, str]:
    return dict(request.query)


class Recorder:
    """The reflector's store: remembers lists and events."""

    def __init__(self) -> None:
        self.lists: list[list[Any]] = []
        self.events: list[WatchEvent] = []

    def replace(self, items: list[Any]) -> None:
        self.lists.append(items)

    def apply(self, event: WatchEvent) -> None:
        self.events.append(event)


def blocking_ops(list_call: Callable[[], Any], watch_call: Callable[[str, float, float], Any],
                 clock: Clock) -> AsyncOps:
    """init's ops: its blocking client through k8s/blocking.py, its blocking sleep."""
    async def sleep(seconds: float) -> None:
        clock.sleep(seconds)

    return AsyncOps(list_call, watch_call, clock=clock, sleep=sleep)


def reflect_for(seconds: float, watch: Callable[[Request, Clock], Response | Iterable[bytes]], *,
                settings: Settings | None = None) -> tuple[list[Request], Recorder, Reflector, Clock]:
    """Run init's driver (blocking client) for ``seconds`` of virtual time against ``watch``'s answers."""
    clock = Clock()

    def handler(request: Request) -> Response | Iterable[bytes]:
        return watch(request, clock) if request.verb == "watch" else listing(items=[pod("a", "10")])

    transport = MockTransport(handler)
    client = Blocking(Client(CONFIG, transport=transport, clock=clock))
    pods = "/api/v1/namespaces/default/pods"
    ops = blocking_ops(lambda: client.list_objects(pods, label_selector="job=x", limit=500),
                       lambda rv, timeout, idle: client.watch_objects(pods, rv, timeout=timeout, label_selector="job=x",
                                                                      idle=idle), clock)
    reflector = Reflector("pods", settings, rand=lambda: 0.5, now=clock())
    recorder = Recorder()
    # nobody is satisfied: it ends at the deadline
    assert asyncio.run(reflect(reflector, ops, recorder, deadline=seconds)) is False
    assert clock.now >= seconds
    return transport.requests, recorder, reflector, clock


def rate(requests: list[Request], seconds: float) -> float:
    return len(requests) / seconds


def test_a_watch_that_ends_at_once_is_restarted_at_most_once_a_second_and_is_no_progress():
    requests, _, reflector, clock = reflect_for(MINUTE, lambda request, clock: [])
    assert rate(requests, MINUTE) <= 1.05  # 16,795 requests in 10 s before the minimum interval
    assert [r.verb for r in requests[:3]] == ["list", "watch", "watch"]
    assert reflector.stale_for(clock.now) == pytest.approx(MINUTE)  # /readyz sees it


def test_a_410_on_every_watch_relists_after_a_random_pause_then_backs_off():
    requests, recorder, _, _ = reflect_for(2 * MINUTE, lambda request, clock: Response(410, b'{"message":"too old"}'))
    verbs = [r.verb for r in requests]
    assert verbs[:4] == ["list", "watch", "list", "watch"]  # a 410 lists again, then watches from the new list
    assert rate(requests, 2 * MINUTE) < 0.5  # 655 LIST+WATCH in 2 s before
    assert len(recorder.lists) == verbs.count("list")


def test_the_relist_after_a_410_waits_a_random_part_of_the_jitter_window():
    clock = Clock()
    reflector = Reflector("pods", rand=lambda: 0.25, now=0.0)
    reflector.listed("10", 0.0)
    assert reflector.failed(ApiGone("gone", status=410), 0.0) == pytest.approx(0.5)  # 0.25 of 2 s
    assert reflector.next(clock.now) == ("list", pytest.approx(0.5))
    assert reflector.failed(ApiGone("gone", status=410), 0.5) >= 0.8  # a second 410 in a row: the backoff


def test_429_with_retry_after_0_waits_at_least_the_floor():
    requests, _, _, _ = reflect_for(MINUTE, lambda request, clock: Response(429, b"{}", retry_after="0"))
    assert rate(requests, MINUTE) <= 1 / 0.8 + 0.05
    assert [r.verb for r in requests].count("list") == 1  # the list still holds: only the watch is retried


def test_watches_ask_for_bookmarks_and_an_end_and_resume_from_the_last_bookmark():
    def watch(request: Request, clock: Clock) -> Iterable[bytes]:
        clock.now += 45.0  # the watch ran its course
        return [line("BOOKMARK", {"metadata": {"resourceVersion": str(20 + int(clock.now))}})]

    requests, recorder, _, _ = reflect_for(100.0, watch)
    watches = [query(r) for r in requests if r.verb == "watch"]
    assert watches[0]["allowWatchBookmarks"] == "true"
    assert 40 <= int(watches[0]["timeoutSeconds"]) <= 55  # a healthy watch shows progress before ``idle`` (60)
    assert [w["resourceVersion"] for w in watches] == ["10", "65", "110"][:len(watches)]
    assert [r.verb for r in requests].count("list") == 1
    assert [e.type for e in recorder.events] == ["BOOKMARK"] * len(watches)


def test_a_stream_cut_mid_event_resumes_the_watch_from_the_last_event_without_a_list():
    def watch(request: Request, clock: Clock) -> Iterable[bytes]:
        if query(request)["resourceVersion"] == "10":
            return [line("MODIFIED", pod("a", "11")) + b'{"type":"MODIF']
        return []

    requests, recorder, _, _ = reflect_for(5.0, watch)
    assert [r.verb for r in requests[:3]] == ["list", "watch", "watch"]
    assert query(requests[2])["resourceVersion"] == "11"
    assert recorder.events[0].object["metadata"]["resourceVersion"] == "11"


def test_a_silently_stalled_watch_is_dropped_and_the_list_read_again():
    def watch(request: Request, clock: Clock) -> Iterator[bytes]:
        clock.now += 60.0  # the transport's read waited ``idle`` and got nothing
        raise ApiStalled("watch pods: no event or bookmark for 60 s", status=0)
        yield b""

    requests, _, _, _ = reflect_for(150.0, watch)
    assert [r.verb for r in requests[:4]] == ["list", "watch", "list", "watch"]


def test_a_trickle_of_bytes_without_events_is_no_progress():
    sent: list[int] = []

    def watch(request: Request, clock: Clock) -> Iterator[bytes]:
        sent.append(0)
        for _ in range(1000):
            clock.now += 1.0
            sent[-1] += 1
            yield b" "  # a byte a second: the socket never times out, but no event ever arrives

    requests, _, reflector, _ = reflect_for(150.0, watch, settings=Settings.with_idle(10.0))
    verbs = [r.verb for r in requests]
    assert verbs[:4] == ["list", "watch", "list", "watch"]  # dropped, and the list read again
    assert len(sent) >= 5 and max(sent) <= 11  # every watch dropped after 10 s of bytes without an event
    assert reflector.last_error and "no event or bookmark for 10 s" in reflector.last_error


def test_the_async_driver_makes_the_same_decisions_as_the_blocking_one():
    """The sidecar's path (AsyncClient, AsyncOps) against the fault init's path was checked with above."""
    clock = Clock()
    transport = AsyncMockTransport(lambda request: [] if request.verb == "watch" else listing())
    client = AsyncClient(CONFIG, transport=transport, clock=clock)
    ops = AsyncOps(lambda: client.list_pods("default", "job=x"),
                   lambda rv, timeout, idle: client.watch_pods("default", "job=x", rv, timeout=timeout, idle=idle),
                   clock=clock, sleep=clock.async_sleep)
    assert asyncio.run(reflect(Reflector("pods", rand=lambda: 0.5), ops, Recorder(), deadline=MINUTE)) is False
    assert rate(transport.requests, MINUTE) <= 1.05


def paged(request: Request) -> Response | Iterable[bytes]:
    token = query(request).get("continue", "")
    if request.verb == "watch":
        return [line("ADDED", pod("c", "12"))]
    following = {"": "p2", "p2": "p3", "p3": ""}[token]
    body = {"metadata": {"resourceVersion": "10", **({"continue": following} if following else {})},
            "items": [pod(f"pod-{token or 'p1'}", "10")]}
    return Response(200, json.dumps(body).encode())


def test_both_clients_send_the_same_requests_and_read_the_same_answers():
    sync_transport, async_transport = MockTransport(paged), AsyncMockTransport(paged)
    sync_client = Client(CONFIG, transport=sync_transport)
    async_client = AsyncClient(CONFIG, transport=async_transport)

    async def async_side() -> tuple[Any, list[WatchEvent]]:
        listed = await async_client.list_pods("default", "job=x")
        events = [e async for e in async_client.watch_pods("default", "job=x", "10", timeout=50)]
        return listed, events

    sync_listed = sync_client.list_pods("default", "job=x")
    sync_events = list(sync_client.watch_pods("default", "job=x", "10", timeout=50))
    assert (sync_listed, sync_events) == asyncio.run(async_side())
    assert sync_listed[1] == "10" and [p["metadata"]["name"] for p in sync_listed[0]] == ["pod-p1", "pod-p2", "pod-p3"]
    assert sync_transport.requests == async_transport.requests
    assert [query(r).get("continue") for r in sync_transport.requests[:3]] == [None, "p2", "p3"]
    assert "resourceVersion" not in query(sync_transport.requests[1])  # refused together with a continue token


@pytest.mark.parametrize("status, kind", [(403, "ApiForbidden"), (404, "ApiNotFound"), (409, "ApiConflict"),
                                          (410, "ApiGone"), (429, "ApiUnavailable"), (503, "ApiUnavailable"),
                                          (400, "ApiError")])
def test_every_status_means_the_same_error_on_both_clients(status, kind):
    answer = Response(status, b'{"message":"m"}')
    sync_client = Client(CONFIG, transport=MockTransport(lambda request: answer))
    async_client = AsyncClient(CONFIG, transport=AsyncMockTransport(lambda request: answer))
    with pytest.raises(Exception) as sync_err:
        sync_client.get_pod("default", "p")
    with pytest.raises(Exception) as async_err:
        asyncio.run(async_client.get_pod("default", "p"))
    assert type(sync_err.value).__name__ == type(async_err.value).__name__ == kind
    assert str(sync_err.value) == str(async_err.value)


def test_a_deadline_ends_requests_with_the_clients_budget():
    clock = Clock()
    client = Client(CONFIG, transport=MockTransport(lambda request: listing()), clock=clock)
    client.budget.deadline = 5.0
    client.get_object("/api/v1/namespaces/default/pods/p")
    clock.now = 5.0
    with pytest.raises(ApiUnavailable, match="deadline"):
        client.get_object("/api/v1/namespaces/default/pods/p")


async def test_a_watch_left_because_the_caller_is_satisfied_is_closed_before_reflect_returns():
    """init leaves its watch when the gang is complete, then closes its client: a watch stream closed only when
    collected held its socket past the client's close (an unclosed TLS socket, CI on Python 3.13)."""
    clock, closed, streams = Clock(), [], []

    async def watch(rv: str, timeout: float, idle: float):
        try:
            yield WatchEvent("ADDED", pod("a", "11"))
            yield WatchEvent("ADDED", pod("b", "12"))
        finally:
            closed.append(rv)

    def start(rv: str, timeout: float, idle: float):
        stream = watch(rv, timeout, idle)
        streams.append(stream)  # held elsewhere, as a generator in a reference cycle is
        return stream

    async def listed() -> tuple[list[Any], str]:
        return [pod("a", "10")], "10"

    ops = AsyncOps(listed, start, clock=clock, sleep=clock.async_sleep)
    recorder = Recorder()
    assert await reflect(Reflector("pods", None, rand=lambda: 0.5, now=clock()), ops, recorder,
                         done=lambda: bool(recorder.events)) is True
    assert [e.object["metadata"]["name"] for e in recorder.events] == ["a"]
    assert closed == ["10"]  # at once, not when the stream is collected


def test_the_blocking_driver_closes_the_clients_watch_as_it_leaves_it():
    """The same for init's blocking client: the watch's generator (its connection) is closed by the driver."""
    clock, closed = Clock(), []

    def watch(rv: str, timeout: float, idle: float):
        try:
            yield WatchEvent("ADDED", pod("a", "11"))
            yield WatchEvent("ADDED", pod("b", "12"))
        finally:
            closed.append(rv)

    class Client:  # the blocking client's calls, as k8s/blocking.py makes them
        def list_objects(self, path, **_):
            return [pod("a", "10")], "10"

        def watch_objects(self, path, rv, **kwargs):
            return watch(rv, kwargs["timeout"], kwargs["idle"])

    client = Blocking(Client())  # type: ignore[arg-type]
    ops = blocking_ops(lambda: client.list_objects("/pods"),
                       lambda rv, timeout, idle: client.watch_objects("/pods", rv, timeout=timeout, idle=idle), clock)
    recorder = Recorder()
    assert asyncio.run(reflect(Reflector("pods", None, rand=lambda: 0.5, now=clock()), ops, recorder,
                               done=lambda: bool(recorder.events))) is True
    assert closed == ["10"]
