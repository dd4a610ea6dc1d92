"""The process's memory: glibc's heap and the cyclic collector. The agent's RSS is paid in every pod of a job, and
its large transients (a LIST page, a snapshot read back) would otherwise stay in the heap for the pod's life."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any


def _libc() -> Any:
    """glibc through ctypes, imported on the first call rather than with this module: of init's processes only the
    leader's calls here, and the import costs every other pod's start a few milliseconds (bench/import_bench.py)."""
    import ctypes

    return ctypes.CDLL("libc.so.6")


def release_memory() -> None:
    """Give freed transient megabytes (a LIST, a snapshot read back, a burst of changes) back to the OS.

    Python frees the parsed objects, but glibc keeps the freed heap until asked (malloc_trim)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        _libc().malloc_trim(0)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt(3) parameters
KEEP_FREED = 16 << 20  # bytes: blocks up to this size come from the heap, and freed heap stays until trimmed


def keep_freed_memory() -> None:
    """Let a change reuse the memory the last one freed. glibc gives a freed block over its (self-raising) mmap
    threshold back to the OS at once, so every change of a 16384-pod job faulted its ~10 MB of files in again:
    2500 page faults per change, 20.5-22.0 ms of CPU against 14.6-15.8 ms with fixed thresholds (in-process).
    Freed blocks now stay in the heap, and ``release_memory`` hands them back once a burst is over."""
    with contextlib.suppress(OSError, AttributeError):
        libc = _libc()
        libc.mallopt(M_MMAP_THRESHOLD, KEEP_FREED)
        libc.mallopt(M_TRIM_THRESHOLD, 2 * KEEP_FREED)


def freeze() -> None:
    """The pods held live until the next LIST and hold no cycles: keep the cyclic collector off them, so a
    collection during a change does not walk every pod of the job (refcounting still frees them)."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off for one synchronous burst of allocations (a change's plan and files), on again
    after it. A pod that leaves a 16384-pod job moves every member after it: ~13000 new members, texts and keys,
    whose allocations would run the collector's young passes ~150 times per change, and now and then a full pass
    over the plan, about a fifth of a full-view pod's CPU per change in-process. Cycles made meanwhile are found
    by the first collection after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
