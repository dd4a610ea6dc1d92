"""The test lanes: a skip fails CI (TOPOLOGY_TESTS_REQUIRE_ALL=1) in xdist's workers too, and every test of
tests/integration and tests/e2e carries its lane's marker, so ``scripts/test --fast`` leaves them out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_skip_fails_in_every_worker_when_every_test_must_run(tmp_path):
    (tmp_path / "test_skip.py").write_text("import pytest\n\n\ndef test_skips():\n    pytest.skip('no tool')\n\n\n"
                                           "def test_passes():\n    pass\n")
    env = {**os.environ, "TOPOLOGY_TESTS_REQUIRE_ALL": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                          "-n", "2", "--rootdir", str(tmp_path), str(tmp_path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed, 1 passed" in run.stdout and "skipped where every test must run" in run.stdout, run.stdout


@pytest.mark.slow
def test_the_fast_lane_selects_no_test_of_tests_integration_or_tests_e2e():
    fast = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co", "-m",
                           "not sandbox and not e2e", "tests/integration", "tests/e2e"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert fast.returncode == 5 and "deselected" in fast.stdout, fast.stdout  # 5: none selected
    every = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co", "-m",
                            "sandbox or e2e", "tests/integration", "tests/e2e"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert every.returncode == 0 and "deselected" not in every.stdout, every.stdout
