"""init's transport (k8s/client.HttpTransport) against a loopback HTTP server that does what real servers and
proxies do to a kept connection: close it while it rests."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from agent.k8s.client import Client
from agent.k8s.config import ApiConfig

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"}}


class _ClosesAfterEachAnswer(http.server.BaseHTTPRequestHandler):
    """HTTP/1.1 without ``Connection: close``: the client may keep the connection, and the server closes it
    after the answer anyway (an idle timeout that has passed, a proxy's recycling)."""

    protocol_version = "HTTP/1.1"
    served: list[str]

    def do_GET(self) -> None:
        body = json.dumps(POD).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        self.served.append(self.path)
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


class _Server(http.server.HTTPServer):
    """Tells when it has closed a connection (``closed``), so a test can wait for the close, not race it."""

    closed = threading.Semaphore(0)

    def shutdown_request(self, request: object) -> None:
        super().shutdown_request(request)  # type: ignore[arg-type]
        self.closed.release()


@pytest.fixture
def server() -> Iterator[tuple[str, list[str], threading.Semaphore]]:
    served: list[str] = []
    handler = type("Handler", (_ClosesAfterEachAnswer,), {"served": served})
    httpd = _Server(("127.0.0.1", 0), handler)
    httpd.closed = threading.Semaphore(0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", served, httpd.closed
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_a_kept_connection_the_server_closed_is_not_used_for_the_next_call(server):
    url, served, closed = server
    client = Client(ApiConfig(server=url))
    try:
        for _ in range(3):
            assert client.get_pod("default", "p")["metadata"]["name"] == "p"
            assert client.transport.idle, "nothing said the connection would close: it is kept"
            assert closed.acquire(timeout=10), "the server did not close the connection"
    finally:
        client.close()
    assert served == ["/api/v1/namespaces/default/pods/p"] * 3
