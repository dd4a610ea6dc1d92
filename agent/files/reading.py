"""Reading files the trainer can write (the shared directory is its too): a pid file, the previous topology.json.

Nothing about such a file is trusted. It is opened without following a link (a link could point at /dev/zero or
at another pod's secrets) and without blocking (a FIFO would stop the sidecar's event loop until someone writes
to it); it must be a regular file, and no more than ``limit`` bytes are read (a huge file is refused, not read).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class Unreadable(Exception):
    """The file is not one the agent reads: the message says why, for one log line."""


def read_untrusted(path: Path, limit: int) -> bytes:
    """The file's bytes; ``FileNotFoundError`` when there is none; ``Unreadable`` for a link, a FIFO, a device,
    a directory, or more than ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise
    except OSError as err:
        if os.path.islink(path):
            raise Unreadable(f"{path} is a symbolic link; the agent reads only regular files there") from None
        raise Unreadable(f"{path} cannot be opened ({err.strerror or err})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable(f"{path} is not a regular file; the agent reads only regular files there")
        if info.st_size > limit:
            raise Unreadable(f"{path} is {info.st_size} bytes, more than the {limit} the agent reads")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise Unreadable(f"{path} grew past the {limit} bytes the agent reads")
        return b"".join(chunks)
    finally:
        os.close(fd)
