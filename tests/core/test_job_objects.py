"""What the job's objects say beyond the pods: replica counts, dependencies between roles, the leader.

A role that the controller creates only once another role's pods are Ready is never waited for by that other
role's pods (waiting would deadlock the job): JobSet's ``dependsOn`` (api/jobset/v1alpha2/jobset_types.go,
v0.8.0+), the deprecated ``startupPolicy: InOrder``, and the MPI operator's ``launcherCreationPolicy:
WaitForWorkersReady`` (pkg/apis/kubeflow/v2beta1/types.go, v0.6.0+).
"""

from __future__ import annotations

import pytest

from agent.core.controllers import CONTROLLERS
from agent.core.model import Options
from agent.core.plan.gang import deferred_roles, expectation_from_job
from agent.core.publication.leading import rank_zero_identity
from agent.errors import InputError


def jobset(*rjobs: tuple[str, int, list[str]], in_order: bool = False) -> dict:
    spec: dict = {"replicatedJobs": [
        {"name": name, "replicas": 1, "template": {"spec": {"parallelism": n, "completions": n}},
         **({"dependsOn": [{"name": d, "status": "Ready"} for d in needs]} if needs else {})}
        for name, n, needs in rjobs]}
    if in_order:
        spec["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    return {"kind": "JobSet", "metadata": {"name": "j"}, "spec": spec}


DEEPSPEED = jobset(("node", 3, []), ("launcher", 1, ["node"]))  # Trainer v2.3.0's DeepSpeed runtime
CHAIN = jobset(("init", 1, []), ("workers", 4, ["init"]), ("eval", 1, ["workers"]))
IN_ORDER = jobset(("driver", 1, []), ("workers", 4, []), ("eval", 1, []), in_order=True)
MPI_WAITS = {"kind": "MPIJob", "metadata": {"name": "m"},
             "spec": {"launcherCreationPolicy": "WaitForWorkersReady", "runLauncherAsWorker": True,
                      "mpiReplicaSpecs": {"Launcher": {"replicas": 1}, "Worker": {"replicas": 4}}}}

CASES = [
    # (id, controller, job object, roles, this pod's role, per-role counts waited for, deferred roles)
    ("deepspeed node waits for nodes only", "trainjob", DEEPSPEED, ("node", "launcher"), "node",
     {"node": 3}, ("launcher",)),
    ("deepspeed launcher waits for everyone", "trainjob", DEEPSPEED, ("node", "launcher"), "launcher",
     {"node": 3, "launcher": 1}, ()),
    ("dependencies chain: the first role waits for itself alone", "jobset", CHAIN, None, "init",
     {"init": 1}, ("eval", "workers")),
    ("dependencies chain: the middle role does not wait for the last", "jobset", CHAIN, None, "workers",
     {"init": 1, "workers": 4}, ("eval",)),
    ("InOrder: each replicated job waits for the ones before it only", "jobset", IN_ORDER, None, "workers",
     {"driver": 1, "workers": 4}, ("eval",)),
    ("MPIJob WaitForWorkersReady: workers do not wait for the launcher", "mpijob", MPI_WAITS,
     ("launcher", "worker"), "worker", {"worker": 4}, ("launcher",)),
    ("MPIJob at startup: everyone waits for everyone", "mpijob",
     {**MPI_WAITS, "spec": {**MPI_WAITS["spec"], "launcherCreationPolicy": "AtStartup"}},
     ("launcher", "worker"), "worker", {"launcher": 1, "worker": 4}, ()),
]


@pytest.mark.parametrize(("key", "owner", "roles", "role", "per_role", "deferred"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_pod_waits_only_for_roles_that_can_exist_before_it_is_ready(key, owner, roles, role, per_role, deferred):
    expected = expectation_from_job(CONTROLLERS[key], (owner,), roles, Options(), role=role)
    assert expected.per_role == per_role
    assert expected.total == sum(per_role.values())
    assert expected.deferred == deferred


def test_the_log_line_names_what_is_not_waited_for():
    expected = expectation_from_job(CONTROLLERS["trainjob"], (DEEPSPEED,), ("node", "launcher"), Options(),
                                    role="node")
    assert expected.source == "JobSet 'j' replicas; not waiting for launcher, created once node is Ready"


def test_dependency_cycles_never_defer_the_pods_own_role():
    assert deferred_roles({"a": frozenset({"b"}), "b": frozenset({"a"})}, "a") == ("b",)


def test_a_role_that_waits_for_others_never_leads_the_publication():
    """The leader publishes for the others, who wait for it: a launcher created after the nodes are Ready would
    make the nodes wait for a publication that cannot come."""
    from agent.core.plan.gang import Expectation

    launcher_first = jobset(("launcher", 1, ["node"]), ("node", 3, []))
    expected = Expectation(4, {"launcher": 1, "node": 3}, "t")
    assert rank_zero_identity(CONTROLLERS["jobset"], expected, (launcher_first,), ("launcher", "node")) == \
        ("node", (1, 0))


def test_only_the_pods_own_role_is_known_to_exist_when_every_role_is_deferred():
    with pytest.raises(InputError, match="lists no training roles"):
        expectation_from_job(CONTROLLERS["jobset"], (CHAIN,), ("eval",), Options(), role="init")
