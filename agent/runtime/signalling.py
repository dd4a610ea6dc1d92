"""Finding the trainer process in the pod's shared process namespace and signalling it.

The pod must set ``shareProcessNamespace: true`` for the sidecar to see the trainer. The trainer is named by a
pid file (the most exact) or by a regular expression over its command line; of several matches the oldest is
signalled: that is the launcher (torchrun's agent, deepspeed, mpirun), not one of its workers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

import psutil

from agent.core.model import is_whole_number
from agent.files.reading import Unreadable, read_untrusted

log = logging.getLogger("topology_agent.signal")

PID_FILE_LIMIT = 64  # a pid and a newline; anything longer is not a pid file


@dataclass(frozen=True)
class TrainerFinder:
    pid_file: Path | None = None
    match: re.Pattern[str] | None = None

    def find(self) -> psutil.Process | None:
        if self.pid_file is not None:
            try:
                text = read_untrusted(self.pid_file, PID_FILE_LIMIT).decode("ascii").strip()
                pid = int(text) if is_whole_number(text) and len(text) <= 10 else -1
                proc = psutil.Process(pid) if pid > 0 else None
            except Unreadable as err:
                log.warning("%s; nobody signalled", err)
                return None
            except (OSError, ValueError, psutil.Error):
                return None
            if proc is None or pid in _untouchable():
                # The pid file is written by the trainer's side: pid 1 (the pod's pause process or init), the
                # sidecar itself or its parents are never signalled, whatever it says.
                log.warning("pid file %s names pid %s, which is not a trainer; nobody signalled", self.pid_file,
                            text[:20])
                return None
            if self.match is not None:
                # Both given: the pid file may name only a process the pattern also names (the file is the
                # trainer's to write, and so is any other process of its user's it could name).
                try:
                    cmdline = " ".join(proc.cmdline())
                except psutil.Error:
                    return None
                if not self.match.search(cmdline):
                    log.warning("pid file %s names pid %d, whose command line does not match --trainer-match %r; "
                                "nobody signalled", self.pid_file, pid, self.match.pattern)
                    return None
            return proc
        if self.match is None:
            return None
        untouchable = _untouchable()
        candidates = []
        for proc in psutil.process_iter(["pid", "cmdline", "create_time"]):
            try:
                argv = list(proc.info["cmdline"] or [])
            except (psutil.Error, KeyError):
                continue
            cmdline = " ".join(argv)
            if proc.info["pid"] not in untouchable and cmdline and self.match.search(cmdline) \
                    and not is_shell_wrapper(argv):
                candidates.append(proc)
        if not candidates:
            return None
        return min(candidates, key=lambda p: (p.info["create_time"], p.info["pid"]))


_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ash", "ksh"})


def is_shell_wrapper(argv: list[str]) -> bool:
    """``sh -c "... torchrun ..."``: the pattern matches the wrapper's command line too, and it is the oldest
    match, but a signal to the shell kills it or is ignored, never reaching the trainer (use exec)."""
    return len(argv) >= 2 and os.path.basename(argv[0]) in _SHELLS and argv[1].startswith("-") and "c" in argv[1]


def _untouchable() -> set[int]:
    """Pid 1, this process and its ancestors: never the trainer, whatever a pid file or a pattern says."""
    pids = {1, os.getpid()}
    with contextlib.suppress(psutil.Error):
        pids |= {p.pid for p in psutil.Process().parents()}
    return pids


# Signals whose default action is to do nothing: the only ones a process that does not handle them survives.
_HARMLESS = frozenset({signal.SIGCHLD, signal.SIGCONT, signal.SIGURG, signal.SIGWINCH})


def is_torchrun(argv: list[str]) -> bool:
    """torchrun's elastic agent (``torchrun``, ``python -m torch.distributed.run`` or ``.launch``): it handles
    SIGTERM, SIGINT, SIGHUP and SIGQUIT by stopping its workers and exiting (TORCHELASTIC_SIGNALS_TO_HANDLE in
    torch/distributed/elastic/multiprocessing/api.py), and dies of the rest."""
    if not argv:
        return False
    if os.path.basename(argv[0]) == "torchrun":
        return True
    return any(a in ("torch.distributed.run", "torch.distributed.launch") for a in argv[1:3]) and "-m" in argv[1:3]


def signal_trainer(finder: TrainerFinder, signum: signal.Signals | None) -> str:
    """Send ``signum``; return what happened, for the log and the metrics label."""
    if signum is None:
        return "disabled"
    proc = finder.find()
    if proc is None:
        named = f"--trainer-pid-file {finder.pid_file}" if finder.pid_file is not None else \
            f"--trainer-match {finder.match.pattern if finder.match else ''!r}"
        log.warning("no process matches %s: files rewritten, nobody signalled (is the trainer running, and does "
                    "the pod set shareProcessNamespace: true?)", named)
        return "no_trainer"
    try:
        argv = proc.cmdline()
    except psutil.Error:
        argv = []
    if is_torchrun(argv) and signum not in _HARMLESS:
        log.warning("trainer pid %d is torchrun, which %s would end (torchrun stops on SIGTERM, SIGINT, SIGHUP and "
                    "SIGQUIT, and dies of the rest): not signalled; torchrun's rendezvous follows the members "
                    "itself (use --signal none), or name the training script's own process", proc.pid, signum.name)
        return "refused"
    try:
        proc.send_signal(signum)
    except psutil.AccessDenied:
        try:
            trainer_uid: object = proc.uids().real
        except psutil.Error:
            trainer_uid = "?"
        log.warning("could not signal trainer pid %d: permission denied: the trainer runs as uid %s, the sidecar as "
                    "uid %d with no CAP_KILL; run the sidecar as the trainer's user (securityContext.runAsUser: %s "
                    "on the sidecar; inject does so when a trainer is named, docs/sidecar.md)", proc.pid,
                    trainer_uid, os.geteuid(), trainer_uid)
        return "failed"
    except psutil.Error as err:
        log.warning("could not signal trainer pid %s: %s", proc.pid, err)
        return "failed"
    log.info("sent %s to trainer pid %d", signum.name, proc.pid)
    return "sent"
