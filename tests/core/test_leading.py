"""Who leads a large job's publication (core/publication/leading.py): an init's first look at the Lease, a guard's later
looks, which pods guard, the publisher's standbys. The runtime's races over the API: tests/runtime/test_leading.py."""

from __future__ import annotations

import pytest

from agent.core.model import Identity
from agent.core.publication.leading import (
    Claim,
    claim,
    is_guard,
    is_leftover,
    must_publish_again,
    standbys,
    takes_over,
)
from agent.core.publication.lease import Observation, read_record

JOB_UID = "uid-of-this-job"


def lease(holder, *, owner=JOB_UID, rv="7", renew="2026-11-22T00:00:00.000000Z", duration=15):
    meta = {"resourceVersion": rv}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "demo",
                                    "uid": owner}]
    return {"metadata": meta, "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration,
                                       "renewTime": renew, "acquireTime": renew, "leaseTransitions": 0}}


FIRST_LOOKS = [
    ("no Lease: create it", None, "demo-worker-3", JOB_UID, Claim.CREATE),
    ("another pod of this job holds it", lease("demo-worker-1"), "demo-worker-3", JOB_UID, Claim.FOLLOW),
    ("held under this pod's name: its init ran before, or its pod was re-created", lease("demo-worker-3"),
     "demo-worker-3", JOB_UID, Claim.TAKE),
    ("released by its holder", lease(""), "demo-worker-3", JOB_UID, Claim.TAKE),
    ("made for an earlier incarnation of the job", lease("demo-worker-1", owner="uid-of-the-job-before"),
     "demo-worker-3", JOB_UID, Claim.TAKE),
    ("a Lease with no owner is judged by its holder alone", lease("demo-worker-1", owner=None), "demo-worker-3",
     JOB_UID, Claim.FOLLOW),
    ("a pod with no controller cannot tell an incarnation", lease("demo-worker-1", owner="another-uid"),
     "demo-worker-3", "", Claim.FOLLOW),
]


@pytest.mark.parametrize(("lease_", "me", "owner_uid", "expected"), [case[1:] for case in FIRST_LOOKS],
                         ids=[case[0] for case in FIRST_LOOKS])
def test_an_inits_first_look_at_the_lease(lease_, me, owner_uid, expected):
    record = read_record(lease_) if lease_ is not None else None
    assert claim(record, me=me, owner_uid=owner_uid) is expected


def test_a_lease_of_an_earlier_incarnation_is_told_by_its_owners_uid():
    assert is_leftover(read_record(lease("x", owner="old")), JOB_UID)
    assert not is_leftover(read_record(lease("x")), JOB_UID)
    assert not is_leftover(read_record(lease("x", owner=None)), JOB_UID)


def test_a_guard_takes_over_only_a_lease_unrenewed_for_its_whole_duration_on_its_own_clock():
    seen = Observation()
    seen.see(read_record(lease("demo-worker-3")), now=100.0)
    assert not takes_over(seen, me="demo-worker-0", owner_uid=JOB_UID, now=114.9)
    seen.see(read_record(lease("demo-worker-3", rv="8", renew="2026-11-22T00:00:02.000000Z")), now=110.0)  # renewed
    assert not takes_over(seen, me="demo-worker-0", owner_uid=JOB_UID, now=124.9)
    assert takes_over(seen, me="demo-worker-0", owner_uid=JOB_UID, now=125.0)
    # the holder's timestamps are never compared with the guard's clock: a renewTime long past is no verdict
    fresh = Observation()
    fresh.see(read_record(lease("demo-worker-3", renew="2000-01-01T00:00:00.000000Z")), now=500.0)
    assert not takes_over(fresh, me="demo-worker-0", owner_uid=JOB_UID, now=500.0)


@pytest.mark.parametrize("holder", ["", "demo-worker-0"], ids=["released", "handed to this pod"])
def test_a_guard_takes_at_once_a_lease_it_may_have(holder):
    seen = Observation()
    seen.see(read_record(lease(holder)), now=100.0)
    assert takes_over(seen, me="demo-worker-0", owner_uid=JOB_UID, now=100.0)


def test_a_guard_takes_at_once_a_lease_made_for_an_earlier_incarnation():
    seen = Observation()
    seen.see(read_record(lease("demo-worker-3", owner="old")), now=100.0)
    assert takes_over(seen, me="demo-worker-0", owner_uid=JOB_UID, now=100.0)


GUARDS = [
    ("rank 0 by the job's objects", Identity("demo", "master", (0,), 0), ("master", (0,)), True),
    ("a role's first indices", Identity("demo", "worker", (2,), 2), ("master", (0,)), True),
    ("past them", Identity("demo", "worker", (3,), 3), ("master", (0,)), False),
    ("a JobSet pod: every part of its index among the first", Identity("js", "workers", (1, 2), -1),
     ("driver", (0, 0)), True),
    ("a JobSet pod past them in one part", Identity("js", "workers", (3, 0), -1), ("driver", (0, 0)), False),
    ("rank 0 whatever its index (a coordinator)", Identity("js", "workers", (5, 7), -1), ("workers", (5, 7)),
     True),
]


@pytest.mark.parametrize(("me", "zero", "expected"), [case[1:] for case in GUARDS], ids=[c[0] for c in GUARDS])
def test_which_pods_guard_the_leading_init(me, zero, expected):
    assert is_guard(me, zero) is expected


def test_the_publisher_names_the_first_training_members_other_than_itself_its_standbys():
    ranks = ["demo-master-0", "demo-worker-0", "demo-worker-1", "demo-worker-2"]
    assert standbys(ranks, "demo-master-0") == ("demo-worker-0", "demo-worker-1")  # rank 0 publishes
    assert standbys(ranks, "demo-worker-2") == ("demo-master-0", "demo-worker-0")  # another pod does
    assert standbys(ranks, "demo-worker-0") == ("demo-master-0", "demo-worker-1")
    assert standbys(ranks[:2], "demo-master-0") == ("demo-worker-0",)

    def endless():  # the training members of a large job are read as far as needed, not copied
        yield from ranks
        raise AssertionError("read past the standbys")

    assert standbys(endless(), "demo-master-0") == ("demo-worker-0", "demo-worker-1")


def test_a_pod_publishes_again_only_a_copy_its_own_earlier_incarnation_wrote():
    assert must_publish_again("demo-worker-2", ["demo-worker-2"])
    assert not must_publish_again("demo-worker-2", ["demo-master-0"])
    assert not must_publish_again("demo-worker-2", [])
