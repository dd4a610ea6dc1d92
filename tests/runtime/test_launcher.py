"""``python -m agent.trainer run``: the command gets the agent's files as its environment (read as data, never
through a shell), starts again when a new generation gives it something else, and nothing else moves it.

Real processes throughout: the launcher is started as a user starts it, the command is a small Python program
that writes the environment it got, and the sidecar's own ``TrainerFinder`` and ``signal_trainer`` find and
signal the launcher through the pid file it writes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.runtime.signalling import TrainerFinder, signal_trainer
from agent.trainer import apply_env_file, launcher

# The command: records each start (its pid and the variables it got), then waits for a signal.
COMMAND = """
import json, os, sys, time
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"pid": os.getpid(), "env": {k: v for k, v in os.environ.items()
                                                   if k.startswith(("RANK", "WORLD", "JAX", "ODD", "PATH"))}}) + "\\n")
code = os.environ.get("EXIT_WITH")
if code is not None:
    sys.exit(int(code))
time.sleep(600)
"""
ODD = "it's $HOME; `rm -rf /`\nline two \u2028 \"quoted\""  # what a shell would expand, split or run


def _put(path: Path, text: str) -> None:
    """Written to a temp file and renamed, as the agent writes: a reader never sees half a file."""
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(text)
    os.replace(temp, path)


def write_files(out: Path, generation: int, *, world: int, jax: bool = True, withheld: str | None = None,
                extra: str = "") -> None:
    """The agent's files as init and the sidecar write them: the env files first, generation last."""
    out.mkdir(exist_ok=True)
    quoted = "'" + ODD.replace("'", "'\"'\"'") + "'"
    _put(out / "torch.env", f"# Written by topology-agent\nexport WORLD_SIZE='{world}'\nexport RANK='1'\n"
                            f"export ODD={quoted}\nunset PATHLESS\n{extra}")
    frameworks = {}
    if jax:
        body = "# not written: no IP yet\n" if withheld else \
            f"export JAX_NUM_PROCESSES='{world}'\nexport JAX_COORDINATOR_ADDRESS='10.0.0.1:55527'\n"
        _put(out / "jax.env", body)
        frameworks["jax"] = {"files": ["jax.env"], "withheld": withheld}
    _put(out / "topology.json", json.dumps({"generation": generation, "frameworks": frameworks}))
    _put(out / "generation", f"{generation}\n")


def starts(record: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in record.read_text().splitlines()]
    except OSError:
        return []


def wait_for(predicate, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def launch(out: Path, record: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agent.trainer", "run", "--out", str(out), "--poll", "0.1", "--grace", "2", *args,
         "--", sys.executable, "-c", COMMAND, str(record)],
        env={**os.environ, "PATHLESS": "set in the container", **(env or {})}, stderr=subprocess.PIPE, text=True)


def read_until(proc: subprocess.Popen[str], text: str, timeout: float = 20.0) -> str:
    """The launcher's stderr up to the line holding ``text``; the launcher is stopped if it has not said it by
    ``timeout`` (the read then ends and the test fails on what was said)."""
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    said = ""
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            said += line
            if text in line:
                return said
    finally:
        watchdog.cancel()
    raise AssertionError(f"the launcher ended without saying {text!r}: {said!r}")


@pytest.fixture
def files(tmp_path):
    out, record = tmp_path / "shared", tmp_path / "record"
    write_files(out, 1, world=2)
    procs: list[subprocess.Popen[str]] = []
    yield out, record, procs
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()  # passed on to the command, which would otherwise outlive the test
        proc.communicate(timeout=20)


def test_the_command_gets_torch_env_and_the_frameworks_files_read_as_data(files):
    out, record, procs = files
    procs.append(launch(out, record))
    wait_for(lambda: starts(record), "the command")
    env = starts(record)[0]["env"]
    assert env["WORLD_SIZE"] == "2" and env["RANK"] == "1" and env["JAX_NUM_PROCESSES"] == "2"
    assert env["ODD"] == ODD  # no shell: nothing expanded, split or run
    assert "PATHLESS" not in env  # torch.env's unset removes what the container had
    assert (out / "trainer.pid").read_text() == f"{procs[0].pid}\n"


def test_a_new_world_stops_the_command_and_starts_it_again_with_the_new_files(files):
    out, record, procs = files
    procs.append(launch(out, record))
    wait_for(lambda: len(starts(record)) == 1, "the first start")
    write_files(out, 2, world=3)  # no signal: the launcher reads the generation file
    wait_for(lambda: len(starts(record)) == 2, "the second start")
    first, second = starts(record)
    assert second["env"]["WORLD_SIZE"] == "3" and second["env"]["JAX_NUM_PROCESSES"] == "3"
    with pytest.raises(ProcessLookupError):
        os.kill(first["pid"], 0)  # the old command is gone, not left beside the new one
    assert procs[0].poll() is None  # the launcher itself goes on: the pod is not recreated


def test_the_sidecar_finds_the_launcher_by_its_pid_file_and_its_signal_restarts_the_command(files):
    out, record, procs = files
    procs.append(launch(out, record, "--poll", "60"))  # no polling to speak of: only the signal can do it
    wait_for(lambda: len(starts(record)) == 1 and (out / "trainer.pid").exists(), "the first start")
    write_files(out, 2, world=3)
    finder = TrainerFinder(pid_file=out / "trainer.pid")
    assert finder.find().pid == procs[0].pid
    assert signal_trainer(finder, signal.SIGUSR1) == "sent"
    wait_for(lambda: len(starts(record)) == 2, "the start the signal asked for", timeout=10)
    assert starts(record)[1]["env"]["WORLD_SIZE"] == "3"


def test_a_generation_that_changes_nothing_the_command_gets_does_not_restart_it(files):
    out, record, procs = files
    procs.append(launch(out, record, "--frameworks", "jax"))  # jax.env only: torch.env's WORLD_SIZE is not its
    wait_for(lambda: len(starts(record)) == 1, "the first start")
    assert "WORLD_SIZE" not in starts(record)[0]["env"]
    write_files(out, 2, world=2, extra="export NEW='for torch only'\n")
    os.kill(procs[0].pid, signal.SIGUSR1)
    time.sleep(1.0)
    assert len(starts(record)) == 1
    procs[0].send_signal(signal.SIGTERM)
    _, err = procs[0].communicate(timeout=10)
    assert "generation 2: the command's files are unchanged; not restarted" in err


def test_sigterm_goes_to_the_command_and_the_launcher_exits_with_its_status(files):
    out, record, procs = files
    procs.append(launch(out, record))
    wait_for(lambda: len(starts(record)) == 1, "the first start")
    procs[0].send_signal(signal.SIGTERM)
    procs[0].communicate(timeout=10)
    assert procs[0].returncode == 128 + signal.SIGTERM  # the command died of the SIGTERM it was passed
    with pytest.raises(ProcessLookupError):
        os.kill(starts(record)[0]["pid"], 0)


def test_a_command_that_ends_by_itself_ends_the_launcher_with_its_code(files):
    out, record, procs = files
    procs.append(launch(out, record, env={"EXIT_WITH": "0"}))
    assert procs[0].wait(20) == 0 and len(starts(record)) == 1


@pytest.mark.slow  # seconds of real waiting (backoffs, a timeout): the whole suite runs it
def test_a_failing_command_is_started_again_a_few_times_then_its_code_is_the_launchers(files):
    out, record, procs = files
    procs.append(launch(out, record, "--max-restarts", "2", env={"EXIT_WITH": "7"}))
    _, err = procs[0].communicate(timeout=30)
    assert procs[0].returncode == 7 and len(starts(record)) == 3  # the first start and 2 restarts
    assert "restart 2 of 2 in this generation" in err


def test_withheld_values_hold_the_start_until_a_generation_has_them(files):
    out, record, procs = files
    write_files(out, 1, world=2, withheld="pod fw-1 has no IP yet")
    procs.append(launch(out, record))
    said = read_until(procs[0], "generation 1: not started")  # it has read generation 1 and held the start
    assert starts(record) == []
    write_files(out, 2, world=2)
    wait_for(lambda: len(starts(record)) == 1, "the start once the values are there")
    procs[0].send_signal(signal.SIGTERM)
    _, err = procs[0].communicate(timeout=10)
    assert "generation 1: not started, the files have no values yet (jax: pod fw-1 has no IP yet)" in said + err


def test_a_hot_spare_starts_nothing_until_a_generation_makes_it_a_member_and_stops_when_made_a_spare(files):
    out, record, procs = files
    write_files(out, 1, world=2, jax=False, extra="export TOPOLOGY_SPARE='1'\n")
    procs.append(launch(out, record))
    said = read_until(procs[0], "generation 1: ")  # "not started", or "started" by a launcher that knows no spare
    assert "generation 1: not started" in said and "hot spare (TOPOLOGY_SPARE=1)" in said and starts(record) == []
    write_files(out, 2, world=2, jax=False, extra="export TOPOLOGY_SPARE='0'\n")  # it took a member's place
    wait_for(lambda: len(starts(record)) == 1, "the start once the pod is a member")
    first = starts(record)[0]["pid"]
    write_files(out, 3, world=2, jax=False, extra="export TOPOLOGY_SPARE='1'\n")  # the seat went back
    wait_for(lambda: is_gone(first), "the command stopped once the pod is a spare again")
    assert len(starts(record)) == 1
    procs[0].send_signal(signal.SIGTERM)
    procs[0].communicate(timeout=10)


def is_gone(pid: int) -> bool:
    """Not even a zombie: ``kill(pid, 0)`` succeeds on a process that ended and was not waited for."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_file_read_across_two_generations_is_read_again_from_the_new_one(tmp_path, monkeypatch):
    out = tmp_path / "shared"
    write_files(out, 1, world=2)
    (out / "topology.json").write_text('{"generation": 1, "framew')  # what a reader of a file being written sees
    with pytest.raises(launcher.LaunchError, match="cannot read the agent's files"):
        launcher.read_files(out, {})  # the generation stays: a bad file is said, not waited on
    real, calls = launcher._read_generation, []

    def moving(where: Path) -> int:
        calls.append(where)
        if len(calls) == 2:  # looked at after the failed read: generation 2 is there by then
            write_files(out, 2, world=3)
        return real(where)

    monkeypatch.setattr(launcher, "_read_generation", moving)
    files = launcher.read_files(out, {})
    assert files.generation == 2 and files.env["WORLD_SIZE"] == "3" and files.env["JAX_NUM_PROCESSES"] == "3"


@pytest.mark.parametrize(("args", "message"), [
    (["--frameworks", "tf"], "--frameworks tf: this pod got no files for it (its frameworks: jax)"),
    (["--out", "/nonexistent/shared"], "/nonexistent/shared/topology.json: not there; run the launcher where "
                                       "topology-agent init has written its files"),
])
def test_bad_input_is_one_line_and_exit_2(files, args, message):
    out, record, _ = files
    result = subprocess.run([sys.executable, "-m", "agent.trainer", "run", "--out", str(out), "--pid-file", "none",
                             *args, "--", "true"], capture_output=True, text=True, timeout=30)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"agent.trainer: {message}")
    assert not record.exists()


def test_no_command_is_a_usage_error():
    result = subprocess.run([sys.executable, "-m", "agent.trainer", "run", "--"], capture_output=True, text=True)
    assert result.returncode == 2 and "no command: give it after --" in result.stderr


def test_apply_env_file_takes_references_from_the_environment_it_builds():
    env = {"USER_RANK": "5"}
    apply_env_file('export RANK="${USER_RANK}"\nexport LITERAL=\'${USER_RANK}\'\n', env)
    assert env == {"USER_RANK": "5", "RANK": "5", "LITERAL": "${USER_RANK}"}


def test_importing_agent_trainer_and_its_launcher_loads_nothing_of_the_agent_or_heavy():
    code = ("import sys, agent.trainer, agent.trainer.launcher, agent.trainer.xgboost; "
            "print(sorted(m for m in sys.modules if m.startswith(('agent.', 'aiohttp', 'urllib3', 'psutil', "
            "'xgboost', 'numpy', 'yaml'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == str(["agent.trainer", "agent.trainer.launcher", "agent.trainer.xgboost"])


def test_trainer_match_on_the_launchers_command_line_finds_the_launcher_not_its_command(files):
    import re

    out, record, procs = files
    procs.append(launch(out, record, "--pid-file", "none"))
    wait_for(lambda: len(starts(record)) == 1, "the first start")
    # This launcher's --out in the pattern: other tests' launchers run beside it, as a pod's would not
    found = TrainerFinder(match=re.compile(r"agent\.trainer run --out " + re.escape(str(out)))).find()
    assert found is not None and found.pid == procs[0].pid
