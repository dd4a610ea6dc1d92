"""The webhook's server (runtime/webhook.py): one GET per namespace for a burst of pods, a namespace it cannot
read refuses the pod with the reason, a body that is not an AdmissionReview gets 400, metrics count results."""

from __future__ import annotations

import asyncio
import base64
import json

from aiohttp.test_utils import TestClient, TestServer

from agent import __version__
from agent.cli import check_agent_args
from agent.core.injection import PREFIX
from agent.errors import ApiForbidden, ApiNotFound
from agent.runtime.webhook import Webhook, WebhookSettings


class Namespaces:
    """The API as the webhook uses it per request: GET a namespace."""

    def __init__(self, annotations: dict[str, dict[str, str]], forbidden: bool = False) -> None:
        self.annotations, self.forbidden, self.gets = annotations, forbidden, 0

    async def get_object(self, path: str, *, metadata_only: bool = False) -> dict:
        self.gets += 1
        await asyncio.sleep(0.01)
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
    webhook = Webhook(api, WebhookSettings(), version=__version__, check=check_agent_args)  # type: ignore[arg-type]
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
    """Issue 23, L4: the health port is open to the pod network (the kubelet probes it); the job's layout is
    served there only with --health-topology."""
    from agent.runtime.health import make_app
    from agent.runtime.metrics import SidecarMetrics

    class Status:
        metrics = SidecarMetrics()
        healthy, generation, document = True, 3, b'{"generation": 3}'

        def unready(self):
            return None

    for topology, want in ((False, 404), (True, 200)):
        client = TestClient(TestServer(make_app(Status(), topology=topology)))
        await client.start_server()
        try:
            answer = await client.get("/topology")
            assert answer.status == want
            if not topology:
                assert "--health-topology" in await answer.text()
            assert (await client.get("/readyz")).status == 200
        finally:
            await client.close()
