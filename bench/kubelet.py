"""Pods the size and churn of a real cluster's, for the benchmarks.

The examples' pods carry the fields the agent reads and little else (~4.6 KB). A pod that a controller created, the
admission webhook injected, the scheduler bound and the kubelet runs carries much more: the service account's
projected token volume and its mount in every container, the default tolerations, the scheduler's and the
kubelet's conditions and container statuses, and managedFields for each writer; about 8.6 KB of JSON as the
sandbox sends it (``real_pod``). The kubelet then writes the pod's status several times while it starts: the
pod's IP with its init container running (``kubelet_started``), the init container done and the containers
running (``kubelet_initialized``: phase Running), then the containers ready (``kubelet_ready``). Every write is one
MODIFIED event of the whole pod to each agent that watches the pods.

Field names and values are as the kubelet and the API server of Kubernetes 1.32 write them (pkg/kubelet/status,
pkg/api/pod, the service account admission plugin); the byte count, not any value, is what the benchmarks use.
"""

from __future__ import annotations

import copy
from typing import Any

Pod = dict[str, Any]
T0 = "2026-11-22T00:00:00Z"
TOKEN_VOLUME = "kube-api-access-x7k2p"
TOKEN_MOUNT = {"name": TOKEN_VOLUME, "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
CONTAINER_DEFAULTS = {"terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                      "imagePullPolicy": "IfNotPresent"}
AGENT_RESOURCES = {"limits": {"memory": "128Mi"}, "requests": {"cpu": "10m", "memory": "64Mi"}}
AGENT_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                  "readOnlyRootFilesystem": True, "runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                  "seccompProfile": {"type": "RuntimeDefault"}}


def _token_volume() -> dict[str, Any]:
    return {"name": TOKEN_VOLUME, "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                                                                       "fieldPath": "metadata.namespace"}}]}}]}}


def _sidecar(init: dict[str, Any]) -> dict[str, Any]:
    """The agent's native sidecar beside its init container, as the webhook adds it."""
    return {**copy.deepcopy(init), "name": "topology-sidecar", "restartPolicy": "Always",
            "args": ["sidecar", "--out", "/shared"], "ports": [{"name": "health", "containerPort": 8090,
                                                                 "protocol": "TCP"}],
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "health", "scheme": "HTTP"},
                               "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3}}


def _managed_fields(pod: Pod) -> list[dict[str, Any]]:
    """The controller's, the scheduler's and the kubelet's entries, as `kubectl get pod -o json` shows them."""
    def names(containers: list[dict[str, Any]]) -> dict[str, Any]:
        return {f'k:{{"name":"{c["name"]}"}}': {".": {}, "f:image": {}, "f:name": {}, "f:resources": {},
                                                "f:env": {}, "f:volumeMounts": {}}
                for c in containers}
    spec = pod["spec"]
    return [
        {"manager": "vc-controller-manager", "operation": "Update", "apiVersion": "v1", "time": T0,
         "fieldsType": "FieldsV1", "fieldsV1": {
             "f:metadata": {"f:annotations": {f"f:{k}": {} for k in pod["metadata"]["annotations"]},
                            "f:labels": {f"f:{k}": {} for k in pod["metadata"]["labels"]},
                            "f:ownerReferences": {}},
             "f:spec": {"f:containers": names(spec["containers"]), "f:initContainers": names(spec["initContainers"]),
                        "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:hostname": {}, "f:restartPolicy": {},
                        "f:schedulerName": {}, "f:securityContext": {}, "f:subdomain": {},
                        "f:terminationGracePeriodSeconds": {}, "f:volumes": {}}}},
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": T0, "fieldsType": "FieldsV1",
         "subresource": "status", "fieldsV1": {"f:status": {
             "f:conditions": {f'k:{{"type":"{t}"}}': {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {},
                                                     "f:status": {}, "f:type": {}}
                              for t in ("ContainersReady", "Initialized", "PodReadyToStartContainers", "Ready")},
             "f:containerStatuses": {}, "f:hostIP": {}, "f:hostIPs": {}, "f:initContainerStatuses": {},
             "f:phase": {}, "f:podIP": {}, "f:podIPs": {}, "f:startTime": {}}}},
    ]


def real_pod(pod: Pod, *, node: str) -> Pod:
    """The example pod as the cluster holds it once it is bound to ``node`` and not started: Pending, no IP."""
    pod = copy.deepcopy(pod)
    spec = pod["spec"]
    init = {**spec["initContainers"][0], **CONTAINER_DEFAULTS, "resources": AGENT_RESOURCES,
            "securityContext": AGENT_SECURITY, "name": "topology-init"}
    init["volumeMounts"] = [*init.get("volumeMounts", []), TOKEN_MOUNT]
    spec["initContainers"] = [init, _sidecar(init)]
    for container in spec["containers"]:
        container.update(CONTAINER_DEFAULTS)
        container["volumeMounts"] = [*container.get("volumeMounts", []), TOKEN_MOUNT]
    spec["volumes"] = [*spec.get("volumes", []), _token_volume()]
    spec.update(nodeName=node, schedulerName="volcano", serviceAccountName="default", serviceAccount="default",
                dnsPolicy="ClusterFirst", securityContext={}, terminationGracePeriodSeconds=30, priority=0,
                enableServiceLinks=True, preemptionPolicy="PreemptLowerPriority", tolerations=[
                    {"key": f"node.kubernetes.io/{t}", "operator": "Exists", "effect": "NoExecute",
                     "tolerationSeconds": 300} for t in ("not-ready", "unreachable")])
    pod["metadata"]["managedFields"] = _managed_fields(pod)
    pod["status"] = {"phase": "Pending", "qosClass": "Burstable", "conditions": [
        {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": T0}]}
    return pod


def _condition(kind: str, status: bool, reason: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {"type": kind, "status": "True" if status else "False", "lastProbeTime": None,
                             "lastTransitionTime": T0}
    if reason:
        found["reason"] = reason
    return found


def _state(container: dict[str, Any], state: str, *, ready: bool = False, started: bool | None = None
           ) -> dict[str, Any]:
    states = {"waiting": {"waiting": {"reason": "PodInitializing"}},
              "running": {"running": {"startedAt": T0}},
              "done": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": T0, "finishedAt": T0,
                                      "containerID": "containerd://" + "0" * 64}}}
    found: dict[str, Any] = {"name": container["name"], "state": states[state], "lastState": {}, "ready": ready,
                             "restartCount": 0, "image": container.get("image", ""),
                             "imageID": f"{container.get('image', '')}@sha256:{'1' * 64}"}
    if state != "waiting":
        found["containerID"] = "containerd://" + "2" * 64
    if started is not None:
        found["started"] = started
    return found


def _status(pod: Pod, ip: str, *, phase: str, initialized: bool, ready: bool) -> None:
    spec, status = pod["spec"], pod["status"]
    init, sidecar = spec["initContainers"]
    status.update(phase=phase, hostIP="127.0.0.1", hostIPs=[{"ip": "127.0.0.1"}], podIP=ip, podIPs=[{"ip": ip}],
                  startTime=T0, conditions=[
                      _condition("PodReadyToStartContainers", True),
                      _condition("Initialized", initialized, "" if initialized else "ContainersNotInitialized"),
                      _condition("Ready", ready, "" if ready else "ContainersNotReady"),
                      _condition("ContainersReady", ready, "" if ready else "ContainersNotReady"),
                      _condition("PodScheduled", True)])
    status["initContainerStatuses"] = [
        _state(init, "done" if initialized else "running"),
        _state(sidecar, "running" if initialized else "waiting", ready=initialized, started=initialized)]
    status["containerStatuses"] = [_state(c, "running" if initialized else "waiting", ready=ready,
                                          started=initialized) for c in spec["containers"]]


def kubelet_started(pod: Pod, ip: str) -> None:
    """The pod's sandbox is up: its IP, the agent's init container running, phase Pending."""
    _status(pod, ip, phase="Pending", initialized=False, ready=False)


def kubelet_initialized(pod: Pod) -> None:
    """The init container is done: the sidecar and the trainer run, phase Running, not ready yet."""
    _status(pod, pod["status"]["podIP"], phase="Running", initialized=True, ready=False)


def kubelet_ready(pod: Pod) -> None:
    """The readiness probes passed: ContainersReady and Ready."""
    _status(pod, pod["status"]["podIP"], phase="Running", initialized=True, ready=True)


NODE_IMAGES = 50  # the kubelet reports at most this many images (--node-status-max-images, default 50)


def real_node(name: str) -> dict[str, Any]:
    """A Node as the kubelet and the node controller keep it: labels, addresses, capacity, its conditions with
    heartbeats, its images (the bulk of it) and managedFields; about 12 KB of JSON."""
    resources = {"cpu": "96", "ephemeral-storage": "1919813472Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0",
                 "memory": "1056306116Ki", "nvidia.com/gpu": "8", "pods": "110"}
    conditions = [{"type": kind, "status": "False", "reason": reason, "message": message,
                   "lastHeartbeatTime": T0, "lastTransitionTime": T0} for kind, reason, message in (
        ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"))]
    conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                       "message": "kubelet is posting ready status", "lastHeartbeatTime": T0,
                       "lastTransitionTime": T0})
    images = [{"names": [f"registry.example.com/team/image-{k}@sha256:{k:064x}",
                         f"registry.example.com/team/image-{k}:v1.{k}.0"], "sizeBytes": 1_000_000 * (k + 1)}
              for k in range(NODE_IMAGES)]
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": f"00000000-0000-4000-8000-{abs(hash(name)) % 10**12:012d}",
                     "creationTimestamp": T0, "annotations": {
                         "node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach":
                         "true"},
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "a3-highgpu-8g",
                                "topology.kubernetes.io/region": "region-1", "topology.kubernetes.io/zone": "zone-a",
                                "nvidia.com/gpu.present": "true"},
                     "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": T0,
                                        "fieldsType": "FieldsV1", "subresource": "status",
                                        "fieldsV1": {"f:status": {"f:conditions": {}, "f:images": {}}}}]},
        "spec": {"podCIDR": "10.0.0.0/24", "podCIDRs": ["10.0.0.0/24"], "providerID": f"gce://project/zone-a/{name}"},
        "status": {"capacity": resources, "allocatable": resources, "conditions": conditions,
                   "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                 {"type": "Hostname", "address": name}],
                   "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                   "nodeInfo": {"machineID": "0" * 32, "systemUUID": "0" * 32, "bootID": "0" * 32,
                                "kernelVersion": "6.1.0", "osImage": "Container-Optimized OS",
                                "containerRuntimeVersion": "containerd://1.7.24", "kubeletVersion": "v1.32.0",
                                "kubeProxyVersion": "v1.32.0",
                                "operatingSystem": "linux", "architecture": "amd64"},
                   "images": images}}
