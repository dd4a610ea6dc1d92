"""``topology-agent status``'s pure part (core/report/status.py): pods, the job's roster, generation Events and the
publication -> rows and the pods left out, as a table and a stable JSON document. The ranks are the planner's:
each row says what that pod's own files say."""

from __future__ import annotations

import copy

import pytest

from agent import examples
from agent.core import render_pod
from agent.core.model import Options, Processes
from agent.core.plan.gang import Roster
from agent.core.pods.placement import parse_levels
from agent.core.report.events import (
    GENERATION_LABEL,
    GENERATION_REASONS,
    REASONS,
    Correlator,
    Occurrence,
    Ref,
    micro_time,
)
from agent.core.report.status import (
    SCHEMA,
    Publication,
    Seen,
    controller_path,
    document,
    generations,
    human_duration,
    job_status,
    table,
)

NOW = 1_800_000_000.0


def job(**kwargs):
    pods = examples.volcano_job("demo", (("master", 1), ("worker", 3), ("extras", 1)))
    return pods, job_status(pods, job="demo", kind="Volcano Job 'demo'", namespace="default", options=Options(),
                            roster=None, expected=4, seen={}, **kwargs)


def test_each_row_has_the_rank_and_node_rank_the_pods_own_files_have():
    pods, status = job()
    for row in status.rows:
        env = {v.name: v.value for v in render_pod(pods, row.name, Options()).variables if v.value is not None}
        if row.first_rank is None:
            assert row.role == "extras" and "RANK" not in env
        else:
            assert (str(row.first_rank), str(row.node_rank)) == (env["RANK"], env["NODE_RANK"]), row.name
    assert [(r.name, r.role, r.first_rank, r.node_rank) for r in status.rows] == [
        ("demo-master-0", "master", 0, 0), ("demo-worker-0", "worker", 1, 1), ("demo-worker-1", "worker", 2, 2),
        ("demo-worker-2", "worker", 3, 3), ("demo-extras-0", "extras", None, None)]
    assert status.training == 4 and status.world_size == 4 and status.left == ()


def test_pods_that_cannot_be_placed_are_left_out_with_the_agents_own_reason():
    pods = examples.volcano_job("demo", (("master", 1), ("worker", 4)))
    pods[2]["status"] = {"phase": "Pending"}  # worker 1: not scheduled
    pods[3]["status"] = {"phase": "Pending"}
    pods[3]["spec"]["nodeName"] = "node-b"  # worker 2: on a node, no IP yet
    pods[4]["metadata"]["deletionTimestamp"] = "2026-11-22T01:00:00Z"  # worker 3: terminating
    rogue = examples.volcano_job("demo", (("master", 1), ("worker", 1)))[1]
    rogue["metadata"].update(name="rogue-1", ownerReferences=[])
    from agent.core.controllers import VOLCANO

    roster = Roster(VOLCANO, Options(address="ip"), "Volcano Job 'demo'", "uid-demo", {"master": 1, "worker": 4})
    for pod in pods:
        pod["metadata"]["ownerReferences"][0]["uid"] = "uid-demo"
    status = job_status([*pods, rogue], job="demo", kind="Volcano Job 'demo'", namespace="default",
                        options=Options(address="ip"), roster=roster, expected=5, seen={})
    assert [r.name for r in status.rows] == ["demo-master-0", "demo-worker-0"]
    assert {item.name: item.reason for item in status.left} == {
        "demo-worker-1": "not scheduled (no node, no IP yet)",
        "demo-worker-2": "no IP yet (on node node-b)",
        "demo-worker-3": "terminating (deletionTimestamp is set)",
        "rogue-1": "pod 'rogue-1' has the labels of Volcano Job 'demo' but is not owned by it (no ownerReference "
                   "with its uid uid-demo); only the job's own pods are members"}
    text = table(status, now=NOW)
    assert text.splitlines()[0] == "Volcano Job 'demo' in namespace default: 2 of 5 training pods placed, world size 2"
    assert "LEFT OUT        REASON\ndemo-worker-1   not scheduled (no node, no IP yet)\n" in text


def test_a_lost_member_is_left_out_with_the_condition_that_says_why():
    pods = examples.volcano_job("demo", (("master", 1), ("worker", 3), ("extras", 1)))
    pods[2]["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True",
                                        "reason": "DeletionByTaintManager"}]
    pods[3]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]  # the node controller's mark
    status = job_status(pods, job="demo", kind="Volcano Job 'demo'", namespace="default", options=Options(),
                        roster=None, expected=4, seen={})
    assert [r.name for r in status.rows] == ["demo-master-0", "demo-worker-0", "demo-extras-0"]
    assert {item.name: item.reason for item in status.left} == {
        "demo-worker-1": "lost: DisruptionTarget (DeletionByTaintManager: evicted by the taint manager (a NoExecute "
                         "taint on its node))",
        "demo-worker-2": "lost: not Ready and no kubelet said why: the node lifecycle controller marked it (its node "
                         "stopped reporting)"}
    assert "demo-worker-1   lost: DisruptionTarget (DeletionByTaintManager" in table(status, now=NOW)


def test_a_member_with_no_pod_at_all_is_named_on_the_first_line():
    """A worker deleted and not replaced: the job asks for it, no pod stands for it, and no LEFT OUT row can name
    it; the first line names its role and index, as init's gang line does."""
    from agent.core.controllers import VOLCANO

    pods = examples.volcano_job("demo", (("master", 1), ("worker", 4)))
    for pod in pods:
        pod["metadata"]["ownerReferences"][0]["uid"] = "uid-demo"
    rogue = copy.deepcopy(pods[3])  # worker 2's labels, not the job's own pod: stands for no one
    rogue["metadata"].update(name="rogue-2", uid="uid-rogue", ownerReferences=[])
    del pods[3]
    roster = Roster(VOLCANO, Options(), "Volcano Job 'demo'", "uid-demo", {"master": 1, "worker": 4},
                    check_index=False)
    status = job_status([*pods, rogue], job="demo", kind="Volcano Job 'demo'", namespace="default",
                        options=Options(), roster=roster, expected=5, seen={})
    assert status.missing == ("worker 2",)
    assert table(status, now=NOW).splitlines()[0] == (
        "Volcano Job 'demo' in namespace default: 4 of 5 training pods placed, world size 4; missing: worker 2 "
        "(no pod)")
    pods[3]["metadata"]["deletionTimestamp"] = "2026-11-22T01:00:00Z"  # worker 3: its LEFT OUT row says why
    status = job_status(pods, job="demo", kind="Volcano Job 'demo'", namespace="default", options=Options(),
                        roster=roster, expected=5, seen={})
    assert status.missing == ("worker 2",) and [item.name for item in status.left] == ["demo-worker-3"]


def shown_job():
    pods = examples.volcano_job("demo", (("master", 1), ("worker", 1)))
    for pod, node in zip(pods, ("node-a", "node-b"), strict=True):
        pod["spec"]["nodeName"] = node
    publication = Publication("demo-topology", 12, "demo-master-0", ("demo-worker-0",), "demo-master-0", NOW - 4)
    return job_status(pods, job="demo", kind="Volcano Job 'demo'", namespace="default",
                      options=Options(levels=parse_levels("topology.kubernetes.io/zone")), roster=None, expected=2,
                      seen={pods[0]["metadata"]["uid"]: Seen(3, NOW - 75)},
                      nodes={"node-a": {"topology.kubernetes.io/zone": "z1"}, "node-b": None}, publication=publication)


def test_the_table_shows_generation_seen_with_its_age_the_publication_and_domains_when_levels_are_known():
    assert table(shown_job(), now=NOW) == """\
Volcano Job 'demo' in namespace default: 2 of 2 training pods placed, world size 2
NAME            ROLE     RANK   NODE-RANK   NODE     DOMAIN      ADDRESS              GENERATION   READY
demo-master-0   master   0      0           node-a   z1          demo-master-0.demo   3 (75s)      1/1
demo-worker-0   worker   1      1           node-b   <unknown>   demo-worker-0.demo   <unknown>    1/1

PUBLISHED   configmap demo-topology, sequence 12
PUBLISHER   demo-master-0 (Lease held by demo-master-0, renewed 4s ago)
STANDBYS    demo-worker-0
"""
    assert "DOMAIN" not in table(job()[1], now=NOW)  # no levels asked: no column


def test_the_json_document_is_stable():
    doc = document(shown_job(), now=NOW)
    assert list(doc) == ["apiVersion", "kind", "job", "owner", "namespace", "expectedTrainingPods", "trainingPods",
                         "worldSize", "levels", "problem", "members", "leftOut", "publication", "restarts"]
    assert doc["apiVersion"] == SCHEMA and doc["kind"] == "JobStatus" and doc["levels"] == ["ZONE"]
    assert doc["members"][0] == {"name": "demo-master-0", "role": "master", "rank": 0, "slots": 1, "nodeRank": 0,
                                 "node": "node-a", "domain": ["z1"], "address": "demo-master-0.demo",
                                 "generation": 3, "generationAge": 75.0, "ready": "1/1"}
    assert doc["members"][1]["generation"] is None and doc["members"][1]["domain"] is None
    assert doc["publication"] == {"configmap": "demo-topology", "sequence": 12, "publisher": "demo-master-0",
                                  "standbys": ["demo-worker-0"], "leaseHolder": "demo-master-0",
                                  "leaseRenewedAge": 4.0}


def test_a_pod_with_several_processes_shows_its_rank_range():
    pods = examples.volcano_job("demo", (("master", 1), ("worker", 1)))
    status = job_status(pods, job="demo", kind="Volcano Job 'demo'", namespace="default",
                        options=Options(processes=Processes(per_node=4)), roster=None, expected=2, seen={})
    assert "demo-worker-0   worker   4-7    1" in table(status, now=NOW) and status.world_size == 8


def test_pods_that_make_no_plan_say_why_instead_of_rows():
    pods = examples.volcano_job("demo", (("master", 1), ("worker", 2)))
    pods[2]["metadata"]["labels"]["volcano.sh/task-index"] = "0"  # two pods claim worker 0
    status = job_status(pods, job="demo", kind="Volcano Job 'demo'", namespace="default", options=Options(),
                        roster=None, expected=3, seen={})
    assert status.rows == () and "both claim role 'worker' index 0" in (status.problem or "")
    assert "no plan: pods 'demo-worker-0' and 'demo-worker-1' both claim" in table(status, now=NOW)


@pytest.mark.parametrize(("seconds", "shown"), [(5, "5s"), (75, "75s"), (150, "2m30s"), (3 * 3600, "3h")])
def test_ages_are_kubectls(seconds, shown):
    assert human_duration(seconds) == shown


# --- whose Events say a generation, whose objects own a pod ------------------------------------------------------

MEMBERS = {"uid-0": "demo-worker-0"}


def generation_event(**given) -> dict:
    """An Event as the agent of pod demo-worker-0 writes it (core/report/events.py Correlator.body), saying generation
    3."""
    correlator = Correlator(Ref("demo-worker-0", "default", "uid-0"), "demo-worker-0", NOW, job="demo")
    write = correlator.observe(Occurrence("NewGeneration", "generation 3", generation=3), NOW)
    assert write is not None
    body = copy.deepcopy(write.body)
    for path, value in given.items():
        *keys, last = path.split(".")
        target = body
        for key in keys:
            target = target[key]
        target[last] = value
    return body


def test_the_generation_of_an_event_the_pods_own_agent_writes_is_read():
    assert generations([generation_event()], MEMBERS, "default") == {"uid-0": Seen(3, NOW)}
    later = generation_event(**{"metadata.labels": {GENERATION_LABEL: "4"}, "series": {
        "count": 2, "lastObservedTime": micro_time(NOW + 5)}})
    assert generations([generation_event(), later], MEMBERS, "default") == {"uid-0": Seen(4, NOW + 5)}


@pytest.mark.parametrize("forged", [
    {"reportingController": "evil.example/forger"},
    {"reportingInstance": "aaa-rogue"},
    {"reason": "PodRefused"},
    {"regarding.name": "aaa-rogue"},
    {"regarding.uid": "uid-of-no-member"},
    {"regarding.kind": "Node"},
    {"regarding.namespace": "other"},
    {"metadata.name": "aaa-rogue.18ed42c20fb6c100"},
    {"metadata.labels": {GENERATION_LABEL: "³"}},
    {"metadata.labels": {GENERATION_LABEL: "9" * 40}},
    {"eventTime": "yesterday"},
], ids=["controller", "instance", "reason", "regarding-name", "regarding-uid", "regarding-kind",
        "regarding-namespace", "event-name", "not-ascii-digit", "huge", "no-time"])
def test_an_event_the_pods_own_agent_could_not_have_written_says_no_generation(forged):
    assert generations([generation_event(**forged)], MEMBERS, "default") == {}


def test_only_the_reasons_that_say_a_generation_carry_one():
    assert set(REASONS) >= GENERATION_REASONS
    with pytest.raises(ValueError, match="says no generation"):
        Occurrence("PodRefused", "x", generation=2)


@pytest.mark.parametrize(("ref", "path"), [
    ({"apiVersion": "batch/v1", "kind": "Job", "name": "demo-node-0", "uid": "u", "controller": True},
     ("u", "/apis/batch/v1/namespaces/default/jobs/demo-node-0")),
    ({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "vllm-0", "uid": "u", "controller": True},
     ("u", "/apis/apps/v1/namespaces/default/statefulsets/vllm-0")),
    ({"apiVersion": "v1", "kind": "Pod", "name": "vllm-0", "uid": "u", "controller": True},
     ("u", "/api/v1/namespaces/default/pods/vllm-0")),
    ({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "ds", "uid": "u", "controller": True},
     ("u", "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/ds")),
    ({"apiVersion": "batch/v1", "kind": "Job", "name": "demo-node-0", "uid": "u"}, None),  # not the controller
    ({"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u", "controller": True}, None),
    ({"apiVersion": "batch/v1", "kind": "Job", "name": "../../secrets/x", "uid": "u", "controller": True}, None),
    ({"apiVersion": "batch/V1/x", "kind": "Job", "name": "x", "uid": "u", "controller": True}, None),
], ids=["job", "statefulset", "pod", "jobset", "not-controller", "unknown-kind", "name-no-path", "bad-version"])
def test_the_chain_from_a_pod_to_its_job_is_followed_only_through_known_kinds(ref, path):
    assert controller_path({"ownerReferences": [ref]}, "default") == path
