"""``python -m agent.trainer run -- CMD ARGS...``: run a command under the current files, and start it again
under the new ones when the membership changes.

JAX, TensorFlow, PaddlePaddle, MLX, LightGBM and MPI launchers fix their world when they start (docs/frameworks.md,
"What a membership change does"); the only way to give them a new one is a new process. The launcher is that
process's parent in the trainer container: it reads ``torch.env`` and the frameworks' env files the pod got (the
list is in ``topology.json``), parses their ``export K='v'`` lines as data (no shell), and starts the command in a
process group of its own with that environment.

A new generation is noticed two ways: SIGUSR1 (the sidecar's signal: it finds the launcher by the pid file the
launcher writes, ``--trainer-pid-file /shared/trainer.pid``) makes it look at once, and the ``generation`` file is
read every ``--poll`` seconds in case no signal comes (no trainer named, a signal lost). The command is started
again only when what it is given changed: its environment, or the bytes of an agent file a variable names (the
MPI hostfile, MLX's JSON hostfile). Then the process group gets SIGTERM, SIGKILL after ``--grace`` seconds, and
the command starts again from the new files; checkpoints are the command's business. The pod is not recreated.
A hot spare's files (``TOPOLOGY_SPARE=1``: no world of its own) start no command: the launcher waits until a
generation makes the pod a member, and a member made a spare again has its command stopped until then.

The files are read when the command starts: a restart reads them after the old command has ended, so a generation
that came during the grace period is the one the new command gets. Every file is read with a size limit
(``FILE_LIMIT``) and only when it is a regular file: one that is not, or is larger, is said in one line, never
read whole (a FIFO would hold the launcher, a file of any size its memory).

SIGTERM and SIGINT are passed to the command's group and no command is started after them; the launcher exits with
the command's code (128 + the signal when a signal ended it, as a shell reports it; 128 + the launcher's own signal
when no command was running). A second one sends SIGKILL. An error after the command started (a file that cannot
be read) stops the command before the launcher exits: a command is never left without it. The launcher waits for
every child that ends, not only its command: as a container's PID 1 (or a subreaper) it inherits what the command
left behind, and whatever it does not wait for stays a zombie. Its signal handlers are in place before it writes
the pid file, so the sidecar's first SIGUSR1 finds them.

A command that fails after the files moved on (a peer left and broke its collective before the signal came) is
started again, not reported; one that fails while the files stay is started again up to ``--max-restarts`` times
per generation, after 1, 2, 4... s, as torchrun's ``--max-restarts`` does: a process that joins may reach a
coordinator that still runs the old world (measured with JAX: ``Unexpected task registered``) until that pod's
launcher has started it again.

It imports only the standard library, so it runs in any Python that can import ``agent.trainer``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import select
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import BinaryIO

from agent.trainer import apply_env_file

log = logging.getLogger("topology_agent.launcher")

# Any file the launcher reads: topology.json, the largest, is 4.5 MB at 16384 pods (docs/benchmarks.md), and a
# hostfile of every member is far smaller.
FILE_LIMIT = 64 << 20
GENERATION_LIMIT = 64  # a number and a line break
CHUNK = 1 << 20  # a file named by a variable is hashed this much at a time


# torch.env of a hot spare (--world-size): no world to join until the spare takes a member's place
SPARE = "this pod is a hot spare (TOPOLOGY_SPARE=1): it starts the command once it takes a member's place"


class LaunchError(Exception):
    """Bad input or a missing file, said in one line."""


@dataclass(frozen=True)
class Files:
    """One generation of the files, as the command gets it."""

    generation: int
    env: dict[str, str]
    key: str  # what the command is given, hashed: the environment and the agent files it names
    withheld: tuple[str, ...]  # why a selected framework's values are not there (nothing to run with yet)


@contextlib.contextmanager
def _open_regular(path: Path, limit: int) -> Iterator[BinaryIO]:
    """``path`` opened for reading when it is a regular file of at most ``limit`` bytes. O_NONBLOCK: opening a
    FIFO does not wait for a writer, and the check below refuses it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise LaunchError(f"{path}: not a regular file; the agent writes only regular files in {path.parent}")
        if info.st_size > limit:
            raise _too_large(path, limit)
        yield file


def _too_large(path: Path, limit: int) -> LaunchError:
    return LaunchError(f"{path}: larger than {limit} bytes, the most the launcher reads of a file; no agent file "
                       f"is that large: keep other files out of {path.parent}")


def read_bounded(path: Path, limit: int = FILE_LIMIT) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; a larger one is refused before it is read (and a
    file that grows while it is read is cut off there)."""
    with _open_regular(path, limit) as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise _too_large(path, limit)
    return data


def _read_text(path: Path) -> str:
    return read_bounded(path).decode()


def _read_generation(out: Path) -> int:
    try:
        return int(read_bounded(out / "generation", GENERATION_LIMIT).strip())
    except (OSError, ValueError, LaunchError):  # not there yet, or not a number: no generation to go by
        return -1


def _frameworks(document: dict[str, object], wanted: tuple[str, ...] | None, out: Path) -> list[tuple[str, dict]]:
    found = document.get("frameworks") or {}
    if not isinstance(found, dict):
        raise LaunchError(f"{out / 'topology.json'}: 'frameworks' is not an object; is it the agent's file?")
    if wanted is None:
        return [(name, spec) for name, spec in found.items() if isinstance(spec, dict)]
    missing = [name for name in wanted if name not in found and name != "torch"]
    if missing:
        got = ", ".join(found) or "none"
        raise LaunchError(f"--frameworks {','.join(missing)}: this pod got no files for it (its frameworks: {got}); "
                          "select it for the job (--frameworks on init and the sidecar, or the annotation "
                          "topology-agent.io/frameworks)")
    return [(name, found[name]) for name in wanted if name != "torch"]


def read_files(out: Path, base: dict[str, str], wanted: tuple[str, ...] | None = None) -> Files:
    """torch.env, then each framework's env files in topology.json's order, applied to ``base``; with ``wanted``,
    only those frameworks' files (torch.env if it names ``torch``). Read until the
    generation is the same before and after, so that one reading is one generation (``generation`` is written
    last); a file that fails to read while the generation moved on is read again, from the new one."""
    for _ in range(50):
        before = _read_generation(out)
        try:
            document = json.loads(_read_text(out / "topology.json"))
            env = dict(base)
            if wanted is None or "torch" in wanted:
                apply_env_file(_read_text(out / "torch.env"), env)
            withheld = []
            for name, spec in _frameworks(document, wanted, out):
                if spec.get("withheld"):
                    withheld.append(f"{name}: {spec['withheld']}")
                for file in spec.get("files", []):
                    if str(file).endswith(".env"):
                        apply_env_file(_read_text(out / file), env)
            key = _key(env, out)
        except (OSError, ValueError) as err:
            if _read_generation(out) != before:  # read across two generations: read the new one
                time.sleep(0.02)
                continue
            if isinstance(err, FileNotFoundError):
                raise LaunchError(f"{err.filename}: not there; run the launcher where topology-agent init has "
                                  f"written its files (--out {out})") from None
            raise LaunchError(f"cannot read the agent's files in {out}: {err}") from None
        if _read_generation(out) == before:
            return Files(before, env, key, tuple(withheld))
        time.sleep(0.02)
    raise LaunchError(f"{out}: the generation kept changing while the files were read")


def _key(env: dict[str, str], out: Path) -> str:
    digest = hashlib.sha256()
    for name in sorted(env):
        digest.update(f"{name}={env[name]}\0".encode("utf-8", "surrogateescape"))
        path = Path(env[name])
        if path.is_absolute() and path.parent == out and path.is_file():  # MPI's hostfile, MLX's JSON hostfile
            with _open_regular(path, FILE_LIMIT) as file:
                size = 0
                while chunk := file.read(CHUNK):
                    size += len(chunk)
                    if size > FILE_LIMIT:
                        raise _too_large(path, FILE_LIMIT)
                    digest.update(chunk)
    return digest.hexdigest()


def write_pid_file(path: Path) -> None:
    """The sidecar's ``--trainer-pid-file``: this process, written to a temp file and renamed."""
    temp = path.with_name(f".{path.name}.tmp")
    try:
        temp.write_text(f"{os.getpid()}\n")
        os.replace(temp, path)
    except OSError as err:
        raise LaunchError(f"cannot write the pid file {path}: {err.strerror}; mount the shared volume writable in "
                          "the trainer container, or give --pid-file another path the sidecar can read") from None


class Wake:
    """A wake-up that a signal handler may set: a byte in a pipe, no lock. A handler runs in the main thread
    between two bytecodes, so one that took a lock (threading.Event's) while the main thread held it, in that
    Event's own ``clear`` or ``wait``, would wait for itself for ever."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def set(self) -> None:
        with contextlib.suppress(BlockingIOError):  # full: it is set already
            os.write(self._write, b"\0")

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError):  # empty: cleared
            while os.read(self._read, 4096):
                pass

    def wait(self, timeout: float | None) -> bool:
        """True once set, False after ``timeout`` seconds (a signal's handler that sets it ends the wait)."""
        return bool(select.select([self._read], [], [], timeout)[0])


class Launcher:
    """The command's life across generations. Single-threaded: the signal handlers only record and wake, and
    every wait is on ``wake`` (set by SIGCHLD, SIGUSR1, SIGTERM, SIGINT), checked after it is cleared so that no
    signal is missed between a check and a wait."""

    def __init__(self, out: Path, command: list[str], *, grace: float, poll: float,
                 frameworks: tuple[str, ...] | None, max_restarts: int = 3) -> None:
        self.out, self.command, self.grace, self.poll, self.frameworks = out, command, grace, poll, frameworks
        self.max_restarts = max_restarts
        self.base = dict(os.environ)
        self.wake = Wake()
        self.forwarded: int | None = None  # SIGTERM or SIGINT received: the command is being stopped for good
        self.forwarded_to: int | None = None  # the command that got it (one started meanwhile has not)
        self.proc: subprocess.Popen[bytes] | None = None  # the command; its returncode is set when it is reaped
        self.files: Files | None = None

    def install_handlers(self) -> None:
        """Before anything can signal: the pid file tells the sidecar where to send SIGUSR1, whose default action
        ends a process."""
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGCHLD):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            if self.forwarded is not None:  # a second one: stop waiting for the grace period
                self._signal_group(signal.SIGKILL)
            self.forwarded = signum
            self._forward()
        self.wake.set()

    def _forward(self) -> None:
        assert self.forwarded is not None
        if self.proc is not None and self.proc.returncode is None:
            self.forwarded_to = self.proc.pid
            self._signal_group(self.forwarded)

    def _signal_group(self, signum: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signum)

    def _reap(self) -> None:
        """Wait for every child that has ended: the command (its status kept on ``proc``), and the processes it
        left behind that were given to this one, as to any PID 1 or subreaper."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.proc is not None and pid == self.proc.pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)

    def _wait_for_command(self, timeout: float | None) -> int | None:
        """The command's status once it has ended, or None after ``timeout`` seconds."""
        assert self.proc is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.wake.clear()
            self._reap()
            if self.proc.returncode is not None:
                return self.proc.returncode
            left = self.poll if deadline is None else min(self.poll, deadline - time.monotonic())
            if left <= 0:
                return None
            self.wake.wait(left)

    def _wait_for_files(self) -> Files | None:
        """The current files, once no selected framework's values are withheld; None when the launcher is told to
        stop meanwhile."""
        said = ""
        while True:
            self.wake.clear()
            self._reap()
            if self.forwarded is not None:
                return None
            files = read_files(self.out, self.base, self.frameworks)
            spare = files.env.get("TOPOLOGY_SPARE") == "1"
            if not files.withheld and not spare:
                return files
            why = f"the files have no values yet ({'; '.join(files.withheld)})" if files.withheld else SPARE
            if why != said:
                said = why
                log.warning("generation %d: not started, %s; waiting for the next generation", files.generation, why)
            self.wake.wait(self.poll)

    def _start(self) -> bool:
        """Start the command with the files as they are now; False when told to stop first."""
        files = self._wait_for_files()
        if files is None:
            return False
        self.files = files
        self.proc = subprocess.Popen(self.command, env=files.env, start_new_session=True)
        if self.forwarded is not None and self.forwarded_to != self.proc.pid:  # came while it was being started
            self._forward()
        log.info("generation %d: started %s (pid %d)", files.generation, self.command[0], self.proc.pid)
        return True

    def _stop(self) -> None:
        """SIGTERM to the command's group, SIGKILL to what is left after the grace period."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        self._signal_group(signal.SIGTERM)
        if self._wait_for_command(self.grace) is None:
            log.warning("pid %d did not end within %.0f s of SIGTERM: SIGKILL", proc.pid, self.grace)
        with contextlib.suppress(ProcessLookupError):  # its children too, whether or not the leader ended
            os.killpg(proc.pid, signal.SIGKILL)
        self._wait_for_command(None)

    def _moved_on(self) -> int | None:
        """The new generation, when it gives the command something else."""
        assert self.files is not None
        if _read_generation(self.out) == self.files.generation:
            return None
        files = read_files(self.out, self.base, self.frameworks)
        if files.key == self.files.key:
            log.info("generation %d: the command's files are unchanged; not restarted", files.generation)
            self.files = files
            return None
        return files.generation

    def _pause(self, seconds: float) -> None:
        """Before a failed command starts again: until ``seconds`` have passed, a new generation is there, or
        the launcher is told to stop."""
        assert self.files is not None
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.wake.clear()
            self._reap()
            if self.forwarded is not None or _read_generation(self.out) != self.files.generation:
                return
            self.wake.wait(min(left, self.poll))

    def run(self) -> int:
        """Run the command until it ends by itself or the launcher is told to stop, and exit as a shell would
        with its status. Whatever ends the launcher otherwise (a file that cannot be read) stops the command
        first."""
        try:
            return self._supervise()
        except LaunchError as err:
            if self.proc is not None and self.proc.returncode is None:
                pid = self.proc.pid
                self._stop()
                raise LaunchError(f"{err} (stopped the command, pid {pid})") from None
            raise
        except BaseException:
            self._stop()
            raise

    def _supervise(self) -> int:
        if not self._start():  # told to stop before there was a command: as a shell that got the signal
            assert self.forwarded is not None
            return 128 + self.forwarded
        failures = 0  # in this generation
        while True:
            self.wake.clear()
            self._reap()
            proc = self.proc
            assert proc is not None and self.files is not None
            code = proc.returncode
            if self.forwarded is not None:
                if code is None:
                    self.wake.wait(self.poll)
                    continue
                return _exit_code(code)
            if code == 0:
                log.info("the command ended by itself with 0")
                return 0
            moved = self._moved_on()
            if code is not None and moved is None:
                if failures >= self.max_restarts:
                    log.info("the command ended by itself with %s", code)
                    return _exit_code(code)
                failures += 1
                pause = min(2.0 ** (failures - 1), 30.0)
                log.warning("the command ended with %s; starting it again in %.0f s (restart %d of %d in this "
                            "generation: a peer may still run the old world)", code, pause, failures,
                            self.max_restarts)
                self._pause(pause)
            elif code is not None:
                log.warning("the command ended with %s after the files moved on: starting it again", code)
            elif moved is not None:
                log.info("generation %d: the world changed; stopping pid %d and starting again", moved, proc.pid)
                self._stop()
            else:
                self.wake.wait(self.poll)
                continue
            # The command has ended here. Told to stop while it was stopped or during the pause: no new one.
            before = self.files.generation
            if self.forwarded is not None or not self._start():
                return _exit_code(proc.returncode)
            if self.files.generation != before:
                failures = 0


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m agent.trainer",
        description="Run a training command under the agent's files; start it again when the world changes.")
    sub = parser.add_subparsers(dest="command_name", required=True)
    run = sub.add_parser("run", help="run CMD with torch.env and the frameworks' env files (after --)")
    run.add_argument("--out", default="/shared", type=Path, help="the shared volume (default /shared)")
    run.add_argument("--grace", default=30.0, type=float,
                     help="seconds between SIGTERM and SIGKILL when the command is stopped (default 30)")
    run.add_argument("--poll", default=1.0, type=float,
                     help="seconds between looks at the generation file when no signal comes (default 1)")
    run.add_argument("--pid-file", default=None,
                     help="where to write this launcher's pid for the sidecar's --trainer-pid-file (default "
                          "<out>/trainer.pid; 'none': do not write one)")
    run.add_argument("--max-restarts", default=3, type=int,
                     help="times a failing command is started again within one generation, after 1, 2, 4... s "
                          "(default 3): a process that joins may reach a peer still in the old world and fail")
    run.add_argument("--frameworks", default=None,
                     help="only these frameworks' env files, comma-separated, torch for torch.env (default: torch.env "
                          "and every framework's file the pod got; where two files name a variable, the later wins)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    if args.cmd[:1] == ["--"]:
        args.cmd = args.cmd[1:]
    if not args.cmd:
        parser.error("no command: give it after --, e.g. python -m agent.trainer run -- python train.py")
    if args.grace < 0 or args.poll <= 0 or args.max_restarts < 0:
        parser.error("--grace and --max-restarts must be 0 or more, --poll more than 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="agent.trainer: %(message)s", stream=sys.stderr)
    wanted = tuple(n for n in args.frameworks.split(",") if n) if args.frameworks else None
    launcher = Launcher(args.out, args.cmd, grace=args.grace, poll=args.poll, frameworks=wanted,
                        max_restarts=args.max_restarts)
    launcher.install_handlers()  # before the pid file: the sidecar signals as soon as it reads it
    try:
        if args.pid_file != "none":
            write_pid_file(Path(args.pid_file) if args.pid_file else args.out / "trainer.pid")
        return launcher.run()
    except LaunchError as err:
        print(f"agent.trainer: {err}", file=sys.stderr)
        return 2
    except FileNotFoundError as err:
        print(f"agent.trainer: {args.cmd[0]}: command not found ({err.strerror})", file=sys.stderr)
        return 127
