"""Finding the trainer process in the pod's shared process namespace and signalling it.

The pod must set ``shareProcessNamespace: true`` for the sidecar to see the trainer. The trainer is named by a
pid file (the most exact) or by a regular expression over its command line; of several matches the oldest is
signalled: that is the launcher (torchrun's agent, deepspeed, mpirun), not one of its workers.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

import psutil

from agent.core.model import is_whole_number
from agent.errors import InputError

log = logging.getLogger("topology_agent.signal")


def parse_signal(name: str | None, *, label: str = "--signal") -> signal.Signals | None:
    """``SIGUSR1``, ``USR1``, ``10`` or ``none``."""
    if name is None or name.lower() == "none":
        return None
    text = name.upper()
    try:
        if is_whole_number(text) and len(text) <= 3:
            return signal.Signals(int(text))
        return signal.Signals[text if text.startswith("SIG") else f"SIG{text}"]
    except (KeyError, ValueError):
        raise InputError(f"{label} '{name}' is not a signal; use a name like SIGUSR1, or none") from None


@dataclass(frozen=True)
class TrainerFinder:
    pid_file: Path | None = None
    match: re.Pattern[str] | None = None

    def find(self) -> psutil.Process | None:
        if self.pid_file is not None:
            try:
                pid = int(self.pid_file.read_text().strip())
                return psutil.Process(pid)
            except (OSError, ValueError, psutil.Error):
                return None
        if self.match is None:
            return None
        me = os.getpid()
        candidates = []
        for proc in psutil.process_iter(["pid", "cmdline", "create_time"]):
            try:
                cmdline = " ".join(proc.info["cmdline"] or [])
            except (psutil.Error, KeyError):
                continue
            if proc.info["pid"] != me and cmdline and self.match.search(cmdline):
                candidates.append(proc)
        if not candidates:
            return None
        return min(candidates, key=lambda p: (p.info["create_time"], p.info["pid"]))


def signal_trainer(finder: TrainerFinder, signum: signal.Signals | None) -> str:
    """Send ``signum``; return what happened, for the log and the metrics label."""
    if signum is None:
        return "disabled"
    proc = finder.find()
    if proc is None:
        log.warning("no trainer process found (pid file %s, match %s): files rewritten, nobody signalled; "
                    "is shareProcessNamespace: true set on the pod?", finder.pid_file,
                    finder.match.pattern if finder.match else None)
        return "no_trainer"
    try:
        proc.send_signal(signum)
    except psutil.Error as err:
        log.warning("could not signal trainer pid %s: %s", proc.pid, err)
        return "failed"
    log.info("sent %s to trainer pid %d", signum.name, proc.pid)
    return "sent"
