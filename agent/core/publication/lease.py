"""Who publishes a large job's topology: a coordination.k8s.io/v1 Lease, used the way client-go's leaderelection
package uses it (tryAcquireOrRenew in tools/leaderelection/leaderelection.go).

- The holder renews ``spec.renewTime`` every few seconds; every write carries the resourceVersion it read, so
  two candidates never both win (the loser gets 409 Conflict).
- A candidate takes the Lease only when it is free (no holder) or when the record it observed has not changed
  for ``leaseDurationSeconds`` of the candidate's own clock. Like client-go, the remote timestamps are never
  compared with the local clock: pods' clocks may disagree.
- A holder that stops (SIGTERM) releases the Lease (holder emptied, duration 1 s), so a standby takes over within
  one retry period instead of one lease duration.

Pure: the caller passes the object it read and its own monotonic and wall times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

LEASE_SECONDS = 15  # client-go's defaults for kube-controller-manager: a 15 s lease, a 10 s renew deadline
HOLDER_UID = "topology-agent.io/holder-uid"  # annotation: the holder pod's uid (its name alone outlives it)


@dataclass(frozen=True)
class Timing:
    """How often the holder renews and the standbys look, from the lease duration (``--lease-seconds``)."""

    duration: int = LEASE_SECONDS

    @property
    def renew_deadline(self) -> float:  # a holder that could not renew for this long stops publishing
        return self.duration * 2 / 3

    @property
    def renew_every(self) -> float:
        return min(2.0, self.duration / 5)

    @property
    def retry_every(self) -> float:
        """Standbys look every second (two of them: 2 GETs/s for the whole job), so a crashed leader is replaced
        within the lease duration + 1 s of its last renewal."""
        return min(1.0, self.duration / 10)

    @property
    def ready_after(self) -> float:
        """A record unchanged for this part of its duration: a standby gets ready to take over (it lists the
        pods then, not at start), so that its LIST is done before the Lease can be taken: two thirds of the
        lease (10 s at the default 15) for two standbys' LISTs of every pod at once."""
        return 1 / 3


@dataclass(frozen=True)
class Record:
    holder: str
    duration: int
    transitions: int
    acquire_time: str
    renew_time: str
    resource_version: str
    owner_uid: str = ""  # the uid its ownerReference names: the job's incarnation that made it
    holder_uid: str = ""  # the holder pod's uid, as its holder wrote it ("": not said)

    @property
    def key(self) -> tuple[str, int, int, str, str]:
        """What must change for the holder to count as alive (the resourceVersion changes with it)."""
        return self.holder, self.duration, self.transitions, self.acquire_time, self.renew_time


def read_record(lease: dict[str, Any]) -> Record:
    """The election record of a Lease as the API returned it; odd values read as 'no holder', never as a crash."""
    raw_spec, raw_meta = lease.get("spec"), lease.get("metadata")
    spec: dict[str, Any] = raw_spec if isinstance(raw_spec, dict) else {}
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}

    def text(value: Any) -> str:
        return value if isinstance(value, str) else ""

    def whole(value: Any, default: int) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else default

    owners = meta.get("ownerReferences")
    owner = owners[0] if isinstance(owners, list) and owners and isinstance(owners[0], dict) else {}
    notes = meta.get("annotations")
    notes = notes if isinstance(notes, dict) else {}
    return Record(holder=text(spec.get("holderIdentity")), duration=whole(spec.get("leaseDurationSeconds"),
                                                                          LEASE_SECONDS),
                  transitions=whole(spec.get("leaseTransitions"), 0), acquire_time=text(spec.get("acquireTime")),
                  renew_time=text(spec.get("renewTime")), resource_version=text(meta.get("resourceVersion")),
                  owner_uid=text(owner.get("uid")), holder_uid=text(notes.get(HOLDER_UID)))


@dataclass
class Observation:
    """The last record a candidate saw and when (its own monotonic clock) it last changed."""

    record: Record | None = None
    changed_at: float = 0.0
    renewals: int = 0  # changes seen after the first sight (a holder seen renewing)

    def see(self, record: Record, now: float) -> None:
        if self.record is None or self.record.key != record.key:
            self.changed_at = now
            self.renewals += self.record is not None
        self.record = record


def lease_body(name: str, holder: str, *, now_wall: str, previous: Record | None,
               owner: dict[str, Any] | None, duration: int = LEASE_SECONDS, holder_uid: str = "") -> dict[str, Any]:
    """The Lease to create (previous None) or to write over ``previous`` (with its resourceVersion), held by pod
    ``holder`` (its uid ``holder_uid``, when known)."""
    if previous is not None and previous.holder == holder:
        acquire, transitions = previous.acquire_time or now_wall, previous.transitions
    else:
        acquire, transitions = now_wall, (previous.transitions + 1 if previous is not None else 0)
    body: dict[str, Any] = {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "topology-agent"}},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration, "acquireTime": acquire,
                 "renewTime": now_wall, "leaseTransitions": transitions},
    }
    if previous is not None:
        body["metadata"]["resourceVersion"] = previous.resource_version
    if holder_uid:
        body["metadata"]["annotations"] = {HOLDER_UID: holder_uid}
    if owner:
        body["metadata"]["ownerReferences"] = [{**owner, "controller": False}]
    return body


def release_body(name: str, previous: Record, *, now_wall: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    """What a holder writes when it stops: no holder, so a standby need not wait out the lease."""
    body = lease_body(name, "", now_wall=now_wall, previous=previous, owner=owner, duration=1)
    body["spec"]["leaseTransitions"] = previous.transitions
    return body


def may_take(observed: Observation, me: str, now: float) -> bool:
    """Whether ``me`` may write the Lease now: it holds it, nobody does, or the holder stopped renewing."""
    record = observed.record
    if record is None or not record.holder or record.holder == me:
        return True
    return now - observed.changed_at >= record.duration


def stands_down(observed: Observation, me: str, readied: int, timing: Timing, durations: int = 1) -> bool:
    """Whether a standby that got ready (listed every pod) when it saw ``readied`` renewals should go back to
    following the publication: a holder other than itself has renewed the Lease for ``durations`` whole
    durations since (a leader that was slow, not gone). Otherwise a standby readied once held every pod for the
    rest of its life. The caller doubles ``durations`` at each stand-down: a leader slow again and again costs
    a LIST of every pod each time, so the standby keeps them longer each time."""
    record = observed.record
    if record is None or not record.holder or record.holder == me:
        return False
    return observed.renewals - readied >= durations * math.ceil(record.duration / timing.renew_every)


def abandoned(observed: Observation, me: str, now: float, timing: Timing, rank: int = 0) -> bool:
    """Whether a standby should get ready to take over: nobody holds the Lease, or a holder seen renewing it has
    not for ``timing.ready_after`` of its duration (5 s at the default 15 s: two renewals missed). A record not
    seen to change yet is given twice as long: the leader's sidecar renews it first seconds after its init wrote
    it, while the standbys' sidecars start. The second standby (``rank`` 1) waits one whole duration more: it
    gets ready only when the first has not taken over, so that one LIST of every pod, not two at once, stands
    between a crash and the new publisher."""
    record = observed.record
    if record is None or record.holder == me:
        return False
    after = (timing.ready_after if observed.renewals else 2 * timing.ready_after) + rank
    return not record.holder or now - observed.changed_at >= record.duration * after
