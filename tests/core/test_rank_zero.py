"""Rank 0's pod is predicted from the job's objects alone, before any pod is seen (``leading.rank_zero_identity``,
by ``topology.rank_zero``: the pod that publishes where Leases cannot be read, and a guard of the leading init);
it must be the pod the plan then puts at rank 0. For every controller's example, the shipped manifests, and any
JobSet shape (roles, a coordinator, dependsOn)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agent import examples
from agent.core import Options, build_plan
from agent.core.controllers import COORDINATOR, detect_controller
from agent.core.plan.gang import expectation_from_job, expectation_from_pod
from agent.core.publication.leading import rank_zero_identity
from agent.errors import InputError
from tests.manifest_pods import pods_for

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "examples"


def jobset_object(rjobs, *, coordinator=None, depends=None):
    """A JobSet as the API returns it: replicated jobs (name, replicas, parallelism), optional coordinator
    (replicatedJob, jobIndex, podIndex) and dependsOn (name -> the replicated job it waits for)."""
    spec = {"replicatedJobs": [
        {"name": name, "replicas": count, "template": {"spec": {"parallelism": width, "completions": width}},
         **({"dependsOn": [{"name": depends[name], "status": "Ready"}]} if depends and name in depends else {})}
        for name, count, width in rjobs]}
    if coordinator is not None:
        spec["coordinator"] = dict(zip(("replicatedJob", "jobIndex", "podIndex"), coordinator, strict=True))
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "js"}, "spec": spec}


def name_coordinator(pods, name, coordinator):
    """Every pod of the JobSet carries the coordinator's host name, as JobSet labels them (v0.6.0+)."""
    role, job_index, pod_index = coordinator
    for pod in pods:
        for section in ("labels", "annotations"):
            pod["metadata"][section][COORDINATOR] = f"{name}-{role}-{job_index}-{pod_index}.{name}"
    return pods


JOBSET_RJOBS = (("driver", 1, 1), ("workers", 2, 2))
EXAMPLES = {
    "volcano": (lambda: examples.volcano_job(), {}, {"spec": {"tasks": [
        {"name": "master", "replicas": 1}, {"name": "worker", "replicas": 3}, {"name": "extras", "replicas": 4}]}}),
    "volcano-no-master": (lambda: examples.volcano_job(tasks=(("worker", 3),)), {},
                          {"spec": {"tasks": [{"name": "master", "replicas": 0}, {"name": "worker", "replicas": 3}]}}),
    "pytorchjob": (lambda: examples.pytorchjob(workers=3), {},
                   {"spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 3}}}}),
    "mpijob": (lambda: examples.mpijob(workers=3), {},
               {"spec": {"mpiReplicaSpecs": {"Launcher": {"replicas": 1}, "Worker": {"replicas": 3}}}}),
    "mpijob-launcher-as-worker": (lambda: examples.mpijob(workers=3), {}, {"spec": {
        "runLauncherAsWorker": True, "mpiReplicaSpecs": {"Launcher": {"replicas": 1}, "Worker": {"replicas": 3}}}}),
    "jobset": (lambda: examples.jobset(rjobs=JOBSET_RJOBS), {}, jobset_object(JOBSET_RJOBS)),
    "jobset-roles": (lambda: examples.jobset(rjobs=JOBSET_RJOBS), {"roles": ("workers", "driver")},
                     jobset_object(JOBSET_RJOBS)),
    "jobset-coordinator": (
        lambda: name_coordinator(examples.jobset(rjobs=JOBSET_RJOBS), "trainer", ("workers", 1, 1)), {},
        jobset_object(JOBSET_RJOBS, coordinator=("workers", 1, 1))),
    "jobset-coordinator-roles": (
        lambda: name_coordinator(examples.jobset(rjobs=JOBSET_RJOBS), "trainer", ("workers", 0, 1)),
        {"roles": ("driver", "workers")}, jobset_object(JOBSET_RJOBS, coordinator=("workers", 0, 1))),
    "jobset-coordinator-not-training": (
        lambda: name_coordinator(examples.jobset(rjobs=JOBSET_RJOBS), "trainer", ("driver", 0, 0)),
        {"roles": ("workers",)}, jobset_object(JOBSET_RJOBS, coordinator=("driver", 0, 0))),
    "trainjob": (lambda: examples.trainjob(num_nodes=3), {},
                 jobset_object((("dataset-initializer", 1, 1), ("node", 1, 3)))),
    "trainjob-mpi": (lambda: examples.trainjob_mpi(num_nodes=4), {},
                     jobset_object((("node", 1, 3), ("launcher", 1, 1)))),
    "lws": (lambda: examples.leaderworkerset(size=4, groups=1), {}, None),
    "indexed-job": (lambda: examples.indexed_job(completions=3), {}, {"spec": {"parallelism": 3, "completions": 3}}),
}


def predicted_and_planned(pods, options, owner, *, me=None):
    """(the rank 0 init predicts for pod ``me``, (role, index) of rank 0 in the plan of ``pods``), the options
    first completed by the job's object as init completes them (job_reads)."""
    me_pod = me or next(p for p in pods if p["status"].get("phase") != "Succeeded")
    objects = (owner,) if owner is not None else ()
    controller = detect_controller(me_pod, options)
    options = controller.owner_options(objects, options).options if objects else options
    controller = detect_controller(me_pod, options)
    roles = controller.training_roles(options)
    role = controller.identify(me_pod, options).role
    expected = expectation_from_pod(controller, me_pod)  # as init: what the pod says first (LeaderWorkerSet)
    if expected is not None:
        objects = ()
    else:
        expected = expectation_from_job(controller, objects, roles, options, role=role)
    leader = rank_zero_identity(controller, expected, objects, roles)
    plan = build_plan(pods, me_pod["metadata"]["name"], dataclasses.replace(options, roles_checked=True))
    if not plan.topology.training:
        return leader, None
    first = next(p for p in pods if p["metadata"]["name"] == plan.topology.training[0].name)
    ident = plan.controller.identify(first, options)
    return leader, (ident.role, ident.index)


@pytest.mark.parametrize("case", sorted(EXAMPLES))
def test_the_predicted_leader_is_rank_0_of_every_controllers_example(case):
    build, options, owner = EXAMPLES[case]
    leader, rank0 = predicted_and_planned(build(), Options(**options), owner)
    assert leader is not None and leader == rank0


def test_the_coordinator_leads_wherever_jobset_names_it():
    build, options, owner = EXAMPLES["jobset-coordinator"]
    leader, rank0 = predicted_and_planned(build(), Options(**options), owner)
    assert leader == rank0 == ("workers", (2, 1))  # global index: the driver's Job, then workers' Job 1


@pytest.mark.parametrize("path", sorted(MANIFESTS.glob("*.yaml")), ids=lambda p: p.stem)
def test_the_predicted_leader_is_rank_0_of_every_shipped_manifest(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") != "Service"]
    assert len(docs) == 1
    owner = docs[0]
    leader, rank0 = predicted_and_planned(pods_for(owner), Options(address="ip"), owner)
    if (owner["spec"].get("elasticPolicy") or {}).get("minReplicas"):
        assert leader is None  # an elastic job's size moves: no pod is known to lead, every pod reads the pods
    else:
        assert leader is not None and leader == rank0


NAMES = ("a", "b", "c", "d")


@st.composite
def jobsets(draw):
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4, unique=True))
    rjobs = tuple((name, draw(st.integers(0, 2)), draw(st.integers(1, 3))) for name in names)
    populated = [r for r in rjobs if r[1]]
    assume(populated)
    coordinator = None
    if draw(st.booleans()):
        name, count, width = draw(st.sampled_from(populated))
        coordinator = (name, draw(st.integers(0, count - 1)), draw(st.integers(0, width - 1)))
    depends = {name: draw(st.sampled_from(names[:at])) for at, name in enumerate(names)
               if at and draw(st.integers(0, 3)) == 0}
    roles = draw(st.none() | st.permutations(names).flatmap(lambda p: st.integers(1, len(p)).map(lambda k: p[:k])))
    return rjobs, coordinator, depends, roles


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(jobsets())
def test_the_predicted_leader_is_rank_0_of_any_jobset(shape):
    """Roles that wait for others (dependsOn) have no pods yet when the others' gang is complete: the plan at
    that moment is of the others' pods, and its rank 0 is the leader they wait for."""
    rjobs, coordinator, depends, roles = shape
    pods = examples.jobset("js", rjobs)
    if coordinator is not None:
        name_coordinator(pods, "js", coordinator)
    waiting = set(depends)
    present = [p for p in pods if p["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] not in waiting]
    assume(present)
    owner = jobset_object(rjobs, coordinator=coordinator, depends=depends)
    try:
        leader, rank0 = predicted_and_planned(present, Options(roles=roles), owner, me=present[-1])
    except InputError as err:  # the roles name none of the pods init would wait for: init refuses alike
        assert "lists no training roles" in str(err)
        return
    assert leader == rank0
