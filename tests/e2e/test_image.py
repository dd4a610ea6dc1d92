"""The agent's image, built from the project's Dockerfile (scripts/image) and run as a kubelet runs the agent's
containers: the user 65532, a read-only root, every capability dropped, no privilege escalation, the memory limit
``inject`` asks for, the shared emptyDir writable through the pod's fsGroup, the service-account token where
Kubernetes mounts it, and the API server (the sandbox, over HTTPS) reached as in-cluster. Host network stands in
for the pod network: the sandbox listens on 127.0.0.1 only.

The files init writes in the image must be those it writes from the source tree for the same pod, byte for byte;
a step that needed a writable root, a file the wheel lacks or a module the image cannot import would fail here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.core.adoption.injection import AGENT_UID, TOKEN_PATH, resources_for
from agent.sandbox.threaded import SandboxThread
from tests.jobs import create_volcano_job

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "image"
TOOLS = ("podman", "buildah", "runc", "mmdebstrap")
FS_GROUP = 2000  # the pod's securityContext.fsGroup: the kubelet gives it to the emptyDir and to every container
POD = "demo-worker-1"
JOB = (("master", 1), ("worker", 2))
LIMIT = resources_for(sum(n for _, n in JOB))["limits"]["memory"]  # what inject gives the agent's containers
assert LIMIT.endswith("Mi")
LIMIT_MIB = int(LIMIT[:-2])


@dataclass(frozen=True)
class Image:
    cache: Path
    name: str

    def podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(SCRIPT), str(self.cache), "podman", *args], capture_output=True, text=True,
                              timeout=timeout)


@pytest.fixture
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: the image is built and run with them "
                    "(apt-get install podman buildah runc mmdebstrap; .ci/run does)")
    if os.geteuid() != 0:
        pytest.skip("building and running the image needs root (podman and buildah as root, mmdebstrap)")
    # CI keeps the base in its temp directory (TOPOLOGY_IMAGE_CACHE); elsewhere each session makes its own.
    cache = Path(os.environ.get("TOPOLOGY_IMAGE_CACHE") or tmp_path_factory.mktemp("image"))
    result = subprocess.run([str(SCRIPT), str(cache), "build"], capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, f"scripts/image build failed:\n{result.stderr[-6000:]}"
    return Image(cache, result.stdout.strip().splitlines()[-1])


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[SandboxThread]:
    with SandboxThread(tmp_path / "sandbox", bookmark_interval=0.5) as running:
        yield running


def pod_volumes(sandbox: SandboxThread, where: Path) -> tuple[Path, list[str]]:
    """The pod's two agent volumes as the kubelet lays them out: the shared emptyDir (group fsGroup, setgid, so
    the agent's files get the group; writable by the group only, so the agent writes through fsGroup alone) and
    the projected token (token, ca.crt, namespace; files 0644)."""
    shared, token = where / "shared", where / "token"
    shared.mkdir()
    os.chown(shared, 0, FS_GROUP)
    shared.chmod(0o2770)
    token.mkdir()
    for name in ("token", "ca.crt", "namespace"):
        shutil.copyfile(sandbox.sandbox.serviceaccount_dir / name, token / name)
        os.chown(token / name, 0, FS_GROUP)
        (token / name).chmod(0o644)
    return shared, ["-v", f"{shared}:/shared", "-v", f"{token}:{TOKEN_PATH}:ro"]


def as_kubelet(sandbox: SandboxThread, volumes: list[str]) -> list[str]:
    """`podman run` options for an agent container of pod POD, as inject writes its securityContext and
    resources and the kubelet applies them."""
    return ["--network", "host", "--user", f"{AGENT_UID}:{AGENT_UID}", "--group-add", str(FS_GROUP),
            "--read-only", "--read-only-tmpfs=false", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--memory", f"{LIMIT_MIB}m", "--memory-swap", f"{LIMIT_MIB}m",
            "-e", f"POD_NAME={POD}", "-e", "POD_NAMESPACE=default",
            "-e", "KUBERNETES_SERVICE_HOST=127.0.0.1", "-e", f"KUBERNETES_SERVICE_PORT={sandbox.sandbox.port}",
            *volumes]


def init_from_the_source_tree(sandbox: SandboxThread, out: Path) -> None:
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": POD, "POD_NAMESPACE": "default"}
    env.pop("KUBECONFIG", None)
    result = subprocess.run([sys.executable, "-m", "agent.cli", "init", "--out", str(out)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_init_then_the_sidecar_run_in_the_image_as_the_kubelet_runs_them(image, sandbox, tmp_path):
    """Init, then the sidecar, in one image built once for the session (scripts/image, a lock on its
    directory)."""
    create_volcano_job(sandbox, JOB)
    shared, volumes = pod_volumes(sandbox, tmp_path)
    options = as_kubelet(sandbox, volumes)
    check_init(image, sandbox, options, shared, tmp_path / "source")
    check_sidecar(image, options, name=f"topology-sidecar-{os.getpid()}-{tmp_path.name}")


def check_init(image: Image, sandbox: SandboxThread, options: list[str], shared: Path, source: Path) -> None:
    """init in the image writes, as the agent's user in the pod's group, what it writes from the source tree."""
    result = image.podman("run", "--rm", *options, image.name, "init", "--out", "/shared")
    assert result.returncode == 0, result.stderr
    assert "node rank 2 of 3" in result.stderr, result.stderr
    assert not re.search(r"^\S+ (WARNING|ERROR) ", result.stderr, re.M), result.stderr

    init_from_the_source_tree(sandbox, source)
    written = files(shared)
    assert written == files(source)
    env = dict(re.findall(r"^export (\w+)='([^']*)'$", written["torch.env"].decode(), re.M))
    assert {k: env[k] for k in ("MASTER_ADDR", "WORLD_SIZE", "NODE_RANK", "TOPOLOGY_ROLE")} == {
        "MASTER_ADDR": "demo-master-0.demo", "WORLD_SIZE": "3", "NODE_RANK": "2", "TOPOLOGY_ROLE": "worker"}
    assert written["hostfile"].decode().splitlines() == [
        "demo-master-0.demo slots=1", "demo-worker-0.demo slots=1", "demo-worker-1.demo slots=1"]
    assert json.loads(written["topology.json"])["self"] == POD
    # Written by the agent's user, in the pod's group (the emptyDir's setgid), readable by the trainer's user.
    for path in shared.iterdir():
        stat = path.stat()
        assert (stat.st_uid, stat.st_gid) == (AGENT_UID, FS_GROUP), path.name
        assert stat.st_mode & 0o044 == 0o044, f"{path.name}: {oct(stat.st_mode)}"


def check_sidecar(image: Image, options: list[str], *, name: str) -> None:
    """The sidecar in the image, after init: ready at init's generation, alive, its environment hidden from its
    own user's other processes, within its memory limit, and gone with exit 0 on SIGTERM."""
    port = free_port()
    started = image.podman("run", "--detach", "--name", name, *options, image.name, "sidecar", "--out", "/shared",
                           "--health-host", "127.0.0.1", "--health-port", str(port))
    assert started.returncode == 0, started.stderr
    try:
        assert wait_for_ready(image, name, port) == "generation 1\n"
        with NO_PROXY.open(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            assert answer.read() == b"ok\n"
        # The agent's processes are non-dumpable (docs/security.md): another process of the same user, in the
        # same container, cannot read the sidecar's environment (it could a dumpable process's: same user).
        peek = image.podman("exec", "--user", f"{AGENT_UID}:{AGENT_UID}", name, "cat", "/proc/1/environ")
        assert peek.returncode != 0 and "Permission denied" in peek.stderr, peek.stdout + peek.stderr
        stopped = image.podman("stop", "--time", "20", name)
        assert stopped.returncode == 0, stopped.stderr
        state = image.podman("inspect", "--format", "{{.State.ExitCode}} {{.State.OOMKilled}} {{.HostConfig.Memory}}",
                             name)
        logs = image.podman("logs", name).stderr
        assert state.stdout.split() == ["0", "false", str(LIMIT_MIB * 2**20)], logs
        assert not re.search(r"^\S+ (WARNING|ERROR) ", logs, re.M), logs
    finally:
        image.podman("rm", "--force", name)


NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def wait_for_ready(image: Image, name: str, port: int, timeout: float = 60) -> str:
    """/readyz's answer once it is 200 (a process in a container: polled); the container's logs if it stops
    first or is not ready in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with NO_PROXY.open(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
                return answer.read().decode()
        except (urllib.error.URLError, ConnectionError):
            running = image.podman("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
            if running != "true":
                pytest.fail(f"the sidecar stopped: {image.podman('logs', name).stderr[-4000:]}")
            time.sleep(0.3)
    pytest.fail(f"not ready within {timeout} s: {image.podman('logs', name).stderr[-4000:]}")
