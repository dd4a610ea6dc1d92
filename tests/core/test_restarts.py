"""The in-place restart rule (core/plan/restarts.py): each pod's restart attempt as the API shows it, and when a
rerun's barrier is down, by the pods' init restartCounts or by JobSet's in-place restart protocol."""

from __future__ import annotations

from typing import Any

import pytest

from agent.core.plan.restarts import (
    JOBSET_ATTEMPT,
    attempt_of,
    init_attempt,
    init_running,
    jobset_barrier,
    jobset_in_place,
    restarts_barrier,
    wanted_jobset_attempt,
)


def pod(name: str, restarts: int | None = 0, *, state: str = "terminated", phase: str = "Running",
        container: str = "topology-agent", others: list[dict[str, Any]] | None = None,
        annotations: dict[str, str] | None = None, sidecars: tuple[str, ...] = ()) -> dict[str, Any]:
    statuses = [] if restarts is None else [{"name": container, "restartCount": restarts, "state": {state: {}}}]
    return {"metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"initContainers": [{"name": n, "restartPolicy": "Always"} for n in sidecars]},
            "status": {"phase": phase, "initContainerStatuses": statuses + (others or [])}}


ATTEMPTS = [
    pytest.param(pod("a", 3), 3, id="the-agent-init-restartCount"),
    pytest.param(pod("a", None), 0, id="no-status-yet-is-attempt-0"),
    pytest.param(pod("a", 2, container="configure", others=[{"name": "fetch", "restartCount": 1, "state": {}}]), 2,
                 id="an-agent-init-named-otherwise:-the-highest-regular-init"),
    pytest.param(pod("a", 1, container="configure", sidecars=("jobset-agent",),
                     others=[{"name": "jobset-agent", "restartCount": 9, "state": {}}]), 1,
                 id="a-sidecar's-own-restarts-do-not-count"),
    pytest.param(pod("a", 1, others=[{"name": "fetch", "restartCount": 5, "state": {}}]), 1,
                 id="topology-agent-wins-over-other-inits"),
    pytest.param(pod("a", -1), 0, id="a-negative-count-is-no-count"),
    pytest.param(pod("a", True), 0, id="a-bool-is-no-count"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("raw", "attempt"), ATTEMPTS)
def test_a_pods_attempt_is_its_agent_inits_restart_count(raw, attempt):
    assert init_attempt(raw) == attempt
    assert attempt_of(raw, "restarts") == attempt


@pytest.mark.parametrize(("raw", "running"), [
    pytest.param(pod("a", 1, state="running"), True, id="running"),
    pytest.param(pod("a", 1, state="waiting"), True, id="waiting-to-start"),
    pytest.param(pod("a", None), True, id="no-status-yet"),
    pytest.param(pod("a", 1, state="terminated"), False, id="completed"),
    pytest.param(pod("a", 1, state="running", phase="Failed"), False, id="a-failed-pod"),
])
def test_an_agent_init_that_has_not_terminated_is_running_now(raw, running):
    assert init_running(raw) is running


BARRIERS = [
    pytest.param({"a": pod("a", 1, state="running"), "b": pod("b", 0)}, 1, ("b",),
                 id="a-member-not-restarted-holds-it"),
    pytest.param({"a": pod("a", 1, state="running"), "b": pod("b", 1)}, 1, (), id="every-member-restarted"),
    pytest.param({"a": pod("a", 1, state="running"), "b": pod("b", 0, state="running")}, 1, (),
                 id="a-member-starting-now-(a-new-pod)-is-there"),
    pytest.param({"a": pod("a", 2, state="running"), "b": pod("b", 3)}, 1, (),
                 id="a-member-ahead-(an-init-retried-after-a-failure)-is-there"),
    pytest.param({"a": pod("a", 2, state="running"), "b": pod("b", 1)}, 2, ("b",),
                 id="the-second-restart-waits-for-attempt-2"),
    pytest.param({"a": pod("a", 1, state="running")}, 1, (), id="a-member-gone-is-not-waited-for"),
]


@pytest.mark.parametrize(("pods", "runs", "behind"), BARRIERS)
def test_the_restarts_barrier_is_down_once_every_member_restarted_since(pods, runs, behind):
    barrier = restarts_barrier(pods, ("a", "b"), runs)
    assert barrier.behind == behind
    assert barrier.down is (not behind)
    if behind:
        assert f"not restarted to attempt {runs} yet: {', '.join(behind)}" in barrier.describe()


def jobset(strategy: str | None = "InPlaceRestart", *, current: Any = None, disabled: bool = False) -> dict[str, Any]:
    return {"kind": "JobSet", "metadata": {"name": "js", "annotations": {
        "jobset.sigs.k8s.io/disable-in-place-restart": "true"} if disabled else {}},
            "spec": {"failurePolicy": {"restartStrategy": strategy}} if strategy else {},
            "status": {} if current is None else {"currentInPlaceRestartAttempt": current}}


@pytest.mark.parametrize(("objects", "used"), [
    pytest.param([jobset()], True, id="InPlaceRestart"),
    pytest.param([{"kind": "TrainJob"}, jobset()], True, id="a-TrainJob's-JobSet"),
    pytest.param([jobset("Recreate")], False, id="Recreate"),
    pytest.param([jobset(None)], False, id="no-failurePolicy"),
    pytest.param([jobset(disabled=True)], False, id="turned-off-by-its-annotation"),
    pytest.param([{"kind": "Job"}], False, id="not-a-JobSet"),
])
def test_a_job_uses_jobsets_protocol_when_its_jobset_restarts_in_place(objects, used):
    assert (jobset_in_place(objects) is not None) is used


@pytest.mark.parametrize(("annotation", "recorded", "wanted"), [
    pytest.param("1", 0, 1, id="written-for-this-run"),
    pytest.param("0", 0, 1, id="not-written-yet-for-this-run:-the-next"),
    pytest.param(None, 0, 1, id="none-written:-the-next"),
    pytest.param("3", None, 3, id="no-attempt-recorded-before"),
    pytest.param("x", 2, 3, id="not-a-number:-the-next"),
    pytest.param("-1", None, 0, id="negative:-the-first"),
])
def test_the_attempt_a_rerun_belongs_to_by_jobsets_protocol(annotation, recorded, wanted):
    raw = pod("a", annotations={} if annotation is None else {JOBSET_ATTEMPT: annotation})
    assert wanted_jobset_attempt(raw, recorded) == wanted


@pytest.mark.parametrize(("current", "attempt", "down"), [
    pytest.param(None, 1, False, id="not-set"),
    pytest.param(0, 1, False, id="behind"),
    pytest.param(1, 1, True, id="at-this-attempt"),
    pytest.param(2, 1, True, id="past-it"),
    pytest.param("1", 1, False, id="a-string-is-not-the-field"),
])
def test_the_jobset_barrier_is_down_once_its_current_attempt_reached_this_pods(current, attempt, down):
    barrier = jobset_barrier(jobset(current=current), attempt)
    assert barrier.down is down
    if not down:
        assert f"waiting for {attempt}" in barrier.describe()


def test_jobsets_attempt_is_read_from_its_annotation():
    assert attempt_of(pod("a", 5, annotations={JOBSET_ATTEMPT: "2"}), "jobset") == 2
    assert attempt_of(pod("a", 5), "jobset") is None


# --- what `status` shows ------------------------------------------------------------------------------------------

def _volcano(*attempts: tuple[int, str]) -> list[dict[str, Any]]:
    from agent import examples

    pods = examples.volcano_job("demo", (("master", 1), ("worker", len(attempts) - 1)))
    for raw, (count, state) in zip(pods, attempts, strict=True):
        raw["status"]["initContainerStatuses"] = [{"name": "topology-agent", "restartCount": count,
                                                   "state": {state: {}}}]
    return pods


def _status(pods: list[dict[str, Any]], objects: list[dict[str, Any]] | None = None) -> Any:
    from agent.core.model import Options
    from agent.core.report.status import job_status

    return job_status(pods, job="demo", kind="Volcano Job 'demo'", namespace="default", options=Options(),
                      roster=None, expected=len(pods), seen={}, objects=objects or [])


def test_status_shows_each_pods_attempt_and_who_waits_at_the_barrier_for_whom():
    from agent.core.report.status import document, table

    status = _status(_volcano((0, "terminated"), (1, "running"), (1, "terminated")))
    text = table(status, now=0)
    assert text.endswith("""
RESTARTS    in place, by the pods' agent init restartCounts
POD             ATTEMPT
demo-master-0   0
demo-worker-0   1
demo-worker-1   1
BARRIER     demo-worker-0 wait(s) for demo-master-0
""")
    assert document(status, now=0)["restarts"] == {
        "rule": "restarts", "current": None, "attempts": {"demo-master-0": 0, "demo-worker-0": 1, "demo-worker-1": 1},
        "atBarrier": True, "waiting": ["demo-worker-0"], "behind": ["demo-master-0"]}
    after = _status(_volcano((1, "terminated"), (1, "terminated"), (1, "terminated")))
    assert "BARRIER     none (no pod waits)" in table(after, now=0)
    assert document(after, now=0)["restarts"]["atBarrier"] is False


def test_status_says_nothing_of_restarts_where_no_pod_restarted_in_place():
    from agent.core.report.status import document, table

    status = _status(_volcano((0, "terminated"), (0, "running")))
    assert "RESTARTS" not in table(status, now=0)
    assert document(status, now=0)["restarts"] is None


def test_status_follows_the_jobsets_attempts_under_its_protocol():
    from agent.core.report.status import document, table

    pods = _volcano((5, "terminated"), (5, "terminated"), (5, "terminated"))
    for raw, attempt in zip(pods, ("2", "2", "1"), strict=True):
        raw["metadata"].setdefault("annotations", {})[JOBSET_ATTEMPT] = attempt
    status = _status(pods, [jobset(current=1)])
    text = table(status, now=0)
    assert "RESTARTS    in place, by JobSet's in-place restart, current attempt 1" in text
    assert "BARRIER     demo-master-0, demo-worker-0 wait(s) for demo-worker-1" in text
    assert document(status, now=0)["restarts"]["attempts"] == {"demo-master-0": 2, "demo-worker-0": 2,
                                                               "demo-worker-1": 1}


GATE = {"name": "in-place-restart-agent", "restartPolicy": "Always", "startupProbe": {"httpGet": {"port": 8081}}}


@pytest.mark.parametrize(("inits", "gate"), [
    pytest.param([{"name": "topology-agent"}, GATE], "in-place-restart-agent", id="JobSet's-agent-after-ours"),
    pytest.param([GATE, {"name": "topology-agent"}], None, id="JobSet's-agent-first"),
    pytest.param([{"name": "topology-agent"}, {**GATE, "startupProbe": None}], None, id="a-sidecar-without-probe"),
    pytest.param([{"name": "topology-agent"}, {**GATE, "restartPolicy": None}], None, id="a-plain-init"),
    pytest.param([GATE], None, id="no-agent-init-named-topology-agent"),
])
def test_a_gate_after_the_agents_init_is_found(inits, gate):
    from agent.core.plan.restarts import gate_after_agent

    assert gate_after_agent({"metadata": {"name": "a"}, "spec": {"initContainers": inits}}) == gate


@pytest.mark.parametrize(("spec", "in_place"), [
    pytest.param({"containers": [{"name": "t", "restartPolicyRules": [{"action": "RestartAllContainers"}]}]}, True,
                 id="the-trainer's-rule"),
    pytest.param({"initContainers": [{"name": "j", "restartPolicy": "Always",
                                      "restartPolicyRules": [{"action": "RestartAllContainers"}]}]}, True,
                 id="a-sidecar's-rule-(JobSet's-agent)"),
    pytest.param({"containers": [{"name": "t", "restartPolicyRules": [{"action": "Restart"}]}]}, False,
                 id="a-rule-that-restarts-one-container"),
    pytest.param({"containers": [{"name": "t"}]}, False, id="no-rule"),
    pytest.param({"containers": [{"name": "t", "restartPolicyRules": "RestartAllContainers"}]}, False,
                 id="not-a-list-of-rules"),
])
def test_a_pod_restarts_in_place_when_a_container_has_the_restart_all_rule(spec, in_place):
    from agent.core.plan.restarts import restarts_in_place

    assert restarts_in_place({"metadata": {"name": "a"}, "spec": spec}) is in_place
