"""The sandbox API server's fidelity, shown with real kubectl and with the agent's own client."""

from __future__ import annotations

import json
import threading

import pytest

from agent import examples
from agent.errors import ApiForbidden, ApiGone, ApiNotFound, ApiUnavailable
from agent.k8s.client import Client
from agent.k8s.config import kubeconfig_config

POD_YAML = """
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: demo, role: {role}}}
spec:
  containers: [{{name: trainer, image: trainer:1}}]
"""


@pytest.fixture
def client(sandbox):
    api = Client(kubeconfig_config(str(sandbox.sandbox.kubeconfig)))
    yield api
    api.close()


def test_kubectl_apply_get_label_patch_status_delete(kubectl):
    for name, role in (("a-0", "master"), ("a-1", "worker")):
        out = kubectl("apply", "-f", "-", input=POD_YAML.format(name=name, role=role))
        assert f"pod/{name} created" in out.stdout
    again = kubectl("apply", "-f", "-", input=POD_YAML.format(name="a-0", role="master"))
    assert "pod/a-0 unchanged" in again.stdout
    listed = json.loads(kubectl("get", "pods", "-o", "json").stdout)
    assert [p["metadata"]["name"] for p in listed["items"]] == ["a-0", "a-1"]
    assert all(p["metadata"]["uid"] and p["metadata"]["resourceVersion"] for p in listed["items"])
    assert listed["items"][0]["status"]["phase"] == "Pending"
    kubectl("label", "pod", "a-1", "gen=2")
    selected = json.loads(kubectl("get", "pods", "-l", "gen=2,role in (worker)", "-o", "json").stdout)
    assert [p["metadata"]["name"] for p in selected["items"]] == ["a-1"]
    kubectl("patch", "pod", "a-1", "--subresource=status", "-p",
            '{"status":{"phase":"Running","podIP":"127.1.0.9"}}')
    pod = json.loads(kubectl("get", "pod", "a-1", "-o", "json").stdout)
    assert pod["status"]["podIP"] == "127.1.0.9" and pod["metadata"]["labels"]["gen"] == "2"
    by_field = json.loads(kubectl("get", "pods", "--field-selector", "status.phase=Running", "-o", "json").stdout)
    assert [p["metadata"]["name"] for p in by_field["items"]] == ["a-1"]
    kubectl("delete", "pod", "a-0")
    missing = kubectl("get", "pod", "a-0", check=False)
    assert missing.returncode != 0 and 'pods "a-0" not found' in missing.stderr


def test_kubectl_get_pods_output_feeds_render(kubectl, sandbox, tmp_path):
    for pod in examples.pytorchjob(workers=1):
        sandbox.create_pod(pod)
    path = tmp_path / "pods.json"
    path.write_text(kubectl("get", "pods", "-o", "json").stdout)
    from agent.cli import main

    assert main(["render", "--pods", str(path), "--self", "mnist-worker-0", "--out", str(tmp_path / "o")]) == 0
    assert "export NODE_RANK='1'" in (tmp_path / "o" / "torch.env").read_text()


def test_kubectl_sees_a_403_fault_as_forbidden(kubectl, sandbox):
    sandbox.faults(status=403)
    result = kubectl("get", "pods", check=False)
    assert result.returncode != 0 and "forbidden" in result.stderr.lower()


def test_list_then_watch_from_its_resource_version_sees_only_later_changes(client, sandbox):
    for pod in examples.volcano_job(tasks=(("master", 1), ("worker", 1))):
        sandbox.create_pod(pod)
    items, rv = client.list_pods("default", "volcano.sh/job-name=demo")
    assert len(items) == 2 and rv

    seen = []

    def watch():
        for event in client.watch_pods("default", "volcano.sh/job-name=demo", rv, timeout=3):
            seen.append((event.type, event.object["metadata"].get("name")))

    thread = threading.Thread(target=watch)
    thread.start()
    sandbox.set_pod_ip("default", "demo-worker-0", "127.1.0.7")
    sandbox.update_pod("default", "demo-master-0", lambda p: p["metadata"]["labels"].pop("volcano.sh/job-name"))
    thread.join(10)
    changes = [e for e in seen if e[0] != "BOOKMARK"]
    assert changes == [("MODIFIED", "demo-worker-0"), ("DELETED", "demo-master-0")]
    assert ("BOOKMARK", None) in seen  # bookmarks every 0.5 s in the fixture


def test_watch_from_a_compacted_resource_version_gets_410(client, sandbox):
    sandbox.create_pod(examples.indexed_job(completions=1)[0])
    _, rv = client.list_pods("default", "")
    sandbox.create_pod(examples.indexed_job("other", completions=1)[0])
    sandbox.faults(compact=True)
    with pytest.raises(ApiGone):
        list(client.watch_pods("default", "", rv, timeout=2))


def test_client_maps_statuses_to_the_agent_errors(client, sandbox):
    with pytest.raises(ApiNotFound):
        client.get_pod("default", "nope")
    sandbox.faults(status=503, count=1, retry_after=2)
    with pytest.raises(ApiUnavailable) as info:
        client.get_pod("default", "nope")
    assert info.value.retry_after == 2.0
    sandbox.faults(status=401, count=1)
    with pytest.raises(ApiForbidden):
        client.get_pod("default", "nope")


def test_no_library_exception_leaks_from_the_client_when_the_server_is_gone(sandbox):
    config = kubeconfig_config(str(sandbox.sandbox.kubeconfig))
    sandbox.stop()
    client = Client(config)
    with pytest.raises(ApiUnavailable):
        client.get_pod("default", "x")
    with pytest.raises(ApiUnavailable):
        list(client.watch_pods("default", "", "1", timeout=1))
    client.close()


def test_inits_client_asks_each_call_on_the_connection_the_last_one_read_whole(sandbox, client):
    """A GET, an error's answer and a paged LIST each end with their connection kept for the next call: one TLS
    handshake for a pod's init, however many calls it makes, and no more than two connections (a page asked for
    ahead runs on the second)."""
    for pod in examples.volcano_job("demo", (("master", 1), ("worker", 5))):
        sandbox.create_pod(pod)
    local: set[tuple] = set()

    def kept() -> None:
        assert client.transport.idle, "the connection was closed after an answer read whole"
        local.update(conn.sock.getsockname() for conn in client.transport.idle)

    client.get_pod("default", "demo-master-0")
    kept()
    with pytest.raises(ApiNotFound):
        client.get_pod("default", "nope")
    kept()
    names, _ = client.list_objects("/api/v1/namespaces/default/pods", limit=2,
                                   keep=lambda items: [i["metadata"]["name"] for i in items])
    assert len(names) == 6
    kept()
    client.get_pod("default", "demo-master-0")
    kept()
    assert 1 <= len(local) <= 2


def test_keygen_prints_a_secret_and_apply_creates_it(sandbox, capsys):
    import yaml

    from agent.cli import main

    assert main(["keygen", "--job", "train"]) == 0
    manifest = yaml.safe_load(capsys.readouterr().out)
    assert manifest["kind"] == "Secret" and manifest["metadata"]["name"] == "train-ssh"
    assert set(manifest["data"]) == {"id_ed25519", "id_ed25519.pub", "host_ca", "host_ca.pub"}
    assert main(["keygen", "--job", "train", "--apply", "--kubeconfig", str(sandbox.sandbox.kubeconfig)]) == 0
    assert "secret/train-ssh created" in capsys.readouterr().out
    stored = sandbox.sandbox.store.get("/v1/secrets", "default", "train-ssh")
    assert set(stored["data"]) == set(manifest["data"])
    assert stored["data"]["host_ca"] != manifest["data"]["host_ca"]  # every keygen makes new keys


def test_pods_are_listed_in_pages_each_cut_down_as_its_bytes_come(sandbox, client):
    """Pages bound a LIST's memory (a 4096-pod LIST parsed at once would take the leader to ~200 MB), and each
    page's items are cut down (``keep``) a read at a time, never a whole page parsed."""
    import asyncio

    from agent.k8s.async_client import AsyncClient
    from agent.k8s.core import PAGE, page_query

    pods = examples.volcano_job("demo", (("master", 1), ("worker", 2 * PAGE + 10)))
    for pod in pods:
        sandbox.create_pod(pod)
    batches: list[int] = []

    def keep(items):
        batches.append(len(items))
        return [item["metadata"]["name"] for item in items]

    before = client.traffic.requests
    names, rv = client.list_pods("default", "volcano.sh/job-name=demo", keep=keep)
    assert sorted(names) == sorted(p["metadata"]["name"] for p in pods) and rv
    assert sum(batches) == 2 * PAGE + 11 and max(batches) < PAGE and client.traffic.requests - before == 3

    async def listed() -> list[str]:
        async with AsyncClient(kubeconfig_config(str(sandbox.sandbox.kubeconfig))) as api:
            found, _ = await api.list_pods("default", "volcano.sh/job-name=demo", keep=keep)
            return found

    assert sorted(asyncio.run(listed())) == sorted(names)
    # The API server refuses a resourceVersion with a continue token.
    assert page_query({"resourceVersion": "0", "labelSelector": "a=b"}, 500, "tok") == \
        {"labelSelector": "a=b", "limit": "500", "continue": "tok"}


def test_kubectl_lists_the_nodes_and_their_topology_labels(sandbox, kubectl):
    from agent import examples

    for node in examples.racks(examples.volcano_job(tasks=(("master", 1), ("worker", 1)))):
        sandbox.create_node(node)
    listed = kubectl("get", "nodes", "-L", examples.RACK).stdout.split()
    # kube-apiserver's columns for Nodes, then the label asked for
    assert listed[:6] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION", "RACK"]
    assert "node-1" in listed and "rack-b" in listed and "Ready" in listed
    labels = kubectl("get", "node", "node-0", "-o", "jsonpath={.metadata.labels.example\\.com/rack}").stdout
    assert labels == "rack-a"


def test_a_paged_list_continues_the_snapshot_of_its_first_page(sandbox, client):
    """As the API server lists etcd at the first page's revision: a pod created or changed between two pages is
    not in (or not changed in) the later pages, every page carries the first page's resourceVersion, and a
    continue token the server no longer holds gets 410 Expired."""
    from agent.k8s.core import list_page, page_query

    for pod in examples.volcano_job("demo", (("master", 1), ("worker", 5))):
        sandbox.create_pod(pod)
    path = "/api/v1/namespaces/default/pods"
    first = client.call(list_page(path, page_query({"labelSelector": "volcano.sh/job-name=demo"}, 2, "")))
    version = first["metadata"]["resourceVersion"]
    sandbox.set_pod_ip("default", "demo-worker-4", "127.0.0.99")
    late = examples.volcano_job("demo", (("master", 1), ("worker", 7)))[-1]  # demo-worker-6
    sandbox.create_pod(late)
    pages, token = [first], first["metadata"]["continue"]
    while token:
        page = client.call(list_page(path, page_query({"labelSelector": "volcano.sh/job-name=demo"}, 2, token)))
        pages.append(page)
        token = page["metadata"].get("continue", "")
    items = [item for page in pages for item in page["items"]]
    assert [i["metadata"]["name"] for i in items] == \
        ["demo-master-0", *(f"demo-worker-{k}" for k in range(5))]  # demo-worker-6 came later
    assert {page["metadata"]["resourceVersion"] for page in pages} == {version}
    changed = next(i for i in items if i["metadata"]["name"] == "demo-worker-4")
    assert changed["status"].get("podIP") != "127.0.0.99"
    with pytest.raises(ApiGone):
        client.call(list_page(path, page_query({"labelSelector": "volcano.sh/job-name=demo"}, 2, "999:2")))


def test_the_next_page_is_asked_for_before_this_one_is_parsed(sandbox, client, monkeypatch):
    """init asks for page k+1 while it parses page k, with the continue token read from the page's first bytes
    (the list's metadata comes before its items); a wrong peek costs one request, never a wrong list."""
    from agent.k8s import core
    from agent.k8s.core import PAGE, peek_continue

    head = b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7","continue":"3:500",' \
           b'"remainingItemCount":9},"items":[{"metadata":{"name":"a","continue":"x"}}]}'
    assert peek_continue(head) == "3:500"
    assert peek_continue(b'{"items":[],"metadata":{"continue":"3:500"}}') == ""  # items first: no peek
    assert peek_continue(b'{"metadata":{"continue":"a\\u003db"},"items":[]}') == ""  # escaped: no peek
    for pod in examples.volcano_job("demo", (("master", 1), ("worker", 2 * PAGE + 10))):
        sandbox.create_pod(pod)
    before = client.traffic.requests
    names, _ = client.list_pods("default", "volcano.sh/job-name=demo", keep=lambda items: [
        i["metadata"]["name"] for i in items])
    assert len(names) == 2 * PAGE + 11 and client.traffic.requests - before == 3
    monkeypatch.setattr(core, "peek_continue", lambda raw: "999:1")  # always wrong
    before = client.traffic.requests
    again, _ = client.list_pods("default", "volcano.sh/job-name=demo", keep=lambda items: [
        i["metadata"]["name"] for i in items])
    assert again == names and client.traffic.requests - before == 6  # each wrong peek: one extra request


def test_the_sandbox_certificate_passes_strict_x509_verification(sandbox):
    """Python 3.13's default context sets VERIFY_X509_STRICT (and VERIFY_X509_PARTIAL_CHAIN): the sandbox's
    certificates carry what a strict verifier asks for, checked here on any Python."""
    import socket
    import ssl

    context = ssl.create_default_context(cafile=str(sandbox.sandbox.state_dir / "ca.crt"))
    context.verify_flags |= ssl.VERIFY_X509_STRICT | getattr(ssl, "VERIFY_X509_PARTIAL_CHAIN", 0)
    with socket.create_connection(("127.0.0.1", sandbox.sandbox.port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        assert tls.version() in ("TLSv1.2", "TLSv1.3")


def _exchange(sandbox, head: str, body: bytes = b"") -> bytes:
    """One request over a raw TLS socket, the connection closed after the answer: every byte either way."""
    import socket
    import ssl

    context = ssl.create_default_context(cafile=str(sandbox.sandbox.state_dir / "ca.crt"))
    with socket.create_connection(("127.0.0.1", sandbox.sandbox.port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        tls.sendall(head.encode() + body)
        received = b""
        while chunk := tls.recv(65536):
            received += chunk
    return received


@pytest.mark.parametrize("kind", ["get", "put", "watch", "unauthorized"])
def test_the_stats_count_every_byte_of_a_request_and_its_answer_on_the_wire(sandbox, kind):
    """The benchmarks' API traffic is request and answer, headers included (a watch's chunk framing
    too), so the sandbox's counts must equal what a client sends and receives."""
    import time

    for pod in examples.volcano_job("demo", (("master", 1), ("worker", 1))):
        sandbox.create_pod(pod)
    path = "/api/v1/namespaces/default/pods"
    body = b""
    target = f"{path}/demo-worker-0"
    method = "GET"
    if kind == "put":
        pod = sandbox.sandbox.store.get("/v1/pods", "default", "demo-worker-0")
        body = json.dumps(pod).encode()
        method = "PUT"
    elif kind == "watch":
        target = f"{path}?watch=true&resourceVersion=0&timeoutSeconds=1&labelSelector=volcano.sh%2Fjob-name%3Ddemo"
    token = "wrong" if kind == "unauthorized" else sandbox.sandbox.token
    head = (f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: counted/{kind}\r\n"
            f"Authorization: Bearer {token}\r\nAccept: application/json\r\nConnection: close\r\n"
            + (f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n" if body else "") + "\r\n")
    sandbox.reset_stats()
    received = _exchange(sandbox, head, body)
    assert received.startswith(b"HTTP/1.1 401" if kind == "unauthorized" else b"HTTP/1.1 200")
    deadline = time.monotonic() + 5
    while True:  # the access log counts once the answer is sent; the client may read it first
        counted = sandbox.stats()["byAgent"][f"counted/{kind}"]
        if counted["bytes"] + counted["headers"] == len(received) or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert counted["sent"] == len(head.encode()) + len(body)
    assert counted["bytes"] + counted["headers"] == len(received)
    if kind == "watch":  # the lines are the body; the rest (chunk sizes, CRLFs, the last chunk) is framing
        chunked, lines = received.split(b"\r\n\r\n", 1)[1], []
        while (size := int(chunked.split(b"\r\n", 1)[0], 16)) > 0:
            chunked = chunked.split(b"\r\n", 1)[1]
            lines.append(chunked[:size])
            chunked = chunked[size + 2:]
        assert len(lines) == 2 and counted["bytes"] == sum(map(len, lines))
