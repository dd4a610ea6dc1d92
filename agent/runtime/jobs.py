"""Reading the job's objects (the owner, and what it leads to) for init and the sidecar: the steps are the core's
``job_reads``; this module only makes the GETs. The owner is required (it says how many pods to wait for); an
object it leads to that cannot be read (no RBAC for TrainJobs or runtimes) is logged in one line and the
controller's defaults stand."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agent.core.model import Options, RawPod
from agent.core.plan.gang import JobView, job_reads
from agent.errors import ApiForbidden, ApiNotFound

log = logging.getLogger("topology_agent.job")
AsyncGet = Callable[[str], Awaitable[Mapping[str, Any]]]


async def read_job(get: AsyncGet, me: RawPod, options: Options) -> JobView:
    """The job's view after the core's reads (``job_reads``). ``get`` raises ``ApiNotFound``/``ApiForbidden``
    for the owner itself (the caller explains those); an object it leads to that cannot be read is said in one
    line, and the controller's defaults stand."""
    reads = job_reads(me, options)
    owner = True
    try:
        path = next(reads)
        while True:
            try:
                obj: Mapping[str, Any] | None = await get(path)
            except (ApiNotFound, ApiForbidden) as err:
                if owner:
                    raise
                log.warning("cannot read %s (%s); the controller's defaults stand (grant get on it: "
                            "docs/controllers.md)", path, err)
                obj = None
            owner = False
            path = reads.send(obj)
    except StopIteration as done:
        return done.value
