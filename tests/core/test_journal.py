"""The journal: followers that apply the leader's changes hold exactly the leader's members, whether
they keep up, fall behind the journal's reach (then the snapshot), or meet a leader that took over; a change
costs each of them a few KiB whatever the job size; forged journals are refused."""

from __future__ import annotations

import base64
import copy
import gzip
import json
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import examples
from agent.core import Options, render_pod
from agent.core.publication import journal as journal_module
from agent.core.publication.journal import JOURNAL_BYTES, PublishedState, Publisher, read_journal
from agent.core.publication.published import _pod_of, decode, pack
from agent.errors import InputError

OPTIONS = Options(address="ip")


def job(n: int) -> dict[str, dict]:
    pods = examples.volcano_job("demo", (("master", 1), ("worker", n - 1)))
    for i, pod in enumerate(pods):
        pod["metadata"]["resourceVersion"] = str(1000 + i)
    return {p["metadata"]["name"]: p for p in pods}


def leader_for(pods: dict[str, dict]) -> Publisher:
    publisher = Publisher(PublishedState(job="demo", namespace="default"), OPTIONS, leader="demo-master-0")
    publisher.change(pods, pods)
    publisher.snapshot_written(publisher.state.seq)
    return publisher


def same_text(packed: bytes, whole: bytes) -> bool:
    """The block-wise snapshot inflates to the whole document's text, byte for byte (gzip reads every member)."""
    return gzip.decompress(packed) == gzip.decompress(whole)


def snapshot_of(publisher: Publisher) -> PublishedState:
    """What a follower reads from the snapshot ConfigMap (through its bytes, as from the API)."""
    return PublishedState.from_document(decode(pack(publisher.snapshot_document())))


def journal_of(publisher: Publisher):
    return read_journal({"data": json.loads(json.dumps(publisher.journal_data()))})


def files(pods: dict[str, dict], me: str = "demo-worker-1", full: dict | None = None) -> dict[str, bytes]:
    """A follower's files: its own pod whole (it reads its own env from it), the others as published."""
    own = (full or JOB_ME)[me]
    return render_pod([own if name == me else pod for name, pod in pods.items()], me, OPTIONS).files


JOB_ME = job(6)


RV = [5000]


def mutate(pods: dict[str, dict], what: str, k: int) -> set[str]:
    """One change a cluster makes; returns the names touched (what the leader's watch saw)."""
    RV[0] += 1
    names = sorted(pods)
    if what == "join":
        name = f"demo-worker-{100 + k}"
        pod = copy.deepcopy(pods["demo-worker-1"])
        pod["metadata"]["name"] = pod["spec"]["hostname"] = name
        pod["metadata"]["labels"]["volcano.sh/task-index"] = str(100 + k)
        pod["metadata"]["annotations"]["volcano.sh/task-index"] = str(100 + k)
        pod["status"]["podIP"] = f"127.3.{RV[0] // 250 % 250}.{RV[0] % 250 + 1}"  # unique: two pods, two IPs
        pod["status"]["podIPs"] = [{"ip": pod["status"]["podIP"]}]
        pod["metadata"]["resourceVersion"] = str(RV[0])
        pods[name] = pod
        return {name}
    name = names[k % len(names)]
    if name == "demo-master-0" or name == "demo-worker-1":
        return set()
    if what == "leave":
        del pods[name]
    elif what == "new-ip":
        pods[name]["status"]["podIP"] = f"127.4.{RV[0] // 250 % 250}.{RV[0] % 250 + 1}"
        pods[name]["status"]["podIPs"] = [{"ip": pods[name]["status"]["podIP"]}]
    elif what == "status-only":  # a readiness probe failing: a new resourceVersion, nothing the core reads
        pods[name]["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}]
    elif what == "lost":  # evicted: the member leaves every follower's world
        pods[name]["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True",
                                               "reason": "EvictionByEvictionAPI"}]
    elif what == "found":  # the kubelet's Ready again: a lost member rejoins
        pods[name]["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    elif what == "new-shape":
        pods[name]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": str(1 + k % 7)}}
    pods.get(name, {}).get("metadata", {})["resourceVersion"] = str(RV[0])
    return {name}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["join", "leave", "new-ip", "status-only", "new-shape", "lost", "found"]),
                          st.integers(0, 10_000)), min_size=1, max_size=40),
       st.integers(1, 12), st.sampled_from([256, 2, 1]))
def test_followers_hold_the_leaders_members_after_every_change(changes, away, block_rows):
    """``block_rows``: the snapshot's rows per gzip member, made small so that small jobs cross the block counts,
    rows move between blocks and blocks empty, as a 16384-pod job's do."""
    with mock.patch.object(journal_module, "BLOCK_ROWS", block_rows):
        _follow(changes, away)


def _follow(changes: list[tuple[str, int]], away: int) -> None:
    pods = job(6)
    leader = leader_for(pods)
    keeping_up = snapshot_of(leader)
    coming_back = snapshot_of(leader)
    for step, (what, k) in enumerate(changes):
        touched = mutate(pods, what, k)
        leader.change(pods, touched)  # None when nothing followers read changed (the files then agree too)
        assert same_text(leader.snapshot_packed(), pack(leader.snapshot_document()))  # the shell writes the first
        if leader.snapshot_due:
            leader.snapshot_written(leader.state.seq)  # the shell writes it before the journal
            snapshot = pack(leader.snapshot_document())
        else:
            snapshot = None
        journal = journal_of(leader)
        assert keeping_up.apply(journal) is not None  # one who applies every journal never needs the snapshot
        assert set(keeping_up.pods) == set(pods) and files(keeping_up.pods) == files(pods)
        if step % away == away - 1 and coming_back.apply(journal) is None:  # another one reads now and then
            coming_back = PublishedState.from_document(decode(snapshot or pack(leader.snapshot_document())))
            assert coming_back.apply(journal) is not None
        assert len(json.dumps(leader.journal_data())) <= JOURNAL_BYTES + 1024 or len(leader.entries) == 1
    assert files(keeping_up.pods) == files(pods)
    if coming_back.apply(journal_of(leader)) is None:
        coming_back = snapshot_of(leader)
    assert files(coming_back.pods) == files(pods)


def test_a_member_lost_reaches_followers_through_the_journal_and_so_does_its_return():
    """A large job's followers take membership from the publication: the row carries the condition that says the
    pod is lost, and a follower leaves it out of its world as the publisher does."""
    pods = job(6)
    leader = leader_for(pods)
    follower = snapshot_of(leader)
    pods["demo-worker-3"]["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True",
                                                      "reason": "PreemptionByScheduler"}]
    pods["demo-worker-3"]["metadata"]["resourceVersion"] = "9001"
    assert leader.change(pods, {"demo-worker-3"}) is not None
    assert follower.apply(journal_of(leader)) is not None
    world = json.loads(files(follower.pods)["topology.json"])
    assert world["env"]["WORLD_SIZE"] == "5" and "demo-worker-3" not in {m["name"] for m in world["members"]}
    pods["demo-worker-3"]["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "False"}]
    pods["demo-worker-3"]["metadata"]["resourceVersion"] = "9002"
    assert leader.change(pods, {"demo-worker-3"}) is not None
    assert follower.apply(journal_of(leader)) is not None
    world = json.loads(files(follower.pods)["topology.json"])
    assert world["env"]["WORLD_SIZE"] == "6" and "demo-worker-3" in {m["name"] for m in world["members"]}


def test_a_status_update_that_moves_nothing_is_not_published():
    pods = job(8)
    leader = leader_for(pods)
    seq = leader.state.seq
    pods["demo-worker-3"]["metadata"]["resourceVersion"] = "99999"
    assert leader.change(pods, {"demo-worker-3"}) is None
    assert leader.state.seq == seq


@pytest.mark.slow
def test_a_change_too_large_for_a_configmap_goes_in_the_snapshot_and_the_journal_stays_readable(monkeypatch):
    """The newest entry was kept whatever its size: after the publisher's relist at 16384 pods one entry held
    every row, the journal passed 1 MiB, and every follower that reads it refused it and listed the pods. A
    change past ``MAX_PARTS`` entries' worth (here one: every IP of 4096 pods is ~0.87 MB) is the snapshot's."""
    monkeypatch.setattr(journal_module, "MAX_PARTS", 1)
    pods = job(4096)
    leader = leader_for(pods)
    for k, name in enumerate(sorted(pods)):
        pods[name]["status"]["podIP"] = f"127.8.{k // 250}.{k % 250 + 1}"
    entry = leader.change(pods, set(pods))
    assert entry is not None and len(entry.encoded()) > journal_module.MAX_ENTRY
    assert leader.take_lead_in() == []
    data = leader.journal_data()
    assert data[journal_module.JOURNAL_KEY] == "[]" and data["base"] == data["seq"] == str(entry.seq)
    assert leader.snapshot_due
    assert read_journal({"data": data}) is not None  # readable: a follower behind it reads the snapshot again
    leader.snapshot_written(leader.state.seq)
    assert not leader.snapshot_due


@pytest.mark.slow
def test_a_large_change_goes_out_in_parts_that_a_follower_applies_one_after_another():
    """Every IP of a 4096-pod job at once (~0.87 MB, as a burst of the kubelet's writes at 16384 pods) is two
    journal versions of one part each, in sequence, each under ``MAX_ENTRY``: a follower that applies them
    in turn holds the leader's rows, and never has to read the snapshot again. Only the last says where the rows
    stand in the pods' history."""
    pods = job(4096)
    leader = leader_for(pods)
    leader.take_lead_in()  # its first change's parts, written before the snapshot the follower reads
    follower = snapshot_of(leader)
    leader.pods_rv = "90001"
    for k, name in enumerate(sorted(pods)):
        pods[name]["status"]["podIP"] = f"127.8.{k // 250}.{k % 250 + 1}"
    before = leader.state.seq
    entry = leader.change(pods, set(pods))
    assert entry is not None and len(entry.encoded()) > journal_module.MAX_ENTRY
    versions = [*leader.take_lead_in(), leader.journal_data()]
    assert len(versions) == 2 and leader.take_lead_in() == []
    assert [int(v["seq"]) for v in versions] == [before + 1, before + 2] == [int(v["base"]) + 1 for v in versions]
    assert entry.seq == leader.state.seq == before + 2
    assert all(len(v[journal_module.JOURNAL_KEY]) <= journal_module.MAX_ENTRY for v in versions)
    assert [journal_module.PODS_RV_KEY in v for v in versions] == [False, True]
    changed: set[str] = set()
    for version in versions:
        applied = follower.apply(read_journal({"data": json.loads(json.dumps(version))}))
        assert applied is not None  # each reaches back to the state the one before left
        changed |= applied
    assert changed == set(pods) and follower.seq == leader.state.seq
    assert {name: pod["status"]["podIP"] for name, pod in follower.pods.items()} == \
        {name: pod["status"]["podIP"] for name, pod in pods.items()}
    assert leader.snapshot_due  # a follower that falls behind the last part reads the snapshot, at its sequence


@pytest.mark.parametrize("n", [1024, pytest.param(4096, marks=pytest.mark.slow)])
def test_a_single_pod_change_costs_each_follower_a_few_kib_at_any_size(n):
    pods = job(n)
    leader = leader_for(pods)
    sizes = []
    for k in range(40):
        name = f"demo-worker-{1 + k}"
        pods[name]["status"]["podIP"] = f"127.9.0.{k + 1}"
        pods[name]["metadata"]["resourceVersion"] = str(90000 + k)
        assert leader.change(pods, {name}) is not None
        sizes.append(len(json.dumps({"data": leader.journal_data()})))
        if leader.snapshot_due:
            leader.snapshot_written(leader.state.seq)
    assert max(sizes) <= 4096  # bytes per follower per single-pod change, whatever the job size
    before = len(base64.b64encode(pack(leader.snapshot_document())))  # what each follower received per change
    assert before > n // 100 * max(sizes)


def test_a_new_leader_continues_the_sequence_from_what_it_reads_back():
    pods = job(10)
    old = leader_for(pods)
    packed = old.snapshot_packed()  # the snapshot as the old leader published it
    touched = mutate(pods, "new-ip", 4)
    old.change(pods, touched)
    read = PublishedState.from_configmap(as_configmap(packed), pods=False, compare_only=True)
    assert read is not None and read.apply(journal_of(old)) == set(touched)  # brought forward, as state_from does
    other = snapshot_of(old)
    other.apply(journal_of(old))
    # The old leader's pod goes; a new leader takes over from what it read back and publishes only the difference.
    gone = "demo-master-0"
    del pods[gone]
    new = Publisher(read, OPTIONS, leader="demo-worker-1", journal=journal_of(old).entries)
    entry = new.change(pods, set(pods) | {gone})
    assert entry is not None and entry.gone == (gone,) and entry.put == ()
    assert other.apply(journal_of(new)) == {gone}
    assert set(other.pods) == set(pods)


@pytest.mark.parametrize("n", [1, journal_module.BLOCK_ROWS, journal_module.BLOCK_ROWS + 1,
                               2 * journal_module.BLOCK_ROWS + 3])
def test_an_entry_encoded_a_block_of_rows_at_a_time_is_the_whole_entrys_json(n):
    pods = job(n + 2)
    leader = leader_for(pods)
    first = leader.entries[-1]
    gone = ["demo-worker-1"]
    del pods[gone[0]]
    leader.change(pods, set(pods) | set(gone))
    for entry in (first, leader.entries[-1], journal_module.Entry(seq=3, put=(), gone=(), shapes=())):
        whole = json.dumps({"seq": entry.seq, "put": list(entry.put), "gone": list(entry.gone),
                            "shapes": {str(i): s for i, s in entry.shapes}}, separators=(",", ":"), sort_keys=True)
        assert entry.encoded() == whole
        assert entry.encoded_within(len(whole)) == whole
        assert entry.encoded_within(0) == (None if entry.put else whole)
    assert first.shapes and len(first.put) == n + 2 and leader.entries[-1].gone == tuple(gone)


def test_a_leader_reading_back_its_own_rows_holds_once_what_every_pod_repeats():
    """The rows decoded one at a time (its sidecar's read-back): no parse shared their labels' keys either."""
    pods = job(6)
    leader = leader_for(pods)
    read = PublishedState.from_configmap(as_configmap(leader.snapshot_packed()), compare_only=True)
    assert read is not None
    a, b = read.pods["demo-worker-1"], read.pods["demo-worker-2"]
    (key_a, value_a), = ((k, v) for k, v in a["metadata"]["labels"].items() if k == "volcano.sh/job-name")
    (key_b, value_b), = ((k, v) for k, v in b["metadata"]["labels"].items() if k == "volcano.sh/job-name")
    assert key_a is key_b and value_a is value_b and a["spec"]["subdomain"] is b["spec"]["subdomain"]
    whole = snapshot_of(leader)
    assert {name: dict(pod) for name, pod in read.pods.items()} == {name: dict(pod) for name, pod in whole.pods.items()}
    assert leader.change(pods, set(pods)) is None  # the rows it kept to compare still say every pod's content
    again = Publisher(read, OPTIONS, leader="demo-master-0")
    assert again.change(pods, set(pods)) is None


def test_a_leader_that_hands_its_read_back_pods_to_its_view_keeps_none_of_their_values():
    """The view shares the values of the pods it takes in later: the state's own table would keep the values of
    the pods read alive after the kubelet's writes replace them."""
    pods = job(6)
    read = PublishedState.from_configmap(as_configmap(leader_for(pods).snapshot_packed()), compare_only=True)
    assert read is not None
    held = read.pods["demo-worker-1"]["spec"]["subdomain"]
    assert read._strings("".join(held)) is held  # shared while the state holds the pods
    given = read.hand_over_pods()
    assert given["demo-worker-1"]["spec"]["subdomain"] is held and read.pods == {} and not read.keep_pods
    again = "".join(held)
    assert read._strings(again) is again  # the table is gone with the pods
    assert Publisher(read, OPTIONS, leader="demo-master-0").change(pods, set(pods)) is None  # the keys stay


def test_the_publishers_rows_without_annotations_or_lost_conditions_share_one_empty_container_each():
    """The publisher holds a row per pod for the job's life; most pods have neither: two empty containers per pod
    held for nothing. A pod that has them keeps its own, and every row says what it said."""
    from agent.core.publication.published import Col, Compactor

    pods = job(4)
    lost = copy.deepcopy(pods["demo-worker-2"])
    lost["metadata"]["annotations"]["jobset.sigs.k8s.io/coordinator"] = "demo-master-0"  # a row keeps it
    lost["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}]
    pods["demo-worker-2"] = lost
    compactor = Compactor(OPTIONS)
    for held in (pods, {name: compactor.pod(pod) for name, pod in pods.items()}):
        rows = leader_for(held).state.rows
        plain = [rows[name] for name in rows if name != "demo-worker-2"]
        assert all(row[Col.ANNOTATIONS] == {} and row[Col.CONDITIONS] == [] for row in plain)
        assert all(row[Col.ANNOTATIONS] is plain[0][Col.ANNOTATIONS] for row in plain)
        assert all(row[Col.CONDITIONS] is plain[0][Col.CONDITIONS] for row in plain)
        odd = rows["demo-worker-2"]
        assert odd[Col.ANNOTATIONS] == {"jobset.sigs.k8s.io/coordinator": "demo-master-0"}
        assert odd[Col.CONDITIONS] == [["DisruptionTarget", "True", "TerminationByKubelet"]]


def test_a_follower_keeps_no_rows_beside_its_pods_and_the_node_labels_by_node():
    """A follower's pods say all their rows say but the labels of their Nodes: those are kept by Node, from the
    latest row that names it (a relabelled Node's new labels; a Node read without labels has none), never the
    rows themselves (a row per pod beside it, in a topology-ordered job)."""
    pods = job(6)
    follower = snapshot_of(leader_for(pods))
    assert set(follower.pods) == set(pods) and follower.rows == {}  # each pod says all its row says
    row = next(iter(leader_for(pods).state.rows.values()))
    labelled = [*row[:10], "node-1", {"topology.kubernetes.io/zone": "z1"}, *row[12:]]  # read with --topology-levels
    follower._put(labelled)
    assert follower.rows == {} and follower.node_labels() == {"node-1": labelled[11]}
    relabelled = [*labelled[:11], {"topology.kubernetes.io/zone": "z2"}, *labelled[12:]]
    follower._put(relabelled)
    assert follower.rows == {} and follower.node_labels() == {"node-1": {"topology.kubernetes.io/zone": "z2"}}
    follower._put([*labelled[:11], None, *labelled[12:]])  # the same Node, its labels not read
    assert follower.rows == {} and follower.node_labels() == {}


@pytest.mark.parametrize("data", [
    {"changes.json": "[{\"seq\": 3, \"put\": [], \"gone\": [], \"shapes\": {}}]", "base": "1", "seq": "3"},  # hole
    {"changes.json": "[{\"seq\": 2, \"put\": [[1]], \"gone\": [], \"shapes\": {}}]", "base": "1", "seq": "2"},
    {"changes.json": "[{\"seq\": 2, \"put\": [], \"gone\": [7], \"shapes\": {}}]", "base": "1", "seq": "2"},
    {"changes.json": "{}", "base": "1", "seq": "2"},
    {"changes.json": "[]", "base": "x", "seq": "2"},
    {"changes.json": "[NaN]", "base": "1", "seq": "2"},
    {"changes.json": "[" * 100000 + "]" * 100000, "base": "1", "seq": "2"},
])
def test_a_forged_or_broken_journal_is_refused_in_one_line(data):
    state = PublishedState.from_document(decode(pack(leader_for(job(4)).snapshot_document())))
    with pytest.raises(InputError) as err:
        journal = read_journal({"data": data})
        state.apply(journal)  # type: ignore[arg-type]
    assert "\n" not in str(err.value) and "published topology" in str(err.value)


EDGE = 2**53 - 1


def _entry(seq: object) -> str:
    return json.dumps([{"seq": seq, "put": [], "gone": [], "shapes": {}}])


@pytest.mark.parametrize(("data", "said"), [
    pytest.param({"changes.json": "[]", "base": str(EDGE), "seq": str(EDGE + 1)},
                 f"seq {EDGE + 1} is out of range: a sequence number is from 0 to 2**53-1 ({EDGE})",
                 id="seq-one-past-2**53-1"),
    pytest.param({"changes.json": "[]", "base": str(EDGE + 1), "seq": str(EDGE + 1)},
                 f"base {EDGE + 1} is out of range", id="base-one-past-2**53-1"),
    pytest.param({"changes.json": _entry(EDGE + 1), "base": str(EDGE), "seq": str(EDGE + 1)},
                 f"a journal entry's seq {EDGE + 1} is out of range", id="entry-one-past-2**53-1"),
    pytest.param({"changes.json": "[]", "base": "-1", "seq": "0"}, "base -1 is out of range", id="negative-base"),
    pytest.param({"changes.json": "[]", "base": "1" + "0" * 100, "seq": "1" + "0" * 100},
                 "base of 333 bits is out of range", id="a-hundred-digits"),
    pytest.param({"changes.json": _entry(2.5), "base": "1", "seq": "2"},
                 "a journal entry's seq is not a whole number but a floating-point number", id="entry-seq-2.5"),
    pytest.param({"changes.json": _entry("2"), "base": "1", "seq": "2"},
                 "a journal entry's seq is not a whole number but a string", id="entry-seq-a-string"),
])
def test_a_sequence_number_out_of_range_is_named_with_its_value(data, said):
    with pytest.raises(InputError) as err:
        read_journal({"data": data})
    assert said in str(err.value) and "\n" not in str(err.value)


def test_a_journal_at_sequence_2_53_minus_1_is_read():
    journal = read_journal({"data": {"changes.json": _entry(EDGE), "base": str(EDGE - 1), "seq": str(EDGE)}})
    assert journal is not None and (journal.base, journal.seq) == (EDGE - 1, EDGE)


def test_a_followers_pods_hold_once_the_values_every_pod_repeats_and_read_as_published():
    pods = job(6)
    leader = leader_for(pods)
    follower = snapshot_of(leader)
    a, b = follower.pods["demo-worker-1"], follower.pods["demo-worker-2"]
    assert a["metadata"]["labels"]["volcano.sh/job-name"] is b["metadata"]["labels"]["volcano.sh/job-name"]
    assert a["spec"]["subdomain"] is b["spec"]["subdomain"] and a["status"]["phase"] is b["status"]["phase"]
    fresh = PublishedState.from_document(decode(pack(leader.snapshot_document())), pods=False)
    assert {name: dict(pod) for name, pod in follower.pods.items()} == {
        name: _pod_of(row, fresh.shapes, "default") for name, row in fresh.rows.items()}


def test_a_refused_container_shape_stays_refused_for_the_rows_after():
    """Rows share container shapes and each shape is checked once; a shape that fails is not remembered as
    checked, so a second row with it is refused too."""
    from agent.errors import InputError

    pods = job(4)
    leader = leader_for(pods)
    follower = snapshot_of(leader)
    bad = {"name": "trainer", "env": [{"name": "X", "value": 7}]}
    index = len(follower.shapes)
    follower.shapes.append(bad)
    for name in ("demo-worker-1", "demo-worker-2"):
        row = [*leader.state.rows[name]]  # as published (a follower keeps the pod, not the row)
        row[6] = index
        with pytest.raises(InputError, match="env"):
            follower._put(row)


def test_a_forged_snapshot_with_a_huge_sequence_does_not_silence_every_later_journal():
    """A snapshot forged at sequence 2**53-1 would make each real journal look old and be ignored for good. A
    journal that far behind is another history: the follower reads again (and, finding the
    same forged snapshot, follows the pods instead: docs/sidecar.md)."""
    from agent.core.publication.journal import JOURNAL_LAG, state_from

    leader = leader_for(job(4))
    forged = leader.snapshot_document()
    forged["generation"] = 2**53 - 1
    state = PublishedState.from_document(decode(pack(forged)))
    pods = job(4)
    pods["demo-worker-1"]["status"]["podIP"] = "127.1.0.77"
    leader.change(pods, {"demo-worker-1"})
    journal = journal_of(leader)
    assert journal.seq < 10
    assert state.apply(journal) is None  # read again, not "nothing new" forever
    # the API's view: the forged snapshot with the real journal: no state to follow
    from agent.core.publication.published import configmap_body

    snapshot_cm = configmap_body("demo-topology", pack(forged), generation=2**53 - 1, leader="demo-master-0",
                                 owner=None)
    journal_cm = {"metadata": {"name": "demo-topology-journal"}, "data": leader.journal_data()}
    assert state_from([snapshot_cm, journal_cm], "demo-topology")[0] is None
    honest_cm = configmap_body("demo-topology", pack(leader.snapshot_document()), generation=leader.state.seq,
                               leader="demo-master-0", owner=None)
    assert state_from([honest_cm, journal_cm], "demo-topology")[0] is not None
    # a journal that lags a fresh snapshot by a change or two (the leader writes the snapshot first) is fine
    fresh = snapshot_of(leader)
    behind = copy.deepcopy(journal)
    assert fresh.seq - behind.seq <= JOURNAL_LAG and fresh.apply(behind) == set()


def test_a_new_leaders_packed_snapshot_is_the_documents_text():
    """The publisher keeps each block of rows compressed while no row of it changes (encoding a 16384-pod
    snapshot costs ~25 ms, every few changes); a leader that starts from a state it read has none kept
    yet."""
    pods = job(8)
    old = leader_for(pods)
    new = Publisher(snapshot_of(old), OPTIONS, leader="demo-worker-0", leader_uid="u2")
    assert same_text(new.snapshot_packed(), pack(new.snapshot_document()))
    touched = mutate(pods, "join", 3) | mutate(pods, "leave", 5) | mutate(pods, "new-shape", 7)
    new.change(pods, touched)
    assert same_text(new.snapshot_packed(), pack(new.snapshot_document()))
    assert decode(new.snapshot_packed()) == new.snapshot_document()


def as_configmap(packed: bytes) -> dict:
    return {"metadata": {"name": "demo-topology"},
            "binaryData": {"topology.json.gz": base64.b64encode(packed).decode()}}


@pytest.mark.parametrize("what", ["new-ip", "new-shape", "leave", "join", "status-only"])
def test_a_new_leader_reads_back_content_keys_and_publishes_only_what_changed(what):
    """A new leader compares every published row with its own once, so it keeps each row read back as its
    content key only (16384 decoded rows would cost it 25 MB); after that first change it holds what a leader
    that published these pods from the start holds."""
    pods = job(12)
    old = leader_for(pods)
    state = PublishedState.from_configmap(as_configmap(old.snapshot_packed()), pods=False, compare_only=True)
    assert state is not None and state.pods == {}
    assert all(len(row) == 3 and isinstance(row[2], bytes) for row in state.rows.values())
    new = Publisher(state, OPTIONS, leader="demo-worker-1", leader_uid="u2")
    touched = mutate(pods, what, 5)
    entry = new.change(pods, set(pods) | set(state.rows))
    if what == "status-only":
        assert entry is None
    else:
        assert entry is not None and {row[0] for row in entry.put} | set(entry.gone) == touched
    assert all(len(row) == 14 for row in state.rows.values())
    # the same rows but for the resourceVersion of a pod whose content did not change: the published one stays
    assert [[r[0], *r[2:]] for r in new.snapshot_document()["pods"]] == \
        [[r[0], *r[2:]] for r in leader_for(pods).snapshot_document()["pods"]]


def test_rows_written_in_another_key_order_compare_as_the_same_content():
    """Another writer's key order or spacing (labels sorted, the document indented, "pods" before the header)
    makes the same rows: nothing is published again."""
    pods = job(6)
    document = leader_for(pods).snapshot_document()
    for row in document["pods"]:
        row[2] = dict(sorted(row[2].items(), reverse=True))  # the labels
    pods_first = {"pods": document["pods"], **{k: v for k, v in document.items() if k != "pods"}}
    text = json.dumps(pods_first, indent=1)
    state = PublishedState.from_configmap(as_configmap(gzip.compress(text.encode())), pods=False,
                                          compare_only=True)
    assert state is not None and len(state.rows) == 6
    assert Publisher(state, OPTIONS, leader="demo-worker-1").change(pods, set(pods)) is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False), st.sampled_from([2, 3, 256]),
       st.lists(st.sampled_from(["new-ip", "new-shape", "leave"]), max_size=6))
def test_rows_staged_as_the_pods_arrive_publish_what_rows_built_at_the_end_publish(rnd, block_rows, later):
    """The leader's init stages each pod's row as it arrives (building 16384 rows after the last IP would cost
    ~0.1 s, encoding them for the snapshot ~50 ms more). Pods arrive in any order, some twice (a new version
    replaces the staged row), some staged and gone before the gang is complete, with two container shapes: the
    first publication holds what a publisher that built every row at the end holds, its snapshot is its document's
    text, and the changes after it are published alike."""
    pods = job(12)
    for name in ("demo-worker-3", "demo-worker-7"):
        pods[name]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "3"}}
    gone = copy.deepcopy(pods["demo-worker-2"])
    gone["metadata"]["name"] = "demo-worker-99"
    with mock.patch.object(journal_module, "BLOCK_ROWS", block_rows):
        staged = Publisher(PublishedState(job="demo", namespace="default"), OPTIONS, leader="demo-master-0")
        arrivals = [*pods.values(), gone]
        rnd.shuffle(arrivals)
        for pod in arrivals:
            staged.stage(copy.deepcopy(pod))  # an earlier version of the pod: not the object published
            staged.stage(pod)
        replaced = sorted(pods)[rnd.randrange(len(pods))]
        pods[replaced] = copy.deepcopy(pods[replaced])  # a version that came after its row was staged
        pods[replaced]["status"]["podIP"] = "127.9.9.9"
        built = Publisher(PublishedState(job="demo", namespace="default"), OPTIONS, leader="demo-master-0")
        for publisher in (staged, built):
            publisher.change(pods, pods, journal=False)
        packed = staged.snapshot_packed()
        assert same_text(packed, pack(staged.snapshot_document()))
        followed = {k: PublishedState.from_document(decode(p.snapshot_packed())).pods for k, p in
                    (("staged", staged), ("built", built))}
        assert followed["staged"] == followed["built"]
        assert followed["staged"][replaced]["status"]["podIP"] == "127.9.9.9"
        assert "demo-worker-99" not in followed["staged"]
        for publisher in (staged, built):
            publisher.snapshot_written(publisher.state.seq)
        for k, what in enumerate(later):
            touched = mutate(pods, what, 3 + k)
            entries = [p.change(pods, touched) for p in (staged, built)]
            assert (entries[0] is None) == (entries[1] is None)
            for publisher in (staged, built):
                assert same_text(publisher.snapshot_packed(), pack(publisher.snapshot_document()))
        assert PublishedState.from_document(decode(staged.snapshot_packed())).pods == \
            PublishedState.from_document(decode(built.snapshot_packed())).pods


def test_rows_that_carry_node_labels_are_not_staged():
    """With --levels each row carries its Node's labels, read once the gang is complete: a row staged before
    would publish none."""
    from agent.core.pods.placement import DEFAULT_LEVELS

    pods = job(3)
    for pod in pods.values():
        pod["spec"]["nodeName"] = "node-a"
    options = Options(address="ip", levels=DEFAULT_LEVELS)
    publisher = Publisher(PublishedState(job="demo", namespace="default"), options, leader="demo-master-0")
    for pod in pods.values():
        publisher.stage(pod)
    nodes = {"node-a": {DEFAULT_LEVELS[0].label: "block-a"}}
    publisher.change(pods, pods, nodes, journal=False)
    document = decode(publisher.snapshot_packed())
    assert document["nodeLabels"] == [{DEFAULT_LEVELS[0].label: "block-a"}]  # said once, for the three rows
    assert [row[11] for row in document["pods"]] == [0] * 3
    assert PublishedState.from_document(document).node_labels() == {"node-a": {DEFAULT_LEVELS[0].label: "block-a"}}


def node_job(n: int) -> tuple[dict[str, dict], dict[str, dict[str, str]], Options]:
    """``n`` pods on two Nodes of one rack, as runtime/nodes.py reads them (the levels' labels alone); a third
    Node read with a label of no level; and the options that rank by them."""
    from agent.core.pods.placement import DEFAULT_LEVELS

    pods = job(n)
    for k, pod in enumerate(pods.values()):
        pod["spec"]["nodeName"] = f"node-{k % 3}"
    rack = {level.label: "r1" for level in DEFAULT_LEVELS}
    nodes = {"node-0": rack, "node-1": rack, "node-2": {**rack, "kubernetes.io/hostname": "node-2"}}
    return pods, nodes, Options(address="ip", levels=DEFAULT_LEVELS)


def test_rows_hold_the_label_set_their_node_was_read_into():
    """Every pod of a Node, and every Node of a rack, carries the same labels: a row holds the dict its Node's
    labels were read into (one per distinct set), not a copy of its own; a Node read with labels of no level is
    cut to the levels' own."""
    pods, nodes, options = node_job(6)
    publisher = Publisher(PublishedState(job="demo", namespace="default"), options, leader="demo-master-0")
    publisher.change(pods, pods, nodes, journal=False)
    labels = {name: row[11] for name, row in publisher.state.rows.items()}
    on = {name: pod["spec"]["nodeName"] for name, pod in pods.items()}
    assert all(labels[name] is nodes["node-0"] for name in pods if on[name] in ("node-0", "node-1"))
    assert all(labels[name] == nodes["node-0"] and labels[name] is not nodes["node-2"]
               for name in pods if on[name] == "node-2")
    assert decode(publisher.snapshot_packed())["nodeLabels"] == [nodes["node-0"]]


def test_a_new_leader_with_node_labels_holds_what_a_leader_from_the_start_holds():
    """A new leader's first change builds every row again and keeps those whose content was published already,
    with the published resourceVersion; its snapshot says what its predecessor's said."""
    pods, nodes, options = node_job(8)
    old = Publisher(PublishedState(job="demo", namespace="default"), options, leader="demo-master-0")
    old.change(pods, pods, nodes, journal=False)
    packed = old.snapshot_packed()
    state = PublishedState.from_configmap(as_configmap(packed), pods=False, compare_only=True)
    assert state is not None
    for pod in pods.values():
        pod["metadata"]["resourceVersion"] += "0"  # a status write since, nothing a row says
    new = Publisher(state, options, leader="demo-worker-1")
    assert new.change(pods, set(pods), nodes) is None
    assert new.state.rows == old.state.rows
    assert all(new.state.rows[name][11] is nodes["node-0"] for name, pod in pods.items()
               if pod["spec"]["nodeName"] != "node-2")
    assert gzip.decompress(new.snapshot_packed()) == gzip.decompress(packed)


@pytest.mark.slow
def test_a_change_too_large_for_the_journal_is_never_encoded_whole(monkeypatch):
    """Every row of a large job changed (its pods' phase Running, past the snapshot its init published): the
    entry is encoded only until its rows pass what the journal carries, ``MAX_PARTS`` entries' worth (here one;
    the whole text, ~3.5 MB at 16384 pods, was held in three copies while joined, then let go)."""
    monkeypatch.setattr(journal_module, "MAX_PARTS", 1)
    pods = job(4096)
    leader = leader_for(pods)
    for k, name in enumerate(sorted(pods)):
        pods[name]["status"]["podIP"] = f"127.8.{k // 250}.{k % 250 + 1}"
    made: list[int] = []
    dumps = journal_module._dumps
    monkeypatch.setattr(journal_module, "_dumps", lambda value: made.append(len(text := dumps(value))) or text)
    entry = leader.change(pods, set(pods))
    assert entry is not None and leader.journal_data()[journal_module.JOURNAL_KEY] == "[]"
    assert journal_module.MAX_ENTRY < sum(made) <= journal_module.MAX_ENTRY + max(made)
    monkeypatch.setattr(journal_module, "_dumps", dumps)
    assert len(entry.encoded()) > journal_module.MAX_ENTRY + max(made)


def test_a_row_changed_after_staging_is_packed_as_it_is_now():
    """The staged rows' text serves the first snapshot only while each row is the one published: a change
    published before that snapshot is packed re-encodes its row."""
    pods = job(5)
    publisher = Publisher(PublishedState(job="demo", namespace="default"), OPTIONS, leader="demo-master-0")
    for pod in pods.values():
        publisher.stage(pod)
    publisher.change(pods, pods, journal=False)
    touched = mutate(pods, "new-ip", 3)
    publisher.change(pods, touched)
    assert same_text(publisher.snapshot_packed(), pack(publisher.snapshot_document()))
    (name,) = touched
    assert PublishedState.from_document(decode(publisher.snapshot_packed())).pods[name]["status"]["podIP"] == \
        pods[name]["status"]["podIP"]


def test_a_follower_reads_the_snapshot_one_row_at_a_time_and_holds_the_pods_of_one_decode(monkeypatch):
    """A follower holds each row's pod, not the rows: decoding every row at once (~25 MB at 16384 pods) was a
    transient of its start. The rows come one at a time, each pod equal to what the whole document says, and
    the labels' keys every pod repeats are held once."""
    leader = leader_for(job(6))
    asked = []
    decode_configmap = journal_module.decode_configmap

    def recorded(configmap, rows=None):  # type: ignore[no-untyped-def]
        asked.append(rows)
        return decode_configmap(configmap, rows)

    monkeypatch.setattr(journal_module, "decode_configmap", recorded)
    state = PublishedState.from_configmap(as_configmap(leader.snapshot_packed()))
    assert state is not None and asked and all(rows is not None for rows in asked)
    whole = PublishedState.from_document(decode(leader.snapshot_packed()))
    assert state.pods == whole.pods and state.rows == whole.rows and state.seq == whole.seq
    keys = [next(k for k in pod["metadata"]["labels"] if k == "volcano.sh/job-name") for pod in state.pods.values()]
    assert all(key is keys[0] for key in keys)


def test_a_pods_next_row_holds_what_it_repeats_of_the_pod_held_once():
    """A row that changes a pod (a new IP here; the kubelet's phase writes alike), by the journal or in a snapshot
    read again, makes a new pod that holds the earlier one's objects wherever it says the same (its labels): a
    follower that holds every pod keeps one copy of each value, not one per version it read."""
    from agent.core.publication.published import configmap_body

    def moved(pod: dict, version: str, ip: str) -> dict:
        pod = copy.deepcopy(pod)
        pod["metadata"]["resourceVersion"] = version
        pod["status"]["podIP"], pod["status"]["podIPs"] = ip, [{"ip": ip}]
        return pod

    pods = job(4)
    publisher = leader_for(pods)
    follower = snapshot_of(publisher)
    first = follower.pods["demo-worker-1"]
    pods["demo-worker-1"] = moved(pods["demo-worker-1"], "2001", "127.1.0.91")
    assert publisher.change(pods, {"demo-worker-1"}) is not None
    assert follower.apply(journal_of(publisher)) == {"demo-worker-1"}
    second = follower.pods["demo-worker-1"]
    assert second["status"]["podIP"] == "127.1.0.91" and second["metadata"]["labels"] is first["metadata"]["labels"]
    pods["demo-worker-1"] = moved(pods["demo-worker-1"], "2002", "127.1.0.92")
    assert publisher.change(pods, {"demo-worker-1"}) is not None
    body = configmap_body("demo-topology", publisher.snapshot_packed(), generation=publisher.state.seq,
                          leader="demo-master-0", owner=None)
    relisted = PublishedState.from_configmap(json.loads(json.dumps(body)), held=follower.pods)
    assert relisted is not None
    third = relisted.pods["demo-worker-1"]
    assert third["status"]["podIP"] == "127.1.0.92" and third["metadata"]["labels"] is first["metadata"]["labels"]
    assert relisted.pods["demo-worker-2"] is follower.pods["demo-worker-2"]  # unchanged: the object held
    # the new state's keys are the held pods' own names, not the snapshot's copy of each
    held_names = {id(name) for name in follower.pods}
    assert all(id(name) in held_names for name in relisted.pods)
