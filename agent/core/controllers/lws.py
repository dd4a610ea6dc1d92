"""LeaderWorkerSet (leaderworkerset.x-k8s.io): groups of one leader and size - 1 workers; each group is one training
world, whose size the pods carry (the agent never reads the object)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from agent.core.controllers.base import (
    Controller,
    JobResource,
    Objects,
    PodTemplate,
    at,
    map_at,
    meta,
    number,
    qualify,
    replicas,
    required,
    spec_dns,
)
from agent.core.model import Identity, Options, RawPod

LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"

# Only injected: a group's size is on its pods (short name lws: config/crd/bases/
# leaderworkerset.x-k8s.io_leaderworkersets.yaml).
LEADERWORKERSETS = JobResource("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets",
                               short=("lws",), read=False)


class LeaderWorkerSet(Controller):
    key, title, marker = "lws", "LeaderWorkerSet", LWS_NAME
    labels = frozenset({LWS_NAME, LWS_GROUP, LWS_WORKER, LWS_SIZE})
    resources = (LEADERWORKERSETS,)
    default_roles = ("leader", "worker")

    def identify(self, pod: RawPod, options: Options) -> Identity:
        fix = "the pod must be created by a LeaderWorkerSet (or pass --controller)"
        name = required(pod, LWS_NAME, fix=fix)
        group = number(pod, LWS_GROUP, fix=fix)
        worker = number(pod, LWS_WORKER, fix=fix)
        role = "leader" if worker == 0 else "worker"
        return Identity(job=f"{name}/{group}", role=role, index=(worker,), ordinal=worker)

    def job_of(self, pod: RawPod) -> str | None:
        labels = meta(pod).labels
        return f"{labels[LWS_NAME]}/{labels.get(LWS_GROUP)}" if LWS_NAME in labels else None

    def index_base(self, role: str) -> int:
        """Worker index 0 is the leader: the workers count from 1."""
        return 1 if role == "worker" else 0

    def dns_name(self, pod: RawPod, ident: Identity, namespace: str, cluster_domain: str | None) -> str:
        # The LWS webhook sets hostname <lws>-<group>[-<worker>] and subdomain <lws> (the shared headless Service).
        if spec := spec_dns(pod):
            return qualify(f"{spec[0]}.{spec[1]}", namespace, cluster_domain)
        lws, group = ident.job.split("/")
        host = f"{lws}-{group}" if ident.index[0] == 0 else f"{lws}-{group}-{ident.index[0]}"
        return qualify(f"{host}.{lws}", namespace, cluster_domain)

    def selector(self, pod: RawPod, options: Options) -> str:
        labels = meta(pod).labels
        return f"{LWS_NAME}={labels[LWS_NAME]},{LWS_GROUP}={labels[LWS_GROUP]}"

    def size_from_pod(self, pod: RawPod) -> tuple[dict[str, int], str] | None:
        raw = meta(pod).annotations.get(LWS_SIZE)
        if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 9:
            return None
        size = int(raw)
        return {"leader": 1, "worker": size - 1}, f"annotation {LWS_SIZE}"

    def replica_counts(self, objects: Objects) -> dict[str, int]:
        """None: the object counts every group's pods, and a group is the training world (``size_from_pod``)."""
        return {}

    def pod_templates(self, job: Mapping[str, Any]) -> Iterator[PodTemplate]:
        """``leaderWorkerTemplate``'s leaderTemplate (each group's leader) and workerTemplate (the other size - 1
        pods of each group, and the leader too when there is no leaderTemplate), over ``replicas`` groups."""
        lwt = map_at(job, "spec", "leaderWorkerTemplate")
        groups, size = replicas(at(job, "spec", "replicas")), replicas(lwt.get("size"))
        leaders = groups if size and "leaderTemplate" in lwt else 0
        if "leaderTemplate" in lwt:
            yield PodTemplate("leader", "leaderTemplate", ("spec", "leaderWorkerTemplate", "leaderTemplate"),
                              lwt["leaderTemplate"], leaders)
        yield PodTemplate("worker", "workerTemplate", ("spec", "leaderWorkerTemplate", "workerTemplate"),
                          lwt.get("workerTemplate"), groups * size - leaders)

LWS = LeaderWorkerSet()
