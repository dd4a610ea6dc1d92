"""Fixtures of the frameworks' end-to-end tests: a network of pods that is always deleted, and the job."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.frameworks.cluster import Job, Network, network_or_skip

_count = itertools.count()


@pytest.fixture
def network() -> Iterator[Network]:
    net = network_or_skip(f"ta{os.getpid()}x{next(_count)}")
    try:
        yield net
    finally:
        net.close()


@pytest.fixture
def make_job(tmp_path, network) -> Iterator[Callable[..., Job]]:
    jobs: list[Job] = []

    def make(frameworks: str, *, tmp: Path | None = None, agent_args: tuple[str, ...] = (), **job: Any) -> Job:
        jobs.append(Job(tmp or tmp_path, network, frameworks, agent_args=agent_args, **job))
        return jobs[-1]

    yield make
    for job in jobs:
        job.close()
