"""In-place restarts against the sandbox over real HTTPS: init run twice in one pod's volumes (the same shared
directory and state directory), as Kubernetes' RestartAllContainers runs every init container again in the same
sandbox. The second run is a new generation and writes nothing until every member has restarted too: by the
pods' init restartCounts, or by JobSet's in-place restart attempt where the job uses JobSet's protocol. The other
members' restarts are simulated through the API (kubectl patch of their status, as the kubelet writes it)."""

from __future__ import annotations

import json
import queue
import threading
import time
from typing import Any

from agent import examples
from tests.integration.conftest import finish, start_init
from tests.integration.test_status import status
from tests.jobs import create_volcano_job, generation

JOBSET_ATTEMPT = "jobset.sigs.k8s.io/in-place-restart-attempt"  # JobSet's agent writes it (jobset_types.go)



def _init_status(restarts: int, *, running: bool) -> list[dict[str, Any]]:
    """The agent init container's status as the kubelet reports it: running now, or completed."""
    state = {"running": {"startedAt": "2026-12-02T00:00:10Z"}} if running else \
        {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "2026-12-02T00:00:00Z",
                        "finishedAt": "2026-12-02T00:00:05Z"}}
    return [{"name": "topology-agent", "ready": False, "restartCount": restarts, "image": "topology-agent",
             "state": state}]


def _restarted(kubectl, name: str, restarts: int, *, running: bool = True) -> None:
    patch = json.dumps({"status": {"initContainerStatuses": _init_status(restarts, running=running)}})
    kubectl("patch", "pod", name, "--subresource=status", "--type=merge", "-p", patch)


class Rerun:
    """A rerun of init, its stderr read as it comes: the test acts once the process says it reached the barrier,
    however slowly it starts on a loaded machine."""

    def __init__(self, proc) -> None:
        self.proc, self.lines = proc, queue.Queue()
        self.said: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def at_barrier(self, timeout: float = 60.0) -> bool:
        """True once init says it waits at the restart barrier (and has not ended); False if it ends first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                self.lines.put(None)
                return False
            self.said.append(line)
            if "waiting at the restart barrier" in line:
                return self.still_waiting(0.5)
        return False

    def still_waiting(self, seconds: float) -> bool:
        time.sleep(seconds)
        return self.proc.poll() is None

    def finish(self, timeout: float = 90.0) -> tuple[int, str]:
        self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        self.proc.stdout.close()  # init writes nothing there
        self.proc.stderr.close()
        while (line := self.lines.get_nowait() if not self.lines.empty() else None) is not None:
            self.said.append(line)
        return self.proc.returncode, "".join(self.said)


RULE = [{"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}]


def _restart_in_place(sandbox, pods) -> None:
    """The trainer's restart rule, as the job's template gives every pod: a failure restarts the whole pod."""
    for pod in pods:
        sandbox.update_pod("default", pod["metadata"]["name"],
                           lambda p: p["spec"]["containers"][0].__setitem__("restartPolicyRules", RULE))


def test_a_rerun_of_init_waits_until_every_member_restarted_then_writes_the_next_generation(sandbox, kubectl,
                                                                                          tmp_path):
    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 2)))
    _restart_in_place(sandbox, pods)
    names = [p["metadata"]["name"] for p in pods]
    for name in names:
        _restarted(kubectl, name, 0, running=False)  # every pod's init ran once and completed
    shared, state = tmp_path / "shared", tmp_path / "state"
    state.mkdir()
    me = "demo-worker-0"
    args = ("--state-dir", str(state), "--timeout", "60")
    code, err = finish(start_init(sandbox, me, shared, *args))
    assert code == 0, err
    assert generation(shared) == 1
    first = (shared / "torch.env").read_text()

    _restarted(kubectl, me, 1)  # RestartAllContainers in this pod: its init runs again, same volumes
    proc = Rerun(start_init(sandbox, me, shared, *args))
    assert proc.at_barrier(), "the rerun must wait for the other members' restarts: " + proc.finish()[1]
    assert generation(shared) == 1, "nothing is written while the barrier holds"
    _restarted(kubectl, "demo-master-0", 1)
    assert proc.still_waiting(1.0), "one member restarted, one not yet: still waiting"
    shown = status(sandbox, "-o", "json")
    out, err = shown.communicate(timeout=60)
    assert shown.returncode == 0, err
    assert json.loads(out)["restarts"] == {
        "rule": "restarts", "current": None, "attempts": {"demo-master-0": 1, "demo-worker-0": 1, "demo-worker-1": 0},
        "atBarrier": True, "waiting": ["demo-master-0", "demo-worker-0"], "behind": ["demo-worker-1"]}
    _restarted(kubectl, "demo-worker-1", 1)
    code, err = proc.finish()
    assert code == 0, err
    assert generation(shared) == 2
    assert "waiting at the restart barrier" in err and "demo-worker-1" in err
    assert (shared / "torch.env").read_text() == first.replace("TOPOLOGY_GENERATION='1'", "TOPOLOGY_GENERATION='2'")

    # A third run in the same pod: the others' reruns completed at attempt 1, this pod completed twice, so it
    # waits for 2.
    for name in ("demo-master-0", "demo-worker-1"):
        _restarted(kubectl, name, 1, running=False)
    _restarted(kubectl, me, 2)
    proc = Rerun(start_init(sandbox, me, shared, *args))
    assert proc.at_barrier(), "a second in-place restart waits again"
    for name in ("demo-master-0", "demo-worker-1"):
        _restarted(kubectl, name, 2)
    code, err = proc.finish()
    assert code == 0, err
    assert generation(shared) == 3


def test_a_rerun_continues_from_the_generation_the_sidecar_wrote(sandbox, kubectl, tmp_path):
    from agent.runtime.restarts import record_generation

    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 1)))
    shared, state = tmp_path / "shared", tmp_path / "state"
    state.mkdir()
    me = "demo-worker-0"
    args = ("--state-dir", str(state), "--timeout", "60")
    for pod in pods:
        _restarted(kubectl, pod["metadata"]["name"], 0, running=False)
    code, err = finish(start_init(sandbox, me, shared, *args))
    assert code == 0, err
    uid = json.loads(kubectl("get", "pod", me, "-o", "json").stdout)["metadata"]["uid"]
    record_generation(state, uid, 7)  # the sidecar wrote generations 2..7 since
    for pod in pods:
        _restarted(kubectl, pod["metadata"]["name"], 1)
    code, err = finish(start_init(sandbox, me, shared, *args))
    assert code == 0, err
    assert generation(shared) == 8


def test_the_shared_directory_decides_nothing_the_state_directory_does(sandbox, kubectl, tmp_path):
    """The trainer can write the shared directory: a record copied there and a high generation make a first run
    neither a rerun nor move its numbering; the rerun's record is the state directory's."""
    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 1)))
    _restart_in_place(sandbox, pods)
    for pod in pods:
        _restarted(kubectl, pod["metadata"]["name"], 0, running=False)
    me = "demo-worker-0"
    uid = json.loads(kubectl("get", "pod", me, "-o", "json").stdout)["metadata"]["uid"]
    shared, state = tmp_path / "shared", tmp_path / "state"
    shared.mkdir()
    state.mkdir()
    forged = json.dumps({"uid": uid, "runs": 5, "generation": 40, "attempt": None})
    (shared / ".topology-init-run.json").write_text(forged)
    (shared / ".topology-generation").write_text(f"{uid} 40\n")
    (shared / "generation").write_text("40\n")
    args = ("--state-dir", str(state), "--timeout", "30")
    code, err = finish(start_init(sandbox, me, shared, *args))
    assert code == 0, err
    assert generation(shared) == 1
    assert "restart barrier" not in err
    _restarted(kubectl, me, 1)
    proc = Rerun(start_init(sandbox, me, shared, *args))
    assert proc.at_barrier(), "the rerun waits for demo-master-0: " + proc.finish()[1]
    _restarted(kubectl, "demo-master-0", 1)
    code, err = proc.finish()
    assert code == 0, err
    assert generation(shared) == 2


def test_a_rerun_in_a_pod_without_the_restart_rule_is_a_new_generation_at_once(sandbox, kubectl, tmp_path):
    """Init ran again without RestartAllContainers (the kubelet made the pod's sandbox again): nothing restarts
    the other members with it, so it does not wait for them."""
    pods = create_volcano_job(sandbox, (("master", 1), ("worker", 1)))
    for pod in pods:
        _restarted(kubectl, pod["metadata"]["name"], 0, running=False)
    shared, state = tmp_path / "shared", tmp_path / "state"
    state.mkdir()
    args = ("--state-dir", str(state), "--timeout", "30")
    code, err = finish(start_init(sandbox, "demo-worker-0", shared, *args))
    assert code == 0, err
    _restarted(kubectl, "demo-worker-0", 1)
    code, err = finish(start_init(sandbox, "demo-worker-0", shared, *args))
    assert code == 0, err
    assert generation(shared) == 2
    assert "restart barrier: none (no container of this pod has the restart rule RestartAllContainers" in err


def _jobset(sandbox, *, current: int | None) -> list[dict[str, Any]]:
    pods = examples.jobset("trainer", (("workers", 1, 2),))
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
              "metadata": {"name": "trainer", "namespace": "default", "uid": "jobset-uid"},
              "spec": {"failurePolicy": {"maxRestarts": 5, "restartStrategy": "InPlaceRestart"},
                       "replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": {
                           "parallelism": 2, "completions": 2, "backoffLimit": 2147483647,
                           "podReplacementPolicy": "Failed", "template": {}}}}]},
              "status": {} if current is None else {"currentInPlaceRestartAttempt": current}}
    sandbox.create("jobset.x-k8s.io/v1alpha2/jobsets", "default", jobset)
    for pod in pods:
        pod["metadata"].setdefault("annotations", {})[JOBSET_ATTEMPT] = "0"
        sandbox.create_pod(pod)
    return pods


def _set_current(sandbox, attempt: int) -> None:
    resource = "jobset.x-k8s.io/v1alpha2/jobsets"

    def change() -> Any:
        store = sandbox.sandbox.store
        obj = json.loads(json.dumps(store.get(resource, "default", "trainer")))
        obj["status"] = {"currentInPlaceRestartAttempt": attempt, "previousInPlaceRestartAttempt": attempt - 1}
        obj["metadata"].pop("resourceVersion", None)
        return store.replace(resource, "default", "trainer", obj)

    sandbox._run(change)


def test_with_jobsets_in_place_restart_the_rerun_follows_the_jobsets_attempt(sandbox, kubectl, tmp_path):
    pods = _jobset(sandbox, current=0)
    me = pods[1]["metadata"]["name"]
    shared, state = tmp_path / "shared", tmp_path / "state"
    state.mkdir()
    args = ("--state-dir", str(state), "--timeout", "60")
    code, err = finish(start_init(sandbox, me, shared, *args))
    assert code == 0, err
    assert generation(shared) == 1

    # JobSet's agent marks this pod's new attempt; the pods' init restartCounts say nothing here (left at 0).
    kubectl("annotate", "pod", me, "--overwrite", f"{JOBSET_ATTEMPT}=1")
    proc = Rerun(start_init(sandbox, me, shared, *args))
    assert proc.at_barrier(), "the rerun waits for the JobSet's current attempt: " + proc.finish()[1]
    assert generation(shared) == 1
    _set_current(sandbox, 1)  # the JobSet controller: every pod is at attempt 1
    code, err = proc.finish()
    assert code == 0, err
    assert generation(shared) == 2
    assert "JobSet 'trainer' status.currentInPlaceRestartAttempt is 0, waiting for 1" in err
