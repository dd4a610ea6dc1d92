"""What a rerun of init knows of the runs before it in the same pod, and what its barrier watches.

The record of init's last completed run (the pod's uid, how many runs completed, the generation written, the
JobSet attempt it belonged to) and the last generation the sidecar wrote are kept in the state directory
(``--state-dir``): an emptyDir only the agent's containers mount, which an in-place restart keeps. Never in the
shared directory: the trainer can write that one, and a record there could hold a pod at its barrier or let it
through. A record of another pod (a volume that outlived its pod) or one that is not what init wrote is no
record: the run is a first run, said in one line.

The barrier (core/plan/restarts.py says when it is down) watches, by the job's rule, the job's pods (each cut to its
name and its init containers' statuses as it is read) or the JobSet, by name.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.core.model import RawPod
from agent.core.plan.restarts import Barrier, is_behind, jobset_barrier
from agent.errors import OutputError
from agent.files.reading import Unreadable, read_untrusted
from agent.files.writing import write_files
from agent.k8s.core import WatchEvent

log = logging.getLogger("topology_agent.restarts")
RECORD = ".topology-init-run.json"
GENERATION = ".topology-generation"  # the sidecar's last generation written: "<uid> <generation>"
LIMIT = 4096


@dataclass(frozen=True)
class Run:
    """Init's last completed run in this pod."""

    uid: str
    runs: int  # runs completed in this pod so far
    generation: int  # the generation the last one wrote (or the sidecar after it)
    attempt: int | None = None  # the JobSet in-place restart attempt it belonged to (JobSet's protocol only)

    def to_bytes(self) -> bytes:
        return json.dumps({"uid": self.uid, "runs": self.runs, "generation": self.generation,
                           "attempt": self.attempt}, separators=(",", ":")).encode()


def _whole(value: Any, *, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < 2**53


def read_run(state_dir: Path | None, uid: str) -> Run | None:
    """The record of init's last completed run in pod ``uid``, with the sidecar's later generations counted, or
    None (a first run: no state directory, no record, or one of another pod)."""
    if state_dir is None or not uid or not state_dir.is_dir():
        return None
    try:
        document = json.loads(read_untrusted(state_dir / RECORD, LIMIT))
    except FileNotFoundError:
        return None
    except (Unreadable, OSError, ValueError, RecursionError) as err:
        log.warning("the record of init's last run in %s cannot be read (%s); this run counts as the pod's first",
                    state_dir / RECORD, str(err)[:200])
        return None
    if not isinstance(document, dict) or not _whole(document.get("runs"), low=1) \
            or not _whole(document.get("generation"), low=1) or not isinstance(document.get("uid"), str) \
            or not (document.get("attempt") is None or _whole(document.get("attempt"), low=0)):
        log.warning("the record of init's last run in %s is not what init writes; this run counts as the pod's "
                    "first", state_dir / RECORD)
        return None
    if document["uid"] != uid:
        log.info("the state directory holds the record of another pod (uid %s); this run is this pod's first",
                 document["uid"][:40])
        return None
    run = Run(uid, document["runs"], document["generation"], document.get("attempt"))
    later = _sidecar_generation(state_dir, uid)
    return Run(uid, run.runs, later, run.attempt) if later is not None and later > run.generation else run


def _sidecar_generation(state_dir: Path, uid: str) -> int | None:
    try:
        words = read_untrusted(state_dir / GENERATION, 128).decode("ascii", "replace").split()
    except (FileNotFoundError, Unreadable, OSError):
        return None
    if len(words) != 2 or words[0] != uid or not words[1].isdigit() or len(words[1]) > 15:
        return None
    return int(words[1])


def write_run(state_dir: Path | None, run: Run) -> None:
    """Written after the files, temp file and rename; a state directory that cannot take it costs the next rerun
    its barrier (said in one line), never this run's files."""
    if state_dir is None or not state_dir.is_dir():
        return
    try:
        write_files(state_dir, {RECORD: run.to_bytes()})
        with contextlib.suppress(FileNotFoundError):
            (state_dir / GENERATION).unlink()  # init's generation is the latest now
    except (OSError, OutputError) as err:
        log.warning("could not record this run in %s (%s); a rerun of init in this pod will not wait for the "
                    "job's restart", state_dir, err)


def record_generation(state_dir: Path | None, uid: str, generation: int) -> None:
    """The sidecar's newest generation, so that a rerun of init continues the numbering from it."""
    if state_dir is None or not uid or not state_dir.is_dir():
        return
    try:
        write_files(state_dir, {GENERATION: f"{uid} {generation}\n".encode()})
    except (OSError, OutputError) as err:
        log.info("could not record generation %d in %s (%s)", generation, state_dir, err)


def cut_pod(pod: Any) -> RawPod:
    """What the barrier reads of a pod: its name, phase and init containers (their statuses and which are
    sidecars), ~200 bytes where the pod is ~4 KB. Cutting a cut pod gives it back as it is."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    inits = [{"name": c.get("name"), "restartPolicy": c.get("restartPolicy")}
             for c in spec.get("initContainers") or [] if isinstance(c, dict)]
    statuses: list[dict[str, Any]] = [
        {"name": s.get("name"), "restartCount": s.get("restartCount"),
         "state": {key: {} for key in (s.get("state") or {})}}
        for s in status.get("initContainerStatuses") or [] if isinstance(s, dict)]
    return {"metadata": {"name": meta.get("name", ""), "uid": meta.get("uid", ""),
                         "annotations": meta.get("annotations") or {},
                         **({"deletionTimestamp": meta["deletionTimestamp"]} if meta.get("deletionTimestamp") else {})},
            "spec": {"initContainers": inits},  # type: ignore[typeddict-item]
            "status": {"phase": status.get("phase", ""), "initContainerStatuses": statuses}}  # type: ignore[typeddict-unknown-key]


def cut_page(page: list[Any]) -> list[Any]:
    """A LIST page of pods, each cut as it is read (``cut_pod``)."""
    return [cut_pod(pod) for pod in page if isinstance(pod, dict)]


class PodAttempts:
    """The job's pods as the barrier reads them (a reflector's store): the members behind, kept pod by pod, so
    an event costs O(1) whatever the job size."""

    def __init__(self, members: frozenset[str] | None, runs: int) -> None:
        self.members, self.runs = members, runs  # members None: every pod listed that is not on its way out
        self.behind: set[str] = set()
        self.listed = False

    def replace(self, items: list[Any]) -> None:
        self.behind = set()
        self.listed = True
        for item in items:
            self._put(item)

    def apply(self, event: WatchEvent) -> None:
        if event.type == "BOOKMARK":
            return
        if event.type == "DELETED":
            self.behind.discard((event.object.get("metadata") or {}).get("name", ""))
        else:
            self._put(event.object)

    def _put(self, pod: Any) -> None:
        cut = cut_pod(pod)  # a LIST's items are cut already: cutting again keeps them as they are
        name = cut["metadata"]["name"]
        leaving = cut["metadata"].get("deletionTimestamp") or cut["status"].get("phase") in ("Failed", "Succeeded")
        member = self.members is None or name in self.members
        if member and not leaving and is_behind(cut, self.runs):
            self.behind.add(name)
        else:
            self.behind.discard(name)  # there, or on its way out: its replacement, if any, is waited for

    def down(self) -> bool:
        return self.listed and not self.behind

    def barrier(self) -> Barrier:
        if not self.listed:
            return Barrier("restarts", self.runs, why="the job's pods are not read yet")
        return Barrier("restarts", self.runs, tuple(sorted(self.behind)))


class JobSetAttempt:
    """The JobSet as the barrier reads it (watched by name), and where the barrier stands."""

    def __init__(self, jobset: Any, attempt: int) -> None:
        self.jobset, self.attempt = jobset, attempt

    def replace(self, items: list[Any]) -> None:
        if items:
            self.jobset = items[0]

    def apply(self, event: WatchEvent) -> None:
        if event.type in ("ADDED", "MODIFIED"):
            self.jobset = event.object

    def down(self) -> bool:
        return self.barrier().down

    def barrier(self) -> Barrier:
        return jobset_barrier(self.jobset, self.attempt)
