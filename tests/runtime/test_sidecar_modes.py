"""How a sidecar gathers changes, by mode: a follower of the published journal rewrites at each entry,
which the publisher gathered already; a sidecar watching pods waits for a burst to end (``--debounce``)."""

from __future__ import annotations

import asyncio
import copy
import gc
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent import examples
from agent.core import Options
from agent.core.plan.layout import build_plan
from agent.runtime.sidecar import Sidecar, SidecarSettings
from agent.runtime.sidecar.following import Mode
from agent.runtime.sidecar.publication import Job, Publication


def test_only_sidecars_that_watch_pods_wait_for_a_burst_to_end(tmp_path: Path) -> None:
    sidecar = Sidecar(None, SidecarSettings("default", "demo-worker-2", Options(), tmp_path))  # type: ignore[arg-type]
    gathered = {}
    for mode in Mode:
        sidecar.changes.mode = mode
        gathered[mode] = sidecar.gathers
    assert gathered == {Mode.PODS: True, Mode.CANDIDATE: True, Mode.STANDBY: False, Mode.FOLLOWER: False}
    sidecar.settings = SidecarSettings("default", "demo-worker-2", Options(), tmp_path, debounce=0)
    sidecar.changes.mode = Mode.PODS
    assert not sidecar.gathers  # --debounce 0: never



def test_a_snapshot_about_to_be_read_again_lets_go_of_the_evaluators_layout_and_texts(tmp_path: Path) -> None:
    """The follower's sink hears that a LIST will replace every pod (following._Journal.replace): the evaluator
    running then, even one made since the sidecar started (new options), lets go of its planner and texts."""
    sidecar = Sidecar(None, SidecarSettings("default", "demo-worker-2", Options(), tmp_path))  # type: ignore[arg-type]
    pods = {p["metadata"]["name"]: p for p in examples.volcano_job("demo", (("master", 1), ("worker", 3)))}
    sidecar.evaluator = type(sidecar.evaluator)(sidecar.settings, sidecar.metrics)
    renderer = sidecar.evaluator.renderer
    sidecar.evaluator.plan = renderer.planner.plan(pods)
    sidecar.changes.replacing()
    assert sidecar.evaluator.renderer is not renderer and sidecar.evaluator.plan is None

def test_a_follower_named_a_standby_keeps_its_watch_and_lists_the_pods_only_to_take_over(tmp_path: Path) -> None:
    """Standbys listed and watched every pod from the moment they were named (~450 MiB each at 16384 pods): now
    a follower named a standby only starts contending (its watch of the publication goes on), and the pods are
    listed when the Lease looks abandoned or is won; a candidate never goes back to the publication."""
    changes = Sidecar(None, SidecarSettings("default", "demo-worker-2", Options(), tmp_path)).changes  # type: ignore
    changes.mode = Mode.FOLLOWER
    changes.switch(Mode.STANDBY, "named a standby publisher")
    assert changes.mode == Mode.FOLLOWER and not changes.candidate.is_set()  # no publication: nothing to stand by
    changes.may_stand_by = True
    changes.switch(Mode.STANDBY, "named a standby publisher")
    assert changes.mode == Mode.STANDBY and changes.candidate.is_set() and not changes.switching.is_set()
    changes.switch(Mode.CANDIDATE, "lease looks abandoned")
    assert changes.mode == Mode.CANDIDATE and changes.switching.is_set()  # the pods follower starts
    changes.switching.clear()
    changes.switch(Mode.STANDBY, "named a standby publisher")  # the journal names it again: it keeps the pods
    assert changes.mode == Mode.CANDIDATE and not changes.switching.is_set()


async def test_a_lease_won_before_the_first_list_evaluates_no_empty_view(tmp_path: Path, caplog) -> None:
    """A leader's sidecar that won the Lease while its first LIST of 16384 pods was still being read evaluated
    the empty view: one warning that the pod list is empty, and /readyz 503 for no reason. An empty LIST is
    still evaluated (and said)."""
    sidecar = Sidecar(None, SidecarSettings("default", "demo-worker-2", Options(), tmp_path,  # type: ignore[arg-type]
                                            debounce=0))
    sidecar.changes.mode = Mode.CANDIDATE
    loop = asyncio.create_task(sidecar.evaluate_loop())
    try:
        sidecar.changes.changed()  # what winning the Lease does
        while sidecar.changes.dirty.is_set():  # until the loop has taken the change (no real time passes)
            await asyncio.sleep(0)
        assert not sidecar.evaluator.evaluated and "no valid topology" not in caplog.text
        sidecar.view.replace([])  # the LIST came back empty
        sidecar.changes.changed()
        async with sidecar.evaluations:
            await asyncio.wait_for(sidecar.evaluations.wait_for(lambda: sidecar.evaluator.evaluated), 10)
        assert sidecar.evaluator.evaluated and "the pod list is empty" in (sidecar.evaluator.problem or "")
    finally:
        loop.cancel()


async def test_a_new_leader_reads_back_the_publication_before_it_plans(tmp_path: Path) -> None:
    """The read-back's transient (~10 MB at 16384 pods) comes before the first plan's memory, not on top of it
    (the leader sidecar's peak); the publication that follows still compares every row read."""
    sidecar = Sidecar(None, SidecarSettings("default", "demo-worker-2", Options(), tmp_path,  # type: ignore[arg-type]
                                            debounce=0))
    sidecar.changes.mode = Mode.CANDIDATE
    calls: list[str] = []

    class Writer:
        publisher = None

        async def prepare(self, read=None) -> None:  # type: ignore[no-untyped-def]
            calls.append("read back" if read is None else "given")
            self.publisher = SimpleNamespace(state=SimpleNamespace(seq=1))  # type: ignore[assignment]

        async def publish(self, pods, touched, nodes, standby, plan=None, pods_rv="", blocks=None) -> bool:  # type: ignore[no-untyped-def]
            calls.append("publish")
            return True

    evaluate = sidecar.evaluator.evaluate

    def planned(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append("plan")
        return evaluate(*args, **kwargs)

    sidecar.evaluator.evaluate = planned  # type: ignore[method-assign]
    job = Job("default", "demo-worker-2", "uid", "demo", "demo-topology", None)
    follower = SimpleNamespace(published=SimpleNamespace(state=None), plan=None, seq=0)  # nothing followed
    sidecar.publication = Publication(None, job, follower, type("Elector", (), {"leading": True})())  # type: ignore
    sidecar.publication.writer = Writer()  # type: ignore[assignment]
    sidecar.view.replace(examples.volcano_job())
    loop = asyncio.create_task(sidecar.evaluate_loop())
    try:
        for published in (1, 2):  # each change once it is evaluated: the sidecar's evaluations say when
            sidecar.changes.changed()
            async with sidecar.evaluations:
                await asyncio.wait_for(sidecar.evaluations.wait_for(lambda n=published: calls.count("publish") == n),
                                       10)
    finally:
        loop.cancel()
    assert calls == ["read back", "plan", "publish", "plan", "publish"]  # read back once, before the first plan


_FAULTS = """
import resource, sys
from agent.runtime.memory import keep_freed_memory
if sys.argv[1] == "keep":
    keep_freed_memory()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):  # a change's files, made (every page written) and dropped together
    files = [bytes([65 + k]) * (4 << 20) for k in range(3)]
    del files
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_a_change_reuses_the_memory_the_last_one_freed() -> None:
    """glibc hands each freed multi-megabyte block back to the OS by default, so each change of a 16384-pod job
    would fault ~10 MB in again (2500 page faults, ~5 ms of CPU per change). The sidecar keeps freed blocks in
    the heap; page faults are counted, not time."""
    counts = {}
    for mode in ("default", "keep"):
        out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True)
        counts[mode] = int(out.stdout)
    assert counts["default"] > 40 * 2000  # the 12 MiB faulted in again at each change (3072 pages of 4 KiB)
    assert counts["keep"] < counts["default"] / 10, counts


async def test_the_planner_is_told_which_pods_changed_since_the_last_evaluation(tmp_path: Path) -> None:
    """The publisher's planner compared every pod it holds at each change (~2.5 ms at 16384 pods) although the
    watch says which pods changed: the sidecar tells it, a LIST or new Node labels meaning any. The plan stays
    the plan from scratch."""
    sidecar = Sidecar(None, SidecarSettings("default", "demo-worker-2", Options(), tmp_path,  # type: ignore[arg-type]
                                            debounce=0))
    planner = sidecar.evaluator.renderer.planner
    told: list[set[str] | None] = []
    plan = planner.plan

    def spy(pods, *, nodes=None, touched=None):  # type: ignore[no-untyped-def]
        told.append(None if touched is None else set(touched))
        return plan(pods, nodes=nodes, touched=touched)

    planner.plan = spy  # type: ignore[method-assign]
    sidecar.view.replace(examples.volcano_job())
    await sidecar._written(0.0, None)
    moved = copy.deepcopy(sidecar.view.pods["demo-worker-1"])
    moved["status"]["podIP"] = "127.0.9.9"
    sidecar.view.put("demo-worker-1", moved)
    sidecar.view.remove("demo-worker-0")
    await sidecar._written(0.0, None)
    await sidecar._written(0.0, None)  # nothing changed since
    assert told == [None, {"demo-worker-0", "demo-worker-1"}, set()]
    scratch = build_plan(list(sidecar.view.pods.values()), "demo-worker-2", Options())
    assert sidecar.evaluator.plan is not None
    assert sidecar.evaluator.plan.topology.members == scratch.topology.members


def test_the_collector_paused_for_a_change_is_left_as_it_was_found_even_when_the_change_fails() -> None:
    from agent.runtime.memory import collector_paused

    assert gc.isenabled()
    try:
        with pytest.raises(ValueError), collector_paused():
            assert not gc.isenabled()
            raise ValueError("a change that fails")
        assert gc.isenabled()
        gc.disable()  # a process that runs without it (a one-shot command) keeps it off
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


async def test_the_publisher_looks_for_new_nodes_among_the_pods_changed_not_every_pod(tmp_path: Path,
                                                                                       monkeypatch) -> None:
    """At each change the publisher reads the Nodes pods landed on that it has no labels of: it looks at the pods
    changed since its last plan (every pod after a LIST), not at every pod of the job; a Node it could not read
    (the API away) is read at its next look, though no pod on it changed since; a pod that came between a look and
    the plan after it is looked at by the next evaluation."""
    import agent.runtime.sidecar as sidecar_module
    from agent.core.pods.placement import DEFAULT_LEVELS

    options = Options(levels=DEFAULT_LEVELS, rank_order="topology")
    sidecar = Sidecar(None, SidecarSettings("default", "demo-worker-2", options, tmp_path))  # type: ignore[arg-type]
    pods = examples.volcano_job(tasks=(("master", 1), ("worker", 40)))
    for k, pod in enumerate(pods):
        pod["spec"]["nodeName"] = f"node-{k}"
    looked: list[int] = []
    asked: list[list[str]] = []
    away = [False]
    wanted = sidecar_module.wanted_nodes

    def counted(pods, options, known):  # type: ignore[no-untyped-def]
        pods = list(pods)
        looked.append(len(pods))
        return wanted(pods, options, known)

    async def read(api, names, options):  # type: ignore[no-untyped-def]
        asked.append(list(names))
        return {} if away[0] else {name: {"topology.kubernetes.io/zone": "z"} for name in names}

    monkeypatch.setattr(sidecar_module, "wanted_nodes", counted)
    monkeypatch.setattr(sidecar_module, "read_nodes", read)
    sidecar.view.replace(pods)
    await sidecar._learn_nodes()
    sidecar.view.take_unplanned()  # the evaluation's plan
    assert looked == [41] and len(asked[0]) == 41
    moved = copy.deepcopy(pods[5])
    moved["spec"]["nodeName"] = "node-new"
    away[0] = True
    sidecar.view.put("demo-worker-4", moved)
    await sidecar._learn_nodes()
    sidecar.view.take_unplanned()
    assert looked[1] == 1 and asked[1] == ["node-new"]
    away[0] = False
    other = copy.deepcopy(pods[7])
    other["status"]["podIP"] = "127.0.0.77"
    sidecar.view.put("demo-worker-6", other)
    await sidecar._learn_nodes()
    assert looked[2] == 1 and asked[2] == ["node-new"] and "node-new" in sidecar.nodes
    late = copy.deepcopy(pods[9])
    late["spec"]["nodeName"] = "node-late"
    sidecar.view.put("demo-worker-8", late)  # came while the evaluation read back the publication: planned
    sidecar.view.take_unplanned()  # without its Node's labels, and looked at by the next evaluation
    await sidecar._learn_nodes()
    assert looked[3] == 1 and asked[3] == ["node-late"]


async def test_the_debounce_counts_the_quiet_from_the_last_change_not_from_when_it_looks(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    """A change that came while the evaluation before it ran (or wrote the publication) has been quiet for part
    of SETTLE already: the debounce waits only the rest, and not at all once SETTLE has passed."""
    import agent.runtime.sidecar as sidecar_module

    now = [100.0]
    sidecar = Sidecar(None, SidecarSettings("default", "demo-worker-2", Options(), tmp_path,  # type: ignore[arg-type]
                                            debounce=1.0), clock=lambda: now[0])
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(round(seconds, 6))
        now[0] += seconds

    monkeypatch.setattr(sidecar_module.asyncio, "sleep", sleep)
    sidecar.changes.changed()
    now[0] += sidecar_module.SETTLE + 0.01  # the evaluation before ran meanwhile
    await sidecar._settle()
    assert slept == []
    sidecar.changes.take()
    sidecar.changes.changed()
    now[0] += 0.02
    await sidecar._settle()
    assert slept == [round(sidecar_module.SETTLE - 0.02, 6)]
