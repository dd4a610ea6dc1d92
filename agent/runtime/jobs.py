"""Reading the job's objects (the owner, and what it leads to) for init and the sidecar: the steps are the core's
``job_reads``; this module only makes the GETs. The owner is required (it says how many pods to wait for); an
object it leads to that cannot be read (no RBAC for TrainJobs or runtimes) is logged in one line and the
controller's defaults stand."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agent.core.gang import JobView, job_reads
from agent.core.model import Options, RawPod
from agent.errors import ApiForbidden, ApiNotFound

log = logging.getLogger("topology_agent.job")
Get = Callable[[str], Mapping[str, Any]]
AsyncGet = Callable[[str], Awaitable[Mapping[str, Any]]]


class _Reading:
    """One pass of ``job_reads``: the path to read next, then the view. The sync and async drivers only GET."""

    def __init__(self, me: RawPod, options: Options) -> None:
        self._reads = job_reads(me, options)
        self._first = True
        self.view: JobView | None = None
        self.path: str | None = self._step(lambda: next(self._reads))

    def _step(self, advance: Callable[[], str]) -> str | None:
        try:
            return advance()
        except StopIteration as done:
            self.view = done.value
            return None

    def answer(self, obj: Mapping[str, Any] | None) -> None:
        self._first = False
        self.path = self._step(lambda: self._reads.send(obj))

    def unreadable(self, err: ApiNotFound | ApiForbidden) -> None:
        """The owner itself must be read (the caller explains why it cannot); anything it leads to may not be."""
        if self._first:
            raise err
        log.warning("cannot read %s (%s); the controller's defaults stand (grant get on it: docs/controllers.md)",
                    self.path, err)
        self.answer(None)

    def result(self) -> JobView:
        assert self.view is not None
        return self.view


def read_job(get: Get, me: RawPod, options: Options) -> JobView:
    """``get`` raises ``ApiNotFound``/``ApiForbidden`` for the owner itself (the caller explains those)."""
    reading = _Reading(me, options)
    while reading.path is not None:
        try:
            obj = get(reading.path)
        except (ApiNotFound, ApiForbidden) as err:
            reading.unreadable(err)
            continue
        reading.answer(obj)
    return reading.result()


async def read_job_async(get: AsyncGet, me: RawPod, options: Options) -> JobView:
    reading = _Reading(me, options)
    while reading.path is not None:
        try:
            obj = await get(reading.path)
        except (ApiNotFound, ApiForbidden) as err:
            reading.unreadable(err)
            continue
        reading.answer(obj)
    return reading.result()
