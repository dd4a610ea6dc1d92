"""Reading the job's objects (the owner, and what it leads to) for init and the sidecar: the steps are the core's
``job_reads``; this module only makes the GETs. The owner is required (it says how many pods to wait for); an
object it leads to that cannot be read (no RBAC for TrainJobs or runtimes) is logged in one line and the
controller's defaults stand."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agent.core.gang import JobReads, JobView, job_reads
from agent.core.model import Options, RawPod
from agent.errors import ApiForbidden, ApiNotFound

log = logging.getLogger("topology_agent.job")
Get = Callable[[str], Mapping[str, Any]]
AsyncGet = Callable[[str], Awaitable[Mapping[str, Any]]]


def _unreadable(path: str, err: Exception, first: bool) -> None:
    if first:
        raise err
    log.warning("cannot read %s (%s); the controller's defaults stand (grant get on it: docs/controllers.md)",
                path, err)


def _step(reads: JobReads, obj: Mapping[str, Any] | None, *, start: bool = False) -> tuple[str | None, JobView | None]:
    """The next path to read, or the finished view."""
    try:
        return (next(reads) if start else reads.send(obj)), None
    except StopIteration as done:
        return None, done.value


def read_job(get: Get, me: RawPod, options: Options) -> JobView:
    """``get`` raises ``ApiNotFound``/``ApiForbidden`` for the owner itself (the caller explains those)."""
    reads = job_reads(me, options)
    path, view = _step(reads, None, start=True)
    first = True
    while path is not None:
        obj: Mapping[str, Any] | None
        try:
            obj = get(path)
        except (ApiNotFound, ApiForbidden) as err:
            _unreadable(path, err, first)
            obj = None
        first = False
        path, view = _step(reads, obj)
    assert view is not None
    return view


async def read_job_async(get: AsyncGet, me: RawPod, options: Options) -> JobView:
    reads = job_reads(me, options)
    path, view = _step(reads, None, start=True)
    first = True
    while path is not None:
        obj: Mapping[str, Any] | None
        try:
            obj = await get(path)
        except (ApiNotFound, ApiForbidden) as err:
            _unreadable(path, err, first)
            obj = None
        first = False
        path, view = _step(reads, obj)
    assert view is not None
    return view
