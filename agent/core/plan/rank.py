"""The rank order, in one place: the sort key every pod gets (``RankRule``), the pod that will be rank 0 from the
job's objects alone (``rank_zero``), the numbers inside a run of the order (``ranks_in_run``) and the order by
topology domains (``topology_order``). The planner (layout.py, planner.py) sorts by the key and gives NODE_RANK and RANK
along it; the publication's summary and leader read ``ranks_in_run`` and ``rank_zero``. Another rule is a change
here: tests/core/test_rank_rule.py swaps one in and holds the planner and the summary to it.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.core.controllers import Controller, Objects
from agent.core.model import Identity, RawPod
from agent.core.plan.facts import PodFacts
from agent.core.pods.pod import host_name

SortKey = tuple[int, int, str, tuple[int, ...], str]


# An address no pod has, after every one: where a training pod without its IP yet waits under the c10d order
# (Planner.follow's provisional layouts; a plan places no such pod)
NO_ADDRESS = "\U0010ffff"


@dataclass(frozen=True)
class RankRule:
    """The rank order as one sort key: JobSet's coordinator first, then the training roles in their order, then
    the controller's index (without explicit roles, JobSet's global index alone orders every replicated job); the
    pods that do not train after them by role and index. The name only breaks ties no controller makes.

    ``by_address`` (torchrun's c10d rendezvous, ``c10d_rendezvous``): the training pods in the order of their
    addresses as strings, whatever their roles and indices, for c10d numbers its nodes so
    (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py, torch 2.13: ``_mark_rendezvous_complete`` ranks
    ``sorted(state.participants)``, each a ``_NodeDesc(addr, pid, local_id)`` whose ``addr`` is torchrun's
    ``--local-addr``, which is the agent's ``PET_LOCAL_ADDR``, the member's address). Pods that share an address
    are told apart by torchrun's process id, which no pod can know: among them index order stands in
    (``variables.c10d_warnings`` says so)."""

    position: dict[str, int]  # training role -> its place in the rank order
    explicit: bool  # the training roles are the user's or the controller's (else every role present trains)
    coordinator: str | None  # the host name of the pod JobSet names rank 0
    by_address: bool = False  # c10d's order: training pods by address

    def key(self, pod: RawPod, ident: Identity, facts: PodFacts) -> SortKey:
        """The pod's place in the rank order (once per pod per layout)."""
        address = None
        if self.by_address:
            address = facts.place.address if facts.place is not None else NO_ADDRESS
        first = self.coordinator is not None and host_name(pod) == self.coordinator
        return self._key(ident.role, ident.index, first=first, address=address, name=facts.name)

    def key_of(self, role: str, index: tuple[int, ...], *, first: bool = False) -> SortKey:
        """``key`` of a pod known by its role and index alone (``first``: the coordinator), for ``rank_zero``. No
        address: an elastic job's rank 0 (the c10d order) is never asked of the job's objects (its expectation
        counts no replicas per role: gang.py)."""
        return self._key(role, index, first=first, address=None, name="")

    def _key(self, role: str, index: tuple[int, ...], *, first: bool, address: str | None, name: str) -> SortKey:
        """The one statement of the order: the training roles before the others (by role, then index), and among
        the training pods the coordinator, then the role's position (when the roles are explicit), then the
        index; or, under c10d (``address`` given), the address, then the index. The name breaks ties."""
        at = self.position.get(role)
        if at is None:
            return (2, len(self.position), role, index, name)
        if address is not None:
            return (1, 0, address, index, name)
        return (0 if first else 1, at if self.explicit else 0, "", index, name)

    @property
    def roles_are_blocks(self) -> bool:
        """Whether each training role's pods lie in one block of the order (``role_block``): the roles are
        explicit, no coordinator moves a pod ahead and no address orders them."""
        return self.explicit and self.coordinator is None and not self.by_address

    @staticmethod
    def untrained_role(key: SortKey) -> str:
        """The role in the key of a pod that does not train (``_key``: such pods are ordered by role)."""
        return key[2]

    def role_block(self, role: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """The keys between which ``role``'s pods lie, when roles are explicit, no coordinator moves a pod ahead and
        no address orders them: each role is then one block of the rank order."""
        block = self.position.get(role)
        if block is not None:
            return (1, block), (1, block + 1)
        return (2, len(self.position), role), (2, len(self.position), role + "\0")


def rank_zero(controller: Controller, counts: Mapping[str, int], objects: Objects,
              training_roles: Sequence[str] | None) -> tuple[str, tuple[int, ...]] | None:
    """(role, index) of the pod the rank order will put first, from the job's objects alone (``counts``: pods
    per training role, as the job asks for them), before any pod is seen; None when they cannot say.

    The same key as the plan's, over each training role's first pod (``Controller.first_index``) and the pod
    the job names first (``Controller.named_first``: JobSet's coordinator). A role the controller creates only
    once others are Ready (``waits_for``: JobSet dependsOn) has no pod yet when the others' gang is complete: it
    is passed over, as the plan of those pods passes it."""
    waits = controller.waits_for(objects)
    roles = tuple(training_roles) if training_roles is not None else tuple(counts)
    rule = RankRule({role: at for at, role in enumerate(roles)}, training_roles is not None, None)
    there = [role for role in roles if counts.get(role, 0) > 0 and role not in waits]
    candidates: list[tuple[SortKey, str, tuple[int, ...]]] = []
    for role in there:
        index = controller.first_index(role, objects)
        if index is None:
            return None
        candidates.append((rule.key_of(role, index), role, index))
    named = controller.named_first(objects)
    if named is not None and named[0] in there:
        candidates.append((rule.key_of(*named, first=True), *named))
    if not candidates:
        return None
    _, role, index = min(candidates)
    return role, index


def ranks_in_run(*, node_rank: int, first_rank: int, slots: int, seen: int, offset: int,
                 ordinal: int = -1) -> tuple[int, int, int]:
    """(NODE_RANK, RANK, ordinal) of the training member ``offset`` places after the first of a run, from the
    first's node rank and rank, the run's process count and the role's members before the run (``seen``).

    A run is consecutive training members of one role, index prefix and process count, with consecutive last
    indices (``Topology.run_starts``). ``_place`` gives each the next node rank, the rank after the previous
    member's processes, and the controller's ordinal, else its place in the role: so a pod that reads only a run
    (``--view own``, summary.py) gets the numbers the whole plan gives it."""
    return node_rank + offset, first_rank + offset * slots, ordinal if ordinal >= 0 else seen + offset


def topology_order(paths: Sequence[tuple[str, ...]]) -> list[int]:
    """A permutation of ``paths`` (each training member's domains outermost first, then its node), given in index
    order: the rank order under ``--rank-order topology``.

    Members sharing a domain become contiguous at every level, and domains keep the order of their first member
    in index order, so the first member (rank 0) stays first and a new member of an existing domain moves only
    the members after that domain's block. Ties keep index order. O(members x levels).

    A level on which every member agrees (a label none of the Nodes has: most of the default levels) sets no member
    apart from the level above it, so it is left out: the order is the same, in a fraction of the passes."""
    if not paths:
        return []
    varying = [d for d in range(len(paths[0])) if len(set(map(operator.itemgetter(d), paths))) > 1]
    if not varying:
        return list(range(len(paths)))
    told: list[tuple[str, ...]] = list(map(operator.itemgetter(*varying), paths)) if len(varying) > 1 else \
        [(value,) for value in map(operator.itemgetter(varying[0]), paths)]
    first: dict[tuple[str, ...], int] = {}
    keys: list[tuple[int, ...]] = []
    for position, path in enumerate(told):
        key = []
        for depth in range(1, len(path) + 1):
            key.append(first.setdefault(path[:depth], position))
        key.append(position)
        keys.append(tuple(key))
    return sorted(range(len(paths)), key=keys.__getitem__)
