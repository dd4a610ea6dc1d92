"""What init read that its pod's sidecar would read again at start: the own pod, the job's objects, the
publishers init vouched for (core/publication/provenance.py) and, in its own view, the summary that placed it. Reading
its own pod, the job and the writer pod again would cost each follower's sidecar ~20 KiB at start (~0.3 GiB
job-wide at 16384 pods), and listing the summary init has just read more; so it starts from init's reads and
watches what changed since (the summary from the resourceVersion init read it at).

These reads decide who the members are and whose publication is followed, so they are kept where only the
agent's containers write: the state directory (``--state-dir``), a volume that init and the sidecar mount and
the trainer never does (``inject`` and the webhook add it). The shared directory is the trainer's to write too
(it often runs as the same user): a copy there is never read. A pod without the state directory (a manifest
written by hand before it existed) has its sidecar read the objects from the API server, as it would without
init. The file is still read with the care of files/reading.py and used only if every part has the shape the
API gives (the own pod is checked as init checks it, and must be this pod). Nothing in it is a secret.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.core.model import RawPod
from agent.core.pods.validation import check_pod, is_label_value
from agent.core.publication.provenance import Writer
from agent.errors import InputError, OutputError
from agent.files.reading import Unreadable, read_untrusted
from agent.files.writing import write_files

log = logging.getLogger("topology_agent.handoff")
NAME = ".topology-init-reads.json"  # not TEMP_PREFIX: a later write would remove it as stale
LIMIT = 4 << 20  # bytes: the own pod and a job's objects are tens of KiB


@dataclass
class Handoff:
    pod: RawPod | None = None  # the own pod as init read it
    objects: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # the job's objects by API path
    writers: set[Writer] = field(default_factory=set)  # publishers init accepted (name and uid)
    summary: dict[str, Any] | None = None  # the summary ConfigMap that placed this pod (its own view)
    blocks: list[dict[str, Any]] = field(default_factory=list)  # and its blocks (core/publication/blocks.py)
    domains: list[str] | None = None  # its own Node's value per level (--topology-levels), as init read it

    def own_pod(self) -> RawPod | None:
        """The own pod if init read it with its IP (an init that starts before the kubelet has posted the pod's
        IP reads it without: the sidecar reads it again; a pod is bound before any of its containers runs)."""
        pod = self.pod
        return pod if pod is not None and pod.get("status", {}).get("podIP") else None

    def to_bytes(self) -> bytes:
        return json.dumps({"pod": self.pod, "objects": self.objects, "summary": self.summary,
                           "blocks": self.blocks, "domains": self.domains,
                           "writers": sorted([w.name, w.uid] for w in self.writers)}, separators=(",", ":")).encode()


def write_handoff(state_dir: Path | None, handoff: Handoff) -> None:
    """Written after the files, temp file and rename like them, in the state directory when the pod has it; a
    failure costs the sidecar its reads only. Init runs before the sidecar in every new pod, so the file is
    always this pod's (a volume that outlives the pod has its earlier pod's file replaced, or removed when it
    cannot be)."""
    if state_dir is None or not state_dir.is_dir():
        return  # no place the trainer cannot write: the sidecar reads the API server (said there, once)
    try:
        write_files(state_dir, {NAME: handoff.to_bytes()})
    except (OSError, OutputError) as err:
        log.info("could not leave init's reads for the sidecar (%s); it reads them again", err)
        with contextlib.suppress(OSError):
            (state_dir / NAME).unlink()


def read_handoff(state_dir: Path | None, pod_name: str) -> Handoff:
    """Init's reads for ``pod_name`` from the state directory, or an empty handoff (said in one line when the
    directory is not there, or the file is there but unusable)."""
    if state_dir is None:
        return Handoff()
    if not state_dir.is_dir():
        log.info("no state directory %s (a volume only the agent's containers mount: inject adds it, "
                 "docs/sidecar.md); reading the own pod and the job's objects from the API server, not from the "
                 "shared directory the trainer can write", state_dir)
        return Handoff()
    try:
        raw = read_untrusted(state_dir / NAME, LIMIT)
    except FileNotFoundError:
        return Handoff()
    except (Unreadable, OSError) as err:
        log.info("not using init's reads (%s); reading them from the API server", err)
        return Handoff()
    try:
        return _parsed(json.loads(raw), pod_name)
    except (ValueError, TypeError, InputError, RecursionError) as err:
        log.info("not using init's reads in %s (%s); reading them from the API server", state_dir / NAME,
                 str(err)[:200])
        return Handoff()


def _parsed(document: Any, pod_name: str) -> Handoff:
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    pod, objects, writers = document.get("pod"), document.get("objects"), document.get("writers")
    summary, blocks, domains = document.get("summary"), document.get("blocks", []), document.get("domains")
    if pod is not None:
        check_pod(pod)
        if pod.get("metadata", {}).get("name") != pod_name:
            raise ValueError(f"its pod is not '{pod_name}'")
    if not isinstance(objects, dict) or not all(
            isinstance(k, str) and k.startswith("/") and isinstance(v, dict) for k, v in objects.items()):
        raise ValueError("objects is not a map of API paths to objects")
    if not isinstance(writers, list) or not all(
            isinstance(w, list) and len(w) == 2 and all(isinstance(x, str) and x for x in w) for w in writers):
        raise ValueError("writers is not a list of [name, uid]")
    if summary is not None and not (isinstance(summary, dict) and isinstance(summary.get("metadata"), dict)
                                    and isinstance(summary["metadata"].get("name"), str)
                                    and isinstance(summary["metadata"].get("resourceVersion"), str)
                                    and summary["metadata"]["resourceVersion"]):
        raise ValueError("summary is not a ConfigMap with a name and a resourceVersion")
    if not isinstance(blocks, list) or len(blocks) > 16 or not all(
            isinstance(b, dict) and isinstance(b.get("metadata"), dict) and isinstance(b["metadata"].get("name"), str)
            for b in blocks):
        raise ValueError("blocks is not a list of ConfigMaps")
    if domains is not None and not (isinstance(domains, list) and len(domains) <= 16
                                    and all(isinstance(d, str) and is_label_value(d) for d in domains)):
        raise ValueError("domains is not a list of label values")
    return Handoff(pod, objects, {Writer(name, uid) for name, uid in writers}, summary, blocks, domains)
