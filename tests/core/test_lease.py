"""The publisher election follows client-go's leaderelection rules (tryAcquireOrRenew): expiry is judged by when
the candidate itself last saw the record change, never by comparing the holder's timestamps with its own clock."""

from __future__ import annotations

from agent.core.publication.lease import (
    Observation,
    Timing,
    abandoned,
    lease_body,
    may_take,
    read_record,
    release_body,
    stands_down,
)


def lease(holder, renew="2026-11-22T00:00:00.000000Z", rv="7", duration=15, transitions=2):
    return {"metadata": {"resourceVersion": rv},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration, "renewTime": renew,
                     "acquireTime": "2026-11-21T00:00:00.000000Z", "leaseTransitions": transitions}}


def test_a_standby_waits_a_whole_lease_duration_after_the_last_change_it_saw():
    seen = Observation()
    seen.see(read_record(lease("leader")), now=100.0)
    assert not may_take(seen, "standby", 114.9)
    seen.see(read_record(lease("leader", renew="2026-11-22T00:00:02.000000Z", rv="8")), now=110.0)  # renewed
    assert not may_take(seen, "standby", 124.9)
    assert may_take(seen, "standby", 125.0)


def test_a_standby_gets_ready_a_third_into_the_lease_long_before_it_may_take_it():
    seen, timing = Observation(), Timing()
    assert not abandoned(seen, "standby", 100.0, timing)  # nothing read yet
    seen.see(read_record(lease("leader")), now=90.0)
    # as init wrote it: the leader's sidecar renews it once it has started, while the standbys start
    assert not abandoned(seen, "standby", 99.9, timing) and abandoned(seen, "standby", 100.0, timing)
    seen.see(read_record(lease("leader", renew="2026-11-22T00:00:01.000000Z", rv="8")), now=100.0)  # renewing
    assert not abandoned(seen, "standby", 104.9, timing)  # a renewal of every 2 s may be late: not yet
    assert abandoned(seen, "standby", 105.0, timing) and not may_take(seen, "standby", 105.0)
    seen.see(read_record(lease("leader", renew="2026-11-22T00:00:02.000000Z", rv="9")), now=108.0)  # renewed
    assert not abandoned(seen, "standby", 112.9, timing)
    assert not abandoned(seen, "leader", 200.0, timing)  # its own Lease is never abandoned to itself
    # the second standby gets ready only when the first has not taken over within the lease
    assert not abandoned(seen, "standby2", 127.9, timing, rank=1) and abandoned(seen, "standby2", 128.0, timing, 1)
    seen.see(read_record(lease("")), now=116.0)  # released on SIGTERM: ready at once
    assert abandoned(seen, "standby", 116.0, timing) and abandoned(seen, "standby2", 116.0, timing, 1)


def test_a_readied_standby_stands_down_once_the_holder_has_renewed_for_a_whole_duration():
    """A leader slow for a few seconds readied a standby (it listed every pod) that then held them for good: it
    stands down after the holder's renewals cover a whole duration (15 s / a renewal every 2 s: 8)."""
    seen, timing = Observation(), Timing()
    seen.see(read_record(lease("leader")), now=0.0)
    readied = seen.renewals
    for k in range(1, 9):
        assert not stands_down(seen, "standby", readied, timing)
        seen.see(read_record(lease("leader", renew=f"2026-11-22T00:00:{2 * k:02d}.000000Z", rv=str(7 + k))),
                 now=2.0 * k)
    assert stands_down(seen, "standby", readied, timing)
    assert not stands_down(seen, "standby", readied, timing, durations=2)  # readied before: twice as long
    assert not stands_down(seen, "leader", readied, timing)  # its own Lease
    seen.see(read_record(lease("")), now=30.0)  # released: nobody to follow
    assert not stands_down(seen, "standby", readied, timing)
    assert not stands_down(Observation(), "standby", 0, timing)  # nothing read


def test_a_renew_time_from_a_skewed_clock_does_not_count_as_expired():
    seen = Observation()
    seen.see(read_record(lease("leader", renew="1999-01-01T00:00:00.000000Z")), now=100.0)
    assert not may_take(seen, "standby", 101.0)  # an old-looking timestamp, but it just changed


def test_free_or_own_leases_may_be_written_at_once_and_odd_fields_read_as_free():
    seen = Observation()
    assert may_take(seen, "me", 0.0)  # none seen
    seen.see(read_record(lease("")), now=5.0)
    assert may_take(seen, "me", 5.0)  # released
    seen.see(read_record(lease("me")), now=6.0)
    assert may_take(seen, "me", 6.0)
    odd = read_record({"spec": {"holderIdentity": 7, "leaseDurationSeconds": "x", "leaseTransitions": True},
                       "metadata": None})
    assert odd.holder == "" and odd.duration == 15 and odd.transitions == 0


def test_writes_carry_the_version_read_and_count_transitions_like_client_go():
    record = read_record(lease("old"))
    taken = lease_body("demo-topology", "new", now_wall="T1", previous=record, owner=None)
    assert taken["metadata"]["resourceVersion"] == "7"  # a second writer of the same version gets 409
    assert taken["spec"] == {"holderIdentity": "new", "leaseDurationSeconds": 15, "acquireTime": "T1",
                             "renewTime": "T1", "leaseTransitions": 3}
    renewed = lease_body("demo-topology", "old", now_wall="T2", previous=record, owner=None)
    assert renewed["spec"]["acquireTime"] == "2026-11-21T00:00:00.000000Z"
    assert renewed["spec"]["leaseTransitions"] == 2
    released = release_body("demo-topology", record, now_wall="T3", owner=None)
    assert released["spec"]["holderIdentity"] == "" and released["spec"]["leaseDurationSeconds"] == 1
    assert released["spec"]["leaseTransitions"] == 2


def test_timing_follows_the_lease_duration():
    assert (Timing().renew_deadline, Timing().renew_every, Timing().retry_every) == (10.0, 2.0, 1.0)
    short = Timing(3)
    assert short.renew_every < short.renew_deadline < short.duration and short.retry_every <= 0.3
