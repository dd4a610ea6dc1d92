"""The controllers the sandbox plays (``topology-agent sandbox --controllers``): a job object written to it gets the
objects and pods its controller would make, placed on the sandbox's Nodes (nodes.py), changed when the job's spec
changes, and removed with it.

What a controller makes of a job is the emulation's answer (``agent.core.emulation``: a pure function of the job
and, for a TrainJob, its runtimes); this module only applies it, as a controller reconciles: it creates what is
missing (pods through the mutating webhooks, as a controller's create meets them), deletes what is no longer
wanted, and leaves alone what is there, so a scale-up adds pods and keeps the running ones, and a pod deleted
while its job lives is made again (with a new uid, as controllers replace a lost pod). Deletion is the garbage
collector's: an object whose controlling owner is deleted is deleted in turn, down the chain (TrainJob, JobSet,
Jobs, pods). Objects with a controlling owner (the Jobs a JobSet made) are never reconciled themselves: their
pods come from the top job's emulation.

One task handles the store's events in order, so a reconcile never races another; a job the emulation cannot
read gets a Warning Event (``FailedCreate``) and the others go on.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from typing import Any

from agent.core.controllers import job_resources
from agent.core.emulation import emulate
from agent.errors import InputError
from agent.sandbox.calls import Answer, Call, route
from agent.sandbox.discovery import Catalog, resource_key
from agent.sandbox.nodes import PODS, create_nodes, place, record_event
from agent.sandbox.objects import Objects
from agent.sandbox.store import Event, NotFound, Obj, Store, Watcher, clone

log = logging.getLogger("topology_agent.sandbox")
AGENT = "sandbox controllers"
RUNTIMES = ("TrainingRuntime", "ClusterTrainingRuntime")
STATEFULSETS = resource_key("apps", "v1", "statefulsets")
# What the emulation cannot make of a job it was given (a manifest missing a field, a value of the wrong type).
UNREADABLE = (InputError, KeyError, TypeError, ValueError, AttributeError, IndexError)


def _controller_uid(obj: Obj) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return ref.get("uid")
    return None


def _rewired(obj: Obj, stored_uid: dict[str, str]) -> Obj:
    """A copy of ``obj`` whose ownerReferences name the stored owners' uids (an owner made in an earlier
    reconcile keeps the uid it was stored with)."""
    copied = clone(obj)
    for ref in copied["metadata"].get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("uid") in stored_uid:
            ref["uid"] = stored_uid[ref["uid"]]
    return copied


def _identity(obj: Obj) -> str:
    """What names a made object across reconciles: its generateName when it has one (a Job's pods get a random
    suffix), else its name."""
    meta = obj["metadata"]
    return meta.get("generateName") or meta["name"]


class Controllers:
    def __init__(self, store: Store, objects: Objects, catalog: Catalog, *, nodes: int) -> None:
        self.store = store
        self.objects = objects
        self.catalog = catalog
        self.nodes = nodes
        self.queue: asyncio.Queue[tuple[str, Event] | None] = asyncio.Queue()
        self.watchers: list[Watcher] = []
        self.jobs = {resource_key(r.group, r.version, r.plural) for r in job_resources() if r.kind not in RUNTIMES}

    def start(self) -> None:
        """Create the Nodes and follow the job objects' (and made owners') events from now on."""
        create_nodes(self.store, self.nodes)
        for resource in sorted(self.jobs | {STATEFULSETS, PODS}):
            watcher = Watcher(resource, None, self.queue)  # type: ignore[arg-type]
            self.store.watchers.add(watcher)
            self.watchers.append(watcher)

    def stop(self) -> None:
        for watcher in self.watchers:
            self.store.watchers.discard(watcher)

    async def run(self) -> None:
        try:
            while (item := await self.queue.get()) is not None:
                kind, event = item
                try:
                    await self.handle(kind, event)
                except Exception:  # one job's failure must not stop the controllers: logged with its traceback
                    log.exception("sandbox controllers: %s %s failed", kind, event.new["metadata"].get("name"))
        finally:
            self.stop()

    async def handle(self, kind: str, event: Event) -> None:
        obj = event.new
        meta = obj["metadata"]
        if kind == "DELETED":
            self.collect(meta.get("namespace", ""), meta["uid"])
            if event.resource == PODS:  # a controller makes a missing pod again
                top = self._top(meta.get("namespace", ""), _controller_uid(obj))
                if top is not None:
                    await self.reconcile(top)
            return
        if event.resource in (STATEFULSETS, PODS) or meta.get("deletionTimestamp") or _controller_uid(obj):
            return
        if kind == "MODIFIED" and event.old is not None and event.old.get("spec") == obj.get("spec"):
            return  # metadata or status only: nothing for a controller to make
        try:
            current = self.store.get(event.resource, meta.get("namespace", ""), meta["name"])
        except NotFound:
            return
        if current["metadata"]["uid"] == meta["uid"]:
            await self.reconcile(current)

    # --- reconcile -----------------------------------------------------------------------------------------

    def _top(self, namespace: str, uid: str | None) -> Obj | None:
        """The job at the top of the controlling owners from ``uid`` up, if it is stored and not being deleted."""
        by_uid = {obj["metadata"]["uid"]: obj for (_, ns, _), obj in self.store.objects.items() if ns == namespace}
        seen: set[str] = set()
        while uid is not None and uid in by_uid and uid not in seen:
            seen.add(uid)
            obj = by_uid[uid]
            parent = _controller_uid(obj)
            if parent is None:  # a job the controllers play, alive
                alive = self._resource(obj) in self.jobs and not obj["metadata"].get("deletionTimestamp")
                return obj if alive else None
            uid = parent
        return None

    def _resource(self, obj: Obj) -> str | None:
        group, _, version = obj["apiVersion"].rpartition("/")
        for (g, v, plural), served in self.catalog.resources.items():
            if (g, v) == (group, version) and served.kind == obj["kind"] and served.stored_as is None:
                return resource_key(g, v, plural)
        return None

    def _runtimes(self, namespace: str) -> list[Obj]:
        found: list[Obj] = []
        for (g, v, plural), served in self.catalog.resources.items():
            if served.kind in RUNTIMES:
                found += self.store.list(resource_key(g, v, plural), namespace if served.namespaced else "")
        return found

    def _owned(self, resources: Iterable[str], namespace: str, uids: set[str]) -> list[tuple[str, Obj]]:
        return [(resource, obj) for resource in resources for obj in self.store.list(resource, namespace)
                if _controller_uid(obj) in uids]

    async def reconcile(self, job: Obj) -> None:
        """Make what the emulation wants and is missing, owners before what they own (a pod that owns a
        StatefulSet, as an LWS leader does, before it); delete what the job's chain holds and it no longer
        wants."""
        namespace = job["metadata"].get("namespace", "")
        try:
            made = emulate(clone(job), runtimes=self._runtimes(namespace))
        except UNREADABLE as err:
            record_event(self.store, job, "FailedCreate", f"the sandbox cannot make this job's pods: "
                         f"{type(err).__name__}: {str(err)[:200]}", kind="Warning", source=AGENT)
            return
        job_uid = job["metadata"]["uid"]
        stored_uid = {job_uid: job_uid}  # an object's uid in the emulation -> the stored object's
        running = {(_identity(p), _controller_uid(p)): p for p in self.store.list(PODS, namespace)}
        kept: set[tuple[str, str]] = set()
        pending = [*made.owners, *made.pods]
        while pending:
            ready = [o for o in pending if _controller_uid(o) in stored_uid or _controller_uid(o) is None]
            if not ready:
                break  # owned by an object the emulation did not give: nothing to hang it on
            for obj in ready:
                resource = PODS if obj.get("kind") == "Pod" else self._resource(obj)
                wired = _rewired(obj, stored_uid)
                if resource is None:
                    continue
                if resource == PODS:
                    stored = running.get((_identity(wired), _controller_uid(wired))) or \
                        await self._create_pod(job, namespace, wired)
                else:
                    stored = self._ensure(resource, namespace, wired)
                if stored is None:
                    continue
                kept.add((resource, stored["metadata"]["name"]))
                if obj["metadata"].get("uid"):
                    stored_uid[obj["metadata"]["uid"]] = stored["metadata"]["uid"]
            pending = [o for o in pending if all(o is not r for r in ready)]
        for resource, obj in self._owned([PODS, *sorted(self._made_resources())], namespace,
                                         set(stored_uid.values())):
            if (resource, obj["metadata"]["name"]) not in kept:
                self._delete(resource, namespace, obj["metadata"]["name"])

    def _made_resources(self) -> set[str]:
        """Where made owners live: Jobs, JobSets and StatefulSets (a kind whose objects a controller makes)."""
        return {resource_key("batch", "v1", "jobs"), resource_key("jobset.x-k8s.io", "v1alpha2", "jobsets"),
                STATEFULSETS}

    def _ensure(self, resource: str, namespace: str, owner: Obj) -> Obj:
        """The made owner as the emulation says, as stored: created if missing, its spec brought up to date if
        not (its uid stays the stored one)."""
        name = owner["metadata"]["name"]
        try:
            current = self.store.get(resource, namespace, name)
        except NotFound:
            return self.store.create(resource, namespace, clone(owner), keep_uid=True)
        if current.get("spec") == owner.get("spec"):
            return current
        updated = clone(current)
        updated["spec"] = clone(owner.get("spec") or {})
        updated["metadata"].pop("resourceVersion", None)
        return self.store.replace(resource, namespace, name, updated)

    async def _create_pod(self, job: Obj, namespace: str, pod: Obj) -> Obj | None:
        """Create the pod as a controller does (through the mutating webhooks), then schedule and run it: the pod
        as stored, or None if the create was refused."""
        path = f"/api/v1/namespaces/{namespace}/pods"
        pod["metadata"].pop("uid", None)
        call = Call("POST", path, route(path) or {}, body=json.dumps(pod).encode(), agent=AGENT)
        answered = await self.objects.answer(call)
        if not isinstance(answered, Answer) or answered.status != 201:
            message = answered.body.get("message", "") if isinstance(answered, Answer) and \
                isinstance(answered.body, dict) else ""
            record_event(self.store, job, "FailedCreate", f"Error creating pod {_identity(pod)}: {message}"[:1000],
                         kind="Warning", source=AGENT)
            return None
        created: dict[str, Any] = answered.body
        name = created["metadata"]["name"]
        placed = place(self.store, namespace, name)
        if placed is None:
            placed = self.store.get(PODS, namespace, name)
            record_event(self.store, placed, "FailedScheduling",
                         f"0/{self.nodes} nodes are available: no Ready node with a free pod address",
                         kind="Warning")
        return placed

    # --- garbage collection ----------------------------------------------------------------------------------

    def collect(self, namespace: str, uid: str) -> None:
        """Delete what the deleted object controlled, and what that controlled, down the chain (a pod can own
        a StatefulSet, as an LWS leader does)."""
        for resource, obj in self._owned([PODS, *sorted(self._made_resources())], namespace, {uid}):
            self._delete(resource, namespace, obj["metadata"]["name"])

    def _delete(self, resource: str, namespace: str, name: str) -> None:
        try:
            gone = self.store.delete(resource, namespace, name)
        except NotFound:
            return
        self.collect(namespace, gone["metadata"]["uid"])
