"""Hot spares: a static world of ``--world-size`` N seats kept full from the job's extra training pods.

A job that runs more training pods than N keeps a world of N. Its training pods in rank order are laid on
*seats*: seat s is NODE_RANK s, and the pod born to it is the one whose index puts it s-th in the job's
rank order. The pods born past seat N-1 are the spares: they get ``TOPOLOGY_SPARE=1`` and no training
variables, and no host list names them. When a member leaves (lost.py's rule, or its pod terminating or
gone), its seat is empty and the first spare takes it: the empty seat's NODE_RANK and RANK, WORLD_SIZE still
N, every other member on its own seat. A static torchrun restarted with the new files forms the same world.

The rule is a function of the pods as they are now, so every sidecar, and an init that starts later, decides
the same from the same pods (none remembers what it saw before):

1. *Seats from indices.* The rank order of the live training pods, with the indices missing in it put back as
   empty places: for each role and index prefix, every last index from the role's first
   (``Controller.index_base``) to the highest present. So a member that leaves empties its own seat and moves
   nobody, whether its pod is still listed (marked lost, terminating) or already deleted. The places past N
   are the spares' (born spares).
2. *A pod that comes back stays out.* A training pod created after every born spare (``creationTimestamp``,
   the API server's clock, seconds) is a pod that came back after its seat was given away (its controller
   made it again with the same index): it does not take its seat back. It waits among the spares, after the
   born ones. At a job's start the pods past N are created last or in the same second (the controllers
   create pods in index order), so no pod is taken for one that came back. A pod whose lost mark is cleared
   (DisruptionTarget reset, its node Ready again) is the same object, created before the spares: it has its
   seat back, and the spare that held it waits again.
3. *Which spare.* Empty seats are filled in seat order, each by the waiting spare that shares the most
   outer topology domains (``--topology-levels``) with the seat's nearest member born to its seat (before it
   first): the spare then sits in the ring where its neighbours are. Ties, and a job without Node labels,
   take the spares in rank order. A seat's neighbours stay while the lost pod is listed, deleted and made
   again, so the choice does not change under it.
4. *Fewer than N.* With more empty seats than spares, the world is the members there are, in seat order, with
   NODE_RANK and RANK numbered again from 0: a static job with too few pods restarts smaller, as it would
   without spares, rather than waiting for a pod that may never be scheduled.

Pure: members in, members out; the planner (layout.py ``seat_spares``) gives it the keys and holes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from agent.core.model import Member, Takeover, Topology

Key = tuple[Any, ...]


class Seating(NamedTuple):
    """The world of N seats: its training members in seat order (NODE_RANK and RANK from their seats), the
    spares in the order they would be promoted, and who holds a seat born to another pod."""

    members: tuple[Member, ...]
    spares: tuple[Member, ...]
    takeovers: tuple[Takeover, ...]


def _shared(one: tuple[str, ...] | None, other: tuple[str, ...] | None) -> int:
    """How many outer domains two members share (0 where either's are unknown)."""
    if one is None or other is None:
        return 0
    count = 0
    for a, b in zip(one, other, strict=False):
        if a != b or not a:
            break
        count += 1
    return count


def seat(training: Sequence[Member], keys: Sequence[Key], created: Sequence[str], holes: Mapping[Key, str | None],
         world_size: int) -> Seating:
    """Seat ``training`` (the live training members in rank order, their sort keys and creation times) in a
    world of ``world_size``; ``holes``: the keys of the indices missing among them, each with the name of its
    pod where one is still listed. See the module's rules."""
    order: list[tuple[Key, int | None]] = sorted([*zip(keys, range(len(training)), strict=True),
                                                  *((key, None) for key in holes)], key=lambda pair: pair[0])
    born_spares = [at for _, at in order[world_size:] if at is not None]
    newest = max((created[at] for at in born_spares), default="")
    seats: list[int | None] = [None] * min(world_size, len(order))
    born: list[str | None] = [None] * len(seats)  # the pod born to each seat, where one can be named
    returned: list[int] = []
    for place in range(len(seats)):
        key, at = order[place]
        if at is None:
            born[place] = holes[key]
            continue
        born[place] = training[at].name
        if newest and created[at] > newest:
            returned.append(at)  # made again after its seat was given away: it waits with the spares
            continue
        seats[place] = at
    home = [at is not None for at in seats]
    waiting = [*born_spares, *returned]
    takeovers: dict[int, int] = {}
    for place in range(len(seats)):
        if seats[place] is not None or not waiting:
            continue
        near = _nearest_home(seats, home, place)
        domains = training[near].domains if near is not None else None
        best = max(range(len(waiting)), key=lambda k: (_shared(training[waiting[k]].domains, domains), -k))
        seats[place] = waiting.pop(best)
        takeovers[place] = seats[place]  # type: ignore[assignment]
    members: list[Member] = []
    node_rank = first_rank = 0
    taken: list[Takeover] = []
    for place, at in enumerate(seats):
        if at is None:
            continue  # fewer pods than seats: the world is the members there are
        member = training[at]._replace(node_rank=node_rank, first_rank=first_rank)
        if place in takeovers:
            taken.append(Takeover(member.name, node_rank, born[place]))
        members.append(member)
        node_rank += 1
        first_rank += member.slots
    spares = tuple(training[at]._replace(training=False, node_rank=None, first_rank=None) for at in waiting)
    return Seating(tuple(members), spares, tuple(taken))


def _nearest_home(seats: Sequence[int | None], home: Sequence[bool], place: int) -> int | None:
    """The member on the seat nearest ``place`` that holds the seat it was born to (the one before first)."""
    for distance in range(1, len(seats)):
        for at in (place - distance, place + distance):
            if 0 <= at < len(seats) and home[at]:
                return seats[at]
    return None


def spare_lines(topology: Topology) -> list[str]:
    """Who is a hot spare, and whose place each promoted spare took (``explain``, ``status``)."""
    if topology.world_size is None:
        return []
    lines = [f"pod '{m.name}' is a hot spare (--world-size {topology.world_size}): it waits to take the place "
             "of a member that leaves" for m in topology.spares]
    lines += [f"pod '{t.name}' holds node rank {t.node_rank} as a promoted spare"
              + (f", in place of pod '{t.replaced}'" if t.replaced else "") for t in topology.takeovers]
    if topology.nnodes < topology.world_size:
        lines.append(f"the world has {topology.nnodes} of the {topology.world_size} training pods --world-size asks "
                     "for and no spare is left: it runs with the members there are")
    return lines
