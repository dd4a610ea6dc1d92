"""Trust inside the pod: the shared volume and the process namespace are shared with the trainer, whose code
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


@pytest.mark.parametrize("which", ["pid 1", "the sidecar", "its parent"])  # ids the same in every xdist worker
def test_a_pid_file_naming_pid_1_or_the_sidecar_or_its_parent_signals_nobody(tmp_path, which):
    pid = {"pid 1": "1", "the sidecar": str(os.getpid()), "its parent": str(os.getppid())}[which]
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


# Files in the shared directory are the trainer's to write, and are read as such.

def _in_thread(fn, seconds: float = 10.0):
    """fn's result, or AssertionError when it blocks (a FIFO read with no writer never returns)."""
    import threading

    result: list = []
    thread = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked on a file the trainer made"
    return result[0]


def test_a_pid_file_that_is_a_fifo_or_a_link_to_dev_zero_is_refused_at_once(tmp_path, caplog):
    fifo = tmp_path / "trainer.pid"
    os.mkfifo(fifo)
    assert _in_thread(TrainerFinder(pid_file=fifo).find) is None
    assert "not a regular file" in caplog.text
    link = tmp_path / "zero.pid"
    link.symlink_to("/dev/zero")
    assert _in_thread(TrainerFinder(pid_file=link).find) is None
    assert "symbolic link" in caplog.text
    big = tmp_path / "big.pid"
    big.write_bytes(b"1" * 100_000)
    assert TrainerFinder(pid_file=big).find() is None


def test_a_pid_file_may_name_only_a_process_the_trainer_match_names_too(tmp_path, caplog):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pid_file = tmp_path / "trainer.pid"
        pid_file.write_text(str(other.pid))
        assert TrainerFinder(pid_file=pid_file).find().pid == other.pid  # alone, the file decides
        finder = TrainerFinder(pid_file=pid_file, match=re.compile(r"train\.py"))
        assert finder.find() is None  # same user, not the trainer: not signalled
        assert "does not match --trainer-match" in caplog.text
        assert TrainerFinder(pid_file=pid_file, match=re.compile("time.sleep")).find().pid == other.pid
    finally:
        other.kill()
        other.wait()


def _evaluator(out):
    from types import SimpleNamespace

    from agent.flags.common import options_from_args
    from agent.flags.parser import build_parser
    from agent.runtime.metrics import SidecarMetrics
    from agent.runtime.sidecar.evaluating import Evaluator

    options = options_from_args(build_parser().parse_args(["render", "--pods", "-"]))
    settings = SimpleNamespace(options=options, pod_name="demo-worker-0", out_dir=out)
    return Evaluator(settings, SidecarMetrics())


@pytest.mark.parametrize("content", [b"[]", b'{"generation": Infinity}', b'{"generation": "1.5"}',
                                     b'{"generation": 1e400}', b'{"generation": -1}', b'{"generation": true}',
                                     b"[" * 100_000, b"\xff\xfe"])
def test_a_previous_topology_json_the_trainer_spoiled_starts_from_zero_with_one_line(tmp_path, caplog, content):
    (tmp_path / "topology.json").write_bytes(content)
    evaluator = _evaluator(tmp_path)
    evaluator.load_previous()
    assert evaluator.generation == 0 and evaluator.document is None
    assert "cannot be continued from" in caplog.text


def test_a_previous_topology_json_that_is_a_fifo_does_not_hang_the_sidecar(tmp_path, caplog):
    os.mkfifo(tmp_path / "topology.json")
    evaluator = _evaluator(tmp_path)
    _in_thread(lambda: evaluator.load_previous())
    assert evaluator.generation == 0 and "not a regular file" in caplog.text


def test_a_generation_marker_left_behind_by_a_kill_is_repaired_at_start(tmp_path, caplog):
    import json

    from agent import examples
    from agent.core import render_pod
    from agent.flags.common import options_from_args
    from agent.flags.parser import build_parser

    pods = examples.volcano_job("demo", (("master", 1), ("worker", 2)))
    options = options_from_args(build_parser().parse_args(["render", "--pods", "-"]))
    files = render_pod(pods, "demo-worker-0", options, generation=2).files
    (tmp_path / "topology.json").write_bytes(files["topology.json"])
    (tmp_path / "generation").write_text("1\n")  # killed between the two renames of generation 2
    caplog.set_level("INFO")
    evaluator = _evaluator(tmp_path)
    evaluator.load_previous()
    assert evaluator.generation == 2 == json.loads(files["topology.json"])["generation"]
    assert (tmp_path / "generation").read_text() == "2\n" and "repaired to 2" in caplog.text


def test_a_sidecar_continuing_from_inits_files_tells_a_changed_membership_by_the_digest_it_read_back(tmp_path):
    import json

    from agent import examples
    from agent.core import render_pod
    from agent.core.files.rendering import KeyDigest
    from agent.flags.common import options_from_args
    from agent.flags.parser import build_parser

    pods = examples.volcano_job("demo", (("master", 1), ("worker", 3)))
    by_name = {p["metadata"]["name"]: p for p in pods}
    options = options_from_args(build_parser().parse_args(["render", "--pods", "-"]))
    init_files = render_pod(pods, "demo-worker-0", options, generation=3).files
    (tmp_path / "topology.json").write_bytes(init_files["topology.json"])
    same, moved = _evaluator(tmp_path), _evaluator(tmp_path)
    for evaluator in (same, moved):
        evaluator.settings.ssh, evaluator.settings.finder, evaluator.settings.signal = None, None, None
        evaluator.load_previous()
        assert isinstance(evaluator.in_place.key, KeyDigest)  # not a copy of every member's strings
    same.evaluate(0.0, pods=by_name, light=None, nodes={}, note="start")
    assert same.generation == 3 and not isinstance(same.in_place.key, KeyDigest)  # the plan's own key from now on
    worker = json.loads(json.dumps(by_name["demo-worker-2"]))
    worker["spec"]["hostname"] = "elsewhere"
    moved.evaluate(0.0, pods={**by_name, "demo-worker-2": worker}, light=None, nodes={}, note="start")
    assert moved.generation == 4


def _as_user(uid: int):
    def drop() -> None:
        os.setgid(uid)
        os.setgroups([])
        os.setuid(uid)

    return drop


def _signal_as(uid: int, pattern: str) -> tuple[str, str]:
    """signal_trainer run in a child process that has become ``uid`` (the sidecar's user): (result, log)."""
    import io
    import logging
    import warnings

    from agent.runtime.signalling import signal_trainer

    read, write = os.pipe()
    with warnings.catch_warnings():  # 3.12+ warns of fork in a threaded process; the child only signals and exits
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: drop to uid, signal, report, leave without running pytest's teardown
        try:
            os.close(read)
            _as_user(uid)()
            stream = io.StringIO()
            handler = logging.StreamHandler(stream)
            logging.getLogger("topology_agent").addHandler(handler)
            logging.getLogger().addHandler(handler)
            result = signal_trainer(TrainerFinder(match=re.compile(pattern)), signal.SIGUSR1)
            os.write(write, f"{result}\n{stream.getvalue()}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        out = pipe.read()
    os.waitpid(pid, 0)
    result, _, log = out.partition("\n")
    return result, log


def test_the_shipped_users_signal_only_when_the_sidecar_runs_as_the_trainer_and_the_log_says_why():
    """Agent 65532 and trainer 10001 with no capability cannot signal (EPERM), and the line says
    why; the sidecar run as the trainer's user (as inject writes it when a trainer is named) can."""
    if os.geteuid() != 0:
        pytest.skip("switching users needs root (CI runs as root)")
    duration = f"61.{os.getpid()}{time.time_ns() % 10**6}"  # the trainer's unique command line
    trainer = subprocess.Popen(["/bin/sleep", duration], preexec_fn=_as_user(10001))
    try:
        time.sleep(0.2)
        result, log = _signal_as(65532, re.escape(duration))
        assert result == "failed", log
        assert (f"could not signal trainer pid {trainer.pid}: permission denied: the trainer runs as uid 10001, the "
                "sidecar as uid 65532 with no CAP_KILL") in log
        assert trainer.poll() is None
        result, log = _signal_as(10001, re.escape(duration))
        assert result == "sent", log
        assert trainer.wait(10) == -signal.SIGUSR1
    finally:
        trainer.kill()
        trainer.wait()


def test_inject_runs_a_signalling_sidecar_as_the_trainer_in_a_shared_process_namespace():
    from agent import __version__
    from agent.core.adoption.injection import PREFIX, SIDECAR, Settings, inject_document
    from agent.errors import InputError

    def job(**spec):
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "annotations": {
            PREFIX + "elastic": "2:4", PREFIX + "trainer-match": "train.py"}},
            "spec": {"template": {"spec": {"containers": [{"name": "t", "image": "t", "securityContext": {
                "runAsUser": 10001, "runAsGroup": 10001}}], **spec}}}}

    doc = job(shareProcessNamespace=True)
    inject_document(doc, Settings(), version=__version__)
    sidecar = next(c for c in doc["spec"]["template"]["spec"]["initContainers"] if c["name"] == SIDECAR)
    context = sidecar["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"]) == (10001, 10001)
    assert context["capabilities"] == {"drop": ["ALL"]} and context["allowPrivilegeEscalation"] is False
    with pytest.raises(InputError, match=re.escape("set spec.shareProcessNamespace: true")):
        inject_document(job(), Settings(), version=__version__)
    quiet = job(shareProcessNamespace=True)
    quiet["metadata"]["annotations"][PREFIX + "signal"] = "none"
    inject_document(quiet, Settings(), version=__version__)
    sidecar = next(c for c in quiet["spec"]["template"]["spec"]["initContainers"] if c["name"] == SIDECAR)
    assert sidecar["securityContext"]["runAsUser"] == 65532  # signals nobody: stays the agent's user


def test_a_sidecar_that_continues_from_the_files_in_place_lets_go_of_the_key_it_read_back(tmp_path):
    """The membership key read back from topology.json is held as its digest (every member's strings would be
    ~5 MB at 16384 pods): once a plan says the same membership, the plan's own key is held instead, and nothing
    is rewritten."""
    from agent import examples
    from agent.core.files.rendering import KeyDigest, key_digest

    def sidecars_evaluator():  # type: ignore[no-untyped-def]
        made = _evaluator(tmp_path)
        made.settings.ssh, made.settings.finder, made.settings.signal = None, None, None
        return made

    pods = {p["metadata"]["name"]: p for p in examples.volcano_job("demo", (("master", 1), ("worker", 3)))}
    sidecars_evaluator().evaluate(0.0, pods=pods, light=None, nodes={}, note="")
    written = (tmp_path / "topology.json").read_bytes()
    evaluator = sidecars_evaluator()
    evaluator.load_previous()
    read_back = evaluator.in_place.key
    assert evaluator.generation == 1 and read_back is not None
    evaluator.evaluate(0.0, pods=pods, light=None, nodes={}, note="")
    assert evaluator.generation == 1 and (tmp_path / "topology.json").read_bytes() == written
    assert isinstance(read_back, KeyDigest) and key_digest(evaluator.in_place.key) == read_back  # none of its
    assert not isinstance(evaluator.in_place.key, KeyDigest)  # strings held: from now on the plan's own key
