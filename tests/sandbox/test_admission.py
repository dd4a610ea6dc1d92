"""The sandbox's mutating admission (sandbox/admission.py) as kube-apiserver runs it: selectors and rules as
apimachinery defines them, failurePolicy on a failed call, the webhook's refusal passed on, one reinvocation."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json

import pytest
from aiohttp import web

from agent.sandbox.admission import Caller, Denied, Target, rule_matches, selector_matches

POD = Target("", "v1", "pods", "Pod", "team-a")


@pytest.mark.parametrize(("selector", "labels", "matches"), [
    (None, {}, True),
    ({}, {"a": "1"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),  # absent: not in
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
    ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}, {"a": "1"}, False),
])
def test_label_selectors_match_as_apimachinery_defines_them(selector, labels, matches):
    assert selector_matches(selector, labels) is matches


@pytest.mark.parametrize(("rule", "target", "matches"), [
    ({"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}, POD, True),
    ({"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}, POD, True),
    ({"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}, POD, False),
    ({"operations": ["CREATE"], "apiGroups": ["batch"], "apiVersions": ["v1"], "resources": ["pods"]}, POD, False),
    ({"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/status"]}, POD, False),
    ({"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["*/*"]}, POD, True),
    ({"operations": ["CREATE"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"],
      "scope": "Cluster"}, POD, False),
    ({"operations": ["CREATE"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"],
      "scope": "Namespaced"}, POD, True),
])
def test_rules_match_operation_group_version_resource_and_scope(rule, target, matches):
    assert rule_matches(rule, target) is matches


class Hooks:
    """Webhook servers on loopback (plain HTTP: TLS is the integration tests')."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.runners: list[web.AppRunner] = []

    async def serve(self, name: str, decide) -> str:
        async def handle(request: web.Request) -> web.Response:
            review = await request.json()
            self.calls.append(name)
            assert request.query["timeout"].endswith("s")
            return web.json_response(await decide(review["request"]))

        app = web.Application()
        app.router.add_post("/", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.runners.append(runner)
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/"  # type: ignore[union-attr]

    async def close(self) -> None:
        for runner in self.runners:
            await runner.cleanup()


def patch(uid: str, ops: list[dict]) -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
        "uid": uid, "allowed": True, "patchType": "JSONPatch",
        "patch": base64.b64encode(json.dumps(ops).encode()).decode()}}


def hook(name: str, url: str, **more) -> dict:
    return {"name": name, "clientConfig": {"url": url}, "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            **more}


def config(name: str, *hooks: dict) -> dict:
    return {"metadata": {"name": name}, "webhooks": list(hooks)}


def pod() -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"x": "1"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}


@pytest.fixture
async def hooks():
    running = Hooks()
    yield running
    await running.close()


async def test_a_patch_is_applied_and_a_refusal_is_passed_on_with_its_code(hooks):
    async def label(request):
        return patch(request["uid"], [{"op": "add", "path": "/metadata/labels/added", "value": "yes"}])

    async def refuse(request):
        return {"response": {"uid": request["uid"], "allowed": False,
                             "status": {"code": 403, "message": "not on my watch"}}}

    caller = Caller()
    try:
        url = await hooks.serve("label", label)
        out = await caller.admit([config("a", hook("label.x", url))], POD, pod(), None)
        assert out["metadata"]["labels"] == {"x": "1", "added": "yes"}
        deny = await hooks.serve("refuse", refuse)
        with pytest.raises(Denied) as err:
            await caller.admit([config("a", hook("label.x", url)), config("b", hook("refuse.x", deny))], POD, pod(),
                               None)
        assert err.value.code == 403
        assert err.value.message == 'admission webhook "refuse.x" denied the request: not on my watch'
    finally:
        await caller.close()


async def test_a_failed_call_refuses_under_fail_and_is_skipped_under_ignore(hooks):
    async def wrong_uid(request):
        return patch("someone-else", [])

    answer = asyncio.Event()  # set once the caller has given up; the teardown then waits for no answer

    async def slow(request):  # answers after 3 s unless the caller has given up by then
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(answer.wait(), 3)
        return patch(request["uid"], [])

    caller = Caller()
    try:
        url = await hooks.serve("wrong", wrong_uid)
        with pytest.raises(Denied) as err:
            await caller.admit([config("a", hook("w.x", url))], POD, pod(), None)
        assert err.value.code == 500 and 'failed calling webhook "w.x"' in err.value.message
        assert "expected response.uid" in err.value.message
        assert await caller.admit([config("a", hook("w.x", url, failurePolicy="Ignore"))], POD, pod(), None) == pod()
        late = await hooks.serve("slow", slow)
        with pytest.raises(Denied, match="context deadline exceeded"):
            await caller.admit([config("a", hook("s.x", late, timeoutSeconds=1))], POD, pod(), None)
    finally:
        answer.set()
        await caller.close()


async def test_selectors_choose_the_webhooks_and_if_needed_ones_run_again_after_a_later_change(hooks):
    async def mount(request):  # the agent's part: a mount in each container that lacks one
        ops = [{"op": "add", "path": f"/spec/containers/{i}/volumeMounts", "value": [{"name": "v", "mountPath": "/v"}]}
               for i, c in enumerate(request["object"]["spec"]["containers"]) if "volumeMounts" not in c]
        return patch(request["uid"], ops)

    async def proxy(request):  # another webhook's: a container
        return patch(request["uid"], [{"op": "add", "path": "/spec/containers/-", "value": {"name": "proxy",
                                                                                          "image": "p"}}])

    caller = Caller()
    try:
        first, second = await hooks.serve("mount", mount), await hooks.serve("proxy", proxy)
        configs = [config("a", hook("mount.x", first, reinvocationPolicy="IfNeeded",
                                    objectSelector={"matchLabels": {"x": "1"}})),
                   config("b", hook("proxy.x", second, namespaceSelector={"matchLabels": {"mesh": "on"}}))]
        out = await caller.admit(configs, POD, pod(), {"metadata": {"name": "team-a", "labels": {"mesh": "on"}}})
        assert hooks.calls == ["mount", "proxy", "mount"]
        assert [c.get("volumeMounts") for c in out["spec"]["containers"]] == [[{"name": "v", "mountPath": "/v"}]] * 2
        hooks.calls.clear()
        await caller.admit(configs, POD, pod(), {"metadata": {"name": "team-a"}})  # namespace not selected
        assert hooks.calls == ["mount"]
    finally:
        await caller.close()


# kube-apiserver never sends admission configuration objects to a webhook (apiserver's
# IsExemptAdmissionConfigurationResource), and labels every namespace with its name.

CONFIG_KINDS = [("mutatingwebhookconfigurations", "MutatingWebhookConfiguration"),
                ("validatingwebhookconfigurations", "ValidatingWebhookConfiguration"),
                ("validatingadmissionpolicies", "ValidatingAdmissionPolicy"),
                ("validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding")]
EVERYTHING = [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}]


async def test_admission_configuration_objects_are_never_sent_to_a_webhook(hooks):
    async def refuse(request):
        return {"response": {"uid": request["uid"], "allowed": False, "status": {"code": 403, "message": "no"}}}

    caller = Caller()
    try:
        configs = [config("a", hook("all.x", await hooks.serve("all", refuse), rules=EVERYTHING))]
        for plural, kind in CONFIG_KINDS:
            obj = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": "x"}}
            target = Target("admissionregistration.k8s.io", "v1", plural, kind, "")
            assert await caller.admit(configs, target, obj, None) == obj
        assert hooks.calls == []
        with pytest.raises(Denied, match="no"):  # anything else is sent
            await caller.admit(configs, Target("", "v1", "configmaps", "ConfigMap", "team-a"),
                               {"metadata": {"name": "c"}}, None)
        assert hooks.calls == ["all"]
    finally:
        await caller.close()


@pytest.fixture
async def api(tmp_path):
    """The sandbox server over plain HTTP on loopback, and a session that holds its token."""
    import aiohttp

    from agent.sandbox.server import running

    async with running(tmp_path / "sandbox", tls=False) as sandbox, aiohttp.ClientSession(
            base_url=sandbox.url, headers={"Authorization": f"Bearer {sandbox.token}"}) as session:
        yield session


async def test_the_sandbox_stores_admission_configuration_even_when_a_catch_all_webhook_is_down(api):
    closed = "https://127.0.0.1:9/"  # the discard port: nothing answers on loopback
    admissions = "/apis/admissionregistration.k8s.io/v1"
    catch_all = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                 "metadata": {"name": "catch-all"}, "webhooks": [hook("all.x", closed, rules=EVERYTHING,
                                                                     failurePolicy="Fail")]}
    async with api.post(f"{admissions}/mutatingwebhookconfigurations", json=catch_all) as response:
        assert response.status == 201
    for plural, kind in CONFIG_KINDS:
        body = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": "second"}}
        async with api.post(f"{admissions}/{plural}", json=body) as response:
            assert response.status == 201, await response.text()  # so a broken webhook can be fixed or removed
    async with api.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "c"}}) as response:
        assert response.status == 500 and 'failed calling webhook "all.x"' in (await response.json())["message"]


async def test_every_namespace_carries_its_name_label_whatever_its_writer_sends(api):
    label = "kubernetes.io/metadata.name"

    async def labels(name: str) -> dict:
        async with api.get(f"/api/v1/namespaces/{name}") as response:
            return (await response.json())["metadata"]["labels"]

    assert (await labels("kube-system"))[label] == "kube-system"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": {label: "kube-system"}}}
    async with api.post("/api/v1/namespaces", json=body) as response:
        assert response.status == 201
    assert (await labels("team-a")) == {label: "team-a"}
    async with api.patch("/api/v1/namespaces/team-a", json={"metadata": {"labels": {label: None, "x": "1"}}},
                         headers={"Content-Type": "application/merge-patch+json"}) as response:
        assert response.status == 200
    assert (await labels("team-a")) == {label: "team-a", "x": "1"}
    async with api.put("/api/v1/namespaces/team-a", json={**body, "metadata": {"name": "team-a", "labels": None}}) \
            as response:
        assert response.status == 200
    assert (await labels("team-a")) == {label: "team-a"}
