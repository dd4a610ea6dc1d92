"""The rank order is rank.py's alone: with another rule swapped in there (each role's pods by index descending), the
planner's incremental layouts still equal plans made from scratch, a pod in its own view still gets the numbers
of the whole plan from the summary, and the ranks follow the new rule. Nothing else is changed for it.

One answer does not follow: ``rank_zero`` (the pod the publication's leader expects first, from the job's objects
alone) asks each role's ``Controller.first_index``, which assumes index order within a role; a rule that puts
another index first must give it the role's index range too."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import examples
from agent.core.model import Options
from agent.core.plan import rank
from agent.core.plan.layout import build_plan
from agent.core.plan.rank import SortKey
from tests.core.test_planner import JOBS, OPS, OPTIONS, World, _check
from tests.core.test_summary import OPS as SUMMARY_OPS
from tests.core.test_summary import _check_every_pod, _stepped


def _descending(self: rank.RankRule, role: str, index: tuple[int, ...], *, first: bool, address: str | None,
                name: str) -> SortKey:
    """The default rule with each training role's pods in descending index order."""
    at = self.position.get(role)
    if at is None:
        return (2, len(self.position), role, index, name)
    if address is not None:
        return (1, 0, address, index, name)
    return (0 if first else 1, at if self.explicit else 0, "", tuple(-i for i in index), name)


@pytest.fixture
def descending(monkeypatch):
    monkeypatch.setattr(rank.RankRule, "_key", _descending)


def test_the_swapped_rule_decides_the_ranks(descending):
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 4)))
    members = build_plan(pods, "demo-master-0", Options()).topology.members
    assert [(m.name, m.node_rank) for m in members] == [
        ("demo-master-0", 0), ("demo-worker-3", 1), ("demo-worker-2", 2), ("demo-worker-1", 3), ("demo-worker-0", 4)]


def test_without_the_swap_the_ranks_follow_the_index():
    members = build_plan(examples.volcano_job(tasks=(("master", 1), ("worker", 4))), "demo-master-0",
                         Options()).topology.members
    assert [m.name for m in members][1:] == [f"demo-worker-{k}" for k in range(4)]


@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("opts", ["default", "ip"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=15),
       told=st.booleans())
def test_the_planner_follows_the_swapped_rule_as_from_scratch(descending, job, opts, seed, ops, told):
    _check(World(JOBS[job](), random.Random(seed)), OPTIONS[opts], ops, told=told)


@pytest.mark.parametrize("job", sorted(JOBS))
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), ops=st.lists(st.sampled_from(SUMMARY_OPS), min_size=0, max_size=10))
def test_the_summary_serves_the_swapped_rule(descending, job, seed, ops):
    _check_every_pod(_stepped(JOBS[job], seed, ops), Options(), 2)


@pytest.mark.parametrize("job", sorted(JOBS))
def test_every_training_pod_is_compared_under_the_swapped_rule(descending, job):
    pods = JOBS[job]()
    training = sum(build_plan(pods, p["metadata"]["name"], Options()).topology.me.training for p in pods
                   if p["status"].get("phase") != "Succeeded")
    assert training > 1
    assert _check_every_pod(pods, Options(), 2) == training
