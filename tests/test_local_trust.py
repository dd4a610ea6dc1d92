"""Issue 12, inside the pod: the shared volume and the process namespace are shared with the trainer, whose code
may be hostile. Links are never followed, killed writers leave no keys behind, and the signal goes to the
trainer, never to pid 1, the sidecar itself or a shell wrapper."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from agent.errors import OutputError
from agent.files.writing import TEMP_PREFIX, write_files
from agent.runtime.signalling import TrainerFinder, is_shell_wrapper


def test_a_symlinked_ssh_directory_is_refused_and_nothing_lands_outside(tmp_path):
    out, elsewhere = tmp_path / "shared", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "ssh").symlink_to(elsewhere)
    with pytest.raises(OutputError) as err:
        write_files(out, {"ssh/id_ed25519": b"PRIVATE", "torch.env": b"x"}, private_dirs=("ssh",))
    assert "symbolic link" in str(err.value)
    assert list(elsewhere.iterdir()) == [] and oct(elsewhere.stat().st_mode & 0o777) != "0o700"
    assert not (out / "torch.env").exists()


def test_a_file_replaced_by_a_link_is_replaced_not_followed(tmp_path):
    out = tmp_path / "shared"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (out / "hostfile").symlink_to(victim)
    write_files(out, {"hostfile": b"a slots=1\n"})
    assert victim.read_text() == "keep" and (out / "hostfile").read_bytes() == b"a slots=1\n"
    assert not (out / "hostfile").is_symlink()


def test_temp_files_of_a_killed_writer_are_removed_by_the_next(tmp_path):
    out = tmp_path / "shared"
    (out / "ssh").mkdir(parents=True)
    (out / f"{TEMP_PREFIX}dead1").write_bytes(b"half")
    (out / "ssh" / f"{TEMP_PREFIX}dead2").write_bytes(b"PRIVATE KEY")
    write_files(out, {"ssh/id_ed25519": b"new", "torch.env": b"x"}, private_dirs=("ssh",))
    left = [p.name for p in out.rglob(f"{TEMP_PREFIX}*")]
    assert left == []


@pytest.mark.parametrize("pid", ["1", str(os.getpid()), str(os.getppid())])
def test_a_pid_file_naming_pid_1_or_the_sidecar_or_its_parent_signals_nobody(tmp_path, pid):
    pid_file = tmp_path / "trainer.pid"
    pid_file.write_text(pid)
    assert TrainerFinder(pid_file=pid_file).find() is None


def test_a_pid_file_with_5000_digits_signals_nobody(tmp_path):
    pid_file = tmp_path / "trainer.pid"
    pid_file.write_text("9" * 5000)
    assert TrainerFinder(pid_file=pid_file).find() is None


@pytest.mark.parametrize(("argv", "wrapper"), [
    (["sh", "-c", "torchrun train.py; echo done"], True), (["/bin/bash", "-lc", "torchrun x"], True),
    (["torchrun", "--nproc-per-node", "2", "train.py"], False), (["python3", "-c", "torchrun"], False),
])
def test_shell_wrappers_are_told_apart(argv, wrapper):
    assert is_shell_wrapper(argv) == wrapper


def test_the_match_finds_the_trainer_not_its_sh_c_wrapper(tmp_path):
    marker = f"fake-trainer-{os.getpid()}"
    script = tmp_path / f"{marker}.py"
    script.write_text("import time\ntime.sleep(60)\n")
    wrapper = subprocess.Popen(["sh", "-c", f"{sys.executable} {script}; echo done"])
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(wrapper.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        found = TrainerFinder(match=re.compile(marker)).find()
        assert found is not None, "the trainer matches"
        assert found.pid != wrapper.pid and found.ppid() == wrapper.pid  # the child, not the older wrapper
    finally:
        for child in psutil.Process(wrapper.pid).children(recursive=True):
            child.send_signal(signal.SIGKILL)
        wrapper.kill()
        wrapper.wait(5)


@pytest.mark.parametrize(("argv", "torchrun"), [
    (["/usr/local/bin/torchrun", "--nnodes", "2:3", "train.py"], True),
    (["python3", "-m", "torch.distributed.run", "train.py"], True),
    (["/usr/bin/python3.11", "-m", "torch.distributed.launch", "train.py"], True),
    (["python3", "train.py", "-m", "torch.distributed.run"], False),
    (["python3", "train.py"], False),
    ([], False),
])
def test_torchrun_agents_are_told_apart_from_their_workers(argv, torchrun):
    from agent.runtime.signalling import is_torchrun

    assert is_torchrun(argv) is torchrun


def test_a_trainer_that_is_torchrun_is_never_signalled(tmp_path):
    """torchrun stops on SIGTERM/SIGINT/SIGHUP/SIGQUIT and dies of SIGUSR1: the sidecar's signal would end the job."""
    from agent.runtime.signalling import signal_trainer

    proc = subprocess.Popen(["bash", "-c", "exec -a torchrun sleep 60"])
    try:
        wait_until = time.monotonic() + 5
        while psutil.Process(proc.pid).cmdline()[:1] != ["torchrun"] and time.monotonic() < wait_until:
            time.sleep(0.02)
        pid_file = tmp_path / "trainer.pid"
        pid_file.write_text(str(proc.pid))
        assert signal_trainer(TrainerFinder(pid_file=pid_file), signal.SIGUSR1) == "refused"
        time.sleep(0.2)
        assert proc.poll() is None, "torchrun must still run"
        assert signal_trainer(TrainerFinder(pid_file=pid_file), signal.SIGWINCH) == "sent"  # ignored by default
        time.sleep(0.2)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
