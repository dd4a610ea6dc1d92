"""Processes per pod from DRA claims made and allocated with real kubectl in the sandbox: init, render and explain
read them as a cluster serves them (resource.k8s.io/v1 ResourceClaims, their status written by the scheduler)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.integration.conftest import finish, start_init
from tests.jobs import create_volcano_job

PODS = ("demo-master-0", "demo-worker-0")

TEMPLATES = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: four-gpus}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.nvidia.com, count: 4}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: imex-channel}
spec:
  spec:
    devices:
      requests:
      - name: channel
        exactly: {deviceClassName: compute-domain-default-channel.nvidia.com}
"""

# As the resourceclaim controller makes them from the templates: owned by the pod, named for its pod claim.
CLAIM = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: {pod}-{claim}-x7k2q
  annotations: {{resource.kubernetes.io/pod-claim-name: {claim}}}
  ownerReferences:
  - {{apiVersion: v1, kind: Pod, name: {pod}, uid: {uid}, controller: true, blockOwnerDeletion: true}}
spec:
  devices:
    requests:
    - name: {request}
      exactly: {{deviceClassName: {device_class}{count}}}
"""


def _with_claims(pod):
    """The pod as the API server holds it once its claims are made: a trainer with cpu 96 taking two claims."""
    name = pod["metadata"]["name"]
    container = pod["spec"]["containers"][0]
    container["resources"] = {"limits": {"cpu": "96"}, "claims": [{"name": "gpus"}, {"name": "imex"}]}
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "four-gpus"},
                                     {"name": "imex", "resourceClaimTemplateName": "imex-channel"}]
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": f"{name}-gpus-x7k2q"},
                                              {"name": "imex", "resourceClaimName": f"{name}-imex-x7k2q"}]


def _job(sandbox, kubectl):
    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 1)))
    uids = {p["metadata"]["name"]: sandbox.update_pod("default", p["metadata"]["name"], _with_claims)["metadata"]["uid"]
            for p in pods}
    kubectl("apply", "-f", "-", input=TEMPLATES)
    claims = [CLAIM.format(pod=pod, uid=uids[pod], claim="gpus", request="gpu", device_class="gpu.nvidia.com",
                           count=", count: 4") for pod in PODS]
    claims += [CLAIM.format(pod=pod, uid=uids[pod], claim="imex", request="channel",
                            device_class="compute-domain-default-channel.nvidia.com", count="") for pod in PODS]
    kubectl("apply", "-f", "-", input="---".join(claims))


def _allocate(kubectl):
    """What the scheduler writes: 4 GPUs from NVIDIA's driver, and the ComputeDomain's IMEX channel."""
    for pod in PODS:
        gpus = [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": f"node-{pod}", "device": f"gpu-{i}"}
                for i in range(4)]
        channel = [{"request": "channel", "driver": "compute-domain.nvidia.com", "pool": f"node-{pod}",
                    "device": "channel-0"}]
        for claim, results in (("gpus", gpus), ("imex", channel)):
            patch = {"status": {"allocation": {"devices": {"results": results}}}}
            kubectl("patch", "resourceclaim", f"{pod}-{claim}-x7k2q", "--subresource=status", "--type=merge",
                    "-p", json.dumps(patch))


def test_init_counts_the_gpus_its_claims_were_allocated_not_the_96_cpus(sandbox, kubectl, tmp_path):
    _job(sandbox, kubectl)
    _allocate(kubectl)
    shown = json.loads(kubectl("get", "resourceclaim", "demo-worker-0-gpus-x7k2q", "-o", "json").stdout)
    assert len(shown["status"]["allocation"]["devices"]["results"]) == 4  # kubectl wrote the status
    procs = {name: start_init(sandbox, name, tmp_path / name) for name in PODS}
    for name, proc in procs.items():
        code, err = finish(proc)
        assert code == 0, err
        doc = json.loads((tmp_path / name / "topology.json").read_text())
        assert doc["env"]["NPROC_PER_NODE"] == doc["env"]["PET_NPROC_PER_NODE"] == "4", err
        assert [m["slots"] for m in doc["members"]] == [4, 4]  # its peer's too, held compact
        hostfile = (tmp_path / name / "hostfile").read_text().split("\n")
        assert [line.split()[-1] for line in hostfile if line] == ["slots=4", "slots=4"]
        assert "read 4 DRA claim(s)" in err


def test_claims_that_cannot_be_listed_fall_back_to_the_cpu_limit_and_say_why(sandbox, kubectl, tmp_path):
    _job(sandbox, kubectl)
    _allocate(kubectl)
    sandbox.faults(status=403, path="/resourceclaims", count=-1)
    procs = {name: start_init(sandbox, name, tmp_path / name) for name in PODS}
    for name, proc in procs.items():
        code, err = finish(proc)
        assert code == 0, err
        doc = json.loads((tmp_path / name / "topology.json").read_text())
        assert doc["env"]["NPROC_PER_NODE"] == "96"
        assert "DRA claims not read: cannot list resourceclaims in namespace default" in err
        assert "grant get and list on resourceclaims" in err


def test_explain_and_render_read_the_claims_kubectl_prints(sandbox, kubectl, tmp_path):
    _job(sandbox, kubectl)
    pods = tmp_path / "pods.json"
    pods.write_text(kubectl("get", "pods", "-o", "json").stdout)
    claims = tmp_path / "claims.json"

    def explain(*extra):
        out = subprocess.run([sys.executable, "-m", "agent.cli", "explain", "--pods", str(pods), "--self",
                              "demo-worker-0", *extra], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    claims.write_text(kubectl("get", "resourceclaims,resourceclaimtemplates", "-o", "json").stdout)
    before = explain("--claims", str(claims))  # made, not allocated: the claims' exactly.count
    assert "4 accelerator(s) in container 'trainer'" in before and "not allocated yet" in before
    _allocate(kubectl)
    claims.write_text(kubectl("get", "resourceclaims", "-o", "json").stdout)
    after = explain("--claims", str(claims))
    assert "allocated 4 x gpu.nvidia.com (NVIDIA GPU)" in after
    assert "left out 1 x compute-domain.nvidia.com" in after
    assert "pass --claims" in explain() and "CPU limit 96" in explain()
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "agent.cli", "render", "--pods", str(pods), "--self",
                           "demo-worker-0", "--claims", str(claims), "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "export NPROC_PER_NODE='4'" in (out / "torch.env").read_text()
