"""``--rank-order topology`` in a kept layout: where a member that leaves or joins stands in ``rank.topology_order``
without laying every pod out again. Domains are ordered by their first member in index order, so a member that
leads a domain (its first member) moves that domain among its siblings when it leaves, and a member that comes
before a domain's first member does when it joins. The planner then puts the training rows in the order again
(``reorder``) and keeps every member it placed: only where each stands changes.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable, Iterable
from typing import Any

from agent.core.model import member_fields
from agent.core.plan.layout import _LIVE_NAME, Live, _Layout
from agent.core.plan.rank import SortKey

DomainsOf = Callable[[str], "tuple[str, ...] | None"]

_DOMAINS, _NODE = member_fields("domains"), member_fields("node")


def _values_at(held: list[Any], nodes: list[str], depth: int, low: int, high: int) -> list[str]:
    """Each of the members ``low:high``'s value at ``depth`` of its path: a domain (``held``: each member's domains),
    or its node past the last level."""
    levels = len(held[low]) if high > low else 0
    return nodes[low:high] if depth == levels else list(map(operator.itemgetter(depth), held[low:high]))


def order_without(layout: _Layout, at: int) -> bool | None:
    """Whether the others keep their order when the member at ``at`` leaves: True unless it was the first of a
    domain that holds others (the domain's next member then decides its place among its siblings: False); None
    where only planning from scratch can say (index order for want of Node labels, a member without domains)."""
    rows, count = layout.rows, layout.census.training
    if layout.order_note is not None:
        return None
    if at >= count:
        return True  # no training member: after the training ones, in index order
    placed: list[Any] = rows.placed[:count]
    me = placed[at]
    if me is None or me.domains is None:
        return None
    found = shared_block(placed, (*me.domains, me.node), least=2)
    if found is None:
        return None
    deepest, lo, hi, _ = found
    return not deepest or min(rows.keys[lo:hi]) < rows.keys[at]


def shared_block(placed: list[Any], path: tuple[str, ...], *, least: int
                 ) -> tuple[int, int, int, Callable[[int, int, int], Iterable[str]]] | None:
    """The deepest domain of ``path`` (a member's domains, then its node) that at least ``least`` of the training
    members ``placed`` (in topology order, each with its domains) share: (its depth, where its members start and
    stop, each member's value at a depth), depth 0 for none. Its members are contiguous (rank.topology_order);
    None where they are not, or a member is not placed or has no domains. C-level passes, level by level, over
    the members of the domain found so far."""
    if None in placed:
        return None
    held: list[Any] = list(map(_DOMAINS, placed))
    if None in held:
        return None
    nodes: list[str] = list(map(_NODE, placed))

    def column(depth: int, low: int, high: int) -> Iterable[str]:
        return _values_at(held, nodes, depth, low, high)

    lo, hi, deepest = 0, len(placed), 0
    for depth, value in enumerate(path):  # the members of path[:depth + 1], among those of path[:depth]
        same = list(map(operator.eq, column(depth, lo, hi), itertools.repeat(value)))
        found = same.count(True)
        if found < least:
            break
        first, stop = lo + same.index(True), hi - same[::-1].index(True)
        if found != stop - first:
            return None  # not contiguous: not the topology order (never so: from scratch all the same)
        lo, hi, deepest = first, stop, depth + 1
    return deepest, lo, hi, column


def topology_arrival(layout: _Layout, new: Live, key: SortKey, domains_of: DomainsOf
                     ) -> tuple[int, tuple[str, ...] | None] | None:
    """Where the pod ``new`` (sort key ``key``) arrives so that the rows are ``rank.topology_order``'s, and its
    path when its arrival moves domains among their siblings (``reorder``): it comes before, in index order, the
    first member of the deepest domain it shares with others (that member decided the domain's place), and
    arrives at the start of that domain; None when its Node's labels are not known. A pod that does not train
    goes after the training members, in index order. Else it joins the block of that deepest domain, D: among D's
    members by index order when it shares their node too, or else as a new child domain of D, before the first
    child whose first member comes after it."""
    rows, count = layout.rows, layout.census.training
    if new.ident.role not in layout.rule.position:
        return bisect.bisect_left(rows.keys, key, count, len(rows.keys)), None
    domains = domains_of(new.facts.node)
    if layout.order_note is not None or domains is None:
        return None
    path = (*domains, new.facts.node)
    found = shared_block(rows.placed[:count], path, least=1)
    if found is None:
        return None
    deepest, lo, hi, column = found
    if deepest and min(rows.keys[lo:hi]) > key:
        return lo, path
    if deepest == len(path):
        return bisect.bisect_left(rows.keys, key, lo, hi), None
    at = lo
    for _, child in itertools.groupby(column(deepest, lo, hi)):
        size = sum(1 for _ in child)
        if min(rows.keys[at:at + size]) > key:
            return at, None
        at += size
    return hi, None


def reorder(layout: _Layout, path: tuple[str, ...], breaks: Iterable[int]) -> list[int]:
    """Put the training rows in topology order again after the member of ``path`` (its domains, then its node)
    left, or arrived at the start of the deepest domain it shares with others, ahead of that domain's first member:
    only the domains on its path changed their first member, so, from the outermost down, each of them is moved
    as one block among its siblings to where its first member now puts it (siblings keep their order, and each
    block its own). ``breaks``: the positions, before the move, whose member was not placed right after the one
    before it (where a member left; a member that arrived, and the one after it).

    Returns the positions to place from their facts (``_place``'s marks): those whose member does not stand right
    after the one it followed, and the breaks. Every other member is carried over with its ranks shifted
    (``_carry``): each run that kept its neighbours moved as one. C-level passes over the rows of the domain
    being moved and its parent, level by level."""
    rows, count = layout.rows, layout.census.training
    placed: list[Any] = rows.placed[:count]
    if None in placed:  # the member that arrived, not placed yet: its path stands for it
        held: list[Any] = [member.domains if member is not None else path[:-1] for member in placed]
        nodes: list[str] = [member.node if member is not None else path[-1] for member in placed]
    else:
        held, nodes = list(map(_DOMAINS, placed)), list(map(_NODE, placed))
    origin = list(range(count))  # where each row stood before
    columns: tuple[list[Any], ...] = (rows.live, rows.keys, rows.placed, origin, held, nodes)
    lo, hi = 0, count
    for depth, value in enumerate(path):  # the block of path[:depth + 1], among its siblings in [lo, hi)
        column = _values_at(held, nodes, depth, lo, hi)
        same = list(map(operator.eq, column, itertools.repeat(value)))
        size = same.count(True)
        if not size:
            break  # the member that left was that domain's only one
        start = lo + same.index(True)
        first = min(rows.keys[start:start + size])
        to = at = lo
        for other, group in itertools.groupby(column):  # siblings, ordered by their first members
            width = sum(1 for _ in group)
            if other != value and min(rows.keys[at:at + width]) < first:
                to += width
            at += width
        if to != start:
            for moving in columns:
                block = moving[start:start + size]
                del moving[start:start + size]
                moving[to:to] = block
        lo, hi = to, to + size
    shifted = list(itertools.compress(range(count), map(operator.ne, origin, range(count))))
    if shifted:  # the rows from the first that moved to the last
        assert rows.at is not None
        rows.at.update(zip(map(_LIVE_NAME, rows.live[shifted[0]:shifted[-1] + 1]), itertools.count(shifted[0])))
    # a row whose predecessor is not the one it had
    apart = itertools.compress(range(count), map(operator.ne, origin, [0, *map(operator.add, origin,
                                                                                  itertools.repeat(1))]))
    return sorted({*apart, *(origin.index(at) for at in breaks if at < count), *(at for at in breaks if at >= count)})
