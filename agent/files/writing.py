"""Atomic writes of one generation of files, through directory file descriptors that never follow a link.

Every file is written to a temp file in its directory and renamed into place, so a reader never sees a
half-written file. All temp files are written before the first rename: a failure (full disk, read-only
directory) leaves the previous generation untouched and removes the temp files. There is no fsync: rename
already gives readers the all-or-nothing view, and an emptyDir does not outlive the node crash that fsync guards
against (fsync would be 10 % of the sidecar's time per change).

The volume is shared with the trainer container, whose code may be hostile: it can replace ``ssh/`` with a
symbolic link to anywhere between two generations. So every directory below the output directory is opened
with ``O_NOFOLLOW`` and every file is created, chmod-ed, chown-ed and renamed relative to that descriptor: a
link is refused (one line), never followed, and private keys never land outside the volume. Temp files left
by a killed writer (``kill -9`` mid-write, possibly holding a private key) are removed by the next writer.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from agent.errors import OutputError

TEMP_PREFIX = ".topology-agent-"
WRITE_PARTS = 512  # parts of a file joined into one write (~90 KB of topology.json's members)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _refuse_link(where: Path, err: OSError) -> OutputError:
    return OutputError(f"cannot write {where}: it is a symbolic link or not a directory ({err.strerror}); the "
                       "agent never writes through a link (keys could land outside the volume): remove it")


@contextlib.contextmanager
def _opened(path: str | Path, *, parent: int | None = None, shown: Path) -> Iterator[int]:
    try:
        fd = os.open(path, _DIR_FLAGS, dir_fd=parent)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):  # a symbolic link, or a file
            raise _refuse_link(shown, err) from err
        raise
    try:
        yield fd
    finally:
        os.close(fd)


def _remove_stale(dir_fd: int) -> None:
    """Temp files of an earlier writer that was killed mid-write."""
    for name in os.listdir(dir_fd):
        if name.startswith(TEMP_PREFIX):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
                os.unlink(name, dir_fd=dir_fd)


def _private_dir(out_fd: int, name: str, owner: tuple[int, int] | None, shown: Path) -> None:
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=out_fd)
    with _opened(name, parent=out_fd, shown=shown) as fd:
        os.fchmod(fd, 0o700)
        if owner is not None:
            os.fchown(fd, *owner)


def _write_data(handle: BinaryIO, data: bytes | Sequence[bytes]) -> None:
    """A file's bytes, or its parts joined a slice at a time: a write per part costs more than the copy."""
    if isinstance(data, bytes):
        handle.write(data)
        return
    for at in range(0, len(data), WRITE_PARTS):
        handle.write(b"".join(data[at:at + WRITE_PARTS]))


def write_files(out_dir: Path, files: Mapping[str, bytes | Sequence[bytes]], *, modes: Mapping[str, int] | None = None,
                owner: tuple[int, int] | None = None, private_dirs: tuple[str, ...] = ()) -> None:
    """Write ``files`` (name -> bytes, or its parts in order, written a slice at a time, never joined whole;
    names relative to ``out_dir``, at most one directory deep) atomically.

    ``private_dirs`` (e.g. ``ssh``) are made 0700; with them the output directory loses group/other write,
    because sshd's StrictModes refuses keys below a directory others can write (an emptyDir is 0777).
    ``owner`` (uid, gid) is given to every file and private directory, so a non-root trainer owns its keys.
    """
    modes = modes or {}
    staged: list[tuple[int, str, str]] = []  # (dir fd, temp name, final name)
    dirs: dict[str, int] = {}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        out_fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the mount itself may be a link
        dirs[""] = out_fd
        _remove_stale(out_fd)
        if private_dirs:
            mode = stat.S_IMODE(os.fstat(out_fd).st_mode)
            if mode & 0o022:
                os.fchmod(out_fd, mode & ~0o022)
            for name in private_dirs:
                _private_dir(out_fd, name, owner, out_dir / name)
        for name, data in files.items():
            sub, _, base = name.rpartition("/")
            if "/" in sub or base in ("", ".", ".."):
                raise OutputError(f"cannot write {out_dir / name}: not a plain file name (a bug: please report)")
            if sub not in dirs:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(sub, 0o755, dir_fd=out_fd)
                with _opened(sub, parent=out_fd, shown=out_dir / sub) as probe:
                    dirs[sub] = os.dup(probe)
                _remove_stale(dirs[sub])
            dir_fd = dirs[sub]
            tmp = f"{TEMP_PREFIX}{os.urandom(8).hex()}"
            fd = os.open(tmp, _NEW_FILE, 0o600, dir_fd=dir_fd)
            staged.append((dir_fd, tmp, base))
            with os.fdopen(fd, "wb") as handle:
                _write_data(handle, data)
                os.fchmod(handle.fileno(), modes.get(name, 0o644))
                if owner is not None:
                    os.fchown(handle.fileno(), *owner)
        for dir_fd, tmp, base in staged:
            os.replace(tmp, base, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        staged.clear()
    except OSError as err:
        if out_dir.exists() and not out_dir.is_dir():
            raise OutputError(f"cannot write to {out_dir}: it is a file, not a directory; give --out a directory "
                              "(the shared volume's mount point)") from err
        raise OutputError(
            f"cannot write {out_dir}: {err.strerror or err}; check that the volume is mounted, writable "
            "and not full"
        ) from err
    finally:
        for dir_fd, tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
        for fd in dirs.values():
            with contextlib.suppress(OSError):
                os.close(fd)
