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
    assert "POD              ROLE     NODE_RANK" in text
    for pod in ("demo-master-0", "demo-worker-0", "demo-worker-1", "demo-worker-2", "demo-extras-0"):
        assert (out / pod / "torch.env").is_file()
    extras = json.loads((out / "demo-extras-0" / "topology.json").read_text())["env"]
    assert "WORLD_SIZE" not in extras
    worker = json.loads((out / "demo-worker-0" / "topology.json").read_text())
    assert worker["env"]["WORLD_SIZE"] == "5" and worker["generation"] >= 2  # after the sidecar's scale-up
    assert "127.1.0.9 slots=1" in (out / "demo-worker-0" / "hostfile").read_text()
