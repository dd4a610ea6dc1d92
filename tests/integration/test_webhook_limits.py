"""The real `topology-agent webhook` process, with its shipped defaults, against callers that do not
play by the rules: idle connections past its limit, and an API server whose namespace reads hang."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from tests.integration.test_webhook import SECRET, cluster, get, start_webhook, stop  # noqa: F401 (fixture)
from tests.runtime.test_webhook_server import review

pytestmark = pytest.mark.xdist_group("timing")  # these measure time: one at a time


def serving(sandbox, proc) -> ssl.SSLContext:
    """Once the webhook has written its Secret and listens: a client context that trusts its CA."""
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the webhook did not start serving"
        try:
            trust = base64.b64decode(get(sandbox, SECRET)["data"]["ca.crt"]).decode()
            with socket.create_connection(("127.0.0.1", sandbox.webhook_port), timeout=1):
                return ssl.create_default_context(cadata=trust)
        except (AssertionError, OSError, KeyError):
            time.sleep(0.1)


def post(port: int, context: ssl.SSLContext, body: dict, query: str = "") -> tuple[dict, float]:
    data = json.dumps(body).encode()
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw, \
            context.wrap_socket(raw, server_hostname="topology-agent-webhook.topology-agent-system.svc") as tls:
        tls.sendall(b"POST /mutate%s HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (query.encode(), len(data), data))
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return json.loads(payload), time.monotonic() - started


def test_idle_connections_past_the_limit_are_not_held_and_keep_no_review_out(cluster):  # noqa: F811
    """300 idle TCP connections were all held (~300 KB each): now the process holds at most its limit, and a
    review gets in while they are still connected."""
    proc = start_webhook(cluster)
    try:
        context = serving(cluster, proc)
        sockets = [socket.create_connection(("127.0.0.1", cluster.webhook_port)) for _ in range(300)]
        try:
            webhook = psutil.Process(proc.pid)

            def accepted() -> int:
                return sum(1 for c in webhook.net_connections(kind="tcp")
                           if c.laddr and c.laddr.port == cluster.webhook_port and c.status == psutil.CONN_ESTABLISHED)

            deadline = time.monotonic() + 10
            while accepted() < 128 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
            assert accepted() == 128
            answer, _ = post(cluster.webhook_port, context, review("during"))
            assert answer["response"]["allowed"] is True
        finally:
            for sock in sockets:
                sock.close()
    finally:
        stop(proc)


def test_hanging_namespace_reads_refuse_in_time_and_a_healthy_namespace_is_not_held_up(cluster):  # noqa: F811
    """The client allowed 4 connections and counted waiting for one as connecting: 4 hung reads made a healthy
    namespace's pod be refused after 5.0 s, and the hung reviews were answered after 30 s."""
    proc = start_webhook(cluster)
    try:
        context = serving(cluster, proc)
        cluster.faults(delay=60, delay_count=4, path="/api/v1/namespaces/slow-")
        with ThreadPoolExecutor(8) as pool:
            hung = [pool.submit(post, cluster.webhook_port, context, review(f"h{i}", namespace=f"slow-{i}"),
                                "?timeout=3s") for i in range(4)]
            time.sleep(0.5)  # the four reads are under way
            answer, seconds = post(cluster.webhook_port, context, review("ok", namespace="default"), "?timeout=3s")
            assert answer["response"]["allowed"] is True and seconds < 1.5, seconds
            for future in hung:
                answer, seconds = future.result()
                assert answer["response"]["allowed"] is False and seconds < 3.0, seconds
                assert "in time" in answer["response"]["status"]["message"]
    finally:
        cluster.faults(clear=True)
        stop(proc)
