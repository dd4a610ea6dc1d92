"""runtime/sidecar/evaluating.Evaluator: a change that alters no membership key (a peer's new IP while members are
addressed by DNS name) renders no file at all; a change of membership renders and writes one generation."""

from __future__ import annotations

import copy
import signal
from types import SimpleNamespace

from agent import core, examples
from agent.core import Options
from agent.core.files.variables import compute_variables
from agent.runtime.metrics import SidecarMetrics
from agent.runtime.sidecar.evaluating import Evaluator


class NoTrainer:
    pid_file, match = None, None

    def find(self) -> None:
        return None


def test_a_peer_s_new_ip_under_dns_names_renders_nothing_and_a_member_that_leaves_is_written(tmp_path, monkeypatch):
    pods = {p["metadata"]["name"]: p for p in examples.volcano_job(tasks=(("master", 1), ("worker", 3)))}
    settings = SimpleNamespace(options=Options(), pod_name="demo-worker-0", out_dir=tmp_path, ssh=None,
                               finder=NoTrainer(), signal=signal.SIGUSR1)
    evaluator = Evaluator(settings, SidecarMetrics(), keep_document=False)
    staged = []  # each rendering of the files: their variables computed
    monkeypatch.setattr(core, "compute_variables", lambda *a, **k: staged.append(1) or compute_variables(*a, **k))
    evaluator.evaluate(0.0, pods=pods, light=None, nodes={}, note="first")
    assert (evaluator.generation, len(staged)) == (1, 1)
    topology = (tmp_path / "topology.json").read_bytes()

    moved = dict(pods)
    worker = moved["demo-worker-2"] = copy.deepcopy(pods["demo-worker-2"])
    worker["metadata"]["resourceVersion"] = "2"  # a new version of the pod (the examples' pods have none)
    worker["status"]["podIP"] = examples.loopback_ip(99)
    worker["status"]["podIPs"] = [{"ip": examples.loopback_ip(99)}]
    assert evaluator.evaluate(0.0, pods=moved, light=None, nodes={}, note="a new IP") is None
    assert (evaluator.generation, len(staged)) == (1, 1)  # the plan has the IP; no file is made
    assert evaluator.plan is not None and examples.loopback_ip(99) in {m.ip for m in evaluator.plan.topology.members}
    assert (tmp_path / "topology.json").read_bytes() == topology

    left = {name: pod for name, pod in moved.items() if name != "demo-worker-2"}
    evaluator.evaluate(0.0, pods=left, light=None, nodes={}, note="a member left")
    assert (evaluator.generation, len(staged)) == (2, 1 + 1)
    assert "demo-worker-2" not in (tmp_path / "hostfile").read_text()
