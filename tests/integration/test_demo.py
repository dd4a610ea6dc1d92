"""The README's first command: `topology-agent demo` runs the whole story with no cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_demo_runs_init_for_every_pod_then_the_sidecar_follows_a_scale_up(tmp_path):
    out = tmp_path / "demo-out"
    result = subprocess.run([sys.executable, "-m", "agent.cli", "demo", "--out", str(out)], capture_output=True,
                            text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stdout + result.stderr
    text = result.stdout
    # Issue 22: the one-line story, through the webhook the sandbox calls
    assert "labelled namespace 'default' topology-agent.io/inject=enabled: the one line" in text
    assert "from templates with no agent in them" in text
    assert "the webhook added to each pod: init container 'topology-agent' (init --out /shared --timeout 120 " \
           "--address ip --rank-order topology" in text
    assert "POD              ROLE     RACK    NODE_RANK" in text
    # Issue 14: a job placed across two racks, its ranks in rack order, rank 0 unchanged
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
        "127.1.0.1", "slots=1", "127.1.0.3", "slots=1", "127.1.0.9", "slots=1", "127.1.0.2", "slots=1",
        "127.1.0.4", "slots=1"]
