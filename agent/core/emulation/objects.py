"""What every emulated controller shares: deterministic uids and name suffixes, ownerReferences, and the Pod made
from a pod template as the API server returns it at creation (no node, no IP: placement is the caller's).

A real API server draws uids at random and the controllers' ``generateName`` suffixes too; here both come from a
hash of what names the object, so the same manifest always gives the same pods, and a caller can name a pod
before it exists.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agent.errors import InputError

Obj = dict[str, Any]
# The characters of apimachinery's rand.String (pkg/util/rand/rand.go: no vowels, no 0/1/3, no look-alikes), which
# SimpleNameGenerator appends to a generateName (names/generate.go: 5 of them).
SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
SUFFIX_LENGTH = 5


def uid_for(*parts: object) -> str:
    """A uid (the UUID layout) that the same parts always give."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def suffix_for(*parts: object) -> str:
    """The 5 characters a generateName gets, from what names the object instead of at random."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return "".join(SUFFIX_ALPHABET[b % len(SUFFIX_ALPHABET)] for b in digest[:SUFFIX_LENGTH])


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def namespace_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "default")


def uid_of(obj: Mapping[str, Any]) -> str:
    """The object's own uid when it has one (a job read from a cluster), else the deterministic one."""
    meta = obj.get("metadata") or {}
    given = meta.get("uid")
    if isinstance(given, str) and given:
        return given
    return uid_for(obj.get("apiVersion", ""), obj.get("kind", ""), namespace_of(obj), name_of(obj))


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """The controller reference a controller puts on what it creates (metav1.NewControllerRef)."""
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": name_of(owner), "uid": uid_of(owner),
            "controller": True, "blockOwnerDeletion": True}


def with_uid(obj: Mapping[str, Any]) -> Obj:
    """A copy of ``obj`` whose metadata has its namespace and uid (as the API server gives them)."""
    out = copy.deepcopy(dict(obj))
    meta = out.setdefault("metadata", {})
    meta.setdefault("namespace", namespace_of(obj))
    meta["uid"] = uid_of(obj)
    return out


def child(api_version: str, kind: str, name: str, *, owner: Mapping[str, Any], labels: Mapping[str, str],
          annotations: Mapping[str, str] | None = None, spec: Mapping[str, Any]) -> Obj:
    """An object a controller creates (a JobSet's Job, a TrainJob's JobSet, an LWS's StatefulSet)."""
    namespace = namespace_of(owner)
    meta: Obj = {"name": name, "namespace": namespace, "uid": uid_for(api_version, kind, namespace, name),
                 "labels": dict(labels), "annotations": dict(annotations or {}),
                 "ownerReferences": [owner_reference(owner)]}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": copy.deepcopy(dict(spec))}


def refuse(job: Mapping[str, Any], problem: str, fix: str) -> InputError:
    """The one line for a manifest the controller would refuse: which object, what is wrong, what to do."""
    return InputError(f"{job.get('kind', '?')} '{name_of(job) or '?'}': {problem}; {fix}")


def count(job: Mapping[str, Any], value: Any, field: str, *, default: int = 1) -> int:
    """A replica count as the API accepts it: absent is ``default``, else a whole number >= 0."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise refuse(job, f"{field} is {value!r}, not a whole number >= 0", f"set {field} to the number of pods")
    return value


def template_at(job: Mapping[str, Any], value: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not isinstance(value.get("spec"), Mapping) \
            or not isinstance(value["spec"].get("containers"), list) or not value["spec"]["containers"]:
        raise refuse(job, f"{field} is not a pod template with containers", f"give {field}.spec.containers")
    return value


def add_env(containers: Iterable[dict[str, Any]], entries: Sequence[Mapping[str, Any]], *,
            mode: str = "append") -> None:
    """Each container's env with ``entries``: appended after the template's (``append``); replacing an entry of
    the same name in place, else appended (``upsert``); or put first, the template's entries of those names
    dropped (``prepend``)."""
    for container in containers:
        env = [dict(e) for e in container.get("env") or [] if isinstance(e, Mapping)]
        if mode == "prepend":
            names = {e["name"] for e in entries}
            env = [dict(e) for e in entries] + [e for e in env if e.get("name") not in names]
        elif mode == "upsert":
            for entry in entries:
                at = next((i for i, e in enumerate(env) if e.get("name") == entry["name"]), None)
                if at is None:
                    env.append(dict(entry))
                else:
                    env[at] = dict(entry)
        else:
            env += [dict(e) for e in entries]
        container["env"] = env


def make_pod(name: str, template: Mapping[str, Any], *, owner: Mapping[str, Any], labels: Mapping[str, str],
             annotations: Mapping[str, str] | None = None, hostname: str | None = None,
             subdomain: str | None = None) -> Obj:
    """The Pod a controller creates from ``template``: the template's labels and annotations with the
    controller's over them, owned by ``owner``, in its namespace; Pending, on no node."""
    meta_t = template.get("metadata") or {}
    spec = copy.deepcopy(dict(template.get("spec") or {}))
    if hostname:
        spec["hostname"] = hostname
    if subdomain:
        spec["subdomain"] = subdomain
    namespace = namespace_of(owner)
    metadata: Obj = {
        "name": name, "namespace": namespace, "uid": uid_for("v1", "Pod", namespace, name),
        "labels": {**(meta_t.get("labels") or {}), **labels},
        "annotations": {**(meta_t.get("annotations") or {}), **(annotations or {})},
        "ownerReferences": [owner_reference(owner)],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": {"phase": "Pending"}}


def container_port(template: Mapping[str, Any], container: str | None, port_name: str, default: int) -> int:
    """The port named ``port_name`` of container ``container`` (any container when None), else ``default``: how
    training-operator finds a job's port (GetPortFromPyTorchJob and its siblings)."""
    for c in (template.get("spec") or {}).get("containers") or []:
        if container is not None and c.get("name") != container:
            continue
        for port in c.get("ports") or []:
            if port.get("name") == port_name and isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
    return default
