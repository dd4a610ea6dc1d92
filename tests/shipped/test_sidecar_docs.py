"""docs/sidecar.md's manifest shows what inject writes: the same container, port and volume names, probes and
restart policy, so a reader who compares it with a pod (or copies it) sees the agent's own names."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from agent import __version__
from agent.core.adoption.injection import Settings
from agent.runtime.commands.inject import inject_text

ROOT = Path(__file__).resolve().parents[2]
ELASTIC = """apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: el}
spec:
  elasticPolicy: {minReplicas: 2, maxReplicas: 8}
  pytorchReplicaSpecs:
    Worker:
      replicas: 2
      template:
        spec:
          shareProcessNamespace: true
          containers: [{name: trainer, image: t}]
"""
SHOWN = ("name", "restartPolicy", "ports", "readinessProbe", "livenessProbe")


def documented() -> dict:
    text = (ROOT / "docs" / "sidecar.md").read_text()
    manifest = text[text.index("## Manifest"):]
    return yaml.safe_load(re.search(r"```yaml\n(.*?)```", manifest, re.S).group(1))["spec"]


def injected() -> dict:
    out, _ = inject_text(ELASTIC, Settings(), version=__version__)
    return yaml.safe_load(out)["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]


def test_the_documented_sidecar_manifest_uses_the_names_inject_writes():
    doc, real = documented(), injected()
    assert len(doc["initContainers"]) == len(real["initContainers"]) == 2
    for shown, written in zip(doc["initContainers"], real["initContainers"], strict=True):
        assert {k: shown.get(k) for k in SHOWN} == {k: written.get(k) for k in SHOWN}
        assert shown["args"][0] == written["args"][0]
        assert {m["name"] for m in shown["volumeMounts"] if isinstance(m, dict)} <= \
            {m["name"] for m in written["volumeMounts"]}
    assert {v["name"] for v in doc["volumes"]} <= {v["name"] for v in real["volumes"]}
