"""Keep a process of the same user out of the agent's ``/proc/<pid>``.

A sidecar that signals the trainer runs as the trainer's user (kill(2) across users needs CAP_KILL, which the
agent's containers drop), and with ``shareProcessNamespace`` the trainer sees its pid. Linux lets a process of
the same user, without any capability, read another's ``/proc/<pid>/environ`` and ``mem`` and walk its
``/proc/<pid>/root`` into its container's file system, where the projected ServiceAccount token is. A process
marked non-dumpable (prctl ``PR_SET_DUMPABLE`` 0) passes that check only for a caller with CAP_SYS_PTRACE, and
its ``/proc/<pid>`` files become root's; kill(2) does not look at the mark, so the trainer and the sidecar still
signal each other.

The mark is per process and ``execve`` sets it back, so every agent process that holds a token or key, or whose
``/proc/<pid>/root`` leads to one, sets it for itself at its start: init, the sidecar, the webhook and the
webhook's reviewing process. A process that only reads (``status``, ``render``) does not. Before the mark, the
interpreter's start: the image closes that interval too, as its interpreter cannot be read by the agent's user
and the kernel starts such a program non-dumpable (Dockerfile).
"""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_DUMPABLE = 4  # <linux/prctl.h>


def seal_process() -> str | None:
    """Mark this process non-dumpable. None when done, or where there is no ``/proc/<pid>`` to guard (not
    Linux); else the one line that says it could not be done and what that leaves open."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError) as err:
        return _unsealed(f"no prctl in the C library ({err})")
    if prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        return _unsealed(os.strerror(ctypes.get_errno()))
    return None


def _unsealed(why: str) -> str:
    return (f"could not make the process non-dumpable (prctl PR_SET_DUMPABLE: {why}): a process of the same "
            "user can read its environment and, through /proc/<pid>/root, its token; run the trainer under "
            "another uid than the agent (docs/security.md)")
