"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def home_tmp() -> Iterator[Path]:
    """A temporary directory under $HOME: sshd's StrictModes refuses keys below a world-writable directory, and
    /tmp is one."""
    base = Path(tempfile.mkdtemp(prefix="topology-e2e-", dir=Path.home()))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)
