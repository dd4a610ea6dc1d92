"""Real consumers read what render writes: torch.distributed (gloo, env://) and DeepSpeed's hostfile parser."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agent import examples
from agent.cli import main

# One at a time, on one worker (xdist): the consumers' processes and ports.
pytestmark = [pytest.mark.consumer, pytest.mark.xdist_group("e2e")]
HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def three_pod_job(tmp_path: Path) -> Path:
    pods = examples.volcano_job(name="e2e", tasks=(("master", 1), ("worker", 2)))
    for k, pod in enumerate(pods):  # every "pod" is a process on this machine, at its own loopback address
        pod["status"]["podIP"] = f"127.0.0.{k + 1}"
        pod["status"]["podIPs"] = [{"ip": f"127.0.0.{k + 1}"}]
    path = tmp_path / "pods.json"
    path.write_text(json.dumps(examples.as_list(pods)))
    return path


def test_torch_all_reduce_across_one_process_per_pod_from_rendered_torch_env(tmp_path):
    pytest.importorskip("torch", reason="torch is installed by scripts/test (pip install torch==2.13.0)")
    pods = three_pod_job(tmp_path)
    port = free_port()
    names = ["e2e-master-0", "e2e-worker-0", "e2e-worker-1"]
    for name in names:
        assert main(["render", "--pods", str(pods), "--self", name, "--out", str(tmp_path / name),
                     "--address", "ip", "--master-port", str(port), "--nproc-per-node", "1"]) == 0
    env = {"PATH": os.environ["PATH"], "GLOO_SOCKET_IFNAME": "lo", "HOME": str(tmp_path)}
    procs = [
        subprocess.Popen(["bash", "-c", f'. {tmp_path / name}/torch.env && exec "{sys.executable}" '
                                        f'{HERE / "worker_allreduce.py"}'],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in reversed(names)  # start order must not matter
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs.append(out.strip())
    assert sorted(outputs) == [
        "rank=0 node_rank=0 world=3 sum=6",
        "rank=1 node_rank=1 world=3 sum=6",
        "rank=2 node_rank=2 world=3 sum=6",
    ]


def test_torch_all_reduce_with_every_pod_on_one_address_as_hostnetwork_pods_on_one_node(tmp_path):
    """hostNetwork pods on one node share its IP: torch.env is written for each and gloo forms the world."""
    pytest.importorskip("torch", reason="torch is installed by scripts/test (pip install torch==2.13.0)")
    pods = examples.volcano_job(name="hostnet", tasks=(("master", 1), ("worker", 2)))
    for pod in pods:
        pod["spec"]["hostNetwork"] = True
        pod["status"].update(podIP="127.0.0.1", podIPs=[{"ip": "127.0.0.1"}])
    path = tmp_path / "pods.json"
    path.write_text(json.dumps(examples.as_list(pods)))
    port = free_port()
    names = ["hostnet-master-0", "hostnet-worker-0", "hostnet-worker-1"]
    for name in names:
        assert main(["render", "--pods", str(path), "--self", name, "--out", str(tmp_path / name),
                     "--address", "ip", "--master-port", str(port), "--nproc-per-node", "1"]) == 0
    assert (tmp_path / names[1] / "hostfile").read_text() == "127.0.0.1 slots=1\n"
    env = {"PATH": os.environ["PATH"], "GLOO_SOCKET_IFNAME": "lo", "HOME": str(tmp_path)}
    procs = [
        subprocess.Popen(["bash", "-c", f'. {tmp_path / name}/torch.env && exec "{sys.executable}" '
                                        f'{HERE / "worker_allreduce.py"}'],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in names
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs.append(out.strip())
    assert sorted(outputs) == [f"rank={r} node_rank={r} world=3 sum=6" for r in range(3)]


def _pods_with_a_cpu_limit(tmp_path: Path, cpu: str) -> tuple[list[str], Path]:
    """A Volcano job of a master and two workers, every pod with ``cpu`` as its CPU limit, each "pod" at its own
    loopback address."""
    pods = examples.volcano_job(name="cpu", tasks=(("master", 1), ("worker", 2)), cpu=cpu)
    for k, pod in enumerate(pods):
        pod["status"].update(podIP=f"127.0.0.{k + 1}", podIPs=[{"ip": f"127.0.0.{k + 1}"}])
    path = tmp_path / "pods.json"
    path.write_text(json.dumps(examples.as_list(pods)))
    return [p["metadata"]["name"] for p in pods], path


def _run_pods(tmp_path: Path, names: list[str], worker: str, timeout: float) -> list[str]:
    """Each pod's trainer, started as a user starts it (source torch.env, run python, no launcher); every line it
    printed. A trainer that waits for ranks that never come is killed at ``timeout`` and fails the test."""
    env = {"PATH": os.environ["PATH"], "GLOO_SOCKET_IFNAME": "lo", "HOME": str(tmp_path)}
    procs = [subprocess.Popen(["bash", "-c", f'. {tmp_path / name}/torch.env && exec "{sys.executable}" '
                                             f'{HERE / worker}'],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
             for name in reversed(names)]  # start order must not matter
    lines = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, err
            lines += out.strip().splitlines()
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)  # its session: the trainer and what it spawned
            proc.communicate()  # reaped, its pipes closed
    return lines


def _rendered_pods_with_a_cpu_limit(tmp_path: Path, cpu: str) -> list[str]:
    """The pods of ``_pods_with_a_cpu_limit``, each one's files rendered into tmp_path/<pod> (IPs, a free port)."""
    names, pods = _pods_with_a_cpu_limit(tmp_path, cpu)
    port = free_port()
    for name in names:
        assert main(["render", "--pods", str(pods), "--self", name, "--out", str(tmp_path / name),
                     "--address", "ip", "--master-port", str(port)]) == 0
    return names


def test_a_plain_env_script_without_a_launcher_forms_the_pods_world_on_pods_with_a_cpu_limit(tmp_path):
    """cpu: 2 makes NPROC_PER_NODE 2 for the launchers; a script started with python runs one process per pod, and
    init_process_group("env://") must find the world of the pods in WORLD_SIZE and RANK."""
    pytest.importorskip("torch", reason="torch is installed by scripts/test (pip install torch==2.13.0)")
    names = _rendered_pods_with_a_cpu_limit(tmp_path, "2")
    for name in names:
        assert "export NPROC_PER_NODE='2'\n" in (tmp_path / name / "torch.env").read_text()
    lines = _run_pods(tmp_path, names, "worker_allreduce.py", timeout=180)
    assert sorted(lines) == [f"rank={r} node_rank={r} world=3 sum=6" for r in range(3)]


def test_the_imagenet_convention_spawns_its_processes_per_node_from_world_size_and_rank(tmp_path):
    """pytorch/examples' ImageNet script: WORLD_SIZE nodes, RANK the node's rank, each node spawning its own
    processes (mp.spawn) with global rank RANK x processes + local; on pods with cpu: 2, two processes each."""
    pytest.importorskip("torch", reason="torch is installed by scripts/test (pip install torch==2.13.0)")
    names = _rendered_pods_with_a_cpu_limit(tmp_path, "2")
    lines = _run_pods(tmp_path, names, "worker_imagenet.py", timeout=300)
    assert sorted(lines) == [f"rank={r} world=6 node={r // 2} local={r % 2} sum=21" for r in range(6)]


def test_deepspeed_parses_the_hostfile_with_hosts_in_rank_order_and_slots(tmp_path):
    runner = pytest.importorskip(
        "deepspeed.launcher.runner",
        reason="DeepSpeed is installed by scripts/test (pip install --no-build-isolation deepspeed)",
    )
    pods = examples.pytorchjob(workers=3, gpus=2)
    path = tmp_path / "pods.json"
    path.write_text(json.dumps(pods))
    out = tmp_path / "shared"
    assert main(["render", "--pods", str(path), "--self", "mnist-worker-1", "--out", str(out)]) == 0
    resources = runner.fetch_hostfile(str(out / "hostfile"))
    assert list(resources.items()) == [
        ("mnist-master-0", 2), ("mnist-worker-0", 2), ("mnist-worker-1", 2), ("mnist-worker-2", 2),
    ]


def test_torch_gloo_and_device_mesh_from_ranks_in_rack_order(tmp_path):
    """Ranks from --rank-order topology form one gloo group, and the DeviceMesh built from topology.json
    (one row per rack) is the same in every process and reduces over the right ranks."""
    pytest.importorskip("torch", reason="torch is installed by scripts/test (pip install torch==2.13.0)")
    pods = examples.volcano_job(name="e2e", tasks=(("master", 1), ("worker", 3)))
    nodes = examples.racks(pods)  # index order alternates racks a, b, a, b
    for k, pod in enumerate(pods):
        pod["status"].update(podIP=f"127.0.0.{k + 1}", podIPs=[{"ip": f"127.0.0.{k + 1}"}])
    (tmp_path / "pods.json").write_text(json.dumps(examples.as_list(pods)))
    (tmp_path / "nodes.json").write_text(json.dumps({"kind": "NodeList", "items": nodes}))
    port = free_port()
    names = [p["metadata"]["name"] for p in pods]
    for name in names:
        assert main(["render", "--pods", str(tmp_path / "pods.json"), "--nodes", str(tmp_path / "nodes.json"),
                     "--self", name, "--out", str(tmp_path / name), "--address", "ip", "--master-port", str(port),
                     "--nproc-per-node", "1", "--rank-order", "topology",
                     "--topology-levels", f"{examples.ZONE},{examples.RACK}"]) == 0
    root = Path(__file__).resolve().parents[2]
    env = {"PATH": os.environ["PATH"], "GLOO_SOCKET_IFNAME": "lo", "HOME": str(tmp_path), "PYTHONPATH": str(root)}
    procs = {name: subprocess.Popen(
        ["bash", "-c", f'. {tmp_path / name}/torch.env && exec "{sys.executable}" {HERE / "worker_mesh.py"} '
                       f'{tmp_path / name}'], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in reversed(names)}
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        results[name] = json.loads(out.strip().splitlines()[-1])
    ranks = {name: r["rank"] for name, r in results.items()}
    assert ranks == {"e2e-master-0": 0, "e2e-worker-1": 1, "e2e-worker-0": 2, "e2e-worker-2": 3}
    for r in results.values():
        assert r["rank"] == r["env_rank"] and r["world"] == 4 and r["sum"] == 10
        assert r["mesh"] == [[0, 1], [2, 3]]  # every process built the same mesh: rack-a, then rack-b
        row = next(row for row in r["mesh"] if r["rank"] in row)
        column = [other[row.index(r["rank"])] for other in r["mesh"]]
        assert r["within"] == sum(row) and r["across"] == sum(column)
        assert r["rack"] == ("rack-a" if r["rank"] < 2 else "rack-b")
