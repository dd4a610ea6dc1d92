"""The knobs the tests turn and read: what the sandbox does wrong (``POST /sandbox/faults``) and what it counts
per client (``GET /sandbox/stats``), so a test can prove the agent's behaviour under each fault and its cost."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from agent.sandbox.calls import Answer, failure


@dataclass
class Faults:
    """What the sandbox does wrong, and for how many more requests (``count`` -1: until cleared)."""

    status: int | None = None
    count: int = 0
    retry_after: float | None = None
    delay: float = 0.0
    delay_count: int = 0
    path: str | None = None
    down_until: float = 0.0
    reset: bool = False  # close the connection without an answer (a cut stream)
    # Watches: "hang" (headers, then nothing), "empty" (200 and no event), "gone" (an ERROR 410 event at once)
    watch: str | None = None
    trickle: float = 0.0  # bytes per second of every answer's body (0: as fast as it goes)

    def applies(self, path: str) -> bool:
        return not self.path or self.path in path

    def take_status(self, path: str) -> int | None:
        if self.status is None or self.count == 0 or (self.path and self.path not in path):
            return None
        if self.count > 0:
            self.count -= 1
        return self.status

    def take_delay(self, path: str) -> float:
        if self.delay <= 0 or self.delay_count == 0 or (self.path and self.path not in path):
            return 0.0
        if self.delay_count > 0:
            self.delay_count -= 1
        return self.delay

    def apply(self, body: dict[str, Any]) -> None:
        """The knobs a ``POST /sandbox/faults`` body turns (its actions, such as dropWatches, are the server's)."""
        if "status" in body:
            self.status = int(body["status"])
            self.count = int(body.get("count", -1))
            self.retry_after = body.get("retryAfter")
            self.reset = bool(body.get("reset", False))
        if "delay" in body:
            self.delay = float(body["delay"])
            self.delay_count = int(body.get("delayCount", -1))
        if "path" in body:
            self.path = body["path"]
        if "watch" in body:
            self.watch = body["watch"]
        if "trickle" in body:
            self.trickle = float(body["trickle"])


@dataclass
class Stats:
    """What each client (by User-Agent) asked and was sent: ``requests`` (watches included), ``watches``,
    ``leases`` (the requests to Leases among them: a large job's publisher election), ``bytes`` (the answers'
    bodies and the watches' lines), ``headers`` (what the wire adds to them: the status line and headers, a
    watch's chunk framing) and ``sent`` (each request as it came: its request line, headers and body; in memory,
    its body). Over HTTPS the three byte counts add up to the HTTP bytes both ways."""

    requests: int = 0
    bytes: int = 0
    watches: int = 0
    by_agent: dict[str, dict[str, int]] = field(default_factory=dict)
    last_event: dict[str, float] = field(default_factory=dict)  # per agent: perf_counter() of its last watch line

    def count(self, agent: str, *, nbytes: int = 0, request: bool = False, watch: bool = False, sent: int = 0,
              headers: int = 0, lease: bool = False) -> None:
        entry = self.by_agent.setdefault(agent, {"requests": 0, "bytes": 0, "watches": 0, "sent": 0, "headers": 0,
                                                 "leases": 0})
        if request:
            self.requests += 1
            entry["requests"] += 1
            entry["leases"] += lease
        if watch:
            self.watches += 1
            entry["watches"] += 1
        self.bytes += nbytes
        entry["bytes"] += nbytes
        entry["sent"] += sent
        entry["headers"] += headers


@dataclass
class Knobs:
    """The current Faults and Stats: a test replaces each whole to clear or reset it, so whatever counts or
    fails (an open watch too) reads them here at the moment it acts, never a copy taken earlier."""

    faults: Faults = field(default_factory=Faults)
    stats: Stats = field(default_factory=Stats)


def fault_answer(faults: Faults, code: int, method: str) -> Answer:
    """The failure the fault asks for, worded as the API server words it (403 as RBAC refuses a pod)."""
    reasons = {403: "Forbidden", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
               504: "Timeout"}
    message = {
        403: f'pods is forbidden: User "system:serviceaccount:default:default" cannot {method.lower()} '
             'resource "pods" in API group "" in the namespace "default"',
    }.get(code, f"sandbox fault: {code}")
    answer = failure(code, reasons.get(code, "InternalError"), message)
    if faults.retry_after is None:
        return answer
    after = str(int(faults.retry_after) if faults.retry_after >= 1 else faults.retry_after)
    return Answer(answer.status, answer.body, {"Retry-After": after})


async def trickle(request: web.Request, response: web.Response, knobs: Knobs) -> web.StreamResponse:
    """The answer's body at ``faults.trickle`` bytes per second, one byte at a time; the rate is read at each
    byte, so a test that clears the faults cuts the answer rather than leave it trickling. Over HTTPS only: how
    a client bounds a trickling answer is its transport's to prove."""
    body = bytes(response.body)  # type: ignore[arg-type]
    stream = web.StreamResponse(status=response.status, headers={"Content-Type": response.content_type})
    stream.content_length = len(body)
    await stream.prepare(request)
    with contextlib.suppress(ConnectionResetError, asyncio.CancelledError):
        for at in range(len(body)):
            await stream.write(body[at:at + 1])
            await asyncio.sleep(1 / knobs.faults.trickle)
    return stream
