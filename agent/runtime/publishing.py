"""Reading and writing the job's published topology (a ConfigMap ``<job>-topology``; see core/published.py).

The leader writes it once its gang is complete; the others LIST it by name (``metadata.name`` field selector,
served from the watch cache) and WATCH it by name until it exists and includes their own pod. Each follower
makes 3 requests and one watch, and receives the compressed topology (~40 B per pod) instead of every pod
(~4 KB each).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from agent.core.model import RawPod
from agent.core.published import configmap_body, read_configmap
from agent.errors import ApiConflict, ApiGone, ApiUnavailable, GangTimeout
from agent.k8s.retrying import Backoff, DeadlineExceeded, with_retries
from agent.k8s.wire import PodSource

log = logging.getLogger("topology_agent.published")


def publish(api: PodSource, namespace: str, name: str, data: bytes, *, generation: int, leader: str,
            owner: dict[str, Any] | None) -> None:
    """Create the ConfigMap, or overwrite it (only the leader writes it, so last writer wins is right)."""
    body = configmap_body(name, data, generation=generation, leader=leader, owner=owner)
    collection = f"/api/v1/namespaces/{namespace}/configmaps"
    try:
        with_retries(lambda: api.create(collection, body), what="publish topology")
    except ApiConflict:
        with_retries(lambda: api.replace(f"{collection}/{name}", body), what="publish topology")
    log.info("published the topology as configmap %s (%d bytes compressed, generation %d)", name, len(data),
             generation)


def read_published(api: PodSource, namespace: str, name: str, pod_name: str, *, deadline: float,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> list[RawPod]:
    """The published pods once they include ``pod_name``; ``GangTimeout`` at the deadline."""
    collection = f"/api/v1/namespaces/{namespace}/configmaps"
    selector = f"metadata.name={name}"
    backoff = Backoff()

    def lookup(items: list[dict[str, Any]]) -> list[RawPod] | None:
        for item in items:
            found = read_configmap(item)
            if found and any(p.get("metadata", {}).get("name") == pod_name for p in found[2]):
                log.info("read the published topology %s: generation %d, %d pods", name, found[1], len(found[2]))
                return found[2]
        return None

    def relist() -> tuple[list[RawPod] | None, str]:
        try:
            items, rv = with_retries(lambda: api.list_objects(collection, field_selector=selector),
                                     what="list published topology", deadline=deadline, sleep=sleep, clock=clock)
        except DeadlineExceeded as err:
            raise GangTimeout(f"timed out reading configmap {name}: the API server kept failing ({err.last})") \
                from err
        return lookup(items), rv

    pods, rv = relist()
    while pods is None:
        remaining = deadline - clock()
        if remaining <= 0:
            raise GangTimeout(f"timed out waiting for the job's leader to publish configmap {name} (with pod "
                              f"'{pod_name}'); is the leader pod running its init container? kubectl get configmap "
                              f"{name} -n {namespace}")
        log.info("waiting for the leader to publish configmap %s", name)
        try:
            for event in api.watch_objects(collection, rv, timeout=max(1.0, remaining), field_selector=selector):
                backoff.reset()
                if event.resource_version:
                    rv = event.resource_version
                if event.type in ("ADDED", "MODIFIED"):
                    pods = lookup([event.object])
                    if pods is not None:
                        break
                if clock() >= deadline:
                    break
        except ApiGone:
            pods, rv = relist()
        except ApiUnavailable as err:
            delay = backoff.next_delay(err.retry_after)
            log.info("watch of configmap %s broke (%s); retry %d in %.1f s", name, err, backoff.attempt, delay)
            sleep(delay)
    return pods
