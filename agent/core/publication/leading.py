"""Who leads a large job's publication: the one place that says it. Pure: the callers (init's
runtime/publication/leading.py, the sidecar's election.py) pass what they read and their own clock.

- The first training pod whose init runs leads. It creates the publisher Lease (``<job>-topology``, lease.py): the
  API server's create is atomic, so of inits that race one gets 201 and leads and the others get 409 and follow.
  Every other training pod's init reads the Lease once and follows, unless it may have it now (``claim``): it is
  held under this pod's name (its init ran before, or its pod was re-created), held by nobody (released), left by
  an earlier incarnation of the job (its owner reference names another uid), or held by no live pod of this job
  (the holder pod is gone, has another uid than the Lease says, or is not a member: provenance.WriterCheck, read
  once, and the publication that pod writes is then read with no second look at it). Then it writes over it with
  the resourceVersion it read (one init wins) and leads. Whoever leads lists and watches the pods through the gang
  wait and publishes: the leader's pod is as likely to start last as any, and a leader that starts last made the
  whole job wait for its LIST of every pod after the last IP.
- The leading init renews the Lease while it waits for the gang; its sidecar renews it after (election.py).
- A few followers guard the leader while their inits wait (``is_guard``): the pods of each training role's first
  ``GUARDS`` indices, and rank 0's pod. Each looks at the Lease every few seconds and takes it over when it has
  not changed for its whole duration on the guard's own clock (client-go's rule, ``lease.may_take``), or when it
  may have it at once; then it leads instead. The other followers never look again: 16384 pods looking every few
  seconds would be ~1000 GETs/s for the API server, a watch of the Lease each a renewal's event to every pod. A
  guard is a member the gang needs, so no job waits for ever on a dead init: a guard not running yet will be.
- A publication left by a member's earlier incarnation (its pod re-created under its name, with another uid) may be
  written over only by that pod (the admission policy binds the writer's name to its token): that pod leads
  whatever the Lease says (``must_publish_again``), and a leader that finds the copy hands it the Lease.
- Without RBAC for Leases, the pod of rank 0 leads, as the job's objects say (``rank_zero_identity``), without
  failover.
- The publisher names as its standbys the first ``STANDBYS`` training members by node rank other than itself
  (``standbys``), wherever it is placed itself.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Sequence

from agent.core.controllers import Controller, Objects
from agent.core.model import Identity
from agent.core.plan.gang import Expectation
from agent.core.plan.rank import rank_zero
from agent.core.publication.journal import STANDBYS
from agent.core.publication.lease import Observation, Record, may_take

GUARDS = 3  # per training role: the pods of its first indices guard the leading init while their inits wait


class Claim(enum.Enum):
    """What an init does with the Lease it read (None: there is none)."""

    CREATE = "create"  # no Lease: create it; a 409 means another init leads
    TAKE = "take"  # write over it with its resourceVersion; a 409 means another init took it first
    FOLLOW = "follow"  # another pod of this incarnation holds it: wait for its publication


def claim(record: Record | None, *, me: str, owner_uid: str, holder_live: bool = True) -> Claim:
    """An init's first look at the Lease (``owner_uid``: the uid of this pod's controller, "" if none;
    ``holder_live``: its holder is a live pod of this job, as far as the caller could tell)."""
    if record is None:
        return Claim.CREATE
    if not record.holder or record.holder == me or is_leftover(record, owner_uid) or not holder_live:
        return Claim.TAKE
    return Claim.FOLLOW


def judges_holder(record: Record | None, *, me: str, owner_uid: str) -> bool:
    """Whether the holder pod must be read before ``claim`` can say: only when the Lease would be followed."""
    return record is not None and claim(record, me=me, owner_uid=owner_uid) is Claim.FOLLOW


def is_leftover(record: Record, owner_uid: str) -> bool:
    """A Lease made for another incarnation of the job (deleted and made again under its name): its owner is not
    this pod's. Its holder's renewals, if any, are no sign of a leader of this job."""
    return bool(record.owner_uid and owner_uid and record.owner_uid != owner_uid)


def takes_over(observed: Observation, *, me: str, owner_uid: str, now: float, holder_live: bool = True) -> bool:
    """Whether a guard writes over the Lease it has been looking at: it may have it at once (``claim``), or the
    holder has not renewed it for its whole duration of the guard's clock."""
    record = observed.record
    return record is not None and (claim(record, me=me, owner_uid=owner_uid, holder_live=holder_live) is
                                   Claim.TAKE or may_take(observed, me, now))


def is_guard(me: Identity, rank_zero_pod: tuple[str, tuple[int, ...]] | None) -> bool:
    """Whether this training pod's init guards the leading init while it waits (the module's docstring)."""
    return (me.role, me.index) == rank_zero_pod or all(0 <= i < GUARDS for i in me.index)


def must_publish_again(me: str, superseded: Iterable[str]) -> bool:
    """A copy this pod's earlier incarnation wrote (``superseded``: the names of writers re-created since, as the
    readers' check found them): no other pod may write over it, so this pod publishes again."""
    return me in superseded


def standbys(training: Iterable[str], publisher: str) -> tuple[str, ...]:
    """The publisher's standbys: the first training members by node rank (``training``, in rank order) that are
    not the publisher."""
    return tuple(itertools.islice((name for name in training if name != publisher), STANDBYS))


def rank_zero_identity(controller: Controller, expected: Expectation, objects: Objects,
                       training_roles: Sequence[str] | None) -> tuple[str, tuple[int, ...]] | None:
    """(role, index) of the pod that will be node rank 0, by the rank order's own rule (``topology.rank_zero``)
    over the owner's replica counts; None if unknown. A role that waits for others to be Ready (JobSet dependsOn)
    is passed over: the others would wait for it."""
    if not expected.per_role:
        return None
    return rank_zero(controller, expected.per_role, objects, training_roles)


def is_rank_zero(me: Identity, rank_zero_pod: tuple[str, tuple[int, ...]] | None) -> bool:
    return rank_zero_pod is not None and (me.role, me.index) == rank_zero_pod
