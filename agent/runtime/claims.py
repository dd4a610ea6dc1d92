"""The DRA claims of the job's namespace, read for the process count (core/pods/claims.py counts their devices).

Read only when a pod of the job has a trainer container that takes DRA claims (``resources.claims``): a job
without them costs nothing. Then one LIST of the namespace's ResourceClaims (resource.k8s.io/v1), paged like the
pods: every pod's claims come with it, a launcher's peers' too, where a GET per claim would cost one request per
pod. The templates are not read: init runs once its pod is scheduled, and the scheduler allocates a pod's claims
before it binds the pod, so the claims say what was allocated. The sidecar reads them again when a pod that takes
claims comes with a node and address it has not seen for it: a pod the controller replaced has a new claim. A
LIST that is refused (RBAC forbidden, or a cluster without resource.k8s.io/v1) does not stop the job: the count
falls back, and the log and ``explain``'s rule say why.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from agent.core.model import Options, RawPod
from agent.core.pods.claims import Claims, has_claims, read_claims
from agent.core.pods.containers import pick_trainer_container
from agent.core.pods.pod import pod_containers
from agent.errors import ApiError, InputError
from agent.k8s.core import PAGE

if TYPE_CHECKING:  # the protocol's module imports aiohttp, which init does not load
    from agent.k8s.async_client import AsyncApi

log = logging.getLogger("topology_agent.claims")
Retry = Callable[[Callable[[], Awaitable[Any]], str], Awaitable[Any]]


def claims_path(namespace: str) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"


def claimants(pods: Iterable[RawPod], options: Options) -> list[RawPod]:
    """The pods whose trainer container takes DRA claims: asked once per containers list (the held pods of one
    shape share theirs), so a look at every pod of a 16384-pod job is one answer per shape."""
    found = []
    answers: dict[int, bool] = {}  # id of a containers list -> its answer (the lists live through the call)
    for pod in pods:
        containers = pod_containers(pod)
        takes = answers.get(id(containers))
        if takes is None:
            try:
                takes = has_claims(pick_trainer_container(pod, options.processes.container))
            except InputError:  # no such --container: the count says so, not this read
                takes = False
            answers[id(containers)] = takes
        if takes:
            found.append(pod)
    return found


def takes_claims(pods: Iterable[RawPod], options: Options) -> bool:
    """Whether any pod's trainer container takes DRA claims."""
    return bool(claimants(pods, options))


async def with_claims(api: AsyncApi, namespace: str, pods: Iterable[RawPod], options: Options, *,
                      retry: Retry) -> Options:
    """``options`` with the namespace's claims when a pod's trainer takes DRA claims, else ``options`` itself
    (also with ``--nproc-per-node N``, which no device count changes)."""
    if isinstance(options.processes.per_node, int) or not takes_claims(pods, options):
        return options
    path = claims_path(namespace)
    try:
        items, _ = await retry(lambda: api.list_objects(path, limit=PAGE), "list resourceclaims")
    except ApiError as err:
        note = (f"cannot list resourceclaims in namespace {namespace} ({err}); grant get and list on "
                "resourceclaims (resource.k8s.io): manifests/rbac/role.yaml")
        log.warning("DRA claims not read: %s; processes per pod fall back to the container's resources", note)
        return dataclasses.replace(options, processes=dataclasses.replace(options.processes, claims=Claims(note=note)))
    claims = read_claims(items)
    log.info("read %d DRA claim(s) in namespace %s for the processes per pod", len(claims.claims), namespace)
    return dataclasses.replace(options, processes=dataclasses.replace(options.processes, claims=claims))
