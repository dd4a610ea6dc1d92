"""A process of the agent's own user and no capability (the trainer beside a sidecar that signals it) cannot read
the agent's ``/proc/<pid>/environ`` or walk its ``/proc/<pid>/root`` to the token; signals pass both ways.

Root with CAP_SYS_PTRACE passes every such check, so each reader here has no capability: the user 65532 (the
image's) when the tests run as root, else the tests' own user."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.runtime.sealing import seal_process

PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
LINUX_CAPABILITY_VERSION_3 = 0x20080522
IS_ROOT = os.geteuid() == 0
USER = 65532 if IS_ROOT else os.geteuid()
SECRET = "token-that-only-the-agent-may-read"

_libc = ctypes.CDLL(None, use_errno=True)


def _become_user() -> None:
    """This forked child becomes USER as a process started by that user is: dumpable (a setuid leaves it not)."""
    if IS_ROOT:
        os.setgid(USER)
        os.setgroups([])
        os.setuid(USER)
    _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)


def _drop_capabilities() -> None:
    """This root process keeps uid 0 and loses every capability, and so does any program it starts: the same
    user and no capability, where the interpreter lives under a directory only root may enter."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP {cap}")
    header = ctypes.create_string_buffer(struct.pack("Ii", LINUX_CAPABILITY_VERSION_3, 0))
    if _libc.capset(header, ctypes.create_string_buffer(24)) != 0:  # v3: effective, permitted, inheritable x 2
        raise OSError(ctypes.get_errno(), "capset")


def _in_child(become: Callable[[], None], work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``work`` in a forked child that has first run ``become``: what it returned."""
    read, write = os.pipe()
    with warnings.catch_warnings():  # 3.12+ warns of fork in a threaded process; the child only probes and exits
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            become()
            outcome = work()
        except BaseException as err:  # reported to the test, which fails on it
            outcome = {"error": f"{type(err).__name__}: {err}"}
        finally:
            with contextlib.suppress(BaseException):
                os.write(write, json.dumps(outcome).encode())
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(text)


def _doors(pid: int, token: Path) -> dict[str, Any]:
    """What a reader gets through each door of ``/proc/<pid>`` that leads to the token or the environment."""
    def environ() -> object:
        return Path(f"/proc/{pid}/environ").read_bytes().count(b"\0") > 0

    def root() -> object:
        return sorted(os.listdir(f"/proc/{pid}/root{token.parent}"))

    def token_file() -> object:
        return Path(f"/proc/{pid}/root{token}").read_text().strip()

    def cwd() -> object:
        return len(os.listdir(f"/proc/{pid}/cwd")) >= 0

    def mem() -> object:
        with open(f"/proc/{pid}/mem", "rb"):
            return True

    seen: dict[str, Any] = {}
    for name, door in (("environ", environ), ("root", root), ("token", token_file), ("cwd", cwd), ("mem", mem)):
        try:
            seen[name] = door()
        except PermissionError:
            seen[name] = "denied"
        except OSError as err:
            seen[name] = f"{type(err).__name__}: {err}"
    return seen


DENIED = dict.fromkeys(("environ", "root", "token", "cwd", "mem"), "denied")


def _signal_and_wait_back(pid: int) -> dict[str, Any]:
    """SIGUSR1 to ``pid``, then wait for its SIGUSR1 back."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    os.kill(pid, signal.SIGUSR1)
    back = signal.sigtimedwait({signal.SIGUSR1}, 20)
    return {"back": back is not None and back.si_pid == pid}


def _private_token(where: Path) -> Path:
    """A token only USER may read, as the agent's container holds it (``where`` is a new directory under /tmp,
    so the reader can walk to it)."""
    token = where / "token"
    token.write_text(SECRET + "\n")
    token.chmod(0o600)
    if IS_ROOT:
        os.chown(where, USER, USER)
        os.chown(token, USER, USER)
    return token


@pytest.fixture
def serviceaccount():
    with tempfile.TemporaryDirectory() as where:
        yield Path(where)


def test_sealing_shuts_the_same_users_proc_doors_and_signals_pass_both_ways(serviceaccount):
    token = _private_token(serviceaccount)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        agent = os.fork()
    if agent == 0:  # the agent's process: its user's, dumpable, until it seals itself when told
        try:
            os.close(ready_r)
            os.close(go_w)
            _become_user()
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
            os.write(ready_w, b"1")
            if os.read(go_r, 1) == b"s":
                unsealed = seal_process()
                os.write(ready_w, b"2" if unsealed is None else b"!")
                got = signal.sigtimedwait({signal.SIGUSR1}, 20)
                if got is not None:
                    os.write(ready_w, b"U")
                    os.kill(got.si_pid, signal.SIGUSR1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(go_r)
    try:
        assert os.read(ready_r, 1) == b"1"
        open_doors = _in_child(_become_user, lambda: _doors(agent, token))
        # The check works here: before the seal the same user reads all of it.
        assert open_doors["environ"] is True and open_doors["mem"] is True, open_doors
        assert open_doors["root"] == ["token"] and open_doors["token"] == SECRET, open_doors

        os.write(go_w, b"s")
        assert os.read(ready_r, 1) == b"2"
        assert _in_child(_become_user, lambda: _doors(agent, token)) == DENIED
        assert _in_child(_become_user, lambda: _signal_and_wait_back(agent)) == {"back": True}
        assert os.read(ready_r, 1) == b"U"
    finally:
        os.close(go_w)
        os.close(ready_r)
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent, signal.SIGKILL)
        os.waitpid(agent, 0)


# --- each process of the agent that holds a token seals itself -----------------------------------------------


def _as_the_same_user_without_capabilities() -> None:
    if IS_ROOT:
        _drop_capabilities()


def _line_with(stream: Any, text: bytes, timeout: float) -> bytes:
    """The first line of ``stream`` that holds ``text``, read within ``timeout`` (lines before it are passed)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([stream], [], [], left)
        line = stream.readline() if ready else b""
        if text in line:
            return line
        assert not ready or line, f"the stream ended before a line with {text!r}"
    raise AssertionError(f"no line with {text!r} within {timeout} s")


def _answers(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing answers on port {port}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tls_pair(tls: Path) -> None:
    import datetime

    from agent.runtime.webhook import certs

    pair, _ = certs.renew(None, ["127.0.0.1"], datetime.datetime.now(datetime.UTC))
    tls.mkdir()
    (tls / "tls.crt").write_bytes(pair.cert)
    (tls / "tls.key").write_bytes(pair.key)


@pytest.mark.slow  # a real agent process each
@pytest.mark.parametrize("command", ["init", "sidecar", "webhook", "webhook's reviewer"])
def test_every_agent_process_that_holds_a_token_is_sealed_once_it_runs(command, tmp_path):
    """Each started as it is in a pod (``python -m agent.cli``; the reviewer as the webhook starts it), the API
    server refusing so that it stays up. Under root the process and its reader are uid 0 with no capability: the
    same user without CAP_SYS_PTRACE (the tests' interpreter may sit where 65532 cannot run it)."""
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(SECRET + "\n")
    (sa / "namespace").write_text("default\n")
    refusing = socket.socket()  # bound, never listening: the API server refuses, and init and the sidecar retry
    refusing.bind(("127.0.0.1", 0))
    env = {**os.environ, "KUBERNETES_SERVICE_HOST": "127.0.0.1",
           "KUBERNETES_SERVICE_PORT": str(refusing.getsockname()[1]), "TOPOLOGY_SERVICEACCOUNT_DIR": str(sa),
           "POD_NAME": "demo-worker-0", "POD_NAMESPACE": "default"}
    env.pop("KUBECONFIG", None)
    port = _free_port()
    argv = {"init": ["-m", "agent.cli", "init", "--out", str(tmp_path / "out")],
            "sidecar": ["-m", "agent.cli", "sidecar", "--out", str(tmp_path / "out"), "--health-port", "0"],
            "webhook": ["-m", "agent.cli", "webhook", "--host", "127.0.0.1", "--port", str(port),
                        "--tls-dir", str(tmp_path / "tls")],
            "webhook's reviewer": ["-m", "agent.runtime.webhook.reviewing"]}[command]
    if command == "webhook":
        _tls_pair(tmp_path / "tls")
    proc = subprocess.Popen([sys.executable, *argv], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=False, preexec_fn=_as_the_same_user_without_capabilities)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        # Each is past its start when: init and the sidecar say that the API server is unreachable, the webhook
        # answers on its port, the reviewer answers a message that is not a review.
        if command in ("init", "sidecar"):
            assert b"unreachable" in _line_with(proc.stderr, b"unreachable", 60)
        elif command == "webhook":
            _answers(port, 60)
        else:
            proc.stdin.write(struct.pack(">cI", b"R", 2) + b"{}")
            proc.stdin.flush()
            assert select.select([proc.stdout], [], [], 60)[0], "the reviewer did not answer"
            assert proc.stdout.read(1) == b"E"
        assert proc.poll() is None
        if IS_ROOT:  # the premise: the agent's process has no capability
            assert "CapEff:\t0000000000000000\n" in Path(f"/proc/{proc.pid}/status").read_text()
        assert _in_child(_as_the_same_user_without_capabilities, lambda: _doors(proc.pid, sa / "token")) == DENIED
        os.kill(proc.pid, 0)  # and its own user may still signal it
    finally:
        refusing.close()
        proc.kill()
        proc.communicate(timeout=30)
