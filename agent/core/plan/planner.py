"""The incremental planner: ``build_plan`` (layout.py) for a caller that lives through many changes (the sidecar,
init's wait). ``Planner`` keeps the layout between changes and takes each change into it: a member whose key,
identity and place stand is updated in place; one that arrives or leaves moves the ranks of the members after it,
which layout.py's ``_carry`` shifts as runs rather than placing again. Anything a kept layout cannot take is laid
out from scratch. A property test holds every plan it makes to ``build_plan``'s over the same pods.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from agent.core.model import Excluded, Options, RawPod
from agent.core.plan.domain_order import order_without, reorder, topology_arrival
from agent.core.plan.facts import Memo, PodFacts, Sizes, facts_of
from agent.core.plan.layout import (
    Live,
    NodeLabels,
    Plan,
    Scope,
    _check_roles,
    _domain_reader,
    _FromScratch,
    _lay_out,
    _Layout,
    _place,
    _plan_of,
    _Rows,
    training_by_default,
)
from agent.core.plan.rank import SortKey
from agent.errors import InputError


@dataclass
class _Taken:
    """What ``Planner._take`` did to the rows: the first position whose members must be placed again, the
    positions updated in place, the live pods with new facts (updated in place, or arrived), the keys of the
    members that left (gone, or to arrive at another key)."""

    lowest: int
    in_place: list[int] = field(default_factory=list)
    renewed: list[str] = field(default_factory=list)
    removed: list[SortKey] = field(default_factory=list)
    left_at: int | None = None  # topology order: where the one member that left stood (its follower stands there)
    path: tuple[str, ...] | None = None  # topology order: the domains and node of a leave or join that moves domains
    breaks: list[int] = field(default_factory=list)  # after a reorder: the positions to place from their facts

    @property
    def moved(self) -> bool:
        return bool(self.removed) or len(self.renewed) > len(self.in_place)

    def marks(self, rows: _Rows) -> list[int]:
        """The positions from ``lowest`` on that ``_place`` places from their facts: each renewed pod's, and the
        one after each member that left, where the ranks before start to move by another amount. Between them,
        members are carried over (``_carry``)."""
        marks = set(map(rows.find, self.renewed))
        if rows.at is None:  # index order: each left member's place is where its key would stand
            marks.update(bisect.bisect_left(rows.keys, key) for key in self.removed)
        elif self.left_at is not None:
            marks.add(self.left_at)
        marks.update(self.breaks)
        return sorted(m for m in marks if self.lowest <= m < len(rows.live))


# --- the planner: a layout kept between changes ---------------------------------------------------------------

_UNKNOWN = object()
FOLLOW_SCRATCH = 16  # Planner.follow: a layout from scratch at most once per len(pods) / this many calls
# A change of more than len(pods) / BURST pods is laid out from scratch; a smaller one is carried over: the
# kubelet's Running writes came ~1000-1700 a journal entry while a 16384-pod job started, and init's wait follows
# ~80 IPs at a time, which kept the plan after the last IP one change away (5 ms, not 210 ms from scratch:
# bench/plan_follow_bench.py --burst 80).
BURST = 4


class Planner:
    """``build_plan`` for a caller that lives through many changes (the sidecar, init's wait): the layout is kept,
    and a change of k pods costs O(k log N) of Python plus list moves, not the O(N) pass over every pod (34 ms
    per change at 4096 pods). A pod that arrives or leaves moves the ranks of the members after it: those are
    carried over with their ranks shifted, in C-level passes (``_carry``), not placed again. Anything rarer
    (this pod itself, the roles present, Node labels, a topology-order move, any error) is planned from
    scratch, so the result is always ``build_plan``'s over the same pods (a property test checks that after
    every change). ``memo``: share the facts another reader of the same pods computed (init's gang tracker)."""

    def __init__(self, options: Options, self_name: str, *, checked: bool = False, memo: Memo | None = None) -> None:
        self.options = options
        self.self_name = self_name
        self.checked = checked  # every pod given has passed check_pod (the sidecar's intake checks each)
        self.memo = memo if memo is not None else Memo(options)
        self._layout: _Layout | None = None
        self._plan: Plan | None = None  # the plan of the layout as it is (None after follow)
        self._since_scratch: int | None = None  # follow(): calls since its last layout from scratch (None: none)
        self._addresses_kept = True  # the last change renewed no member's address (its plan keeps the templates)
        self.incremental = 0  # plans made from the previous layout (the rest were made from scratch)
        self.followed = 0  # follow() calls that carried the layout over (the rest dropped it or made one)
        self.reordered = 0  # incremental plans whose leave or join moved topology domains among their siblings

    def plan(self, pods: Mapping[str, RawPod], *, nodes: NodeLabels | None = None,
             touched: Iterable[str] | None = None) -> Plan:
        """The plan of ``pods`` (each compared with the last call's, by identity). ``touched``: the names that can
        have changed since the last call (a caller that follows the watch knows them), so that the pods are not
        all compared (16384 pods: ~2.5 ms); None: any."""
        layout = self._layout
        if layout is not None:
            try:
                step = self._advance(layout, pods, nodes, touched)
                plan = None if step is None or layout.unplaced else self._plan_after(layout, step)
            except InputError:
                plan = None
            if plan is not None:
                self._plan = plan
                self.incremental += 1
                return plan
        # Nothing may hold the old layout while the new one is made (this frame's name held it: both layouts at
        # once, 8.4 MB more at 16384 pods, bench/transients_bench.py; the publisher's kubelet writes come in bursts).
        self._layout = self._plan = layout = None
        layout = _lay_out(list(pods.values()), self.self_name, self.options, self.memo, nodes, self.checked)
        plan = _plan_of(layout, self.options)
        self._layout, self._plan = layout, plan
        return plan

    def follow(self, pods: Mapping[str, RawPod], touched: Iterable[str] | None = None) -> None:
        """Keep the layout current while the pods gather, so that the plan, once the gang is complete, is one
        change away (16384 pods: ~90 ms of planning from scratch after the last IP). No plan is made: a training
        pod still without its IP holds its rank without an address, and a refusal waits for ``plan``. Where
        the layout cannot be carried over, one is made from scratch at most once per ``len(pods) //
        FOLLOW_SCRATCH`` calls, so the wait costs O(1) per call, amortised, whatever the pods say. With Node
        labels (``--topology-levels``) the plan needs the Nodes, read after the wait: nothing is followed."""
        self._plan = None
        if self.options.levels is not None or self.options.rank_order == "topology":
            self._layout = None  # the changes are not carried over: the next plan is made from scratch
            return
        since = self._since_scratch
        if since is not None:
            self._since_scratch = since = since + 1
        layout = self._layout
        if layout is not None:
            try:
                if self._advance(layout, pods, None, touched) is not None:
                    self.followed += 1
                    return
            except InputError:
                pass
            self._layout = layout = None  # not held while the next one is made (``plan``)
        if since is not None and since * FOLLOW_SCRATCH < len(pods):
            return  # laid out from scratch too recently: the next layout waits (plan() makes one in any case)
        self._since_scratch = 0
        try:
            self._layout = _lay_out(list(pods.values()), self.self_name, self.options, self.memo, None,
                                    self.checked, provisional=True)
        except InputError:
            self._layout = None  # plan() says why, if it still holds once the gang is complete

    def _plan_after(self, layout: _Layout, step: str) -> Plan:
        last = self._plan
        if step == "same" and last is not None:
            return last
        plan = _plan_of(layout, self.options)
        if step != "in place" or last is None or self.options.world_size is not None:
            return plan
        # The members kept their roles, indices and process counts (in place: same key, identity and slots), so
        # the runs are the last plan's, and so are the addresses' templates while no member's address changed
        # (a pod's new IP, addressed by DNS name): no pass over every member (core/publication/summary.py).
        known = last.topology.__dict__
        kept = {name: known[name] for name in ("run_starts", "address_templates")
                if name in known and (name == "run_starts" or self._addresses_kept)}
        plan.topology.remember(**kept)
        return plan

    def _advance(self, layout: _Layout, pods: Mapping[str, RawPod], nodes: NodeLabels | None,
                 touched: Iterable[str] | None) -> str | None:
        """Carry the layout over to ``pods``: "same" (nothing changed), "in place" (no member arrived, left
        or moved) or "moved"; None when only planning from scratch can say (the layout is then unusable)."""
        before = layout.pods
        if layout.nodes is not None and (nodes is None or layout.nodes != nodes):
            if nodes is None or not _nodes_gained(layout, nodes):
                return None
            layout.nodes = dict(nodes)
        changed, gone = _changes(before, pods, touched)
        if not changed and not gone:
            return "same"
        if self.self_name in gone or len(changed) + len(gone) > max(64, len(before) // BURST):
            # this pod gone, or a burst of a quarter of the job: from scratch (one pass's cost). A smaller one is
            # carried over: the kubelet's Running writes while a 16384-pod job starts come ~1000-1700 an entry
            return None
        if self.self_name in changed and not self._renew_me(layout, pods[self.self_name]):
            return None
        domains_of = _domain_reader(self.options, nodes)
        try:
            taken = self._take(layout, pods, [*changed, *gone], domains_of)
        except _FromScratch:
            return None
        lowest, in_place = taken.lowest, taken.in_place
        found, role_count = layout.found, layout.census.role_count
        controller = found.controller
        if controller.roles_by_pod and self.options.roles is None and any(
                p is not None and controller.shows_training(p) for p in (*map(pods.get, changed),
                                                                         *map(before.get, gone))):
            return None  # a pod that says whether its role trains: its roles are decided again, from scratch
        _check_roles(found, role_count, self.options)
        if not found.explicit_roles and training_by_default((r for r, n in role_count.items() if n), self.options) \
                != set(found.training_roles):
            return None
        for name in changed:  # the layout's own copy, one entry per change (a copy of 16384 pods: 0.6 ms)
            before[name] = pods[name]
        for name in gone:
            del before[name]
        self._addresses_kept = True
        for at in in_place:
            if at < lowest:
                self._replace(layout, at, domains_of)
        if lowest < len(layout.rows.live):
            _place(layout, lowest, len(layout.rows.live), self.options, domains_of, marks=taken.marks(layout.rows))
        return "moved" if taken.moved else "in place"

    def _renew_me(self, layout: _Layout, me: RawPod) -> bool:
        """This pod changed and kept its scope, identity and membership (its phase, its IP, the kubelet's writes
        while it starts): the layout takes its new object as any other pod's. Anything else is planned from
        scratch, which says why (a pod that is no longer a member of its own job)."""
        found = layout.found
        if Scope.of(me, self.options) != found.scope:
            return False
        facts = facts_of(me, found.controller, self.options, found.scope.pairs, self.memo, checked=self.checked)
        if facts.reason or facts.ident != found.scope.me_id:
            return False
        layout.found = replace(found, me=me)
        return True

    def _take(self, layout: _Layout, pods: Mapping[str, RawPod], names: list[str],
              domains_of: Callable[[str], tuple[str, ...] | None]) -> _Taken:
        """Take the changes of ``names`` into the rows: a member whose key, identity and place stand is updated in
        place; any other leaves, and arrives again at its new key while it is live. ``_FromScratch`` when only a
        layout from scratch can say (a refused identity, two pods claiming one index; in the topology order a
        move, more than one leave or join, or a Node whose labels are not known). A leave or join that moves a
        domain among its siblings puts the training rows in order again (``_reorder``)."""
        rows = layout.rows
        positions = rows.at  # None: index order, where the keys are sorted
        arriving: list[tuple[Live, SortKey]] = []
        taken = _Taken(lowest=len(rows.live))
        scope, dropped, sort_key = layout.found.scope, layout.dropped, layout.rule.key
        sizes: Sizes = {}  # the changed pods' process counts, one per container shape (as a layout's pass has)
        for name in names:
            pod = pods.get(name)
            new: Live | None = None
            dropped.pop(name, None)
            if pod is not None:
                facts = facts_of(pod, scope.controller, self.options, scope.pairs, self.memo, checked=self.checked,
                                 sizes=sizes)
                if scope.holds(facts):
                    if facts.reason:
                        dropped[name] = Excluded(name=name, reason=facts.reason)  # no member: noted, with why
                    elif facts.ident is None:
                        raise _FromScratch  # planning from scratch says why
                    else:
                        new = Live(pod, facts.ident, facts)
            old_key = rows.key_of.get(name)
            if old_key is None:
                if new is not None:
                    arriving.append((new, sort_key(*new)))
                continue
            at = positions[name] if positions is not None else bisect.bisect_left(rows.keys, old_key)  # rows.find
            if new is not None:
                _, old_ident, old_facts = rows.live[at]
                if sort_key(*new) == old_key and new.ident == old_ident \
                        and self._same_place(layout, old_facts, new.facts):
                    rows.live[at] = new
                    taken.in_place.append(at)
                    taken.renewed.append(name)
                    continue
            if positions is not None:
                stands = order_without(layout, at) if new is None and taken.left_at is None else None
                if stands is None:
                    raise _FromScratch  # a move, a second leave, or an order only a layout from scratch can say
                if not stands:
                    member = rows.placed[at]  # placed, with its domains: order_without says so
                    assert member is not None and member.domains is not None
                    taken.path = (*member.domains, member.node)
                taken.left_at = at
            layout.leave(at, name)
            taken.removed.append(old_key)
            taken.lowest = min(taken.lowest, at)
            if new is not None:
                arriving.append((new, sort_key(*new)))
        self._arrive(layout, taken, arriving, domains_of)
        if taken.path is not None:
            self._reorder(layout, taken)
        return taken

    @staticmethod
    def _arrive(layout: _Layout, taken: _Taken, arriving: list[tuple[Live, SortKey]],
                domains_of: Callable[[str], tuple[str, ...] | None]) -> None:
        """The pods ``arriving`` into the rows: at their keys' places, or in topology order the one that arrives
        where its domains put it (``domain_order.topology_arrival``)."""
        for new, key in arriving:
            where = None
            if layout.rows.at is not None:
                if len(arriving) > 1 or taken.removed:
                    raise _FromScratch
                arrival = topology_arrival(layout, new, key, domains_of)
                if arrival is None:
                    raise _FromScratch  # a Node whose labels are not known
                where, taken.path = arrival
            taken.lowest = min(taken.lowest, layout.arrive(new, key, where))
            taken.renewed.append(new.facts.name)

    def _reorder(self, layout: _Layout, taken: _Taken) -> None:
        """The training rows in topology order again (domain_order.reorder) after the one leave or join of
        ``taken``: where each run of members that kept its neighbours starts is placed again, the rest carried."""
        assert taken.path is not None
        if taken.left_at is not None:
            breaks = [taken.left_at]
        else:
            arrived = layout.rows.find(taken.renewed[-1])
            breaks = [arrived, arrived + 1]
        taken.left_at, taken.breaks = None, reorder(layout, taken.path, breaks)
        taken.lowest = min(taken.lowest, *taken.breaks)
        self.reordered += 1

    def _same_place(self, layout: _Layout, old: PodFacts, new: PodFacts) -> bool:
        """Can the pod keep its member's position and ranks: same slots, still in or out of the host lists (a
        training pod is never left out: its new IP is its member's new address, in place)."""
        if old.slots != new.slots:
            return False
        if layout.rows.at is not None and old.node != new.node:
            return False  # topology order follows the nodes
        if self.options.address == "ip" and old.has_ip != new.has_ip:
            return new.ident is not None and new.ident.role in layout.rule.position
        return True

    def _replace(self, layout: _Layout, at: int, domains_of: Callable[[str], tuple[str, ...] | None]) -> None:
        """The member at ``at`` from its pod's new facts, with the ranks and ordinal it had."""
        old = layout.rows.placed[at]
        if old is None:
            return  # left out before and after
        _, ident, _ = layout.rows.live[at]
        seen = {old.role: old.ordinal if ident.ordinal < 0 else 0}
        counters = (old.node_rank or 0, old.first_rank or 0, seen)
        _place(layout, at, at + 1, self.options, domains_of, counters=counters)
        new = layout.rows.placed[at]
        if new is None or new.address != old.address:
            self._addresses_kept = False


_NODE_OF_LIVE = operator.attrgetter("facts.node")


def _nodes_gained(layout: _Layout, nodes: NodeLabels) -> bool:
    """Whether ``nodes`` only adds Nodes to the labels the layout was made with, none of them one a live pod it
    holds runs on: the layout stands, and a pod that arrives on one is placed by its labels (a worker that comes
    back on a new Node, whose labels the sidecar reads just before it plans). Any other change of the labels
    places every pod anew. C-level passes (a Python one over 16384 pods: ~25 ms)."""
    known = layout.nodes
    if known is None or not known.items() <= nodes.items():
        return False
    added = nodes.keys() - known.keys()
    return added.isdisjoint(map(_NODE_OF_LIVE, layout.rows.live))


def _changes(before: Mapping[str, RawPod], pods: Mapping[str, RawPod],
             touched: Iterable[str] | None) -> tuple[list[str], list[str]]:
    """The pods of ``pods`` that are new objects since ``before``, and the names gone from it; ``touched``: the
    only names that can have changed (None: any)."""
    if touched is None:
        changed = list(itertools.compress(pods.keys(), map(operator.is_not, map(before.get, pods.keys()),
                                                           pods.values())))  # C-level: no Python loop per pod
        missing = len(before) - len(pods) + sum(name not in before for name in changed)
        # the names gone, without a set of every name: a pass that stops at the last one (none, most often)
        return changed, list(itertools.islice(itertools.filterfalse(pods.__contains__, before), max(missing, 0)))
    changed, gone = [], []
    for name in dict.fromkeys(touched):
        pod = pods.get(name)
        if pod is None:
            if name in before:
                gone.append(name)
        elif before.get(name) is not pod:
            changed.append(name)
    return changed, gone
