"""core/rendering.MemberTexts: the texts and membership keys it keeps between generations are those of the
members given, whichever way they changed (in place, equal but new, more or fewer)."""

from __future__ import annotations

import json

import pytest

from agent.core.model import Member
from agent.core.rendering import _KEY_FIELDS, MemberTexts, _member_json


def member(i: int, address: str | None = None, rank: int | None = None) -> Member:
    address = address or f"10.0.0.{i}"
    return Member(name=f"demo-worker-{i}", role="worker", index=(i,), ordinal=i, address=address, dns_name=None,
                  ip=address, training=True, slots=1, node_rank=i if rank is None else rank,
                  first_rank=i if rank is None else rank)


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
    "none": lambda ms: (),
}


@pytest.mark.parametrize("step", sorted(STEPS))
@pytest.mark.parametrize("before", [0, 1, 2])
def test_kept_texts_and_keys_are_the_members_own(step, before):
    texts, members = MemberTexts(), base()
    for _ in range(before):  # the cache as a sidecar holds it after some generations
        texts.texts(members, ())
        members = STEPS["one member changed in place"](members)
    texts.texts(members, ())
    now = STEPS[step](members)
    assert texts.texts(now, ()) == [json.dumps(_member_json(m)).encode() for m in now]

    class Topo:  # what membership_key reads of a topology
        pass
    topo = Topo()
    topo.members, topo.levels = now, ()
    assert texts.membership_key(topo) == tuple(map(_KEY_FIELDS, now))  # type: ignore[arg-type]
