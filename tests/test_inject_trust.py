"""Issue 34 (trust, round 4), inject's side: hostile or odd manifests given to `topology-agent inject` and the
shared transform. A user's own pieces are never removed, bad input is one line and exit 2, YAML is bounded as
kubectl bounds it, and what inject writes reads back the same."""

from __future__ import annotations

import io
import sys

import pytest
from ruamel.yaml import YAML

from agent import __version__
from agent.cli import check_agent_args, main
from agent.core.injection import INJECTED, SHARED, Settings, inject_document
from agent.runtime.adoption import inject_text


def inject(text: str, settings: Settings | None = None) -> str:
    return inject_text(text, settings or Settings(), version=__version__, check=check_agent_args)[0]


def load(text: str) -> dict:
    return YAML(typ="safe").load(text)


def run_inject(text: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    code = main(["inject"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_exit_2(text: str, capsys, monkeypatch) -> str:
    code, out, err = run_inject(text, capsys, monkeypatch)
    assert code == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def pod(volumes: str, mounts: str = "", annotations: str = "") -> str:
    return (f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n{annotations}spec:\n  containers:\n"
            f"  - name: trainer\n    image: trainer:1\n{mounts}  volumes:\n{volumes}")


# -- 1. a user's volume is never removed ---------------------------------------------------------------------


def test_a_users_pvc_named_like_the_agent_is_kept_with_its_mount():
    """Issue 34: a PVC `topology-agent-data` at /data was removed (a name-prefix match) and the pod admitted
    with the shared emptyDir instead: the job would write its data nowhere."""
    text = pod("  - name: topology-agent-data\n    persistentVolumeClaim:\n      claimName: data\n",
               "    volumeMounts:\n    - name: topology-agent-data\n      mountPath: /data\n")
    spec = load(inject(text))["spec"]
    assert {"name": "topology-agent-data", "persistentVolumeClaim": {"claimName": "data"}} in spec["volumes"]
    assert {"name": "topology-agent-data", "mountPath": "/data"} in spec["containers"][0]["volumeMounts"]
    assert {"name": SHARED, "mountPath": "/shared"} in spec["containers"][0]["volumeMounts"]


def test_a_users_volume_stays_through_a_second_run_and_an_upgrade():
    """The same volume in a template the agent injected before (an upgrade takes the agent's pieces out first)."""
    text = pod("  - name: topology-agent-config\n    configMap:\n      name: settings\n",
               "    volumeMounts:\n    - name: topology-agent-config\n      mountPath: /etc/settings\n")
    once = inject(text)
    old = inject(text, Settings({"image": "topology-agent:0.0.9"}))
    for again in (inject(once), inject(old)):
        spec = load(again)["spec"]
        assert {"name": "topology-agent-config", "configMap": {"name": "settings"}} in spec["volumes"]
        assert {"name": "topology-agent-config", "mountPath": "/etc/settings"} in spec["containers"][0]["volumeMounts"]
    assert inject(once) == once


def test_inject_keeps_a_configmap_volume_of_a_job():
    doc = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {"template": {"spec": {
        "containers": [{"name": "t", "image": "x", "volumeMounts": [{"name": "topology-agent-cfg",
                                                                      "mountPath": "/cfg"}]}],
        "volumes": [{"name": "topology-agent-cfg", "configMap": {"name": "cfg"}}]}}}}
    inject_document(doc, Settings(), version=__version__)
    spec = doc["spec"]["template"]["spec"]
    assert {"name": "topology-agent-cfg", "configMap": {"name": "cfg"}} in spec["volumes"]
    assert [v["name"] for v in spec["volumes"]] == ["topology-agent-cfg", "topology-agent-shared",
                                                    "topology-agent-token"]


@pytest.mark.parametrize(("volume", "annotations", "says"), [
    ("  - name: topology-agent-shared\n    persistentVolumeClaim:\n      claimName: data\n", "",
     "volume 'topology-agent-shared' is in a template the agent did not inject"),
    ("  - name: topology-agent-token\n    secret:\n      secretName: mine\n", "",
     "volume 'topology-agent-token' is in a template the agent did not inject"),
    # a template that says it was injected still keeps a volume the agent would not have made
    ("  - name: topology-agent-shared\n    persistentVolumeClaim:\n      claimName: data\n",
     f"  annotations:\n    {INJECTED}: 0.0.9\n",
     "volume 'topology-agent-shared' is a persistentVolumeClaim volume, not the agent's emptyDir"),
], ids=["pvc-not-injected", "secret-not-injected", "pvc-in-injected-template"])
def test_a_users_volume_with_one_of_the_agents_own_names_is_refused_in_one_line(volume, annotations, says, capsys,
                                                                                 monkeypatch):
    line = one_line_exit_2(pod(volume, annotations=annotations), capsys, monkeypatch)
    assert "Pod p: " in line and says in line and "rename the volume and its volumeMounts" in line, line


def test_a_users_container_with_the_agents_name_is_refused(capsys, monkeypatch):
    text = ("apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: j\nspec:\n  template:\n    spec:\n"
            "      initContainers:\n      - name: topology-agent\n        image: mine:1\n"
            "      containers:\n      - name: t\n        image: x\n")
    line = one_line_exit_2(text, capsys, monkeypatch)
    assert "Job j: init container 'topology-agent' is in a template the agent did not inject" in line
    assert "rename it" in line


def test_a_shipped_hand_written_example_is_refused_with_what_to_do(capsys, monkeypatch):
    """manifests/examples have the agent written in by hand (no injected annotation): inject does not guess
    which pieces are the agent's; it says to apply such a job as it is."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "manifests" / "examples" / "pytorchjob.yaml").read_text()
    line = one_line_exit_2(text, capsys, monkeypatch)
    assert "init container 'topology-agent'" in line and "apply the job without inject" in line, line


def test_a_users_own_mount_of_the_shared_volume_elsewhere_stays_and_a_second_run_changes_nothing():
    """A user's init container (or a container) that reads the agent's files where it likes keeps its mount."""
    text = ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  initContainers:\n  - name: prepare\n"
            "    image: x\n    volumeMounts:\n    - name: topology-agent-shared\n      mountPath: /topology\n"
            "  containers:\n  - name: trainer\n    image: trainer:1\n    volumeMounts:\n"
            "    - name: topology-agent-shared\n      mountPath: /etc/topology-files\n")
    once = inject(text)
    spec = load(once)["spec"]
    assert spec["initContainers"][-1]["volumeMounts"] == [{"name": SHARED, "mountPath": "/topology"}]
    assert spec["containers"][0]["volumeMounts"] == [{"name": SHARED, "mountPath": "/etc/topology-files"}]
    assert inject(once) == once
