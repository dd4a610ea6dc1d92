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
from tests.runtime.test_launcher import is_gone, wait_for, write_files

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

# The sidecar at its quickest: SIGUSR1 to the pid in the pid file the moment the file is there.
EARLY_SIGNAL = r"""
import os, signal, sys
from pathlib import Path
from agent.trainer import launcher
written = launcher.write_pid_file
def write_and_signal(path):
    written(path)
    os.kill(int(Path(path).read_text()), signal.SIGUSR1)
launcher.write_pid_file = write_and_signal
sys.exit(launcher.main(sys.argv[1:]))
"""


def starts(record: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in record.read_text().splitlines()]
    except OSError:
        return []


def zombies_of(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z" and int(fields[1]) == parent:
                found.append(int(entry.name))
    return found


def parent_of(pid: int) -> int:
    return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])


class Run:
    """One launcher and its command, in ``tmp_path``; whatever is left is killed at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.out, self.record = tmp_path / "shared", tmp_path / "record"
        self.release = tmp_path / "release"
        self.proc: subprocess.Popen[str] | None = None
        write_files(self.out, 1, world=2)

    def start(self, *modes: str, setup: str | None = None, early_signal: bool = False,
              args: tuple[str, ...] = ()) -> subprocess.Popen[str]:
        argv = ["-m", "agent.trainer", "run", "--out", str(self.out), "--poll", "0.1", "--grace", "60", *args,
                "--", sys.executable, "-c", COMMAND, str(self.record), *modes]
        if early_signal:
            argv = ["-c", EARLY_SIGNAL, *argv[2:]]
        if setup is not None:
            argv = ["-c", SETUP, setup, *argv]
        self.proc = subprocess.Popen([sys.executable, *argv], stderr=subprocess.PIPE, text=True)
        return self.proc

    def terms(self, pid: int) -> int:
        """The SIGTERMs the command ``pid`` has held on to."""
        try:
            return len((self.record.parent / f"term-{pid}").read_text().splitlines())
        except FileNotFoundError:
            return 0

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


def test_sigterm_during_a_restart_starts_no_new_command_and_the_launcher_exits(run):
    proc = run.start("hold")
    wait_for(lambda: len(starts(run.record)) == 1, "the first start")
    first = starts(run.record)[0]["pid"]
    write_files(run.out, 2, world=3)  # a restart: the command gets SIGTERM and holds on to it
    wait_for(lambda: run.terms(first) == 1, "the restart's SIGTERM to reach the command")
    proc.send_signal(signal.SIGTERM)  # the pod is deleted while the launcher waits for the old command
    wait_for(lambda: run.terms(first) == 2, "the launcher to pass the SIGTERM on")
    run.release.touch()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143  # the command's own code, as a shell reports it
    assert len(starts(run.record)) == 1, err  # no command after the SIGTERM
    assert is_gone(first)


def test_a_file_error_after_the_start_stops_the_command_before_the_launcher_exits(run):
    proc = run.start()
    wait_for(lambda: len(starts(run.record)) == 1, "the first start")
    command = starts(run.record)[0]["pid"]
    (run.out / "topology.json").write_text('{"generation": 2, "framew')  # a new generation that cannot be read
    (run.out / "generation").write_text("2\n")
    _, err = proc.communicate(timeout=30)
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 2
    assert last.startswith(f"agent.trainer: cannot read the agent's files in {run.out}")
    assert last.endswith(f"(stopped the command, pid {command})")
    assert is_gone(command)  # stopped and waited for, not left running without its launcher


def test_as_the_reaper_it_waits_for_what_its_commands_leave_behind(run):
    proc = run.start("children", setup="subreaper")
    wait_for(lambda: len(starts(run.record)) == 1, "the first start")
    for generation in range(2, 6):  # four restarts: each command's group is killed, its children with it
        write_files(run.out, generation, world=generation + 1)
        wait_for(lambda n=generation: len(starts(run.record)) == n, f"start {generation}")
    older = starts(run.record)[:-1]
    # The daemons outlived their command's group: each was given to the launcher, which shows it is their reaper.
    assert [parent_of(start["daemon"]) for start in older] == [proc.pid] * 4
    for start in older:
        os.kill(start["daemon"], signal.SIGKILL)
    ended = [pid for start in older for pid in [start["pid"], *start["group"], start["daemon"]]]
    wait_for(lambda: all(is_gone(pid) for pid in ended),
             f"the launcher to wait for every ended process (its zombies: {zombies_of(proc.pid)})")
    assert zombies_of(proc.pid) == []
    assert proc.poll() is None
    latest = starts(run.record)[-1]
    os.kill(latest["daemon"], signal.SIGKILL)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM  # its command's status, among all it waited for


def test_a_restart_starts_the_command_with_the_files_as_they_are_after_the_grace_period(run):
    proc = run.start("hold")
    wait_for(lambda: len(starts(run.record)) == 1, "the first start")
    first = starts(run.record)[0]["pid"]
    write_files(run.out, 2, world=3)
    wait_for(lambda: run.terms(first) == 1, "the restart's SIGTERM to reach the command")
    write_files(run.out, 3, world=4)  # another generation while the old command takes its time to end
    run.release.touch()
    wait_for(lambda: any(start["world"] == "4" for start in starts(run.record)), "the start with generation 3")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    # A command started with generation 2's files would be stopped at once, before it could record itself: the
    # launcher's log names every start.
    assert [line.split(":")[1] for line in err.splitlines() if ": started " in line] == [" generation 1",
                                                                                        " generation 3"], err


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


def test_a_sigusr1_the_moment_the_pid_file_is_there_finds_the_handler(run):
    proc = run.start(early_signal=True)
    wait_for(lambda: len(starts(run.record)) == 1 or proc.poll() is not None, "the first start")
    assert proc.poll() is None, f"the launcher ended with {proc.returncode}"
    assert starts(run.record)[0]["world"] == "2"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM


def test_read_bounded_refuses_a_file_that_is_larger_than_its_size_said():
    """/proc's files say they hold 0 bytes, as a file still growing says less than it will hold."""
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(launcher.LaunchError, match="larger than 4 bytes"):
        launcher.read_bounded(Path("/proc/self/status"), 4)
    assert launcher.read_bounded(Path("/proc/self/status"), 1 << 20).startswith(b"Name:")
