"""Retries against a deadline: the whole budget is used, with one last attempt at the deadline."""

from __future__ import annotations

import itertools

import pytest

from agent.errors import ApiUnavailable
from agent.k8s.retrying import Backoff, DeadlineExceeded, with_retries


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


def _failing(times: FakeTime, attempts: list[float], *, succeed_at: float | None = None):
    def call() -> str:
        attempts.append(times.now)
        if succeed_at is not None and times.now >= succeed_at:
            return "ok"
        raise ApiUnavailable("connection refused")
    return call


def test_the_last_attempt_is_made_at_the_deadline_not_one_backoff_early():
    times, attempts = FakeTime(), []
    with pytest.raises(DeadlineExceeded):
        with_retries(_failing(times, attempts), what="get", deadline=10.0, backoff=Backoff(jitter=0),
                     sleep=times.sleep, clock=times.clock)
    # 0, 0.8, 2.4, 5.6 by the backoff; the next wait (6.4 s) would pass 10 s, so it is cut to end at 10 s.
    assert attempts == pytest.approx([0.0, 0.8, 2.4, 5.6, 10.0])


def test_a_server_back_just_before_the_deadline_is_still_reached():
    times, attempts = FakeTime(), []
    result = with_retries(_failing(times, attempts, succeed_at=9.0), what="get", deadline=10.0,
                          backoff=Backoff(jitter=0), sleep=times.sleep, clock=times.clock)
    assert result == "ok" and attempts[-1] == pytest.approx(10.0)


def test_without_a_deadline_retries_go_on_until_success():
    times, attempts = FakeTime(), []
    assert with_retries(_failing(times, attempts, succeed_at=100.0), what="get", backoff=Backoff(jitter=0),
                        sleep=times.sleep, clock=times.clock) == "ok"
    assert len(attempts) > 5


def test_retry_after_zero_cannot_make_a_request_storm():
    # Retry-After: 0 keeps the backoff (without it one sidecar can send 15,000 requests in 10 s).
    times, attempts = FakeTime(), []

    def call() -> str:
        attempts.append(times.now)
        if times.now >= 10.0:
            return "ok"
        raise ApiUnavailable("429", retry_after=0.0)

    with_retries(call, what="get", backoff=Backoff(), sleep=times.sleep, clock=times.clock)
    assert len(attempts) <= 14  # at least 0.8 s apart
    assert min(b - a for a, b in itertools.pairwise(attempts)) >= 0.8
