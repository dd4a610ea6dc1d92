"""Running coroutines side by side (kopf's aiotasks): ``race`` until the first ends, ``run_tasks`` until one ends
or a stop is asked for. Both cancel the rest and wait for them to finish, so nothing is left running and no
failure goes unseen."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


async def race(*coroutines: Awaitable[object]) -> asyncio.Future[object]:
    """Run ``coroutines`` until the first ends; cancel the others. The first to end (its result or failure is
    the caller's to read)."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # every one finished, whatever it raised
    return next(task for task in tasks if task in done)


async def run_tasks(tasks: dict[str, Awaitable[None]], stop: asyncio.Event) -> None:
    """Run root tasks until one ends or ``stop`` is set; cancel the rest; re-raise the first failure."""
    first = await race(*tasks.values(), stop.wait())
    if not first.cancelled() and first.exception() is not None:
        raise first.exception()  # type: ignore[misc]
