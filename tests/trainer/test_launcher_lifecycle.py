"""The launcher's own life around its command: what a signal does during a restart, what an error after the start
does, what it waits for as a reaper, when it reads the files, how much of a file it reads, and when the sidecar
may signal it.

Real processes throughout, synchronised by files the command writes (never by a sleep): the command records each
start, and a command told to hold on to its SIGTERM says so in a file and ends only once the test releases it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent.trainer import launcher
from tests.runtime.test_launcher import write_files

# The command: records its start (pid, WORLD_SIZE, the processes it started), then waits to be signalled.
#   children: three processes in its group and one in a session of its own, none of them ever waited for
#   hold: on each SIGTERM, adds a line to term-<pid> beside the record; ends (143) once the file `release` is there
COMMAND = r"""
import json, os, signal, subprocess, sys, time
record = sys.argv[1]
here = os.path.dirname(record)
started = {"pid": os.getpid(), "world": os.environ.get("WORLD_SIZE"), "group": [], "daemon": None}
if "children" in sys.argv[2:]:
    started["group"] = [subprocess.Popen(["sleep", "600"]).pid for _ in range(3)]
    started["daemon"] = subprocess.Popen(["sleep", "600"], start_new_session=True).pid
if "hold" in sys.argv[2:]:
    def held(signum, frame):
        with open(os.path.join(here, f"term-{os.getpid()}"), "a") as f:
            f.write("SIGTERM\n")
        while not os.path.exists(os.path.join(here, "release")):
            time.sleep(0.05)
        os._exit(143)
    signal.signal(signal.SIGTERM, held)
with open(record, "a") as f:
    f.write(json.dumps(started) + "\n")
while True:
    time.sleep(600)
"""

# Sets up this process, then runs the launcher in it (both settings stay across execve):
#   subreaper: PR_SET_CHILD_SUBREAPER, as a container's PID 1 is the reaper of its namespace: what the command
#              leaves behind is given to the launcher
#   <bytes>: that much address space at most
SETUP = r"""
import ctypes, os, resource, sys
what, argv = sys.argv[1], sys.argv[2:]
if what == "subreaper":
    if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:
        sys.exit(f"prctl(PR_SET_CHILD_SUBREAPER): errno {ctypes.get_errno()}")
else:
    resource.setrlimit(resource.RLIMIT_AS, (int(what), int(what)))
os.execv(sys.executable, [sys.executable, *argv])
"""


def starts(record: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in record.read_text().splitlines()]
    except OSError:
        return []


class Run:
    """One launcher and its command, in ``tmp_path``; whatever is left is killed at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.out, self.record = tmp_path / "shared", tmp_path / "record"
        self.release = tmp_path / "release"
        self.proc: subprocess.Popen[str] | None = None
        write_files(self.out, 1, world=2)

    def start(self, *modes: str, setup: str | None = None, args: tuple[str, ...] = ()) -> subprocess.Popen[str]:
        argv = ["-m", "agent.trainer", "run", "--out", str(self.out), "--poll", "0.1", "--grace", "60", *args,
                "--", sys.executable, "-c", COMMAND, str(self.record), *modes]
        if setup is not None:
            argv = ["-c", SETUP, setup, *argv]
        self.proc = subprocess.Popen([sys.executable, *argv], stderr=subprocess.PIPE, text=True)
        return self.proc

    def close(self) -> None:
        for start in starts(self.record):
            for pid in [start["pid"], *start["group"], start["daemon"]]:
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.communicate(timeout=30)


@pytest.fixture
def run(tmp_path):
    it = Run(tmp_path)
    yield it
    it.close()


def plant_hostfile(out: Path, size: int) -> None:
    with (out / "torch.env").open("a") as env:
        env.write(f"export HOSTFILE='{out / 'hostfile'}'\n")
    with (out / "hostfile").open("wb") as file:
        file.truncate(size)  # sparse: no disk, and no memory unless it is read


def plant_torch_env(out: Path, size: int) -> None:
    with (out / "torch.env").open("ab") as file:
        file.truncate(size)


def plant_fifo(out: Path, _size: int) -> None:
    (out / "torch.env").unlink()
    os.mkfifo(out / "torch.env")  # nobody writes it: reading it would wait for ever


@pytest.mark.parametrize(("plant", "name", "message"), [
    pytest.param(plant_hostfile, "hostfile", "larger than 67108864 bytes, the most the launcher reads of a file",
                 id="a-hostfile-a-variable-names"),
    pytest.param(plant_torch_env, "torch.env", "larger than 67108864 bytes, the most the launcher reads of a file",
                 id="torch.env"),
    pytest.param(plant_fifo, "torch.env", "not a regular file", id="a-fifo-for-torch.env"),
])
def test_a_file_too_large_or_not_regular_is_one_line_not_read_whole(run, plant, name, message):
    plant(run.out, 8 << 30)
    # 8 GiB in a process limited to 1 GiB of address space: only a bounded read can say what is wrong
    proc = run.start(args=("--pid-file", "none"), setup=str(1 << 30))
    _, err = proc.communicate(timeout=30)
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"agent.trainer: {run.out / name}: {message}")
    assert starts(run.record) == []


def test_read_bounded_refuses_a_file_that_is_larger_than_its_size_said():
    """/proc's files say they hold 0 bytes, as a file still growing says less than it will hold."""
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(launcher.LaunchError, match="larger than 4 bytes"):
        launcher.read_bounded(Path("/proc/self/status"), 4)
    assert launcher.read_bounded(Path("/proc/self/status"), 1 << 20).startswith(b"Name:")
