"""A sandbox running on its own event loop in a background thread, with blocking helpers to change it.

For ``demo``, tests and benchmarks that drive the sandbox from ordinary (blocking) code while agents,
kubectl or other processes talk to it over HTTPS; with ``listen=False`` it opens no socket and is reached in
memory only (memory.py).
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from agent.sandbox.server import Sandbox
from agent.sandbox.store import Watcher, clone

T = TypeVar("T")
PODS = "/v1/pods"


class SandboxThread:
    def __init__(self, state_dir: Path, *, listen: bool = True, **kwargs: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.sandbox = Sandbox(state_dir, **kwargs)
        self.listen = listen
        self._thread = threading.Thread(target=self.loop.run_forever, name="sandbox", daemon=True)

    def __enter__(self) -> SandboxThread:
        self._thread.start()
        if self.listen:
            self.call(self.sandbox.start())
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._thread.is_alive():
            self.call(self.sandbox.stop())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if not self.loop.is_running() and not self.loop.is_closed():
            self.loop.close()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        async def wrapped() -> Any:
            return fn(*args, **kwargs)

        return self.call(wrapped())

    # --- blocking helpers ----------------------------------------------------------------------------------

    def create(self, resource: str, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object as a cluster would hold it, without admission (a CRD's kind is served at once); a
        ``metadata.uid`` given is kept, so a job object and the pods that name it as owner agree."""
        return self._run(self.sandbox.store_object, resource, namespace, copy.deepcopy(obj), keep_uid=True)

    def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        return self.create(PODS, pod["metadata"].get("namespace", "default"), pod)

    def update_pod(self, namespace: str, name: str, change: Any) -> dict[str, Any]:
        """Apply ``change(pod)`` (mutating a copy) as one MODIFIED event."""
        return self.update(PODS, namespace, name, change)

    def update(self, resource: str, namespace: str, name: str, change: Any) -> dict[str, Any]:
        """Apply ``change(obj)`` to any object (mutating a copy) as one MODIFIED event, e.g. a Node ("/v1/nodes",
        namespace "")."""
        def apply() -> dict[str, Any]:
            obj = clone(self.sandbox.store.get(resource, namespace, name))
            change(obj)
            obj["metadata"].pop("resourceVersion", None)
            return self.sandbox.store.replace(resource, namespace, name, obj)

        return self._run(apply)

    def set_pod_ip(self, namespace: str, name: str, ip: str) -> dict[str, Any]:
        def change(pod: dict[str, Any]) -> None:
            pod.setdefault("status", {}).update(phase="Running", podIP=ip, podIPs=[{"ip": ip}], hostIP="127.0.0.1")

        return self.update_pod(namespace, name, change)

    def schedule(self, namespace: str, name: str, ip: str, node: str | None = None) -> dict[str, Any]:
        """What the scheduler and the kubelet do: bind the pod to a node, then report it Running at ``ip``."""
        from agent.examples import container_statuses

        def change(pod: dict[str, Any]) -> None:
            if node is not None:
                pod["spec"]["nodeName"] = node
            pod.setdefault("status", {}).update(phase="Running", podIP=ip, podIPs=[{"ip": ip}], hostIP="127.0.0.1",
                                                containerStatuses=container_statuses(pod["spec"]["containers"]))

        return self.update_pod(namespace, name, change)

    def create_node(self, node: dict[str, Any]) -> dict[str, Any]:
        return self.create("/v1/nodes", "", node)

    def delete_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self._run(self.sandbox.store.delete, PODS, namespace, name)

    def delete(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        """Delete any object as ``kubectl delete`` would (one DELETED event), e.g. a ConfigMap ("/v1/configmaps")."""
        return self._run(self.sandbox.store.delete, resource, namespace, name)

    def faults(self, **knobs: Any) -> None:
        async def apply() -> None:
            s = self.sandbox
            if knobs.get("down_for"):
                await s.go_down(float(knobs["down_for"]))
            if knobs.get("up"):
                await s.come_up()
            if knobs.get("drop_watches"):
                await s._drop_watches()
            if knobs.get("compact"):
                s.store.compact()
            if "status" in knobs:
                s.faults.status = knobs["status"]
                s.faults.count = knobs.get("count", -1)
                s.faults.retry_after = knobs.get("retry_after")
                s.faults.reset = knobs.get("reset", False)
                s.faults.path = knobs.get("path")
            if "delay" in knobs:
                s.faults.delay = knobs["delay"]
                s.faults.delay_count = knobs.get("delay_count", -1)
                s.faults.path = knobs.get("path")
            if "watch" in knobs:
                s.faults.watch = knobs["watch"]
                s.faults.path = knobs.get("path")
            if "trickle" in knobs:
                s.faults.trickle = knobs["trickle"]
                s.faults.path = knobs.get("path")
            if knobs.get("clear"):
                from agent.sandbox.faults import Faults

                s.faults = Faults()

        self.call(apply())

    def stats(self) -> dict[str, Any]:
        st = self.sandbox.stats
        return {"requests": st.requests, "bytes": st.bytes, "watches": st.watches, "byAgent": dict(st.by_agent),
                "lastEventAt": dict(st.last_event)}

    def reset_stats(self) -> None:
        from agent.sandbox.faults import Stats

        async def reset() -> None:
            self.sandbox.stats = Stats()

        self.call(reset())

    def client_env(self) -> dict[str, str]:
        """Environment that makes an agent process see this sandbox as its in-cluster API server."""
        return {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(self.sandbox.port),
            "TOPOLOGY_SERVICEACCOUNT_DIR": str(self.sandbox.serviceaccount_dir),
        }

    # --- what tests wait for -----------------------------------------------------------------------------

    def wait_for(self, resource: str, test: Callable[[Any], Any], *, timeout: float = 30.0) -> Any:
        """Block until ``test(store)`` holds, looked at after each change of ``resource`` (a store key such as
        "/v1/configmaps"): a condition awaited on the store's own events, not polled."""
        future = asyncio.run_coroutine_threadsafe(self._until(resource, test), self.loop)
        try:
            return future.result(timeout)
        finally:
            future.cancel()

    async def until(self, resource: str, test: Callable[[Any], bool], *, timeout: float = 30.0) -> Any:
        """``wait_for`` for a caller on an event loop."""
        future = asyncio.run_coroutine_threadsafe(self._until(resource, test), self.loop)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.wrap_future(future)
        finally:
            future.cancel()

    async def _until(self, resource: str, test: Callable[[Any], bool]) -> Any:
        store = self.sandbox.store
        watcher = Watcher(resource=resource, namespace=None)
        store.watchers.add(watcher)
        try:
            while not (found := test(store)):
                await watcher.queue.get()
            return found
        finally:
            store.watchers.discard(watcher)
