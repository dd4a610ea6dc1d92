"""``topology-agent demo``: the agent at work on an example Volcano job, with no cluster.

Starts the sandbox API server, creates a Volcano PyTorch job (master, 3 workers, 1 non-training task) whose
pods have no IP yet, starts one real ``topology-agent init`` process per pod (each sees the sandbox as its
in-cluster API server), then "schedules" the pods one by one by giving them loopback IPs. The inits wait for
the gang, write ``./demo-out/<pod>/``, and the demo prints what each pod got.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from agent import examples
from agent.sandbox.threaded import SandboxThread

NAMESPACE = "default"
JOB = "demo"
TASKS = (("master", 1), ("worker", 3), ("extras", 1))


def volcano_owner() -> dict[str, object]:
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": JOB, "namespace": NAMESPACE},
        "spec": {"minAvailable": 5, "schedulerName": "volcano",
                 "plugins": {"pytorch": ["--master=master", "--worker=worker", "--port=23456"], "svc": [], "env": []},
                 "tasks": [{"name": name, "replicas": n, "template": {}} for name, n in TASKS]},
    }


def run_demo(out: Path, *, stream: TextIO | None = None) -> int:
    write = (stream or sys.stdout).write
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    pods = examples.volcano_job(JOB, TASKS, namespace=NAMESPACE)
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}
    with SandboxThread(out / ".sandbox") as sandbox:
        write(f"sandbox API server at {sandbox.sandbox.url} (kubeconfig: {sandbox.sandbox.kubeconfig})\n")
        owner = sandbox.create("batch.volcano.sh/v1alpha1/jobs", NAMESPACE, volcano_owner())
        for pod in pods:
            pod["metadata"]["ownerReferences"][0]["uid"] = owner["metadata"]["uid"]
            pod["status"] = {"phase": "Pending"}
            sandbox.create_pod(pod)
        write(f"created Volcano Job '{JOB}': {', '.join(f'{t} x{n}' for t, n in TASKS)}; pods are Pending, no IPs\n")
        procs = {}
        for name in ips:
            env = {**os.environ, **sandbox.client_env(), "POD_NAME": name, "POD_NAMESPACE": NAMESPACE}
            env.pop("KUBECONFIG", None)
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "agent.cli", "init", "--out", str(out / name), "--address", "ip",
                 "--timeout", "120"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        write(f"started {len(procs)} init containers; scheduling the pods one by one...\n")
        for name, ip in ips.items():
            time.sleep(0.3)
            sandbox.set_pod_ip(NAMESPACE, name, ip)
            write(f"  {name} is Running at {ip}\n")
        failed = 0
        for name, proc in procs.items():
            _, err = proc.communicate(timeout=180)
            if proc.returncode != 0:
                failed += 1
                write(f"init for {name} failed ({proc.returncode}): {err.strip().splitlines()[-1:]}\n")
        stats = sandbox.stats()
        if failed:
            return 1
        write("\n" + format_table(out, list(ips)) + "\n")
        if not show_sidecar(sandbox, out / "demo-worker-0", write):
            return 1
    write(f"\nAPI load of the init step: {stats['requests']} requests ({stats['watches']} watches) for {len(ips)} "
          f"pods; bytes sent {stats['bytes']}\n")
    write(f"Try: cat {out / 'demo-worker-0' / 'torch.env'}  |  topology-agent explain --pods "
          f"examples/volcano-pods.json --self demo-extras-0\n")
    return 0


def _generation(directory: Path) -> int:
    try:
        return int((directory / "generation").read_text())
    except (OSError, ValueError):
        return 0


def show_sidecar(sandbox: SandboxThread, shared: Path, write: Any) -> bool:
    """Run the sidecar for demo-worker-0, add a worker, and show the files following."""
    name = shared.name
    env = {**os.environ, **sandbox.client_env(), "POD_NAME": name, "POD_NAMESPACE": NAMESPACE}
    env.pop("KUBECONFIG", None)
    write(f"\nstarting the sidecar for {name} (generation {_generation(shared)}); adding a worker...\n")
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "sidecar", "--out", str(shared), "--address", "ip",
                             "--debounce", "0.2", "--signal", "none", "--health-port", "0"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        pod = examples.volcano_job(JOB, (("master", 1), ("worker", 4)), namespace=NAMESPACE)[4]
        pod["status"] = {"phase": "Running", "podIP": "127.1.0.9", "podIPs": [{"ip": "127.1.0.9"}]}
        base = _generation(shared)
        if base > 1:
            write(f"  (generation {base} already: the sidecar added demo-extras-0, which got its IP after init ran)\n")
        started = time.monotonic()
        sandbox.create_pod(pod)
        write(f"  created {pod['metadata']['name']} at 127.1.0.9\n")
        deadline = started + 15
        while _generation(shared) <= base and time.monotonic() < deadline:
            time.sleep(0.02)
        if _generation(shared) <= base:
            write("  the sidecar did not follow within 15 s\n")
            return False
        env_now = json.loads((shared / "topology.json").read_text())["env"]
        write(f"  generation {_generation(shared)} after {time.monotonic() - started:.2f} s: "
              f"WORLD_SIZE={env_now['WORLD_SIZE']}, NNODES={env_now['NNODES']}; hostfile now:\n")
        for line in (shared / "hostfile").read_text().splitlines():
            write(f"    {line}\n")
        return True
    finally:
        proc.terminate()
        proc.wait(15)
        if proc.stderr:
            proc.stderr.close()


def format_table(out: Path, names: list[str]) -> str:
    header = f"{'POD':<16} {'ROLE':<8} {'NODE_RANK':>9} {'RANK':>5} {'WORLD_SIZE':>10}  {'ADDRESS':<12} FILES"
    rows = [header]
    for name in names:
        doc = json.loads((out / name / "topology.json").read_text())
        env = doc["env"]
        me = next(m for m in doc["members"] if m["name"] == name)
        files = ", ".join(sorted(p.name for p in (out / name).iterdir()))
        rows.append(f"{name:<16} {me['role']:<8} {env.get('NODE_RANK', '-'):>9} {env.get('RANK', '-'):>5} "
                    f"{env.get('WORLD_SIZE', '-'):>10}  {me['address']:<12} {out / name}/{{{files}}}")
    return "\n".join(rows)
