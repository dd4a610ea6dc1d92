"""Atomic writes of one generation of files.

Every file is written to a temp file in the output directory, flushed to disk, and renamed into place, so a
reader never sees a half-written file. All temp files are written before the first rename: a failure (full
disk, read-only directory) leaves the previous generation untouched and removes the temp files.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from agent.errors import OutputError

TEMP_PREFIX = ".topology-agent-"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_files(out_dir: Path, files: Mapping[str, bytes], *, modes: Mapping[str, int] | None = None) -> None:
    """Write ``files`` (name -> bytes, names relative to ``out_dir``) atomically, in the given order."""
    modes = modes or {}
    staged: list[tuple[str, Path]] = []
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            target = out_dir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=target.parent)
            staged.append((name, Path(tmp)))
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, modes.get(name, 0o644))
        for name, tmp in staged:
            os.replace(tmp, out_dir / name)
        _fsync_dir(out_dir)
    except OSError as err:
        for _, tmp in staged:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        raise OutputError(
            f"cannot write {out_dir}: {err.strerror or err}; check that the volume is mounted, writable "
            "and not full"
        ) from err
