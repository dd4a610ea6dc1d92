from __future__ import annotations

import gc
import os
from collections.abc import Generator
from typing import Any

import pytest

from agent.core import Options, Rendered, render_pod
from agent.sandbox.memory import Memory
from tests.fakeapi import FakeApi, Inits, Sidecars, capturing


def env_of(rendered: Rendered) -> dict[str, str]:
    """The variables ``torch.env`` exports (unset ones excluded)."""
    return {v.name: v.value for v in rendered.variables if v.written and not v.unset}


def render(pods: list[dict[str, Any]], self_name: str, **options: Any) -> Rendered:
    return render_pod(pods, self_name, Options(**options))


# CI sets TOPOLOGY_TESTS_REQUIRE_ALL=1: every tool a test needs is installed there, so a skip would hide a test
# that did not run. Locally a missing tool still skips, with the reason.
REQUIRE_ALL = os.environ.get("TOPOLOGY_TESTS_REQUIRE_ALL") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_ALL and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped where every test must run (TOPOLOGY_TESTS_REQUIRE_ALL=1): {reason}"


LANES = {"integration": "sandbox", "e2e": "e2e"}  # a test's folder -> its lane's marker


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test of tests/integration is marked ``sandbox`` and each of tests/e2e ``e2e``, by its folder, so a
    lane is chosen by marker (scripts/test --fast: ``-m "not sandbox and not e2e and not slow"``)."""
    root = config.rootpath / "tests"
    for item in items:
        parts = item.path.relative_to(root).parts if item.path.is_relative_to(root) else ()
        lane = LANES.get(parts[0]) if parts else None
        if lane is not None:
            item.add_marker(lane)



class XdistGroups:
    """Under ``--dist loadgroup`` the tests of one ``xdist_group`` run on one worker, one at a time (those that
    measure time or drive the consumers): xdist tells its scheduler by a ``@<group>`` suffix of the node id,
    which it writes into ``item._nodeid``; pytest 9.2 makes the node id from ``item._id``, so it is set there."""

    @pytest.hookimpl(trylast=True)  # after xdist's own hook
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if not getattr(config.option, "loadgroup", False):
            return
        from _pytest.nodeid import NodeId

        for item in items:
            groups = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                             for mark in item.iter_markers("xdist_group")})
            if groups and "@" not in item.nodeid:
                item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(groups)}")


class SpreadModules:
    """``--spread-modules`` (scripts/test --fast): each module's tests in turn with every other module's, spread
    evenly over the run, instead of one module after the other. The fast lane's waits (leases, deadlines,
    backoffs) are in a few modules of tests/runtime, so in collection order every worker reached them at once
    and the cores sat idle, then queued behind tests/core's property tests; spread, a worker's wait overlaps
    the others' work. The order is the same in every worker (xdist requires it): a module's i-th of n tests
    comes at (i + 1/2) / n of the run."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        modules: dict[object, list[pytest.Item]] = {}
        for item in items:
            modules.setdefault(item.path, []).append(item)
        at = {id(item): (k + 0.5) / len(tests) for tests in modules.values() for k, item in enumerate(tests)}
        items.sort(key=lambda item: at[id(item)])  # stable: ties keep the collection order


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--spread-modules", action="store_true",
                     help="run each module's tests spread evenly over the run (scripts/test --fast)")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(XdistGroups(), "xdist-groups")
    if config.getoption("spread_modules"):
        config.pluginmanager.register(SpreadModules(), "spread-modules")


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection made (every test module, its tables and ~3000 items) lives for the whole session and
    is never garbage: it is frozen out of the cyclic collector's passes, as the sidecar freezes the pods it
    holds (runtime/memory.freeze). Otherwise each full pass walks it again: half of the collector's time in a
    worker of the fast lane, most of it under the property tests."""
    gc.collect()
    gc.freeze()

# --- the fast lane's fixtures: the sandbox's API in memory, with init and sidecars in this process over it
# (tests/fakeapi.py)

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
