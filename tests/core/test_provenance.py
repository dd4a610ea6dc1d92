"""Who wrote a published topology, as a reader checks it (agent/core/publication/provenance.py): one table of
writer pods, and what a reader asks the API for."""

from __future__ import annotations

import asyncio
import copy

import pytest

from agent import examples
from agent.core import Options
from agent.core.controllers import VOLCANO
from agent.core.plan.gang import JobView, roster_of
from agent.core.publication.journal import PublishedState, Publisher, journal_body
from agent.core.publication.provenance import Writer, WriterCheck, writer_of
from agent.core.publication.published import configmap_body, pack
from agent.runtime.demo import volcano_owner

OWNER = volcano_owner()
OWNER["spec"]["tasks"] = [{"name": "master", "replicas": 1}, {"name": "worker", "replicas": 2}]
PODS = {p["metadata"]["name"]: p for p in examples.volcano_job("demo", (("master", 1), ("worker", 2)))}


def check(**kw) -> WriterCheck:
    return WriterCheck(VOLCANO, Options(), "demo", "default", roster_of(JobView(VOLCANO, Options(), (OWNER,))), **kw)


def pod(name: str, **meta) -> dict:
    found = copy.deepcopy(PODS.get(name) or examples.volcano_job(name.split("-")[0], (("master", 1),))[0])
    found["metadata"].update(meta)
    return found


def unowned(name: str) -> dict:
    found = pod(name)
    found["metadata"]["ownerReferences"] = []
    return found


LEADER = Writer("demo-master-0", PODS["demo-master-0"]["metadata"]["uid"])

TABLE = [
    # (writer named by the ConfigMap, the pod of that name as read now, the refusal's words or None)
    (LEADER, pod("demo-master-0"), None),
    (Writer("demo-worker-1", PODS["demo-worker-1"]["metadata"]["uid"]), pod("demo-worker-1"), None),
    (Writer("demo-master-0", ""), pod("demo-master-0"), "does not name the pod that wrote it"),
    (Writer("", ""), None, "does not name the pod that wrote it"),
    (LEADER, None, "its writer, pod 'demo-master-0', does not exist"),
    (LEADER, pod("demo-master-0", uid="re-created"), "is not the uid of pod 'demo-master-0' (re-created)"),
    (Writer("other-master-0", "u1"), pod("other-master-0", uid="u1"), "belongs to job 'other', not 'demo'"),
    (LEADER, unowned("demo-master-0"), "its writer is not a member: pod 'demo-master-0' has the labels of Job"),
    (Writer("x", "u2"), {"metadata": {"name": "x", "uid": "u2"}}, "its writer is not a pod of this job"),
]


def metadata_of(found: dict | None) -> dict | None:
    """The writer pod as a reader fetches it: PartialObjectMetadata (publishing.vouch)."""
    return None if found is None else {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                       "metadata": found["metadata"]}


@pytest.mark.parametrize(("writer", "found", "words"), TABLE)
@pytest.mark.parametrize("form", ["pod", "metadata"])
def test_a_writer_is_used_only_when_it_is_a_member_of_this_job_by_name_and_uid(writer, found, words, form):
    """The same answer from the pod and from its metadata alone, which is what a reader asks for."""
    judged = check()
    why = judged.judge(writer, found if form == "pod" else metadata_of(found), "demo-topology")
    if words is None:
        assert why is None and writer in judged.accepted
    else:
        assert why is not None and words in why, why
        assert why.startswith("configmap demo-topology: ") and why.endswith("delete it if no pod of this job wrote it")
        assert writer not in judged.accepted


def published_items(leader: Writer) -> list[dict]:
    publisher = Publisher(PublishedState(job="demo", namespace="default"), Options(), leader=leader.name,
                          leader_uid=leader.uid)
    publisher.change(PODS, list(PODS))
    snapshot = configmap_body("demo-topology", pack(publisher.snapshot_document()), generation=1,
                              leader=leader.name, leader_uid=leader.uid, owner=None)
    return [snapshot, journal_body("demo-topology", publisher.journal_data(), owner=None)]


def test_the_leader_writes_its_name_and_uid_on_both_objects_and_a_reader_reads_its_pod_once():
    items = published_items(LEADER)
    assert [writer_of(i) for i in items] == [LEADER, LEADER]
    judged = check()
    assert judged.pending(items, "demo-topology") == [(LEADER, "demo-topology")]
    assert judged.path(LEADER) == "/api/v1/namespaces/default/pods/demo-master-0"
    assert judged.judge(LEADER, pod("demo-master-0"), "demo-topology") is None
    assert judged.pending(items, "demo-topology") == []  # accepted: no second read
    assert check(me=LEADER).pending(items, "demo-topology") == []  # its own writes: no read at all
    unrelated = {"metadata": {"name": "settings"}, "data": {"leader": "x", "leaderUid": "y"}}
    assert check().pending([unrelated], "demo-topology") == []


def test_a_reader_fetches_the_writer_pod_as_metadata_once():
    from agent.runtime.publication.publishing import vouch

    asked: list[tuple[str, dict]] = []

    async def get(path: str, **kw) -> dict:
        asked.append((path, kw))
        return metadata_of(pod("demo-master-0"))  # type: ignore[return-value]

    judged = check()
    items = published_items(LEADER)
    assert asyncio.run(vouch(get, judged, items, "demo-topology")) == (None, False)
    assert asyncio.run(vouch(get, judged, items, "demo-topology")) == (None, False)
    assert asked == [("/api/v1/namespaces/default/pods/demo-master-0", {"metadata_only": True})]


def test_after_a_takeover_the_new_writer_is_pending_until_read():
    standby = Writer("demo-worker-0", PODS["demo-worker-0"]["metadata"]["uid"])
    judged = check()
    judged.judge(LEADER, pod("demo-master-0"), "demo-topology")
    snapshot, _ = published_items(LEADER)
    _, journal = published_items(standby)
    assert judged.pending([snapshot, journal], "demo-topology") == [(standby, "demo-topology-journal")]


@pytest.mark.parametrize("name", ["../../secrets/token", "demo-master-0/status", "Demo", "a" * 254, "x\ny"])
def test_a_writer_name_that_is_no_pod_name_is_refused_without_a_read(name):
    """``data.leader`` is anyone's to write without the policy: it never becomes part of a request path."""
    writer = Writer(name, "u")
    judged = check()
    assert judged.path(writer) is None
    why = judged.judge(writer, None, "demo-topology")
    assert why is not None and "is not a pod name" in why and "\n" not in why


def test_a_member_re_created_under_its_name_has_superseded_its_copy_a_stranger_has_not():
    """A copy whose writer's name is now a member under another uid was written by that member's earlier
    incarnation (the policy binds the name to the writer's token): init waits for it to publish again instead of
    making every follower list every pod. Any other refusal is not a supersession."""
    judged = check()
    reborn = pod("demo-master-0", uid="re-created")
    assert judged.judge(LEADER, reborn, "demo-topology") is not None  # not used as it is
    assert judged.superseded(LEADER, reborn)
    assert not judged.superseded(LEADER, pod("demo-master-0"))  # the same uid: nothing superseded
    assert not judged.superseded(LEADER, None)  # gone: nobody will publish under that name
    assert not judged.superseded(LEADER, {**unowned("demo-master-0"), "metadata": {
        **unowned("demo-master-0")["metadata"], "uid": "x"}})  # a pod the job does not own
    assert not judged.superseded(Writer("demo-master-0", ""), reborn)  # no uid named: not a leader's write
    assert not judged.superseded(Writer("other-master-0", "u1"), pod("other-master-0", uid="u9"))


def test_a_forged_writer_uid_is_quoted_escaped_and_cut():
    forged = Writer("demo-worker-0", "x\n12:00:00 INFO init complete\x1b[2J" + "u" * 500)
    why = check().judge(forged, pod("demo-worker-0"), "demo-topology")
    assert why is not None and why.isprintable() and len(why) < 400
    assert "its writer's uid x\\n12:00:00 INFO init complete\\x1b[2J" in why
