"""The README's first command: `topology-agent demo` runs the whole story with no cluster."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agent.errors import OutputError
from agent.runtime.demo import MARKER, clean_output

ROOT = Path(__file__).resolve().parents[2]


def _demo(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.cli", "demo", "--out", str(out)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def _env(torch_env: str) -> dict[str, str]:
    return {name: shlex.split(value)[0] for line in torch_env.splitlines() if line.startswith("export ")
            for name, _, value in [line.removeprefix("export ").partition("=")]}


def test_demo_runs_init_for_every_pod_then_the_sidecar_follows_a_scale_up(tmp_path):
    out = tmp_path / "demo-out"
    result = subprocess.run([sys.executable, "-m", "agent.cli", "demo", "--out", str(out)], capture_output=True,
                            text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stdout + result.stderr
    text = result.stdout
    # the one-line story, through the webhook the sandbox calls
    assert "labelled namespace 'default' topology-agent.io/inject=enabled: the one line" in text
    assert "from templates with no agent in them" in text
    # the job is applied and scaled; the sandbox plays Volcano, the scheduler and the kubelet
    assert "applied Volcano Job 'demo' (master x1, worker x3, extras x1); the sandbox, playing Volcano" in text
    assert "scaled Volcano Job 'demo' to 4 workers: demo-worker-3 runs at 127.1.0.6 on node-5 (rack-a)" in text
    saved = json.loads((out / "pods.json").read_text())["items"]
    owners = {(ref["kind"], ref["name"], ref["uid"]) for p in saved for ref in p["metadata"]["ownerReferences"]}
    assert len(saved) == 6 and len(owners) == 1 and next(iter(owners))[:2] == ("Job", "demo"), owners
    assert "the webhook added to each pod: init container 'topology-agent' (init --out /shared --timeout 120 " \
           "--address ip --rank-order topology" in text
    assert "POD              ROLE     RACK    NODE_RANK" in text
    # a job placed across two racks, its ranks in rack order, rank 0 unchanged
    assert "index order 4, topology order 2 of 4; rank 0 is still demo-master-0" in text
    ranks = {}
    for pod in ("demo-master-0", "demo-worker-0", "demo-worker-1", "demo-worker-2"):
        env = json.loads((out / pod / "topology.json").read_text())["env"]
        ranks[pod] = (env["TOPOLOGY_RACK"], env["RANK"]) if pod != "demo-worker-0" else None
    assert ranks["demo-master-0"] == ("rack-a", "0") and ranks["demo-worker-1"] == ("rack-a", "1")
    assert ranks["demo-worker-2"] == ("rack-b", "3")
    for pod in ("demo-master-0", "demo-worker-0", "demo-worker-1", "demo-worker-2", "demo-extras-0"):
        assert (out / pod / "torch.env").is_file()
    extras = json.loads((out / "demo-extras-0" / "topology.json").read_text())["env"]
    assert "WORLD_SIZE" not in extras
    worker = json.loads((out / "demo-worker-0" / "topology.json").read_text())
    assert worker["env"]["WORLD_SIZE"] == "5" and worker["generation"] >= 2  # after the sidecar's scale-up
    # the worker that joined on a new rack-a node sits in rack-a's block, before rack-b
    assert (out / "demo-worker-0" / "hostfile").read_text().split() == [
        "127.1.0.1", "slots=1", "127.1.0.3", "slots=1", "127.1.0.6", "slots=1", "127.1.0.2", "slots=1",
        "127.1.0.4", "slots=1"]


def test_the_demos_own_follow_up_explains_what_it_wrote_and_a_second_run_starts_clean(tmp_path):
    """The 'Try:' line's explain, on the pods and Nodes the demo saved, gives the pod's files' values (the dry run
    is generation 1, the files the generation the sidecar reached); the numbers say why they are what they are;
    a second run removes the first one's files, a stale one among them, and lists no hidden file."""
    out = tmp_path / "demo-out"
    first = _demo(out)
    assert first.returncode == 0, first.stdout + first.stderr
    (out / "demo-worker-1" / "stale.host").write_text("an earlier run's\n")
    second = _demo(out)
    assert second.returncode == 0, second.stdout + second.stderr
    text = second.stdout
    assert f"removed the files of an earlier demo from {out}: .sandbox, demo-extras-0" in text
    assert not (out / "demo-worker-1" / "stale.host").exists()
    assert "stale.host" not in text and ".topology" not in text.split("POD ", 1)[1].split("\n\n", 1)[0]
    assert "(init wrote 1; the scale-up is one more)" in text
    assert "The count moves by a few between runs" in text and "Event writes" in text
    try_line = next(line for line in text.splitlines() if line.startswith("Try: "))
    command = shlex.split(try_line.split("|", 1)[1].split("(", 1)[0])
    assert command[:2] == ["topology-agent", "explain"] and "--nodes" in command
    explained = subprocess.run([sys.executable, "-m", "agent.cli", *command[1:]], capture_output=True, text=True,
                               timeout=60, cwd=ROOT)
    assert explained.returncode == 0, explained.stderr
    assert "options from its init container: --address ip --rank-order topology" in explained.stdout
    values = {}
    for line in explained.stdout.split("variables (torch.env):\n", 1)[1].split("\n\n", 1)[0].splitlines():
        name, _, value = line.split("#", 1)[0].strip().partition("=")
        values[name] = value
    written = _env((out / "demo-worker-0" / "torch.env").read_text())
    del values["TOPOLOGY_GENERATION"], written["TOPOLOGY_GENERATION"]
    assert values == written


def test_the_demo_refuses_a_folder_it_did_not_make_and_removes_nothing(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    with pytest.raises(OutputError, match=r"holds files the demo did not make \(notes\.txt\)"):
        clean_output(tmp_path)
    (tmp_path / MARKER).write_text("")  # even where the demo ran before, a file it did not make stays
    (tmp_path / "pods.json").write_text("{}")
    with pytest.raises(OutputError, match=r"notes\.txt"):
        clean_output(tmp_path)
    assert mine.read_text() == "mine" and (tmp_path / "pods.json").exists()
