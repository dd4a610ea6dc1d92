"""Reading one pod object: its name, IP and host name, the slim copy a long-lived watcher keeps, and finding a
pod by name. Accessors only: who is a member and which rank it gets is the plan's to decide.

Whatever shape a forged object has, an accessor answers (a name of "" rather than an exception), because the
shell calls them on objects before ``check_pod`` has seen them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# The readers of either form of a pod (core/compact.py), for the modules that read pods through this one
from agent.core.compact import PodMeta as PodMeta
from agent.core.compact import containers_of, ip_of, name_of, node_of, phase_of
from agent.core.compact import life_of as life_of
from agent.core.compact import meta_of as meta_of
from agent.core.compact import version_of as version_of
from agent.core.model import RawContainer, RawPod
from agent.core.pods.validation import check_pod
from agent.errors import InputError


def object_name(obj: object) -> str:
    """Any API object's name, or "" (whatever shape a forged object has)."""
    return name_of(obj)


def pod_name(pod: RawPod) -> str:
    return object_name(pod)


def pod_ip(pod: RawPod) -> str | None:
    """The pod's IP as the kubelet reported it (unchecked: the planner checks it before it reaches a file)."""
    return ip_of(pod)


def node_name(pod: RawPod) -> str:
    """The Node the pod is bound to (``spec.nodeName``), or "" while it is not."""
    return node_of(pod)


def pod_containers(pod: RawPod) -> list[RawContainer]:
    """The pod's containers (``spec.containers``): the pods of one shape, held, share one list."""
    return containers_of(pod)


def pod_phase(pod: RawPod) -> str:
    """The pod's phase (``status.phase``: Pending, Running, ...), or "" while it says none."""
    return phase_of(pod)


def host_name(pod: RawPod) -> str | None:
    """``<spec.hostname>.<spec.subdomain>``, the name JobSet's coordinator label gives; None without both."""
    spec = pod.get("spec", {})
    hostname, subdomain = spec.get("hostname"), spec.get("subdomain")
    return f"{hostname}.{subdomain}" if hostname and subdomain else None


_SPEC_KEEP = ("hostname", "subdomain", "nodeName")
_CONTAINER_KEEP = ("name", "image", "command", "args", "env", "resources", "ports")
_META_KEEP = ("name", "namespace", "uid", "labels", "annotations", "deletionTimestamp", "ownerReferences",
              "resourceVersion")


def slim_pod(pod: RawPod) -> RawPod:
    """Only the fields the core reads: a long-lived watcher keeps 1/4 of the bytes (no managedFields, volumes,
    conditions, container statuses)."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    slim_spec: dict[str, object] = {k: spec[k] for k in _SPEC_KEEP if k in spec}  # type: ignore[literal-required]
    slim_spec["containers"] = [{k: c[k] for k in _CONTAINER_KEEP if k in c}  # type: ignore[literal-required]
                               for c in spec.get("containers", [])]
    slim: dict[str, Any] = {
        "metadata": {k: meta[k] for k in _META_KEEP if k in meta},  # type: ignore[literal-required]
        "spec": slim_spec,
        "status": {k: status[k] for k in ("phase", "podIP", "podIPs") if k in status},
    }
    return slim  # type: ignore[return-value]


def find_pod(pods: Sequence[RawPod], name: str) -> RawPod:
    """The pod named ``name`` (``--self``), checked; ``InputError`` saying where to look when it is absent."""
    if not pods:
        raise InputError(f"the pod list is empty, so pod '{name}' (--self / POD_NAME) is not in it; check the "
                         "namespace and label selector that listed it")
    for pod in pods:
        if pod_name(pod) == name:
            return check_pod(pod)  # type: ignore[return-value]
    raise InputError(f"pod '{name}' (--self / POD_NAME) is not in the pod list; check the name and namespace")
