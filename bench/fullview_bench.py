"""Benchmark: the sidecar of a pod that holds every member (a follower with ``--view full``), in-process, step by
step: RSS (VmRSS, and VmHWM: the kernel's high-water mark) after each step, and the CPU of each change.

The publication of an N-pod job is made first, in a process of its own (the job's pods as the API serves them,
bench/kubelet.py): its snapshot, then the kubelet's Running writes as journal entries of --entry rows, then five
new IPs, then a worker that leaves and comes back twice (every member after it moves in rank). A second process
plays init: it writes the files of the first snapshot. The measured process then does what the sidecar does,
with the same imports: it reads init's topology.json back (``Evaluator.load_previous``), looks for the
publication (its LIST read as content keys), hands the freed heap back, reads the snapshot into its views
(runtime/sidecar/following.JournalFollower) and evaluates, then takes each journal entry as a watch event and
evaluates again, writing the files each time they change.

    python bench/fullview_bench.py --pods 16384
    python bench/fullview_bench.py --pods 16384 --topology 4,16,4   # --rank-order topology, a Node per pod
    python bench/fullview_bench.py --pods 16384 --topology 4,16,4 --relist

With ``--relist`` the kubelet's writes reach the sidecar as one new snapshot, listed again (the leader's first
change after init, past the journal's parts, as in bench/published_bench.py), not as journal entries.

With ``--topology Z,B,R`` each pod runs on a Node of its own in one of Z zones x B blocks x R sub-blocks, placed
at random as bench/published_bench.py places them, and the job is ranked in the topology order: the rows carry
their Node's labels, and the measured process plans with them (``PublishedState.node_labels``).

What it leaves out of the sidecar's process: the HTTP client's buffers and the watch's line reassembly, the
health server, the Events sink, and a relist (a journal that starts after the snapshot held); run
bench/published_bench.py for the whole process in a sandbox.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ME = "demo-worker-1"
SNAPSHOT = "demo-topology"


def _rss() -> tuple[float, float]:
    status = Path("/proc/self/status").read_text()
    found = (re.search(rf"{key}:\s+(\d+)", status) for key in ("VmRSS", "VmHWM"))
    rss, hwm = (int(m.group(1)) / 1024 if m else 0.0 for m in found)
    return rss, hwm


LEVEL_KEYS = ("topology.kubernetes.io/zone", "cloud.google.com/gce-topology-block",
              "cloud.google.com/gce-topology-subblock")


def options(topology: str, **given: Any) -> Any:
    from agent.core.model import Options
    from agent.core.pods.placement import DEFAULT_LEVELS

    return Options(levels=DEFAULT_LEVELS, rank_order="topology", **given) if topology else Options(**given)


def make(pods: int, entry: int, out: Path, topology: str = "", relist: bool = False) -> None:
    """The publication's steps as the sidecar would read them: ("list", [snapshot, journal]) or ("watch", [journal])."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import kubelet
    from transients_bench import raw_pods

    from agent.core.publication.journal import PublishedState, Publisher, journal_body
    from agent.core.publication.published import configmap_body
    from agent.runtime.views import PodView

    raw = raw_pods(pods)
    view = PodView(ME, options(topology))
    held = {p["metadata"]["name"]: view.keep(p) for p in raw}
    publisher = Publisher(PublishedState(job="demo", namespace="default", snapshot_seq=-1), options(topology),
                          leader="demo-master-0")
    nodes: dict[str, dict[str, str]] | None = None
    if topology:
        from published_bench import node_domains

        nodes = {f"node-{i}": dict(zip(LEVEL_KEYS, domains, strict=True))
                 for i, domains in enumerate(node_domains(pods, topology, 1)[:pods])}
    publisher.change(held, set(held), nodes, journal=False)

    def snapshot() -> dict[str, Any]:
        body = configmap_body(SNAPSHOT, publisher.snapshot_packed(), generation=publisher.state.seq,
                              leader="demo-master-0", owner=None)
        publisher.snapshot_written(publisher.state.seq)
        return body

    def journal() -> dict[str, Any]:
        return journal_body(SNAPSHOT, publisher.journal_data(), owner=None)

    steps: list[tuple[str, list[dict[str, Any]]]] = [("list", [snapshot(), journal()])]
    publisher.start_from_snapshot()
    version = 10**6

    def changed(pod: dict[str, Any]) -> str:
        nonlocal version
        version += 1
        pod["metadata"]["resourceVersion"] = str(version)
        held[pod["metadata"]["name"]] = view.keep(pod)
        return str(pod["metadata"]["name"])

    if relist:  # the kubelet's writes as one change, past the journal's parts: a new snapshot, listed again
        names = {changed(kubelet.kubelet_initialized(pod) or pod) for pod in raw}
        publisher.change(held, names, nodes)
        steps.append(("list", [snapshot(), journal()]))
    for at in range(0, pods if not relist else 0, entry):
        names = {changed(kubelet.kubelet_initialized(pod) or pod) for pod in raw[at:at + entry]}
        if publisher.change(held, names, nodes) is not None:
            if publisher.snapshot_due:
                snapshot()
            steps.append(("watch", [journal()]))
    for k in range(5):
        pod = raw[100 + k]
        kubelet.kubelet_started(pod, f"10.9.{k}.1")
        publisher.change(held, {changed(pod)}, nodes)
        steps.append(("watch", [journal()]))
    leaving = raw[3]["metadata"]["name"]
    kept = held[leaving]
    for k in range(4):
        if k % 2 == 0:
            held.pop(leaving)
        else:
            held[leaving] = kept
        publisher.change(held, {leaving}, nodes)
        steps.append(("watch", [journal()]))
    me = next(p for p in raw if p["metadata"]["name"] == ME)
    out.write_text(json.dumps({"steps": steps, "me": me}))


def measure(publication: Path, init_files: Path, *, write_init: bool, topology: str = "") -> None:
    """The sidecar's path over the publication's steps; with ``write_init``, only the first step's files (init's)."""
    started = _rss()
    import agent.cli
    import agent.runtime.health
    import agent.runtime.sidecar  # noqa: F401  (the sidecar process's imports)
    from agent.core.publication.journal import state_from
    from agent.flags.sidecar import SidecarSettings
    from agent.k8s.core import WatchEvent
    from agent.k8s.reflector import Settings as ReflectorSettings
    from agent.runtime.memory import collector_paused, keep_freed_memory, release_memory
    from agent.runtime.metrics import SidecarMetrics
    from agent.runtime.sidecar.evaluating import Evaluator
    from agent.runtime.sidecar.following import JournalFollower, _Journal
    from agent.runtime.views import PodView

    rows: list[tuple[str, float, float, str]] = [("start", *started, ""), ("imported", *_rss(), "")]
    keep_freed_memory()
    data = json.loads(publication.read_text())
    steps = [(kind, json.dumps(items)) for kind, items in data["steps"]]
    me = data["me"]
    del data
    out = init_files if write_init else Path(tempfile.mkdtemp())
    if not write_init:
        for path in init_files.iterdir():
            (out / path.name).write_bytes(path.read_bytes())
    given = options(topology, view="full")
    evaluator = Evaluator(SidecarSettings(namespace="default", pod_name=ME, options=given, out_dir=out),
                          SidecarMetrics())
    evaluator.keep_document, evaluator.own.published = False, True

    class Sink:
        def changed(self) -> None: ...
        def switch(self, mode: object, why: str) -> None:
            raise SystemExit(f"the follower asked to switch to {mode}: {why}")
        def attempted(self) -> None: ...
        def following(self, reflector: object) -> None: ...
        def count(self, what: str) -> None: ...
        def replacing(self) -> None:
            evaluator.forget_pods()  # as the sidecar's Changes

    view = PodView(ME, given)
    view.know_me(me)
    follower = JournalFollower(Sink(), None, view, namespace="default", configmap=SNAPSHOT,  # type: ignore[arg-type]
                               check=None, settings=ReflectorSettings(), clock=time.monotonic)
    store = _Journal(follower)
    if not write_init:
        evaluator.load_previous()
        rows.append(("init's topology.json read back", *_rss(), ""))
        state_from(json.loads(steps[0][1]), SNAPSHOT, pods=False, compare_only=True)
        release_memory()
        rows.append(("publication looked for, heap handed back", *_rss(), ""))
    for k, (kind, text) in enumerate(steps[:1] if write_init else steps):
        cpu = time.process_time()
        items = json.loads(text)
        if kind == "list":
            store.replace(items)
        else:
            store.apply(WatchEvent("MODIFIED", items[0]))
        del items
        pods, touched = view.placed(by_ip=False), view.take_unplanned()
        state = follower.published.state
        nodes = state.node_labels() if topology and state is not None else {}  # as Sidecar._nodes
        with collector_paused():
            evaluator.evaluate(time.monotonic(), pods=pods, light=None, nodes=nodes, note="", touched=touched)
        del pods, nodes
        rows.append((f"step {k}: {kind}, generation {evaluator.generation}", *_rss(),
                     f"{(time.process_time() - cpu) * 1000:.0f}"))
    release_memory()
    rows.append(("released", *_rss(), ""))
    if not write_init:
        print("| step | RSS MB | peak RSS MB | CPU ms |\n|---|---|---|---|")
        for what, rss, hwm, cpu_ms in rows:
            print(f"| {what} | {rss:.1f} | {hwm:.1f} | {cpu_ms} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=16384)
    parser.add_argument("--entry", type=int, default=1500, help="rows per journal entry of the kubelet's writes")
    parser.add_argument("--topology", default="", metavar="Z,B,R",
                        help="--rank-order topology, a Node per pod in Z zones x B blocks x R sub-blocks")
    parser.add_argument("--relist", action="store_true",
                        help="the kubelet's writes reach the sidecar as one new snapshot (a LIST), not journal entries")
    parser.add_argument("--step", choices=["make", "init", "measure"], help=argparse.SUPPRESS)
    parser.add_argument("--publication", help=argparse.SUPPRESS)
    parser.add_argument("--init-files", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step == "make":
        make(args.pods, args.entry, Path(args.publication), args.topology, args.relist)
        return
    if args.step is not None:
        measure(Path(args.publication), Path(args.init_files), write_init=args.step == "init", topology=args.topology)
        return
    with tempfile.TemporaryDirectory() as tmp:
        publication, init_files = Path(tmp) / "publication.json", Path(tmp) / "init"
        init_files.mkdir()
        for step in ("make", "init", "measure"):  # each in a fresh process: its RSS is its own
            subprocess.run([sys.executable, __file__, "--step", step, "--pods", str(args.pods), "--entry",
                            str(args.entry), "--publication", str(publication), "--init-files", str(init_files),
                            "--topology", args.topology, *(["--relist"] if args.relist else [])],
                           check=True, env={**os.environ})
        print(f"\n{args.pods} pods, kubelet entries of {args.entry} rows"
              + (f", --rank-order topology on {args.topology} (zones, blocks, sub-blocks)" if args.topology else ""))


if __name__ == "__main__":
    main()
