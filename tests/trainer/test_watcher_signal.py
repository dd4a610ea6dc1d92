"""``TopologyWatcher``'s signal and a system call it lands in: the call goes on (a C library of the trainer's,
XGBoost's collective bootstrap, failed on EINTR when the sidecar's SIGUSR1 came during its recv)."""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import threading
import time

from agent import examples
from agent.core import Options, render_pod
from agent.trainer import TopologyWatcher


def _libc_read_during_a_signal() -> tuple[int, int]:
    """A libc read(2) on a pipe, blocked when SIGUSR1 is sent to this thread, the byte written after it: what the
    call returned and its errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    reader, writer = os.pipe()
    me = threading.get_ident()

    def later() -> None:
        time.sleep(0.2)
        signal.pthread_kill(me, signal.SIGUSR1)
        time.sleep(0.2)
        os.write(writer, b"x")

    thread = threading.Thread(target=later)
    thread.start()
    buffer = ctypes.create_string_buffer(1)
    try:
        got = libc.read(reader, buffer, 1)
        return got, ctypes.get_errno()
    finally:
        thread.join()
        os.close(reader)
        os.close(writer)


def test_the_watchers_signal_does_not_fail_a_system_call_it_lands_in(tmp_path):
    for name, data in render_pod(examples.volcano_job("demo", (("master", 1), ("worker", 1))), "demo-worker-0",
                                 Options()).files.items():
        (tmp_path / name).write_bytes(data)
    before = signal.getsignal(signal.SIGUSR1)
    try:
        signal.signal(signal.SIGUSR1, lambda *_: None)  # a plain Python handler: the call fails on EINTR
        assert _libc_read_during_a_signal() == (-1, errno.EINTR)
        watcher = TopologyWatcher(tmp_path)
        assert _libc_read_during_a_signal()[0] == 1  # restarted, then the byte read
        assert watcher.changed()  # and the handler noted the signal
    finally:
        signal.signal(signal.SIGUSR1, before)


def _socket_read_with_a_timeout_during_a_signal(hold: object = None) -> tuple[int, int]:
    """A libc recv(2) on a socket with a receive timeout (as XGBoost's bootstrap sets), blocked when SIGUSR1 is sent
    to this thread, the byte sent after it: what the call returned and its errno. ``hold``: a watcher whose
    ``held()`` the call runs in."""
    import contextlib
    import socket
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    reader, writer = socket.socketpair()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 5, 0))
    me = threading.get_ident()

    def later() -> None:
        time.sleep(0.2)
        signal.pthread_kill(me, signal.SIGUSR1)
        time.sleep(0.2)
        writer.send(b"x")

    thread = threading.Thread(target=later)
    buffer = ctypes.create_string_buffer(1)
    try:
        with hold.held() if hold is not None else contextlib.nullcontext():  # type: ignore[attr-defined]
            thread.start()
            got = libc.recv(reader.fileno(), buffer, 1, 0)
            return got, ctypes.get_errno()
    finally:
        thread.join()
        reader.close()
        writer.close()


def test_a_socket_read_with_a_timeout_goes_on_only_while_the_watcher_holds_its_signal(tmp_path):
    """SA_RESTART does not restart a socket read that has a timeout (signal(7)): XGBoost's bootstrap forms its group
    with the signal held, and the signal is noted when it returns."""
    for name, data in render_pod(examples.volcano_job("demo", (("master", 1), ("worker", 1))), "demo-worker-0",
                                 Options()).files.items():
        (tmp_path / name).write_bytes(data)
    before = signal.getsignal(signal.SIGUSR1)
    try:
        watcher = TopologyWatcher(tmp_path)
        assert _socket_read_with_a_timeout_during_a_signal() == (-1, errno.EINTR)
        watcher.reload()
        assert _socket_read_with_a_timeout_during_a_signal(watcher)[0] == 1
        assert watcher.signalled.is_set()  # delivered once the block ended
    finally:
        signal.signal(signal.SIGUSR1, before)
