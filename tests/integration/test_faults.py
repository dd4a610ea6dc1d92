"""The API server misbehaving, as a fault proxy shows it can, against real init and sidecar processes:
the faults a socket makes (a watch that hangs silently, 1 byte a second, no answer at all) and the sidecar's
request rate over seconds. The others run in process, over the sandbox's API in memory
(tests/runtime/test_faults.py).

Each fault is the sandbox's (``sandbox.faults``): a watch that hangs silently, one that ends at once, a 410 on
every watch, 429 with Retry-After 0, 1 byte a second, no answer at all. The tests bound what the agent does:
requests per second (at most 5), the time init takes (``--timeout`` + 1 s at most), and the time a sidecar takes to
see a change made during the fault (twice the inactivity deadline, ``--watch-idle``, here 2 s). docs/reliability.md
lists each fault with what the agent does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from agent import examples
from tests.integration.test_sidecar import free_port, stop_sidecars, wait_for
from tests.jobs import create_volcano_job

pytestmark = pytest.mark.xdist_group("timing")  # these measure time and request rates: one at a time

IDLE = 2.0


def agent_env(sandbox, pod):
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": pod, "POD_NAMESPACE": "default"}
    env.pop("KUBECONFIG", None)
    return env


def requests_by(sandbox, agent):
    return sum(v["requests"] for k, v in sandbox.stats()["byAgent"].items() if agent in k)


def waiting_job(sandbox):
    """A master and a worker without an IP: init waits for the worker."""
    create_volcano_job(sandbox, (("master", 1), ("worker", 1)), with_ips=False)
    sandbox.set_pod_ip("default", "demo-master-0", examples.loopback_ip(0))


def run_init(sandbox, tmp_path, *args):
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "agent.cli", "init", "--out", str(tmp_path / "out"), "--address",
                          "ip", *args], env=agent_env(sandbox, "demo-master-0"), capture_output=True, text=True,
                         timeout=120)
    return run, time.monotonic() - started


def interpreter_start() -> float:
    """What starting init's interpreter and imports takes on this machine now (0.8 s at least): a loaded machine
    (CI beside other work) starts it in seconds, which is not init's wait."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import agent.cli, agent.runtime.init, agent.k8s.client"], check=True)
    return max(0.8, time.monotonic() - started)


INIT_FAULTS = [  # (name, the fault, what init's last line says); the others: tests/runtime/test_faults.py
    ("1 byte a second", {"trickle": 1.0}, "no whole answer within"),
    ("no answer", {"delay": 3600.0}, "no whole answer within"),
]


@pytest.mark.parametrize("fault, says", [f[1:] for f in INIT_FAULTS], ids=[f[0] for f in INIT_FAULTS])
def test_init_ends_by_its_timeout_under_any_fault_and_asks_at_most_5_times_a_second(sandbox, tmp_path, fault,
                                                                                     says):
    waiting_job(sandbox)
    sandbox.faults(**fault)
    run, took = run_init(sandbox, tmp_path, "--timeout", "6")
    assert run.returncode == 4, run.stderr
    assert took <= 6 + 1 + interpreter_start(), took  # --timeout + 1 s, after the interpreter's start
    assert requests_by(sandbox, "init") <= 5 * took
    last = run.stderr.strip().splitlines()[-1]
    assert "timed out after" in last and says in last, last
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_init_sees_past_a_watch_that_hangs_silently(sandbox, tmp_path):
    """init --timeout 20 exited at 50 s saying a pod had no IP, although it had one from 2 s on."""
    waiting_job(sandbox)
    sandbox.faults(watch="hang", path="/pods")
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "init", "--out", str(tmp_path / "out"), "--address",
                             "ip", "--timeout", "20", "--watch-idle", str(IDLE)],
                            env=agent_env(sandbox, "demo-master-0"), stderr=subprocess.PIPE, text=True)
    # The IP comes once init's watch is open (and hangs): given before, the first list would hold it
    wait_for(lambda: sum(v["watches"] for k, v in sandbox.stats()["byAgent"].items() if "init" in k) >= 1,
             timeout=30)
    given = time.monotonic()
    sandbox.set_pod_ip("default", "demo-worker-0", examples.loopback_ip(1))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert time.monotonic() - given <= 2 * IDLE + 1  # the hang noticed after IDLE, the list read again
    assert "no event or bookmark for 2 s (a silently stalled watch); listing again" in err, err


def start_sidecar(sandbox, tmp_path, pod="demo-master-0", *extra):
    port = free_port()
    log = (tmp_path / f"{pod}.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "sidecar", "--out", str(tmp_path / pod), "--address",
                             "ip", "--debounce", "0", "--health-port", str(port), "--health-host", "127.0.0.1",
                             "--watch-idle", str(IDLE), *extra], env=agent_env(sandbox, pod), stderr=log)
    return proc, log, port


def readyz(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return 0, ""


def has_worker(out: Path) -> bool:
    try:
        return examples.loopback_ip(1) in (out / "hostfile").read_text()
    except OSError:
        return False


@pytest.fixture
def sidecar(sandbox, tmp_path):
    waiting_job(sandbox)
    proc, log, port = start_sidecar(sandbox, tmp_path)
    wait_for(lambda: readyz(port)[0] == 200, what="sidecar ready")
    yield proc, port, tmp_path / "demo-master-0"
    stop_sidecars({"s": (proc, log)})


def test_a_sidecar_whose_watch_hangs_silently_sees_the_change_within_twice_the_deadline(sandbox, sidecar):
    """The sidecar had not applied a change after 119 s, while /readyz and /healthz answered 200."""
    _, _, out = sidecar
    sandbox.faults(watch="hang", path="/pods", drop_watches=True)
    changed = time.monotonic()
    sandbox.set_pod_ip("default", "demo-worker-0", examples.loopback_ip(1))
    wait_for(lambda: has_worker(out), timeout=2 * IDLE + 3, what="the change in the files")
    assert time.monotonic() - changed <= 2 * IDLE + 1


SIDECAR_FAULTS = [
    ("a watch that ends at once", {"watch": "empty", "path": "/pods"}),  # 20,076 requests in 10 s before
    ("a 410 on every watch", {"watch": "gone", "path": "/pods"}),
    ("429 with Retry-After 0", {"status": 429, "retry_after": 0}),
]


@pytest.mark.parametrize("fault", [f for _, f in SIDECAR_FAULTS], ids=[n for n, _ in SIDECAR_FAULTS])
def test_a_sidecar_asks_at_most_5_times_a_second_under_any_fault_and_recovers(sandbox, sidecar, fault):
    _, port, out = sidecar
    before = requests_by(sandbox, "sidecar")
    sandbox.faults(drop_watches=True, **fault)
    time.sleep(5.0)
    assert requests_by(sandbox, "sidecar") - before <= 5 * 5.0
    sandbox.faults(clear=True)
    sandbox.set_pod_ip("default", "demo-worker-0", examples.loopback_ip(1))
    wait_for(lambda: has_worker(out), timeout=2 * IDLE + 5, what="the change in the files once the fault ends")
    wait_for(lambda: readyz(port)[0] == 200, what="ready again")


def test_a_sidecar_without_news_from_the_api_server_says_why_it_is_not_ready(sandbox, sidecar):
    _, port, _ = sidecar
    sandbox.faults(status=503, drop_watches=True)
    wait_for(lambda: readyz(port)[0] == 503, timeout=3 * IDLE + 5, what="not ready")
    _, text = readyz(port)
    assert "no news of pods from the API server for" in text and "503" in text, text
    sandbox.faults(clear=True)
    wait_for(lambda: readyz(port)[0] == 200, timeout=2 * IDLE + 5, what="ready again")
