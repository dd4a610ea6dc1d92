"""Processes per pod from Dynamic Resource Allocation claims: one table, each row a pod, its claims, the count."""

from __future__ import annotations

import pytest

from agent.core.model import Options, Processes
from agent.core.pods.accelerators import DRA_DRIVERS
from agent.core.pods.claims import Claims, read_claims
from agent.core.pods.containers import nproc_kind, resolve_nproc
from tests.conftest import env_of, render
from tests.core.test_rules import one_pod_job


def results(*spec):
    """Allocation results from (request, driver, how many)."""
    out = []
    for request, driver, n in spec:
        out += [{"request": request, "driver": driver, "pool": "node-a", "device": f"{driver}-{i}"} for i in range(n)]
    return out


def claim(name, *, allocated=None, requests=(), owner=None, pod_claim=None, created=None, deleted=None):
    meta = {"name": name, "namespace": "default"}
    if created:
        meta["creationTimestamp"] = created
    if deleted:
        meta["deletionTimestamp"] = deleted
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": "u", "controller": True}]
        meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": pod_claim}
    item = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": list(requests)}}}
    if allocated is not None:
        item["status"] = {"allocation": {"devices": {"results": allocated}}}
    return item


def template(name, *requests):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": list(requests)}}}}


def exactly(name, device_class, count=None, mode=None):
    ask = {"deviceClassName": device_class}
    if count is not None:
        ask["count"] = count
    if mode is not None:
        ask["allocationMode"] = mode
    return {"name": name, "exactly": ask}


def trainer(claims, *, cpu="96", limits=None, env=None):
    return {"name": "trainer", "image": "trainer:1", "env": env or [],
            "resources": {"limits": {"cpu": cpu, **(limits or {})}, "claims": claims}}


def dra_pod(c, *, pod_claims=(), statuses=()):
    pod = one_pod_job(c)[0]
    if pod_claims:
        pod["spec"]["resourceClaims"] = list(pod_claims)
    if statuses:
        pod["status"]["resourceClaimStatuses"] = list(statuses)
    return pod


GPUS = {"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}
IMEX = {"name": "imex", "resourceClaimTemplateName": "channel"}
MADE = [{"name": "gpus", "resourceClaimName": "solo-0-gpus-x1"},
        {"name": "imex", "resourceClaimName": "solo-0-imex-y2"}]
TEMPLATES = [template("eight-gpus", exactly("gpu", "gpu.nvidia.com", 8)),
             template("channel", exactly("channel", "compute-domain-default-channel.nvidia.com"))]
ALLOCATED = [claim("solo-0-gpus-x1", allocated=results(("gpu", "gpu.nvidia.com", 4))),
             claim("solo-0-imex-y2", allocated=results(("channel", "compute-domain.nvidia.com", 1)))]

CASES = [
    ("4 NVIDIA GPUs and an IMEX channel allocated: 4, not the 96 CPUs",
     dra_pod(trainer([{"name": "gpus"}, {"name": "imex"}]), pod_claims=[GPUS, IMEX], statuses=MADE),
     read_claims(ALLOCATED + TEMPLATES), 4,
     ("allocated 4 x gpu.nvidia.com (NVIDIA GPU)", "left out 1 x compute-domain.nvidia.com")),
    ("GPUs and channel in one claim: the channel left out",
     dra_pod(trainer([{"name": "gpus"}]), pod_claims=[GPUS], statuses=MADE[:1]),
     read_claims([claim("solo-0-gpus-x1", allocated=results(("gpu", "gpu.nvidia.com", 4),
                                                              ("channel", "compute-domain.nvidia.com", 1)))]), 4,
     ("ResourceClaim 'solo-0-gpus-x1' (pod claim 'gpus')",)),
    ("no claim made yet: the template's exactly.count",
     dra_pod(trainer([{"name": "gpus"}, {"name": "imex"}]), pod_claims=[GPUS, IMEX]),
     read_claims(TEMPLATES), 8,
     ("ResourceClaimTemplate 'eight-gpus'", "asks for 8 x gpu.nvidia.com (NVIDIA GPU) in request 'gpu' (exactly.count)",
      "left out request 'channel'")),
    ("claim made, not allocated: its requests (count 1 when unset)",
     dra_pod(trainer([{"name": "gpus"}]), pod_claims=[GPUS], statuses=MADE[:1]),
     read_claims([claim("solo-0-gpus-x1", requests=[exactly("gpu", "gpu.nvidia.com")])]), 1,
     ("not allocated yet",)),
    ("allocationMode All before allocation: unknown, the CPU limit, and why",
     dra_pod(trainer([{"name": "gpus"}]), pod_claims=[GPUS]),
     read_claims([template("eight-gpus", exactly("gpu", "gpu.nvidia.com", mode="All"))]), 96,
     ("CPU limit 96", "allocationMode All: how many devices is known only after allocation")),
    ("a container naming one request counts that request's devices only",
     dra_pod(trainer([{"name": "gpus", "request": "train"}]), pod_claims=[GPUS], statuses=MADE[:1]),
     read_claims([claim("solo-0-gpus-x1", allocated=results(("train", "gpu.nvidia.com", 4),
                                                              ("spare", "gpu.nvidia.com", 2)))]), 4,
     ("pod claim 'gpus' request 'train'",)),
    ("a subrequest's devices are its request's (firstAvailable)",
     dra_pod(trainer([{"name": "gpus", "request": "train"}]), pod_claims=[GPUS], statuses=MADE[:1]),
     read_claims([claim("solo-0-gpus-x1", allocated=results(("train/h100", "gpu.nvidia.com", 2)))]), 2, ()),
    ("an unknown driver is not counted, and named",
     dra_pod(trainer([{"name": "gpus"}]), pod_claims=[GPUS], statuses=MADE[:1]),
     read_claims([claim("solo-0-gpus-x1", allocated=results(("gpu", "gpu.nvidia.com", 2),
                                                              ("fpga", "fpga.example.com", 3)))]), 2,
     ("not counted 3 x fpga.example.com (not a known DRA accelerator driver",)),
    ("only unknown drivers: the CPU limit, the driver named",
     dra_pod(trainer([{"name": "gpus"}], cpu="6"), pod_claims=[GPUS], statuses=MADE[:1]),
     read_claims([claim("solo-0-gpus-x1", allocated=results(("fpga", "fpga.example.com", 3)))]), 6,
     ("CPU limit 6", "not counted 3 x fpga.example.com")),
    ("AMD and Intel drivers count",
     dra_pod(trainer([{"name": "gpus"}, {"name": "imex"}]), pod_claims=[GPUS, IMEX], statuses=MADE),
     read_claims([claim("solo-0-gpus-x1", allocated=results(("gpu", "gpu.amd.com", 2))),
                  claim("solo-0-imex-y2", allocated=results(("gpu", "gpu.intel.com", 3)))]), 5, ()),
    ("a compact peer's claim is found by its owner and annotation",
     dra_pod(trainer([{"name": "gpus"}])),
     read_claims([claim("solo-0-gpus-x1", allocated=results(("gpu", "gpu.nvidia.com", 4)), owner="solo-0",
                        pod_claim="gpus")]), 4, ()),
    ("a replaced pod's new claim, not the old one the garbage collector has yet to delete",
     dra_pod(trainer([{"name": "gpus"}])),
     read_claims([claim("solo-0-gpus-new", allocated=results(("gpu", "gpu.nvidia.com", 2)), owner="solo-0",
                        pod_claim="gpus", created="2026-12-01T10:05:00Z"),
                  claim("solo-0-gpus-old", allocated=results(("gpu", "gpu.nvidia.com", 4)), owner="solo-0",
                        pod_claim="gpus", created="2026-12-01T09:00:00Z", deleted="2026-12-01T10:00:00Z")]), 2,
     ("ResourceClaim 'solo-0-gpus-new'",)),
    ("a claim not among those read beside one allocated: the GPUs known, the other named",
     dra_pod(trainer([{"name": "gpus"}, {"name": "imex"}]), pod_claims=[GPUS, IMEX], statuses=MADE),
     read_claims(ALLOCATED[:1]), 4, ("ResourceClaim 'solo-0-imex-y2' not read (not among the claims read)",)),
    ("claims that could not be read: the CPU limit, and why",
     dra_pod(trainer([{"name": "gpus"}]), pod_claims=[GPUS], statuses=MADE[:1]),
     Claims(note="resourceclaims forbidden: grant get/list (manifests/rbac)"), 96,
     ("ResourceClaim 'solo-0-gpus-x1' not read (resourceclaims forbidden",)),
    ("claims not given to render: the CPU limit, and what to pass",
     dra_pod(trainer([{"name": "gpus"}]), pod_claims=[GPUS], statuses=MADE[:1]), None, 96,
     ("pass --claims",)),
    ("DRA and device-plugin accelerators add up",
     dra_pod(trainer([{"name": "gpus"}], limits={"nvidia.com/gpu": "2"}), pod_claims=[GPUS], statuses=MADE[:1]),
     read_claims(ALLOCATED), 6, ("+ resources.limits (nvidia.com/gpu: NVIDIA GPU)",)),
    ("an explicit NPROC_PER_NODE beats the claims",
     dra_pod(trainer([{"name": "gpus"}], env=[{"name": "NPROC_PER_NODE", "value": "1"}]), pod_claims=[GPUS],
             statuses=MADE[:1]), read_claims(ALLOCATED), 1, ()),
]


@pytest.mark.parametrize(("pod", "claims", "expected", "said"), [x[1:] for x in CASES], ids=[x[0] for x in CASES])
def test_nproc_from_dra_claims(pod, claims, expected, said):
    options = Options(processes=Processes(claims=claims))
    count, rule = resolve_nproc(pod, pod["spec"]["containers"][0], options)
    assert (count, [s for s in said if s not in rule]) == (expected, [])
    rendered = render([pod], "solo-0", processes=Processes(claims=claims))
    values = {v.name: v.value for v in rendered.variables}
    assert values["NPROC_PER_NODE"] == values["LOCAL_WORLD_SIZE"] == str(expected)
    assert env_of(rendered)["PET_NPROC_PER_NODE"] == str(expected)


def test_a_dra_count_is_an_accelerator_count_for_the_frameworks():
    pod = CASES[0][1]
    options = Options(processes=Processes(claims=read_claims(ALLOCATED)))
    _, rule = resolve_nproc(pod, pod["spec"]["containers"][0], options)
    assert nproc_kind(rule) == "devices"


@pytest.mark.parametrize("row", DRA_DRIVERS, ids=[r.driver for r in DRA_DRIVERS])
def test_each_dra_driver_row_counts_as_its_table_says(row):
    pod = dra_pod(trainer([{"name": "gpus"}], cpu="7"), pod_claims=[GPUS], statuses=MADE[:1])
    claims = read_claims([claim("solo-0-gpus-x1", allocated=results(("gpu", row.driver, 3)))])
    count, rule = resolve_nproc(pod, pod["spec"]["containers"][0], Options(processes=Processes(claims=claims)))
    assert count == (3 if row.accelerator else 7) and row.driver in rule and row.source
    before = read_claims([template("eight-gpus", exactly("gpu", row.classes[0], 2))])
    count, _ = resolve_nproc(dra_pod(trainer([{"name": "gpus"}], cpu="7"), pod_claims=[GPUS]),
                             pod["spec"]["containers"][0], Options(processes=Processes(claims=before)))
    assert count == (2 if row.accelerator else 7)


def test_odd_claim_shapes_are_read_as_absent():
    claims = read_claims([None, {"kind": "ResourceClaim", "metadata": "x", "status": {"allocation": []}},
                          {"kind": "ResourceClaimTemplate", "spec": {"spec": {"devices": {"requests": [3]}}}},
                          claim("solo-0-gpus-x1", allocated=[{"request": "gpu", "driver": 7}])])
    pod = dra_pod(trainer([{"name": "gpus"}], cpu="5"), pod_claims=[GPUS], statuses=MADE[:1])
    count, rule = resolve_nproc(pod, pod["spec"]["containers"][0], Options(processes=Processes(claims=claims)))
    assert count == 5 and "not counted 1 x ?" in rule
