"""LeaderWorkerSet (kubernetes-sigs/lws, v0.10.0), as its controllers create objects.

The LWS owns one leader StatefulSet of its name, whose pods ``<lws>-<group>`` lead the groups; each leader pod
owns a worker StatefulSet ``<lws>-<group>`` whose pods are ``<lws>-<group>-<worker>`` (workers 1 to size - 1)
(pkg/controllers/leaderworkerset_controller.go, pod_controller.go). Every pod has the LWS's name, its group and
worker index, the group key (sha1 of ``<namespace>/<leader>``) and the template revision as labels, the group
size as an annotation (the workers also their leader's name), hostname = its name and subdomain = the LWS's
headless Service (its name). The pod webhook puts LWS_LEADER_ADDRESS, LWS_GROUP_SIZE and LWS_WORKER_INDEX first
in every container (core/injected.py's ``lws`` rows). The StatefulSet controller adds its own pod-name and
pod-index labels.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from agent.core.controllers.lws import LWS_GROUP, LWS_NAME, LWS_SIZE, LWS_WORKER
from agent.core.emulation.objects import (
    Obj,
    add_env,
    child,
    count,
    make_pod,
    name_of,
    namespace_of,
    refuse,
    template_at,
)
from agent.core.injected import injected_env

LWS_RELEASE = "v0.10.0"
GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
REVISION = "leaderworkerset.sigs.k8s.io/template-revision-hash"
LEADER_NAME = "leaderworkerset.sigs.k8s.io/leader-name"
STS_POD_NAME = "statefulset.kubernetes.io/pod-name"
STS_POD_INDEX = "apps.kubernetes.io/pod-index"


def emulate_lws(lws: Mapping[str, Any]) -> tuple[list[Obj], list[Obj]]:
    name, namespace = name_of(lws), namespace_of(lws)
    spec = lws.get("spec") or {}
    lwt = spec.get("leaderWorkerTemplate")
    if not isinstance(lwt, Mapping):
        raise refuse(lws, "spec.leaderWorkerTemplate is missing", "give its size and workerTemplate")
    size = count(lws, lwt.get("size"), "spec.leaderWorkerTemplate.size")
    if size < 1:
        raise refuse(lws, "spec.leaderWorkerTemplate.size is 0", "a group has at least its leader: size >= 1")
    groups = count(lws, spec.get("replicas"), "spec.replicas")
    worker_t = template_at(lws, lwt.get("workerTemplate"), "spec.leaderWorkerTemplate.workerTemplate")
    leader_t = template_at(lws, lwt["leaderTemplate"], "spec.leaderWorkerTemplate.leaderTemplate") \
        if lwt.get("leaderTemplate") is not None else worker_t
    revision = hashlib.sha1(json.dumps(lwt, sort_keys=True, default=str).encode()).hexdigest()[:10]
    base = {LWS_NAME: name, REVISION: revision}
    leaders = child("apps/v1", "StatefulSet", name, owner=lws, labels=base,
                    spec={"replicas": groups, "serviceName": name, "template": leader_t})
    owners, pods = [leaders], []
    for group in range(groups):
        leader_name = f"{name}-{group}"
        group_key = hashlib.sha1(f"{namespace}/{leader_name}".encode()).hexdigest()
        leader: Obj | None = None
        workers: Obj | None = None
        for worker in range(size):
            pod_name = leader_name if worker == 0 else f"{leader_name}-{worker}"
            labels = {**base, LWS_GROUP: str(group), LWS_WORKER: str(worker), GROUP_KEY: group_key,
                      STS_POD_NAME: pod_name, STS_POD_INDEX: str(group if worker == 0 else worker)}
            annotations = {LWS_SIZE: str(size)}
            if worker:
                annotations[LEADER_NAME] = leader_name
            if worker == 1:
                assert leader is not None
                workers = child("apps/v1", "StatefulSet", leader_name, owner=leader,
                                labels={**base, LWS_GROUP: str(group), GROUP_KEY: group_key},
                                spec={"replicas": size - 1, "serviceName": name, "template": worker_t})
                owners.append(workers)
            pod = make_pod(pod_name, leader_t if worker == 0 else worker_t,
                           owner=leaders if worker == 0 else workers or leaders, labels=labels,
                           annotations=annotations, hostname=pod_name, subdomain=name)
            facts = {"lws": name, "group": group, "subdomain": name, "namespace": namespace, "size": size,
                     "worker": worker}
            add_env(pod["spec"]["containers"], injected_env("lws", LWS_RELEASE, set(), facts),
                    mode="prepend")
            if worker == 0:
                leader = pod
            pods.append(pod)
    return owners, pods
