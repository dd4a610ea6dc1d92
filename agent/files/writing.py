"""Atomic writes of one generation of files.

Every file is written to a temp file in the output directory and renamed into place, so a reader never sees a
half-written file. All temp files are written before the first rename: a failure (full disk, read-only
directory) leaves the previous generation untouched and removes the temp files. There is no fsync: rename
already gives readers the all-or-nothing view, and an emptyDir does not outlive the node crash that fsync guards
against (fsync was 10 % of the sidecar's time per change).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from agent.errors import OutputError

TEMP_PREFIX = ".topology-agent-"


def _private_dir(path: Path, owner: tuple[int, int] | None) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    if owner is not None:
        os.chown(path, *owner)


def write_files(out_dir: Path, files: Mapping[str, bytes], *, modes: Mapping[str, int] | None = None,
                owner: tuple[int, int] | None = None, private_dirs: tuple[str, ...] = ()) -> None:
    """Write ``files`` (name -> bytes, names relative to ``out_dir``) atomically, in the given order.

    ``private_dirs`` (e.g. ``ssh``) are made 0700; with them the output directory loses group/other write,
    because sshd's StrictModes refuses keys below a directory others can write (an emptyDir is 0777).
    ``owner`` (uid, gid) is given to every file and private directory, so a non-root trainer owns its keys.
    """
    modes = modes or {}
    staged: list[tuple[str, Path]] = []
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        if private_dirs:
            mode = out_dir.stat().st_mode & 0o777
            if mode & 0o022:
                os.chmod(out_dir, mode & ~0o022)
            for name in private_dirs:
                _private_dir(out_dir / name, owner)
        for name, data in files.items():
            target = out_dir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=target.parent)
            tmp = Path(tmp_name)
            staged.append((name, tmp))
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(tmp, modes.get(name, 0o644))
            if owner is not None:
                os.chown(tmp, *owner)
        for name, tmp in staged:
            os.replace(tmp, out_dir / name)
    except OSError as err:
        for _, tmp in staged:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        raise OutputError(
            f"cannot write {out_dir}: {err.strerror or err}; check that the volume is mounted, writable "
            "and not full"
        ) from err
