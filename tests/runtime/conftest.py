"""The fast lane's fixtures: the sandbox's API in memory, with init and sidecars run in this process over it
(tests/fakeapi.py)."""

from __future__ import annotations

import pytest

from agent.sandbox.memory import Memory
from tests.fakeapi import FakeApi, Inits, Sidecars, capturing


@pytest.fixture
def memory(tmp_path):
    with Memory(tmp_path / "sandbox", bookmark_interval=0.5) as running:
        yield running


@pytest.fixture
def api(memory):
    return FakeApi(memory)


@pytest.fixture
def logs():
    with capturing() as captured:
        yield captured


@pytest.fixture
def inits(api, logs):
    return Inits(api, logs)


@pytest.fixture
async def sidecars(api, logs):
    running = Sidecars(api, logs)
    yield running
    await running.stop_all()
