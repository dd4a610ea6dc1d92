"""core/files/rendering.MemberTexts: the texts it keeps between generations are those of the members given,
whichever way they changed (in place, equal but new, more or fewer, moved in rank), byte for byte what encoding
each member afresh gives, whether the moved members' ranks are replaced in their texts or encoded. And
MembershipKey: two plans' keys are equal exactly when their members' key fields and extras are."""

from __future__ import annotations

import json
import sys

import pytest

from agent.core.files import rendering
from agent.core.files.rendering import _KEY_FIELDS, MembershipKey, MemberTexts, _member_json
from agent.core.model import Member
from agent.core.pods.placement import DEFAULT_LEVELS
from agent.files import writing
from agent.files.writing import write_files


def member(i: int, address: str | None = None, rank: int | None = None) -> Member:
    address = address or f"10.0.0.{i}"
    return Member(name=f"demo-worker-{i}", role="worker", index=(i,), ordinal=i, address=address, dns_name=None,
                  ip=address, training=True, slots=1, node_rank=i if rank is None else rank,
                  first_rank=i if rank is None else rank)


def joined(texts: MemberTexts, members, levels=()) -> list[bytes]:
    """Each member's text: its head and its tail (``MemberTexts.texts``)."""
    heads, tails = texts.texts(members, levels)
    return [head + tail for head, tail in zip(heads, tails, strict=True)]


def base() -> tuple[Member, ...]:
    return tuple(member(i) for i in range(6))


STEPS = {
    "the same tuple": lambda ms: ms,
    "one member changed in place": lambda ms: (*ms[:2], member(2, "10.9.9.9"), *ms[3:]),
    "two changed, apart": lambda ms: (member(0, "10.8.8.8"), *ms[1:5], member(5, "10.7.7.7")),
    "equal members, new objects": lambda ms: tuple(member(i) for i in range(6)),
    "one left: the rest move up": lambda ms: tuple(member(i, rank=i - (i > 2)) for i in range(6) if i != 2),
    "one more at the end": lambda ms: (*ms, member(6)),
    "the same length, every rank shifted": lambda ms: tuple(member(i, rank=i + 1) for i in range(6)),
    "one left and one moved elsewhere": lambda ms: tuple(member(i, "10.6.6.6" if i == 4 else None, rank=i - (i > 1))
                                                         for i in range(6) if i != 1),
    "one joined first: the rest move down": lambda ms: (member(9, rank=0), *(member(i, rank=i + 1) for i in range(6))),
    "a pod that does not train moved": lambda ms: (*ms[:1], *ms[2:], ms[1]._replace(training=False, node_rank=None,
                                                                                    first_rank=None)),
    "none": lambda ms: (),
}


@pytest.mark.parametrize("rerank_from", [0, rendering.RERANK_FROM])  # ranks replaced in the texts, or encoded
@pytest.mark.parametrize("step", sorted(STEPS))
@pytest.mark.parametrize("before", [0, 1, 2])
def test_kept_texts_are_the_members_own(step, before, rerank_from, monkeypatch):
    monkeypatch.setattr(rendering, "RERANK_FROM", rerank_from)
    texts, members = MemberTexts(), base()
    for _ in range(before):  # the cache as a sidecar holds it after some generations
        texts.texts(members, ())
        members = STEPS["one member changed in place"](members)
    texts.texts(members, ())
    now = STEPS[step](members)
    assert joined(texts, now) == [json.dumps(_member_json(m)).encode() for m in now]


@pytest.mark.parametrize("step", sorted(STEPS))
@pytest.mark.parametrize("extras", [(), (("frameworks", ("jax", "d1")),)])
def test_a_membership_key_equals_another_exactly_when_their_key_fields_do(step, extras):
    members = base()
    now = STEPS[step](members)
    key = MembershipKey(now, extras)
    assert tuple(key) == (*map(_KEY_FIELDS, now), *extras)  # its parts, as topology.json's are read back
    same = tuple(map(_KEY_FIELDS, now)) == tuple(map(_KEY_FIELDS, members))
    assert (key == MembershipKey(members, extras)) is same
    assert (MembershipKey(members, extras) == key) is same
    assert (key == MembershipKey(now, (*extras, ("groups", 1)))) is False
    assert key != tuple(key)  # an own view's key is another kind: never the same


def test_a_member_s_ip_alone_is_no_membership_change():
    """The IP is in topology.json but not in the key: a pod addressed by DNS name whose IP changes writes nothing."""
    members = base()
    moved = (*members[:2], members[2]._replace(ip="10.9.9.9"), *members[3:])
    assert MembershipKey(moved) == MembershipKey(members)
    assert MembershipKey(moved) != MembershipKey(members[:-1])


def test_a_leave_and_a_come_back_in_a_large_job_replace_ranks_and_match_a_fresh_encoding(monkeypatch):
    encoded: list[Member] = []
    real, head = rendering._member_json, rendering._member_head_json

    def counting(m: Member):  # what is encoded member by member, rather than re-ranked
        encoded.append(m)
        return head(m)

    monkeypatch.setattr(rendering, "_member_head_json", counting)
    n = 2 * rendering.RERANK_FROM
    job = tuple(member(i) for i in range(n))
    texts = MemberTexts()
    texts.texts(job, ())
    left = tuple(member(i, rank=i - (i > 10)) for i in range(n) if i != 10)
    back = tuple(member(i) for i in range(n))
    want_left, want_back = ([json.dumps(real(m)).encode() for m in ms] for ms in (left, back))
    encoded.clear()
    assert joined(texts, left) == want_left
    assert encoded == []  # every later member moved up: its ranks replaced, nothing encoded
    assert joined(texts, back) == want_back
    assert [m.name for m in encoded] == ["demo-worker-10"]  # the one that came back is new


def test_a_burst_that_changes_every_member_frees_each_last_text_before_the_next_is_encoded(monkeypatch):
    """Every pod Running at once (the same places, every member a new object): the last generation's text of a
    place is let go as its new one is made, not held beside the new generation until the end; a member equal to
    the last one at its place keeps its text, not encoded again."""
    n = 2 * rendering.RERANK_FROM
    texts = MemberTexts()
    before = list(texts.texts(tuple(member(i) for i in range(n)), ())[0])
    alone = sys.getrefcount(before[1]) - 2  # the cache's own references to one text (the list's, the call's: 2)
    assert alone > 0
    real, head = rendering._member_json, rendering._member_head_json
    held_when_next: list[int] = []

    def encoding(m: Member):  # type: ignore[no-untyped-def]
        if m.ordinal >= 3:  # the last changed place was replaced: its old text held by ``before`` alone
            held_when_next.append(sys.getrefcount(before[m.ordinal - 2]) - 2)
        return head(m)

    burst = tuple(member(i, f"10.1.0.{i}") if i % 2 else member(i) for i in range(n))  # odd places change
    want = [json.dumps(real(m)).encode() for m in burst]
    monkeypatch.setattr(rendering, "_member_head_json", encoding)
    assert joined(texts, burst) == want
    assert len(held_when_next) == n // 2 - 1 and set(held_when_next) == {0}
    assert texts.texts(burst, ())[0][0] is before[0]  # equal: kept


def test_the_rank_fields_are_where_the_rank_replacement_reads_them():
    m = member(3)._replace(node="n1", domains=("z",))
    assert rendering._NODE_RANK_OF(m) == m.node_rank and rendering._RANK_OF(m) == m.first_rank
    assert (*rendering._BEFORE_RANKS(m), m.node_rank, m.first_rank, *rendering._AFTER_RANKS(m)) == tuple(m)


def test_members_of_one_domain_share_one_tail_and_each_text_is_a_fresh_encoding():
    """With topology levels a member's domains are most of its text: held once per distinct domains (the tail),
    each member's head its own; joined, byte for byte the member encoded with its levels, after a rerank too."""
    levels = DEFAULT_LEVELS
    blank = ("",) * (len(levels) - 2)
    racks = [("zone-a", "rack-1", *blank), ("zone-a", "rack-2", *blank)]
    n = 2 * rendering.RERANK_FROM
    job = tuple(member(i)._replace(node=f"node-{i}", domains=racks[i % 2]) for i in range(n))
    texts = MemberTexts()
    assert joined(texts, job, levels) == [json.dumps(_member_json(m, levels)).encode() for m in job]
    heads, tails = texts.texts(job, levels)
    assert len({id(t) for t in tails}) == 2 and b"rack-1" in tails[0] and b"rack" not in heads[0]
    left = tuple(m._replace(node_rank=m.node_rank - (i > 3), first_rank=m.first_rank - (i > 3))
                 for i, m in enumerate(job) if i != 3)
    assert joined(texts, left, levels) == [json.dumps(_member_json(m, levels)).encode() for m in left]


@pytest.mark.parametrize("chunk", [1, 7, rendering.RERANK_CHUNK])
def test_a_rerank_cut_in_chunks_replaces_every_moved_members_ranks_as_a_fresh_encoding_would(chunk, monkeypatch):
    """The moved members' texts are cut apart a chunk at a time (their pieces all at once were ~11 MB over what
    a 16384-pod change holds): every chunk, the last one partial, gives the bytes of a fresh encoding."""
    encoded: list[Member] = []
    real, head = rendering._member_json, rendering._member_head_json

    def counting(m: Member):  # type: ignore[no-untyped-def]
        encoded.append(m)
        return head(m)

    monkeypatch.setattr(rendering, "_member_head_json", counting)
    monkeypatch.setattr(rendering, "RERANK_CHUNK", chunk)
    n = 2 * rendering.RERANK_FROM + 3
    texts = MemberTexts()
    texts.texts(tuple(member(i) for i in range(n)), ())
    left = tuple(member(i, rank=i - (i > 4)) for i in range(n) if i != 4)
    want = [json.dumps(real(m)).encode() for m in left]
    encoded.clear()
    assert joined(texts, left) == want
    assert encoded == []


@pytest.mark.parametrize("slice_", [1, 2, writing.WRITE_PARTS])
def test_files_held_in_parts_read_joined_and_are_written_one_part_after_another(slice_, tmp_path, monkeypatch):
    """topology.json is held as its members' texts and what stands between them: read, the parts joined; the
    writer writes the parts a slice at a time (no joined copy of the file), the bytes the same, in write order."""
    monkeypatch.setattr(writing, "WRITE_PARTS", slice_)
    files = rendering.Files({"torch.env": (b"WORLD_SIZE=2\n",), "topology.json": [b'{"members": [', b"{}",
                                                                                  b", ", b"{}", b"]}\n"]})
    assert files["topology.json"] == b'{"members": [{}, {}]}\n' and list(files) == ["torch.env", "topology.json"]
    write_files(tmp_path, files.parts())
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == dict(files.items())

