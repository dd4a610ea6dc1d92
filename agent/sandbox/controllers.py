"""The controllers the sandbox plays (``topology-agent sandbox --controllers``): a job object written to it gets the
objects and pods its controller would make, placed on the sandbox's Nodes (nodes.py), changed when the job's spec
changes, and removed with it.

What a controller makes of a job is the emulation's answer (``agent.core.emulation``: a pure function of the job
and, for a TrainJob, its runtimes); this module only applies it, as a controller reconciles: it creates what is
missing (pods through the mutating webhooks, as a controller's create meets them), deletes what is no longer
wanted, and leaves alone what is there, so a scale-up adds pods and keeps the running ones. Deletion is the garbage
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
            return ref.get("uid")  # type: ignore[no-any-return]
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
    return meta.get("generateName") or meta["name"]  # type: ignore[no-any-return]


class Controllers:
    def __init__(self, store: Store, objects: Objects, catalog: Catalog, *, nodes: int) -> None:
        self.store = store
        self.objects = objects
        self.catalog = catalog
        self.nodes = nodes
        self.queue: asyncio.Queue[tuple[str, Event] | None] = asyncio.Queue()
        self.watchers: list[Watcher] = []

    def start(self) -> None:
        """Create the Nodes and follow the job objects' (and made owners') events from now on."""
        create_nodes(self.store, self.nodes)
        watched = {resource_key(r.group, r.version, r.plural) for r in job_resources() if r.kind not in RUNTIMES}
        for resource in sorted(watched | {STATEFULSETS}):
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
            return
        if event.resource == STATEFULSETS or meta.get("deletionTimestamp") or _controller_uid(obj):
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
        namespace = job["metadata"].get("namespace", "")
        try:
            made = emulate(clone(job), runtimes=self._runtimes(namespace))
        except UNREADABLE as err:
            record_event(self.store, job, "FailedCreate", f"the sandbox cannot make this job's pods: "
                         f"{type(err).__name__}: {str(err)[:200]}", kind="Warning", source=AGENT)
            return
        uids = {job["metadata"]["uid"]}
        stored_uid: dict[str, str] = {}  # an owner's uid in the emulation -> the stored object's
        kept: set[tuple[str, str]] = set()
        for owner in made.owners:  # owners before what they own, as the controllers create them
            resource = self._resource(owner)
            if resource is None:
                continue
            stored = self._ensure(resource, namespace, _rewired(owner, stored_uid))
            stored_uid[owner["metadata"]["uid"]] = stored["metadata"]["uid"]
            uids.add(stored["metadata"]["uid"])
            kept.add((resource, owner["metadata"]["name"]))
        owner_resources = {r for r in (self._resource(o) for o in made.owners) if r} | self._made_resources()
        for resource, obj in self._owned(owner_resources, namespace, uids):
            if (resource, obj["metadata"]["name"]) not in kept:
                self.store.delete(resource, namespace, obj["metadata"]["name"])  # its pods follow (collect)
        wanted = {_identity(pod): pod for pod in made.pods}
        for _, pod in self._owned([PODS], namespace, uids):
            if _identity(pod) not in wanted:
                self.store.delete(PODS, namespace, pod["metadata"]["name"])
            else:
                del wanted[_identity(pod)]
        for pod in wanted.values():
            await self._create_pod(job, namespace, _rewired(pod, stored_uid))

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

    async def _create_pod(self, job: Obj, namespace: str, pod: Obj) -> None:
        """Create the pod as a controller does (through the mutating webhooks), then schedule and run it."""
        path = f"/api/v1/namespaces/{namespace}/pods"
        pod["metadata"].pop("uid", None)
        call = Call("POST", path, route(path) or {}, body=json.dumps(pod).encode(), agent=AGENT)
        answered = await self.objects.answer(call)
        if not isinstance(answered, Answer) or answered.status != 201:
            message = answered.body.get("message", "") if isinstance(answered, Answer) and \
                isinstance(answered.body, dict) else ""
            record_event(self.store, job, "FailedCreate", f"Error creating pod {_identity(pod)}: {message}"[:1000],
                         kind="Warning", source=AGENT)
            return
        created: dict[str, Any] = answered.body
        name = created["metadata"]["name"]
        if place(self.store, namespace, name) is None:
            record_event(self.store, self.store.get(PODS, namespace, name), "FailedScheduling",
                         f"0/{self.nodes} nodes are available: no Ready node with a free pod address",
                         kind="Warning")

    # --- garbage collection ----------------------------------------------------------------------------------

    def collect(self, namespace: str, uid: str) -> None:
        """Delete what the deleted object controlled: its pods now, made owners too (their DELETED events
        collect their own pods in turn)."""
        for resource, obj in self._owned([PODS, *sorted(self._made_resources())], namespace, {uid}):
            try:
                self.store.delete(resource, namespace, obj["metadata"]["name"])
            except NotFound:
                continue
