"""Events in the sandbox (agent/sandbox/events.py): one store for v1 and events.k8s.io/v1, converted at each
request as kube-apiserver converts them, selected by the fields kubectl describe sends, validated as the API
server validates an events.k8s.io/v1 write (the note immutable)."""

from __future__ import annotations

import threading

import pytest

from agent.core.report.events import Correlator, Occurrence, Ref
from agent.errors import ApiError, ApiNotFound
from agent.k8s import core

EVENTS_V1 = "/apis/events.k8s.io/v1/namespaces/default/events"
EVENTS_CORE = "/api/v1/namespaces/default/events"
POD = Ref("demo-worker-0", "default", "uid-0")
T0 = 1_800_000_000.0


def recorded(client, occurrence=None, *, pod: Ref = POD):
    correlator = Correlator(pod, pod.name, T0)
    write = correlator.observe(occurrence or Occurrence("WaitingForGang", "waiting for the gang: 1 of 2"), T0)
    return correlator, client.create(EVENTS_V1, write.body)


def test_an_event_written_through_events_k8s_io_is_read_through_v1_as_kube_apiserver_converts_it(memory, api):
    client = api.client("test")
    _, created = recorded(client, Occurrence("PodRefused", "pod 'rogue' is not the job's",
                                             related=Ref("rogue", "default", "uid-r")))
    assert created["apiVersion"] == "events.k8s.io/v1" and created["note"] == "pod 'rogue' is not the job's"
    name = created["metadata"]["name"]
    core_event = client.get_object(f"{EVENTS_CORE}/{name}")
    assert core_event["apiVersion"] == "v1" and core_event["kind"] == "Event"
    assert core_event["involvedObject"] == POD.body() and core_event["message"] == "pod 'rogue' is not the job's"
    assert core_event["reportingComponent"] == "topology-agent.io/agent"
    assert core_event["reportingInstance"] == "demo-worker-0" and core_event["action"] == "Admit"
    assert core_event["eventTime"] == created["eventTime"] and core_event["related"]["name"] == "rogue"
    assert "regarding" not in core_event and "note" not in core_event
    [listed], _ = client.list_objects(EVENTS_V1)
    assert listed["regarding"] == POD.body() and "involvedObject" not in listed


def test_a_series_patched_through_events_k8s_io_is_the_count_kubectl_describe_reads(memory, api):
    client = api.client("test")
    correlator, created = recorded(client)
    patch = correlator.observe(Occurrence("WaitingForGang", "waiting for the gang: 1 of 2"), T0 + 30)
    assert patch is not None and patch.verb == "patch"
    client.patch(f"{EVENTS_V1}/{created['metadata']['name']}", patch.body)
    core_event = client.get_object(f"{EVENTS_CORE}/{created['metadata']['name']}")
    assert core_event["series"] == patch.body["series"] and core_event["message"] == created["note"]


def test_the_note_and_the_other_fields_are_immutable_through_events_k8s_io(memory, api):
    client = api.client("test")
    _, created = recorded(client)
    path = f"{EVENTS_V1}/{created['metadata']['name']}"
    for change in ({"note": "another note"}, {"reason": "Other"}, {"regarding": {"name": "other"}},
                   {"series": {"count": 1, "lastObservedTime": created["eventTime"]}}):
        with pytest.raises(ApiError, match=r"422.*is invalid") as err:
            client.patch(path, change)
        assert err.value.status == 422
    client.patch(f"{EVENTS_CORE}/{created['metadata']['name']}", {"message": "v1 writes are not checked"})


@pytest.mark.parametrize(("change", "why"), [
    ({"eventTime": None}, "eventTime: Required value"),
    ({"reportingController": None}, "reportingController: Required value"),
    ({"action": None}, "action: Required value"),
    ({"type": "Error"}, "type: Invalid value"),
    ({"note": "x" * 1025}, "note: Invalid value: can have at most 1024 characters"),
    ({"deprecatedCount": 3}, "deprecatedCount: Invalid value: needs to be unset"),
    ({"series": {"count": 1, "lastObservedTime": "2026-01-01T00:00:00.000000Z"}}, "series.count"),
], ids=["no eventTime", "no controller", "no action", "bad type", "long note", "deprecated count", "series of 1"])
def test_an_events_k8s_io_create_is_validated_as_the_api_server_does(memory, api, change, why):
    client = api.client("test")
    body = Correlator(POD, POD.name, T0).observe(Occurrence("WaitingForGang", "waiting"), T0).body
    body.update(change)
    with pytest.raises(ApiError, match=why):
        client.create(EVENTS_V1, {k: v for k, v in body.items() if v is not None})


def test_kubectl_describes_field_selector_finds_a_pods_events_and_events_k8s_io_names_the_same_fields(memory, api):
    client = api.client("test")
    recorded(client)
    recorded(client, pod=Ref("demo-worker-1", "default", "uid-1"))
    describe = "involvedObject.name=demo-worker-0,involvedObject.namespace=default,involvedObject.uid=uid-0"
    items, _ = client.list_objects(EVENTS_CORE, field_selector=describe, limit=500)
    assert [e["involvedObject"]["name"] for e in items] == ["demo-worker-0"]
    items, _ = client.list_objects(EVENTS_V1, field_selector="regarding.name=demo-worker-1,"
                                                             "reportingController=topology-agent.io/agent")
    assert [e["regarding"]["uid"] for e in items] == ["uid-1"]
    for selector in ("source=topology-agent.io/agent", "reason=WaitingForGang,type=Normal",
                     "reportingComponent=topology-agent.io/agent"):
        assert len(client.list_objects(EVENTS_CORE, field_selector=selector)[0]) == 2, selector
    with pytest.raises(ApiError, match=r'400.*"note" is not a known field selector'):
        client.list_objects(EVENTS_V1, field_selector="note=x")
    with pytest.raises(ApiError, match=r'400.*"regarding\.name" is not a known field selector'):
        client.list_objects(EVENTS_CORE, field_selector="regarding.name=x")


def test_a_watch_of_events_k8s_io_sees_the_v1_events_in_its_own_version(memory, api):
    client = api.client("test")
    _, rv = client.list_objects(EVENTS_V1)
    seen = []

    def watch():
        for event in client.watch_objects(EVENTS_V1, rv, timeout=1):
            if event.type != "BOOKMARK":
                seen.append(event.object)

    thread = threading.Thread(target=watch)
    thread.start()
    client.create(EVENTS_CORE, {"metadata": {"name": "legacy"}, "involvedObject": POD.body(), "reason": "Started",
                                "message": "a v1 Event", "type": "Normal", "source": {"component": "kubelet"}})
    thread.join(10)
    assert [(e["apiVersion"], e["note"], e["deprecatedSource"]) for e in seen] == [
        ("events.k8s.io/v1", "a v1 Event", {"component": "kubelet"})]


def test_a_patch_of_an_expired_event_is_not_found(memory, api):
    client = api.client("test")
    with pytest.raises(ApiNotFound):
        client.patch(f"{EVENTS_V1}/gone", {"series": {"count": 2}})
    assert core.patch(f"{EVENTS_V1}/gone", {}).content_type == "application/merge-patch+json"
