"""The webhook's server (runtime/webhook/webhook.py): one GET per namespace for a burst of pods, a namespace it cannot
read refuses the pod with the reason, a body that is not an AdmissionReview gets 400, metrics count results."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import gc
import io
import json
import os
import re
import socket
import ssl
import sys
import time

import aiohttp
import pytest
from aiohttp.test_utils import RawTestServer, TestClient, TestServer

from agent import __version__
from agent.core.adoption.injection import PREFIX, Settings
from agent.errors import ApiForbidden, ApiNotFound
from agent.runtime.webhook import certs
from agent.runtime.webhook.serving import BoundedServer, Limits
from agent.runtime.webhook.tls import load_tls
from agent.runtime.webhook.webhook import MAX_BODY, REVIEWER, Budget, Webhook, WebhookSettings, review_timeout


class Namespaces:
    """The API as the webhook uses it per request: GET a namespace."""

    def __init__(self, annotations: dict[str, dict[str, str]], forbidden: bool = False,
                 hang: set[str] = frozenset(), delay: float = 0.01) -> None:  # type: ignore[assignment]
        self.annotations, self.forbidden, self.hang, self.delay, self.gets = annotations, forbidden, hang, delay, 0
        self.paths: list[str] = []

    async def get_object(self, path: str, *, metadata_only: bool = False) -> dict:
        self.gets += 1
        self.paths.append(path)
        await asyncio.sleep(self.delay)
        if path.rsplit("/", 1)[1] in self.hang:
            await asyncio.sleep(3600)
        if self.forbidden:
            raise ApiForbidden('namespaces "team-a" is forbidden: cannot get', status=403)
        name = path.rsplit("/", 1)[1]
        if name not in self.annotations:
            raise ApiNotFound("not found", status=404)
        return {"metadata": {"name": name, "annotations": self.annotations[name]}}


def review(uid: str, namespace: str = "team-a") -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": namespace,
        "operation": "CREATE", "object": {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "w-"},
            "spec": {"containers": [{"name": "t", "image": "t"}]}}}}


async def serve(api) -> TestClient:
    webhook = Webhook(api, WebhookSettings(), version=__version__)  # type: ignore[arg-type]
    client = TestClient(TestServer(webhook.app()))
    await client.start_server()
    return client


async def test_a_burst_of_pods_reads_the_namespace_once_and_gets_its_settings():
    api = Namespaces({"team-a": {PREFIX + "timeout": "77"}})
    client = await serve(api)
    try:
        answers = await asyncio.gather(*(client.post("/mutate", json=review(f"u{i}")) for i in range(20)))
        for i, answer in enumerate(answers):
            body = await answer.json()
            assert body["response"]["uid"] == f"u{i}" and body["response"]["allowed"] is True
            assert "77" in json.dumps(json.loads(base64.b64decode(body["response"]["patch"])))
        assert api.gets == 1
        metrics = await (await client.get("/metrics")).text()
        assert 'topology_agent_webhook_reviews_total{result="patched"} 20.0' in metrics
    finally:
        await client.close()


async def test_the_image_set_on_the_webhook_is_the_agents_in_each_pod_and_a_namespaces_annotation_wins():
    """The webhook's --set image= (from manifests/webhook's images: entry) is the agent's image in the pods it
    injects, as inject's --set is; a namespace's topology-agent.io/image is more specific and wins."""
    api = Namespaces({"team-a": {}, "team-b": {PREFIX + "image": "registry.example.com/b/topology-agent:2"}})
    settings = WebhookSettings(defaults=Settings({"image": "registry.example.com/team/topology-agent:9.9.9"}))
    client = TestClient(TestServer(Webhook(api, settings, version=__version__).app()))  # type: ignore[arg-type]
    await client.start_server()
    try:
        for namespace, image in (("team-a", "registry.example.com/team/topology-agent:9.9.9"),
                                 ("gone", "registry.example.com/team/topology-agent:9.9.9"),
                                 ("team-b", "registry.example.com/b/topology-agent:2")):
            body = await (await client.post("/mutate", json=review("u1", namespace=namespace))).json()
            ops = json.loads(base64.b64decode(body["response"]["patch"]))
            added = [c for op in ops if op["path"] == "/spec/initContainers" for c in op["value"]]
            assert [c["image"] for c in added] == [image], (namespace, ops)
    finally:
        await client.close()


async def test_a_namespace_it_cannot_read_refuses_the_pod_and_says_why():
    client = await serve(Namespaces({}, forbidden=True))
    try:
        body = await (await client.post("/mutate", json=review("u1"))).json()
        assert body["response"]["allowed"] is False
        message = body["response"]["status"]["message"]
        assert message.startswith("topology-agent: cannot read Namespace team-a's topology-agent.io/ settings")
        assert "RBAC (get namespaces)" in message
    finally:
        await client.close()


async def test_what_is_not_an_admission_review_gets_400_and_a_missing_namespace_no_defaults():
    client = await serve(Namespaces({}))
    try:
        answer = await client.post("/mutate", data=b"{not json")
        assert answer.status == 400
        answer = await client.post("/mutate", json={"kind": "AdmissionReview", "apiVersion": "v1"})
        assert answer.status == 400 and "only admission.k8s.io/v1" in await answer.text()
        body = await (await client.post("/mutate", json=review("u2", namespace="gone"))).json()
        assert body["response"]["allowed"] is True
        assert (await client.get("/readyz")).status == 503  # no certificate loaded in this test
    finally:
        await client.close()


async def test_the_sidecars_health_port_serves_topology_json_only_when_asked():
    """The health port is open to the pod network (the kubelet probes it); the job's layout is
    served there only with --health-topology."""
    from agent.runtime.health import health_handler
    from agent.runtime.metrics import SidecarMetrics

    class Status:
        metrics = SidecarMetrics()
        healthy, generation, document = True, 3, b'{"generation": 3}'

        def unready(self):
            return None

    for topology, want in ((False, 404), (True, 200)):
        client = TestClient(RawTestServer(health_handler(Status(), topology=topology)))
        await client.start_server()
        try:
            answer = await client.get("/topology")
            assert answer.status == want
            if not topology:
                assert "--health-topology" in await answer.text()
            else:
                assert await answer.json() == {"generation": 3}
            assert (await client.get("/readyz")).status == 200
        finally:
            await client.close()


async def test_the_sidecars_health_port_answers_probes_and_nothing_else():
    """What the kubelet and Prometheus ask (GET, HEAD), each path's status as the sidecar says it; any
    other path 404, any other method 405."""
    from agent.runtime.health import health_handler
    from agent.runtime.metrics import SidecarMetrics

    class Status:
        metrics = SidecarMetrics()
        healthy, generation, document = False, 0, None

        def unready(self):
            return "no files written yet"

    client = TestClient(RawTestServer(health_handler(Status(), topology=True)))
    await client.start_server()
    try:
        stuck = await client.get("/healthz")
        assert stuck.status == 503 and "stuck" in await stuck.text()
        unready = await client.get("/readyz")
        assert unready.status == 503 and await unready.text() == "not ready: no files written yet\n"
        metrics = await client.get("/metrics")
        assert metrics.status == 200 and metrics.headers["Content-Type"].startswith("text/plain")
        assert "topology_agent" in await metrics.text()
        none_yet = await client.get("/topology")
        assert none_yet.status == 503 and "error" in await none_yet.json()
        head = await client.head("/healthz")
        assert head.status == 503 and await head.read() == b""
        assert (await client.get("/")).status == 404 and (await client.get("/healthz/x")).status == 404
        posted = await client.post("/readyz", data=b"x")
        assert posted.status == 405 and posted.headers["Allow"] == "GET, HEAD"
    finally:
        await client.close()


# The webhook under hostile callers. The server runs in process on loopback with its real TLS listener
# (serving.py) and small limits, so each bound shows in a second or two.

def tls_pair() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(the server's context, a client's that trusts it) for 127.0.0.1."""
    now = datetime.datetime.now(datetime.UTC)
    ca, ca_key = certs.new_ca(now)
    cert, key = certs.issue(ca, ca_key, ["127.0.0.1"], now)
    client = ssl.create_default_context(cadata=ca.decode())
    return load_tls(None, cert, key), client


class Served:
    def __init__(self, webhook: Webhook, server: BoundedServer, client: ssl.SSLContext) -> None:
        self.webhook, self.server, self.client = webhook, server, client

    async def post(self, body: bytes, path: str = "/mutate") -> tuple[int, bytes, float]:
        """One review on a connection of its own: (status, body, seconds)."""
        started = time.monotonic()
        url = f"https://127.0.0.1:{self.server.port}{path}"
        async with aiohttp.ClientSession() as session, session.post(
                url, data=io.BytesIO(body), ssl=self.client, headers={"Content-Type": "application/json"}) as answer:
            return answer.status, await answer.read(), time.monotonic() - started

    async def get(self, path: str) -> tuple[int, float]:
        started = time.monotonic()
        url = f"https://127.0.0.1:{self.server.port}{path}"
        async with aiohttp.ClientSession() as session, session.get(url, ssl=self.client) as answer:
            await answer.read()
            return answer.status, time.monotonic() - started


@contextlib.asynccontextmanager
async def served(api, **limits: float):
    context, client = tls_pair()
    webhook = Webhook(api, WebhookSettings(), version=__version__)
    webhook.tls = context
    server = BoundedServer(webhook.app(), lambda: context, Limits(**limits))  # type: ignore[arg-type]
    await server.start("127.0.0.1", 0)
    try:
        yield Served(webhook, server, client)
    finally:
        await server.close()
        await webhook.reviewer.close()


async def until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.01)


async def closed_by_server(reader: asyncio.StreamReader, timeout: float) -> bool:
    """Whether the peer closes the connection within ``timeout`` seconds (no byte is expected before)."""
    try:
        return await asyncio.wait_for(reader.read(1), timeout) == b""
    except TimeoutError:
        return False
    except (ConnectionResetError, ssl.SSLError):
        return True


async def test_idle_connections_past_the_limit_make_room_for_a_review():
    """300 idle connections took a webhook from 72 to 161 MB: now at most ``connections`` are open, and a newcomer
    takes the place of the connection that has waited longest without a request, so a flood of idle connections
    keeps no review out."""
    async with served(Namespaces({}), connections=8) as s:
        sockets = []
        for _ in range(40):
            sock = socket.socket()
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.connect(("127.0.0.1", s.server.port))
            sockets.append(sock)
        await until(lambda: s.server.evicted == 32)
        assert s.server.open == 8
        status, body, _ = await s.post(json.dumps(review("u1")).encode())  # the 40 are still connected
        assert status == 200 and json.loads(body)["response"]["allowed"] is True
        assert s.server.open <= 8
        for sock in sockets:
            sock.close()


async def test_a_connection_serving_a_review_is_never_closed_for_a_newcomer():
    api = Namespaces({}, delay=0.5)
    async with served(api, connections=4) as s:
        slow = [asyncio.create_task(s.post(json.dumps(review(f"slow{i}", namespace=f"team-{i}")).encode()))
                for i in range(4)]
        await until(lambda: api.gets == 4)  # four reviews in progress, every slot taken
        late = asyncio.create_task(s.post(json.dumps(review("late")).encode()))
        for task in slow:
            status, body, _ = await task
            assert status == 200 and json.loads(body)["response"]["allowed"] is True
        status, body, _ = await late  # it waited for a slot
        assert status == 200 and s.server.evicted == 0


async def test_a_connection_that_never_says_hello_or_never_finishes_its_head_is_closed():
    """No ClientHello: held 60 s before; a head sent in part (Slowloris): held for good before."""
    async with served(Namespaces({}), handshake=0.5, head=0.5) as s:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.server.port)
        assert await closed_by_server(reader, 5.0)
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", s.server.port, ssl=s.client)
        writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        await writer.drain()
        assert await closed_by_server(reader, 5.0)
        writer.close()
        assert s.server.slow_heads == 1
        await until(lambda: s.server.open == 0)


async def test_a_keep_alive_connection_between_reviews_is_not_taken_for_a_slow_head():
    async with served(Namespaces({}), head=0.3) as s, aiohttp.ClientSession() as session:
        url = f"https://127.0.0.1:{s.server.port}/mutate"
        for i in range(2):
            async with session.post(url, json=review(f"u{i}"), ssl=s.client) as answer:
                assert answer.status == 200
            if i == 0:
                await asyncio.sleep(0.6)  # idle longer than the head timeout, shorter than the idle one
        assert s.server.slow_heads == 0


async def test_a_keep_alive_connection_that_starts_its_next_head_and_stops_is_closed():
    """Slowloris after one whole review: the head's clock starts again at the first byte of the next request,
    so a connection that sends half a head after a review is not held until its idle timeout (120 s)."""
    async with served(Namespaces({}), head=0.5) as s:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.server.port, ssl=s.client)
        body = json.dumps(review("u1")).encode()
        writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = re.search(rb"content-length: *(\d+)", head, re.IGNORECASE)
        assert head.startswith(b"HTTP/1.1 200") and length is not None
        await reader.readexactly(int(length.group(1)))
        await asyncio.sleep(0.8)  # idle between requests, longer than the head timeout: kept (keep-alive)
        assert s.server.open == 1 and s.server.slow_heads == 0
        writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        await writer.drain()
        assert await closed_by_server(reader, 5.0)
        assert s.server.slow_heads == 1
        writer.close()


@pytest.mark.slow
async def test_a_body_too_large_or_of_unknown_length_is_refused_before_it_is_read():
    async with served(Namespaces({})) as s:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.server.port, ssl=s.client)
        writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1))
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 413")
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", s.server.port, ssl=s.client)
        writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 411")
        writer.close()


def big_pod_review(uid: str, megabytes: float) -> bytes:
    body = review(uid)
    count = int(megabytes * (1 << 20) / 40)
    body["request"]["object"]["spec"]["containers"][0]["env"] = [
        {"name": f"VARIABLE_{i}", "value": f"value-{i}"} for i in range(count)]
    return json.dumps(body).encode()


async def test_a_large_object_is_reviewed_in_its_own_process_while_health_and_small_reviews_go_on():
    """All review work ran on the event loop: /healthz took 3.1 s and a small review 8.35 s behind a 2.85 MiB Pod.
    A large body goes to the reviewing process; the server's loop only waits for it."""
    async with served(Namespaces({})) as s:
        big = asyncio.create_task(s.post(big_pod_review("big", 3)))
        await until(lambda: s.webhook.reviewer.pid is not None)
        pid = s.webhook.reviewer.pid
        status, _ = await s.get("/healthz")
        small = await s.post(json.dumps(review("small")).encode())
        assert not big.done()  # both answered while the large one was under review
        assert status == 200 and small[0] == 200 and json.loads(small[1])["response"]["uid"] == "small"
        status, body, _ = await big
        assert status == 200, body
        answer = json.loads(body)["response"]
        assert answer["uid"] == "big" and answer["allowed"] is True and len(answer["patch"]) < 8192
        assert pid != os.getpid() and s.webhook.reviewer.started == 1


async def test_bodies_are_read_only_while_those_held_fit_the_budget():
    """Six 7.9 MiB bodies at once would be 47 MiB read before the first is reviewed: a body is read only when its
    Content-Length fits what the bodies held (read, or waiting for the reviewing process) leave of the budget;
    the others wait, unread, and every review is answered."""
    class Watched(Budget):
        peak = 0

        @contextlib.asynccontextmanager
        async def hold(self, size: int):
            async with super().hold(size):
                self.peak = max(self.peak, self.used)
                yield

    async with served(Namespaces({})) as s:
        s.webhook.bodies = budget = Watched(1 << 20)
        bodies = [big_pod_review(f"b{i}", 0.4) for i in range(4)]
        assert all(len(b) > (1 << 20) // 3 for b in bodies)  # three of them do not fit at once
        answers = await asyncio.gather(*(s.post(body) for body in bodies))
        assert [status for status, _, _ in answers] == [200] * 4
        assert all(json.loads(body)["response"]["allowed"] is True for _, body, _ in answers)
        assert max(len(b) for b in bodies) <= budget.peak <= 1 << 20 and budget.used == 0


async def test_a_review_with_more_json_values_than_the_webhook_reads_is_a_400_with_one_line():
    """1.2 MB of empty objects, 600000 values: refused by the reviewing process before it parses them, one line."""
    async with served(Namespaces({})) as s:
        body = review("u1")
        body["request"]["object"]["spec"]["tolerations"] = [{}] * 300_000
        status, text, _ = await s.post(json.dumps(body).encode())
        assert status == 400, text
        assert b"JSON values, more than the webhook reads (524288)" in text and len(text.strip().splitlines()) == 1
        assert s.webhook.reviewer.started == 1


async def test_a_review_that_outlives_its_deadline_is_answered_in_time_and_its_process_ended(tmp_path):
    """The reviewing process is stuck: the review is answered (503, why) before the API server's timeout and
    the next large review gets a new process."""
    stuck = tmp_path / "stuck.py"
    stuck.write_text("import sys, time\nsys.stdin.buffer.read(1)\ntime.sleep(60)\n")
    async with served(Namespaces({})) as s:
        s.webhook.reviewer.command = [sys.executable, str(stuck)]
        status, body, seconds = await s.post(big_pod_review("big", 0.2), path="/mutate?timeout=2s")
        assert status == 503 and b"in time" in body and seconds < 2.0
        s.webhook.reviewer.command = list(REVIEWER)
        status, body, _ = await s.post(big_pod_review("big", 0.2))
        assert status == 200 and s.webhook.reviewer.started == 2


@pytest.mark.parametrize("namespace", ["kube-system/secrets/x", "x?watch=true&timeoutSeconds=1", "..", "a b",
                                       "topology-agent-system/secrets/topology-agent-webhook-tls", "A", "x" * 64])
async def test_a_namespace_that_is_no_namespace_name_is_never_put_in_a_path(namespace):
    api = Namespaces({})
    client = await serve(api)
    try:
        body = await (await client.post("/mutate", json=review("u1", namespace=namespace))).json()
        assert api.paths == []
        assert body["response"]["allowed"] is False
        assert "is not a Kubernetes namespace name" in body["response"]["status"]["message"]
    finally:
        await client.close()


@pytest.mark.slow
async def test_the_namespaces_kept_are_bounded():
    api = Namespaces({})
    webhook = Webhook(api, WebhookSettings(namespaces=64), version=__version__)
    for i in range(300):
        await webhook.namespaces.get(f"team-{i}", within=5)
    assert len(webhook.namespaces._kept) == 64 and api.gets == 300


async def test_every_review_waiting_on_a_failing_namespace_read_is_answered_with_the_reason():
    """7 of 8 concurrent reviews got no answer (the shared read was cancelled): now all 8 are refused, saying why."""
    client = await serve(Namespaces({}, forbidden=True))
    try:
        answers = await asyncio.gather(*(client.post("/mutate", json=review(f"u{i}")) for i in range(8)))
        for i, answer in enumerate(answers):
            assert answer.status == 200
            body = await answer.json()
            assert body["response"]["uid"] == f"u{i}" and body["response"]["allowed"] is False
            assert "cannot read Namespace team-a" in body["response"]["status"]["message"]
    finally:
        await client.close()


async def test_a_hung_namespace_read_refuses_in_time_and_holds_up_no_other_namespace():
    api = Namespaces({"team-b": {}}, hang={"team-a"})
    client = await serve(api)
    try:
        hung = [asyncio.create_task(client.post("/mutate?timeout=2s", json=review(f"h{i}"))) for i in range(4)]
        started = time.monotonic()
        ok = await (await client.post("/mutate?timeout=2s", json=review("ok", namespace="team-b"))).json()
        assert ok["response"]["allowed"] is True and time.monotonic() - started < 1.0
        for task in hung:
            body = await (await task).json()
            assert body["response"]["allowed"] is False and "in time" in body["response"]["status"]["message"]
        assert time.monotonic() - started < 2.0
    finally:
        await client.close()


async def test_a_review_nested_too_deep_is_a_400_with_one_line_not_a_500():
    client = await serve(Namespaces({}))
    try:
        def nested(depth: int) -> bytes:
            text = json.dumps(review("u1"))
            deep = '{"a": ' * depth + "1" + "}" * depth
            return text.replace('"spec": {', '"spec": {"deep": ' + deep + ", ", 1).encode()

        answer = await client.post("/mutate", data=nested(900))  # a 500 and 139 KB of traceback before
        assert answer.status == 200 and (await answer.json())["response"]["allowed"] is True
        answer = await client.post("/mutate", data=nested(5000))
        assert answer.status == 400
        message = await answer.text()
        assert "nested too deep" in message and len(message.splitlines()) == 1
    finally:
        await client.close()


@pytest.mark.slow
async def test_distinct_long_settings_leave_nothing_behind():
    """30 dry-run Pods with distinct 200 KB trainer-match values: 197 MB never given back. The command lines
    checked are remembered by digest, a bounded number of them."""
    import tracemalloc

    async with served(Namespaces({})) as s:
        await s.post(json.dumps(review("warm-up")).encode())
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(100):
            pod = review(f"u{i}")
            pod["request"]["object"]["metadata"]["annotations"] = {
                PREFIX + "timeout": str(100 + i), PREFIX + "index-label": "idx",
                PREFIX + "selector": f"app=a{i}" + "".join(f",k{j}=v" for j in range(150))}
            status, body, _ = await s.post(json.dumps(pod).encode())
            assert status == 200 and json.loads(body)["response"]["allowed"] is True
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert held < 256 * 1024, held


def test_the_api_servers_timeout_parameter_sets_the_deadline():
    assert review_timeout("5s") == 5 and review_timeout("30s") == 30 and review_timeout("1m0s") == 30
    assert review_timeout("2500ms") == 2.5 and review_timeout(None) == 10 and review_timeout("soon") == 10


def test_the_command_lines_checked_are_remembered_by_digest_and_bounded():
    import tracemalloc

    from agent.runtime.webhook.webhook import _remembering

    calls = [0]
    checked = _remembering(lambda argv, where: calls.__setitem__(0, calls[0] + 1), size=1000)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(3000):
        checked(["sidecar", "--trainer-match", f"{i}" + "x" * 2000], f"pod {i}")
    checked(["sidecar", "--trainer-match", "2999" + "x" * 2000], "again")  # remembered: not checked again
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert calls[0] == 3000 and held < 256 * 1024, held
