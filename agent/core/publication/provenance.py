"""Who wrote a job's published topology, and whether that pod may have.

Each published object names its writer in ``data.leader`` and ``data.leaderUid``. The admission policy
(manifests/policy) admits a write only when both are the writer's own pod, from its bound token; it cannot look
up other objects, so on its own it cannot say whether that pod belongs to *this* job: any pod running under the
agent's ServiceAccount could create another job's ``<job>-topology`` first. The readers close that: before they
use a published object they read its writer pod once and accept the object only if the pod still has that uid,
is a pod of this job, and is a member by the job's own object (gang.Roster). A copy that fails is never used;
the reader follows the pods instead and says why in one line.

Without the policy the names are anyone's to write (docs/security.md): the check then only keeps out writers that
are not the job's pods, and the rows are checked like pod data.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agent.core.controllers import Controller
from agent.core.escaping import shown
from agent.core.model import Options, RawPod
from agent.core.plan.gang import Roster
from agent.core.pods.pod import object_name
from agent.core.pods.validation import is_dns1123_subdomain
from agent.core.publication.journal import journal_name, summary_name
from agent.errors import InputError


@dataclass(frozen=True)
class Writer:
    """The pod a published object says wrote it."""

    name: str
    uid: str


def writer_of(configmap: dict[str, Any]) -> Writer:
    data = configmap.get("data")
    data = data if isinstance(data, dict) else {}
    name, uid = data.get("leader"), data.get("leaderUid")
    return Writer(name if isinstance(name, str) else "", uid if isinstance(uid, str) else "")


@dataclass
class WriterCheck:
    """The writers a reader has accepted (each pod is read once per reader, not once per object or event)."""

    controller: Controller
    options: Options
    job: str
    namespace: str
    roster: Roster | None
    me: Writer | None = None  # this pod: its own writes need no read
    accepted: set[Writer] = field(default_factory=set)
    superseded_by: dict[Writer, str] = field(default_factory=dict)  # writers re-created since, and why refused:
    #                                                                  a uid never comes back, so no second read

    def pending(self, items: Iterable[Any], snapshot_name: str) -> list[tuple[Writer, str]]:
        """The writers of the published objects among ``items`` not accepted yet, each once, with the name of
        an object it wrote."""
        wanted = (snapshot_name, journal_name(snapshot_name), summary_name(snapshot_name))
        found: dict[Writer, str] = {}
        for item in items:
            name = object_name(item)  # any object's name, or ""
            if name in wanted:
                writer = writer_of(item)
                if writer not in self.accepted and writer != self.me and writer not in found:
                    found[writer] = name
        return list(found.items())

    def path(self, writer: Writer) -> str | None:
        """Where to read the writer pod; None when ``data.leader`` is no pod name (never put into a URL)."""
        if not writer.name or not is_dns1123_subdomain(writer.name):
            return None
        return f"/api/v1/namespaces/{self.namespace}/pods/{writer.name}"

    def judge(self, writer: Writer, pod: RawPod | None, what: str) -> str | None:
        """Why ``what`` (a ConfigMap's name) written by ``writer`` must not be used, or None (then accepted);
        ``pod`` is the writer pod as read now, None when it does not exist."""
        why = self.vet(writer, pod)
        return None if why is None else f"configmap {what}: {why}; delete it if no pod of this job wrote it"

    def vet(self, writer: Writer, pod: RawPod | None) -> str | None:
        """Why pod ``writer`` (as read now: ``pod``) is no live member of this job, or None: then it is accepted,
        and what it publishes needs no read of it (the publisher Lease's holder is judged so,
        core/publication/leading.py)."""
        why = self._refusal(writer, pod)
        if why is None:
            self.accepted.add(writer)
        return why

    def superseded(self, writer: Writer, pod: RawPod | None) -> bool:
        """The writer pod was re-created: a pod of that name is a member of this job now, under another uid.
        Not a forgery to flee: the copy names that pod, so its sidecar is the one that publishes again (a whole
        job restarted by its controller, or the leader's pod alone); a reader may wait for it."""
        if pod is None or not writer.uid or (pod.get("metadata") or {}).get("uid") == writer.uid:
            return False
        return self._refusal(Writer(writer.name, str((pod.get("metadata") or {}).get("uid"))), pod) is None

    def _refusal(self, writer: Writer, pod: RawPod | None) -> str | None:
        if not writer.name or not writer.uid:
            return "it does not name the pod that wrote it (data.leader and data.leaderUid)"
        if not is_dns1123_subdomain(writer.name):
            return f"data.leader {writer.name[:80]!r} is not a pod name"
        if pod is None:
            return f"its writer, pod '{writer.name}', does not exist"
        uid = (pod.get("metadata") or {}).get("uid")
        if uid != writer.uid:
            return (f"its writer's uid {shown(writer.uid)} is not the uid of pod '{writer.name}' ({uid}): written "
                    f"by an earlier pod of that name, or by someone else")
        try:
            job = self.controller.identify(pod, self.options).job
        except InputError as err:
            return f"its writer is not a pod of this job ({err})"
        if job != self.job:
            return f"its writer, pod '{writer.name}', belongs to job '{job}', not '{self.job}'"
        if self.roster is not None:
            why = self.roster.refusal(pod)
            if why is not None:
                return f"its writer is not a member: {why}"
        return None
