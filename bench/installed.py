"""The agent as an installed copy runs it: its modules compiled to bytecode once, before any process is measured.

``pip install`` (and the image) compile the package; a checkout does not, and where ``PYTHONDONTWRITEBYTECODE``
is set (this machine sets it) every process the benchmark starts would compile the agent again: 0.09-0.16 s of
CPU per init (bench/import_bench.py), a cost no installed agent pays. Compiling writes only ``__pycache__``
(git-ignored); the processes read it whatever the environment says about writing it.
"""

from __future__ import annotations

import compileall
from pathlib import Path

import agent


def compile_agent(package: Path | None = None) -> None:
    """Compile ``package`` (an ``agent`` directory; the imported one by default)."""
    compileall.compile_dir(str(package or Path(agent.__file__).parent), quiet=1)
