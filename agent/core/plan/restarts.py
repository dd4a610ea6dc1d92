"""In-place restarts: which restart attempt each pod is at, and whether a rerun of init may write its files.

Kubernetes' ``RestartAllContainers`` restart rule restarts every container of a pod in the same sandbox: the
init containers run again in order, the volumes (emptyDirs too) and the pod's name, uid and IP stay. When init
runs again in a pod where it completed before (its record in the state directory says so:
runtime/restarts.py), the run is a new generation of the files, and before it writes them it waits until every
member of the job has restarted too (the barrier): a trainer started before its peers restarted would find them
still in the old world.

What "the same restart" is, read from the API:

- **JobSet's in-place restart** (a JobSet whose ``spec.failurePolicy.restartStrategy`` is ``InPlaceRestart``, not
  turned off by its ``disable-in-place-restart`` annotation): JobSet's agent writes each pod's attempt on the pod
  (annotation ``jobset.sigs.k8s.io/in-place-restart-attempt``), and the JobSet controller sets
  ``status.currentInPlaceRestartAttempt`` to the attempt every pod has reached. The barrier is down once that
  field is at least this pod's attempt. JobSet's agent holds the init containers after it with its startup
  probe until then, so an init placed after it finds the barrier down at once.
- **Any other job whose pod restarts in place** (a container's ``restartPolicyRules`` has the action
  ``RestartAllContainers``): a pod's attempt is the ``restartCount`` of its agent init container (``topology-agent``;
  else the highest of its init containers that are not sidecars): every in-place restart runs it once more. A
  rerun that completed ``runs`` times before waits until every member's attempt is at least ``runs``, or the
  member's agent init is running now (a pod that starts, or reruns, writes its files from this moment's pods).
  The count of the rerun's own completed runs is used, not its own restartCount: an init that failed and was run
  again by the kubelet (restartPolicy OnFailure or Always) counts its restartCount up without a restart of the
  job, so a pod that had such a retry is at most taken for restarted early, never waited for in vain.
- **A pod without such a rule** whose init runs again (its sandbox was recreated, a node restarted): a new
  generation, with no barrier: nothing restarts its peers with it, so waiting for them would end only at the
  timeout.

Facts from the sources, one row each (``SOURCES``). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from agent.core.model import RawPod

JOBSET_ATTEMPT = "jobset.sigs.k8s.io/in-place-restart-attempt"
JOBSET_DISABLE = "jobset.sigs.k8s.io/disable-in-place-restart"
JOBSET_STRATEGY = "InPlaceRestart"
JOBSET_CURRENT = "currentInPlaceRestartAttempt"
JOBSET_PREVIOUS = "previousInPlaceRestartAttempt"
AGENT_INIT = "topology-agent"  # the init container's name as inject and the webhook add it (core/adoption/injection.py)

# (fact, where it was read)
SOURCES: tuple[tuple[str, str], ...] = (
    (f"pod annotation {JOBSET_ATTEMPT}: the pod's in-place restart attempt, a non-negative int32, written by "
     "JobSet's agent", "kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go InPlaceRestartAttemptKey, v0.12.0"),
    (f"JobSet annotation {JOBSET_DISABLE}: its agent lifts its barrier at once",
     "kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go DisableInPlaceRestartKey, v0.12.0"),
    (f"JobSet spec.failurePolicy.restartStrategy {JOBSET_STRATEGY}",
     "kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go JobSetRestartStrategy, v0.12.0"),
    (f"JobSet status.{JOBSET_CURRENT}: set when every pod is at that attempt; a pod at it lifts its barrier",
     "kubernetes-sigs/jobset pkg/controllers/in_place_restart.go, cmd/in-place-restart-agent/main.go, v0.12.0"),
    (f"JobSet status.{JOBSET_PREVIOUS}: a pod at or below it is restarted in place by JobSet's agent",
     "kubernetes-sigs/jobset cmd/in-place-restart-agent/main.go, v0.12.0"),
    ("restartPolicyRules action RestartAllContainers: init containers run again in order in the same sandbox; "
     "volumes (emptyDir) and the pod's uid and IP are kept; each restarted container's restartCount goes up",
     "kubernetes/enhancements keps/sig-node/5532-restart-pod-on-container-exits; Kubernetes v1.35 blog "
     "'New level of efficiency with in-place Pod restart'"),
)

Rule = Literal["jobset", "restarts"]


RESTART_ALL = "RestartAllContainers"  # a container's restartPolicyRules action (KEP-5532)


def restarts_in_place(pod: RawPod) -> bool:
    """The pod's spec restarts it in place: a container (init, sidecar or regular) has a ``restartPolicyRules``
    rule with the action ``RestartAllContainers``."""
    spec: Any = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    return any(isinstance(rule, Mapping) and rule.get("action") == RESTART_ALL
               for c in containers if isinstance(c, Mapping) for rule in c.get("restartPolicyRules") or [])


def jobset_in_place(objects: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The job's JobSet when it restarts in place by JobSet's protocol (None: the job does not use it)."""
    for obj in objects:
        if obj.get("kind") != "JobSet":
            continue
        meta = obj.get("metadata") or {}
        if JOBSET_DISABLE in (meta.get("annotations") or {}):
            return None
        policy = (obj.get("spec") or {}).get("failurePolicy") or {}
        return obj if isinstance(policy, Mapping) and policy.get("restartStrategy") == JOBSET_STRATEGY else None
    return None


def _count(value: Any) -> int | None:
    """A non-negative whole number as the API gives one (an int, or an annotation's decimal string), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 10:
        return int(value)
    return None


def jobset_attempt(pod: RawPod) -> int | None:
    """The pod's in-place restart attempt as JobSet's agent wrote it (None: not written, or not a number)."""
    return _count(((pod.get("metadata") or {}).get("annotations") or {}).get(JOBSET_ATTEMPT))


def jobset_current(jobset: Mapping[str, Any]) -> int | None:
    value = (jobset.get("status") or {}).get(JOBSET_CURRENT)
    return _count(value) if isinstance(value, int) else None  # an int32 field: a string is not what JobSet writes


def _agent_status(pod: RawPod) -> Mapping[str, Any] | None:
    """The status of the pod's agent init container: ``topology-agent``, else the init container that is not a
    sidecar with the highest restartCount (a manifest that names it otherwise)."""
    raw: Any = (pod.get("status") or {}).get("initContainerStatuses") or []
    statuses = [s for s in raw if isinstance(s, Mapping)]
    for status in statuses:
        if status.get("name") == AGENT_INIT:
            return status
    inits: Any = (pod.get("spec") or {}).get("initContainers") or []
    sidecars = {c.get("name") for c in inits if isinstance(c, Mapping) and c.get("restartPolicy") == "Always"}
    regular = [s for s in statuses if s.get("name") not in sidecars]
    return max(regular, key=lambda s: _count(s.get("restartCount")) or 0, default=None)


def init_attempt(pod: RawPod) -> int:
    """The pod's restart attempt by what Kubernetes shows: its agent init container's restartCount (0: none)."""
    status = _agent_status(pod)
    return (_count(status.get("restartCount")) or 0) if status is not None else 0


def init_running(pod: RawPod) -> bool:
    """The pod's agent init container is running or about to (not terminated): the pod is starting, or
    restarting, now."""
    if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
        return False
    status = _agent_status(pod)
    if status is None:
        return True  # no status yet: a pod whose containers have not started
    return "terminated" not in (status.get("state") or {})


def attempt_of(pod: RawPod, rule: Rule) -> int | None:
    """The pod's restart attempt by ``rule``, for ``status`` and the barrier."""
    return jobset_attempt(pod) if rule == "jobset" else init_attempt(pod)


@dataclass(frozen=True)
class Barrier:
    """Where a rerun's barrier stands: the attempt it waits for, and the members that have not reached it."""

    rule: Rule
    attempt: int
    behind: tuple[str, ...] = ()
    why: str = ""  # the JobSet's side, when it holds the barrier

    @property
    def down(self) -> bool:
        return not self.behind and not self.why

    def describe(self) -> str:
        if self.down:
            return f"every member reached restart attempt {self.attempt}"
        if self.why:
            return self.why
        shown = ", ".join(self.behind[:8]) + (f" (and {len(self.behind) - 8} more)" if len(self.behind) > 8 else "")
        return f"{len(self.behind)} member(s) not restarted to attempt {self.attempt} yet: {shown}"


def is_behind(pod: RawPod, runs: int) -> bool:
    """A member that has not restarted to the attempt of a rerun that completed ``runs`` times before: its
    attempt is lower and its agent init is not running now."""
    return init_attempt(pod) < runs and not init_running(pod)


def restarts_barrier(pods: Mapping[str, RawPod], members: Iterable[str], runs: int) -> Barrier:
    """The barrier of a rerun that completed ``runs`` times before, by the pods' init restartCounts: a member is
    there when its attempt is at least ``runs`` or its agent init is running now; a member that is gone is not
    waited for (the sidecar follows the members from here)."""
    return Barrier("restarts", runs, tuple(sorted(name for name in members
                                                  if name in pods and is_behind(pods[name], runs))))


def wanted_jobset_attempt(pod: RawPod, recorded: int | None) -> int:
    """The attempt this run belongs to by JobSet's protocol: the pod's annotation when JobSet's agent has written
    it for this run (newer than the one recorded at the last completed run), else the next one."""
    written = jobset_attempt(pod)
    if written is not None and (recorded is None or written > recorded):
        return written
    return (recorded if recorded is not None else -1) + 1


def gate_after_agent(pod: RawPod) -> str | None:
    """A sidecar with a startup probe placed after the agent's init container (JobSet's agent is one): the kubelet
    starts it only once the agent's init has ended, and it holds every init container after it until its probe
    passes, so the agent's init cannot wait for what it gates. Its name, or None."""
    inits: Any = (pod.get("spec") or {}).get("initContainers") or []
    names = [c.get("name") for c in inits if isinstance(c, Mapping)]
    if AGENT_INIT not in names:
        return None
    after = inits[names.index(AGENT_INIT) + 1:]
    return next((str(c.get("name")) for c in after if isinstance(c, Mapping) and c.get("restartPolicy") == "Always"
                 and c.get("startupProbe")), None)


def jobset_barrier(jobset: Mapping[str, Any], attempt: int) -> Barrier:
    """The barrier by JobSet's protocol: down once the JobSet's current attempt is ``attempt`` or later."""
    current = jobset_current(jobset)
    name = (jobset.get("metadata") or {}).get("name", "?")
    if current is not None and current >= attempt:
        return Barrier("jobset", attempt)
    now = "not set" if current is None else str(current)
    return Barrier("jobset", attempt, why=f"JobSet '{name}' status.{JOBSET_CURRENT} is {now}, waiting for "
                                          f"{attempt} (every pod at attempt {attempt})")


@dataclass(frozen=True)
class Restarts:
    """A job's in-place restarts as ``status`` shows them: each pod's attempt by the job's rule, and whether the
    job is at a barrier (pods whose init runs again wait, ``waiting``, for the members ``behind``)."""

    rule: Rule
    attempts: tuple[tuple[str, int | None], ...]  # (pod, attempt) by name; None: JobSet's agent wrote none yet
    current: int | None = None  # the JobSet's current attempt (JobSet's protocol)
    waiting: tuple[str, ...] = ()
    behind: tuple[str, ...] = ()

    @property
    def at_barrier(self) -> bool:
        return bool(self.waiting)


def restart_state(pods: Iterable[RawPod], objects: Iterable[Mapping[str, Any]]) -> Restarts | None:
    """The job's restarts as the API shows them now, or None when there is nothing to say (no pod restarted in
    place, and the job does not use JobSet's protocol). By the pods' restartCounts a pod whose agent init runs
    again (attempt above 0) is taken to wait for the members below the highest such attempt: the rerun's own
    count of completed runs is in its state directory, which the API does not show."""
    pods = sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name", ""))
    named = [((p.get("metadata") or {}).get("name", "?"), p) for p in pods]
    jobset = jobset_in_place(objects)
    if jobset is not None:
        attempts = [(name, jobset_attempt(pod)) for name, pod in named]
        current = jobset_current(jobset)
        waiting = tuple(name for name, a in attempts if a is not None and (current is None or a > current))
        top = max((a for _, a in attempts if a is not None), default=None)
        behind = tuple(name for name, a in attempts if waiting and top is not None and (a is None or a < top))
        return Restarts("jobset", tuple(attempts), current, waiting, behind)
    counted = [(name, init_attempt(pod), init_running(pod)) for name, pod in named]
    if not any(a for _, a, _ in counted):
        return None
    waiting = tuple(name for name, a, running in counted if running and a > 0)
    top = max((a for name, a, _ in counted if name in waiting), default=0)
    behind = tuple(name for name, a, running in counted if not running and a < top)
    return Restarts("restarts", tuple((name, a) for name, a, _ in counted), None, waiting, behind)
