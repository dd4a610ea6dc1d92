"""A job of pods, each with its own address, for the frameworks' end-to-end tests.

Each pod is a network namespace created here (``ip netns``), joined by veth pairs to a bridge in a namespace of
its own, with an address in 10.99.0.0/24 and its own loopback: the same ports on every pod, as in a cluster. The
agent's processes (init, sidecar) run in the root namespace and reach the sandbox API server on 127.0.0.1; the
pod's IP reaches the agent through the pod's status, as the kubelet reports it. The trainer's processes run in
the pod's namespace (``pod_exec.py``: its hostname resolves to its IP) with nothing in their environment but PATH,
HOME and PYTHONPATH (to import ``agent.trainer``): every framework variable comes from the agent's files.

No address outside these namespaces and loopback is used; every namespace is deleted when the test ends.

The job is an elastic PyTorchJob (minReplicas 2, maxReplicas 3) whose pods select the framework with
``--frameworks``: ``JOB_KIND`` and ``make_pods`` are the one place that changes when the framework's own
controller (TFJob, XGBoostJob, ...) is used instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent import examples
from agent.sandbox.threaded import SandboxThread

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SUBNET = "10.99.0"
JOB = "fw"
JOB_KIND = "PyTorchJob"


def run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")


@dataclass
class Network:
    """A bridge namespace and one namespace per pod; ``close`` deletes them all (and so their links)."""

    tag: str
    namespaces: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.hub = f"{self.tag}-hub"
        self._add(self.hub)
        run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", self.hub, "link", "set", "br0", "up")

    def _add(self, name: str) -> None:
        run("ip", "netns", "add", name)
        self.namespaces.append(name)
        run("ip", "-n", name, "link", "set", "lo", "up")

    def add_pod(self, index: int) -> tuple[str, str]:
        """The namespace and the IP of pod ``index`` (10.99.0.<index + 1>)."""
        name, ip = f"{self.tag}-p{index}", f"{SUBNET}.{index + 1}"
        self._add(name)
        run("ip", "link", "add", "name", "eth0", "netns", name, "type", "veth", "peer", "name", f"p{index}",
            "netns", self.hub)
        run("ip", "-n", name, "addr", "add", f"{ip}/24", "dev", "eth0")
        run("ip", "-n", name, "link", "set", "eth0", "up")
        run("ip", "-n", self.hub, "link", "set", f"p{index}", "master", "br0")
        run("ip", "-n", self.hub, "link", "set", f"p{index}", "up")
        return name, ip

    def close(self) -> None:
        for name in reversed(self.namespaces):
            kill_namespace(name)
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.namespaces.clear()


def sweep_stale_namespaces() -> None:
    """Namespaces of test processes that died before their finalizers ran (``ta<pid>x...``)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith("ta") and "x" in name:
            pid = name[2:name.index("x")]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                subprocess.run(["ip", "netns", "del", name], capture_output=True)


def network_or_skip(tag: str) -> Network:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2 (ip); CI runs as root")
    sweep_stale_namespaces()
    return Network(tag)


# ---- consumer venvs -------------------------------------------------------------------------------------------

REPORT = os.environ.get("TOPOLOGY_CONSUMER_REPORT")  # a JSON-lines file the measurements go to (bench)


def report(**fields: Any) -> None:
    print(json.dumps(fields))
    if REPORT:
        with open(REPORT, "a") as handle:
            handle.write(json.dumps(fields) + "\n")


@dataclass(frozen=True)
class Venv:
    path: Path

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    @property
    def bin(self) -> Path:
        return self.path / "bin"


def install(framework: str, base: Path) -> Venv:
    """A new venv with ``consumers/<framework>.lock`` installed, every file checked against its hash. With
    TOPOLOGY_CONSUMER_VENVS=DIR the venv is kept in DIR and reused while the lock is the same (local runs)."""
    lock = ROOT / "consumers" / f"{framework}.lock"
    keep = os.environ.get("TOPOLOGY_CONSUMER_VENVS")
    path = Path(keep) / framework if keep else base / framework
    stamp = path / "lock.sha256"
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    if keep and stamp.exists() and stamp.read_text() == digest:
        return Venv(path)
    shutil.rmtree(path, ignore_errors=True)
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    result = subprocess.run(
        [str(path / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--require-hashes", "--no-deps", "-r", str(lock)], capture_output=True, text=True)
    if result.returncode != 0:
        shutil.rmtree(path, ignore_errors=True)
        pytest.skip(f"pip could not install consumers/{framework}.lock: {result.stderr.strip()[-600:]}")
    seconds = time.monotonic() - started
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    report(framework=framework, what="install", seconds=round(seconds, 1), megabytes=round(size / 2**20))
    stamp.write_text(digest)
    return Venv(path)


# ---- the job --------------------------------------------------------------------------------------------------

def wait_for(predicate: Any, what: str, timeout: float, *, dump: Any = None) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.1)
    detail = f"\n{dump()}" if dump is not None else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")


def make_pods(count: int) -> list[dict[str, Any]]:
    specs = examples.pytorchjob(JOB, workers=count, master=False, elastic=(2, count))
    for spec in specs:  # the pods start Pending with no IP: Pod.schedule gives each its namespace's
        spec["status"] = {"phase": "Pending"}
    return specs


def create_job(sandbox: SandboxThread, count: int) -> list[dict[str, Any]]:
    owner = sandbox.create("kubeflow.org/v1/pytorchjobs", "default", {
        "apiVersion": "kubeflow.org/v1", "kind": JOB_KIND, "metadata": {"name": JOB},
        "spec": {"elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": 2, "maxReplicas": count},
                 "pytorchReplicaSpecs": {"Worker": {"replicas": 2}}}})
    specs = make_pods(count)
    for spec in specs:
        spec["metadata"]["ownerReferences"][0]["uid"] = owner["metadata"]["uid"]
    return specs


class Pod:
    """One pod: its namespace and IP, its shared volume, the agent's init and sidecar, the trainer."""

    def __init__(self, job: Job, spec: dict[str, Any], index: int) -> None:
        self.job, self.spec, self.index = job, spec, index
        self.name = spec["metadata"]["name"]
        self.netns, self.ip = job.network.add_pod(index)
        self.dir = job.tmp / self.name
        self.out = self.dir / "shared"
        self.out.mkdir(parents=True)
        self.record = self.dir / "record"  # what the trainer's processes saw, one line per world
        self.hosts = self.dir / "hosts"
        self.hosts.write_text(f"127.0.0.1\tlocalhost\n{self.ip}\t{self.name}\n")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.trainer: subprocess.Popen[bytes] | None = None
        job.sandbox.create_pod(spec)

    def agent(self, command: str, *extra: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, **self.job.sandbox.client_env(), "POD_NAME": self.name, "POD_NAMESPACE": "default"}
        env.pop("KUBECONFIG", None)
        with (self.dir / f"{command}.log").open("w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "agent.cli", command, "--out", str(self.out), "--address", "ip",
                 "--nproc-per-node", "1", *(("--frameworks", self.job.frameworks) if self.job.frameworks else ()),
                 *self.job.agent_args, *extra],
                env=env, stdout=log, stderr=log)
        self.procs.append(proc)
        return proc

    def schedule(self) -> float:
        """The kubelet reports the pod Running at its IP; returns the moment."""
        self.job.sandbox.schedule("default", self.name, self.ip)
        return time.monotonic()

    def init(self) -> subprocess.Popen[bytes]:
        """Its init container, started (it waits for the gang)."""
        proc = self.agent("init", "--timeout", "120")
        self.procs.remove(proc)
        return proc

    def initialized(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait(150)
        assert proc.returncode == 0, (self.dir / "init.log").read_text()

    def sidecar(self, *extra: str) -> None:
        self.agent("sidecar", "--health-port", "0", *extra)
        wait_for(lambda: "following" in (self.dir / "sidecar.log").read_text(), f"{self.name}'s sidecar", 30,
                 dump=lambda: (self.dir / "sidecar.log").read_text())

    def exec(self, argv: list[str], venv: Venv, *, log: str = "trainer.log",
             binds: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        """A command as the pod's container runs it: in the pod's namespace, with PATH, HOME and PYTHONPATH only
        (PATH: the pod's own bin/ first, where the image's tools would be, then the venv's)."""
        env = {"PATH": f"{self.dir / 'bin'}:{venv.bin}:/usr/local/bin:/usr/bin:/bin", "HOME": str(self.dir),
               "PYTHONPATH": str(ROOT)}
        with (self.dir / log).open("w") as handle:
            return subprocess.Popen(
                [sys.executable, str(HERE / "pod_exec.py"), self.netns, self.name, str(self.hosts), *binds, "--",
                 *argv], env=env, stdout=handle, stderr=handle, cwd=self.dir, start_new_session=True)

    def start(self, argv: list[str], venv: Venv, *, binds: tuple[str, ...] = ()) -> None:
        """The trainer container's command."""
        self.trainer = self.exec(argv, venv, binds=binds)

    def launch(self, command: list[str], venv: Venv, *, frameworks: str | None = None,
               binds: tuple[str, ...] = ()) -> None:
        """``python -m agent.trainer run -- CMD``: the launcher, restarted commands and all."""
        chosen = ["--frameworks", frameworks] if frameworks else []
        self.start([venv.python, "-m", "agent.trainer", "run", "--out", str(self.out), "--grace", "10",
                    "--poll", "0.5", *chosen, "--", *command], venv, binds=binds)

    def lines(self) -> list[str]:
        try:
            return self.record.read_text().splitlines()
        except OSError:
            return []

    def worlds(self) -> list[int]:
        return [int(dict(w.split("=", 1) for w in line.split())["world"]) for line in self.lines()]

    def last(self) -> dict[str, str]:
        lines = self.lines()
        return dict(w.split("=", 1) for w in lines[-1].split()) if lines else {}

    def logs(self) -> str:
        parts = []
        for name in ("trainer.log", "sidecar.log", "init.log"):
            with contextlib.suppress(OSError):
                parts.append(f"--- {self.name} {name}\n{(self.dir / name).read_text()[-3000:]}")
        return "\n".join(parts)

    def terminate(self) -> None:
        """The kubelet's SIGTERM to the trainer container."""
        if self.trainer is not None and self.trainer.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.trainer.pid, signal.SIGTERM)

    def stop(self) -> None:
        self.terminate()
        if self.trainer is not None:
            try:
                self.trainer.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.trainer.pid, signal.SIGKILL)
                self.trainer.wait(10)
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        kill_namespace(self.netns)


def kill_namespace(netns: str) -> None:
    """Every process left in the pod's namespace (what a command started in a session of its own: Ray's)."""
    listing = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout
    for pid in listing.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


class Job:
    """The sandbox, the network and the pods of one test."""

    def __init__(self, tmp: Path, network: Network, frameworks: str, *, size: int = 3,
                 agent_args: tuple[str, ...] = (), create: Any = create_job) -> None:
        """``frameworks``: the agent's --frameworks ('': none, the job's own); ``create(sandbox, size)`` stores
        the job object and returns its pods' specs (the elastic PyTorchJob's by default)."""
        self.tmp, self.network, self.frameworks, self.agent_args = tmp, network, frameworks, agent_args
        self.sandbox = SandboxThread(tmp / "sandbox", bookmark_interval=0.5)
        self.sandbox.__enter__()
        self.specs = create(self.sandbox, size)
        self.pods: list[Pod] = []

    def add_pod(self) -> Pod:
        pod = Pod(self, self.specs[len(self.pods)], len(self.pods))
        self.pods.append(pod)
        return pod

    def first_pods(self, count: int = 2) -> list[Pod]:
        """The gang: ``count`` pods created, their inits started, each given its IP, the files written."""
        pods = [self.add_pod() for _ in range(count)]
        inits = [pod.init() for pod in pods]
        for pod in pods:
            pod.schedule()
        for pod, init in zip(pods, inits, strict=True):
            pod.initialized(init)
        return pods

    def logs(self) -> str:
        return "\n".join(p.logs() for p in self.pods)

    def close(self) -> None:
        try:
            for pod in self.pods:  # all at once, as when a job is deleted
                pod.terminate()
            for pod in reversed(self.pods):
                pod.stop()
        finally:
            self.sandbox.stop()


def grow(job: Job, start_pod: Any, settle: Any, *, timeout: float = 240) -> tuple[Pod, float]:
    """The third pod: created Pending, its init started, then its IP given (the clock starts), its sidecar and
    trainer started by ``start_pod(pod)``; ``settle()`` is true once the job runs at size 3. Returns the pod and
    the seconds from its IP to ``settle()``."""
    pod = job.add_pod()
    init = pod.init()
    time.sleep(0.5)  # init has read its pod and waits for its IP
    ip_given = pod.schedule()
    pod.initialized(init)
    start_pod(pod)
    wait_for(settle, "the job at size 3", timeout, dump=job.logs)
    return pod, time.monotonic() - ip_given


def venv_fixture(framework: str) -> Any:
    """A module's venv: installed from the framework's lock before its first test, deleted after its last, so
    that one framework's packages are on the disk at a time."""

    @pytest.fixture(scope="module")
    def venv(tmp_path_factory: pytest.TempPathFactory) -> Any:
        made = install(framework, tmp_path_factory.mktemp(f"venv-{framework}"))
        yield made
        if not os.environ.get("TOPOLOGY_CONSUMER_VENVS"):
            shutil.rmtree(made.path, ignore_errors=True)

    return venv


def restarted_at_size_three(job: Job, venv: Venv, command: Any, *, framework: str,
                            launcher_frameworks: str | None = None, timeout: float = 240) -> None:
    """The launcher's case: two pods run ``command(pod)`` under ``python -m agent.trainer run`` until each has
    recorded a world of 2, a third pod joins, and each launcher (signalled by its sidecar through the pid file
    it wrote) starts the command again from the new files, until every pod has recorded a world of 3. The
    launchers are the same processes throughout: the pods are not recreated."""
    started = time.monotonic()
    pods = job.first_pods()

    def start(pod: Pod) -> None:
        pod.sidecar("--trainer-pid-file", str(pod.out / "trainer.pid"))
        pod.launch(command(pod), venv, frameworks=launcher_frameworks)

    for pod in pods:
        start(pod)
    wait_for(lambda: all(p.worlds()[-1:] == [2] for p in pods), "both pods running in a world of 2", timeout,
             dump=job.logs)
    launchers = [p.trainer.pid for p in pods if p.trainer is not None]
    _, seconds = grow(job, start, lambda: all(p.worlds()[-1:] == [3] for p in job.pods), timeout=timeout)
    for pod, pid in zip(pods, launchers, strict=True):
        assert pod.trainer is not None and pod.trainer.pid == pid and pod.trainer.poll() is None, job.logs()
        assert (pod.out / "trainer.pid").read_text().strip() == str(pid)
        assert pod.worlds()[0] == 2 and pod.worlds()[-1] == 3
    report(framework=framework, what="2->3", seconds=round(seconds, 2))
    report(framework=framework, what="test", seconds=round(time.monotonic() - started, 1))
