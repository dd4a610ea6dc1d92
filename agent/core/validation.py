"""The edge of the core: every pod field the agent reads is free text someone else wrote, checked here.

Two layers. ``check_pod`` checks the shape of the few fields the core reads (a label map is a map of strings,
a container list is a list of objects, ...), so no malformed object gets further than one ``InputError``
naming the pod and the field. The ``*_value`` functions check a value against the grammar of the place it
goes before it reaches a file: a name is a DNS-1123 label or subdomain, an index a small whole number, an
address a DNS name or an IP, a role a label value. Nothing that passes can carry a line break, a space, a
quote, a ``#``, a ``*`` or a ``$`` into torch.env, the hostfile, ssh_config, known_hosts or
discover_hosts.sh, whatever the source: a pod, an annotation, or the published topology (decoded into pods
and checked the same way).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from agent.errors import InputError

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
MAX_INDEX_DIGITS = 9  # a controller index below 10^9; int() of thousands of digits is refused or slow


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def pod_label(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"pod '{name}'" if isinstance(name, str) and len(name) <= 253 and name.isprintable() else "a pod"


Field = str | tuple[object, ...]  # a path, joined only when a message needs it (the pods that pass pay nothing)


def _path(field: Field) -> str:
    if isinstance(field, str):
        return field
    return "".join(f"[{part}]" if isinstance(part, int) else (f".{part}" if i else str(part))
                   for i, part in enumerate(field))


def _fail(pod: dict[str, Any], field: Field, value: object, expected: str) -> InputError:
    return InputError(f"{pod_label(pod)}: {_path(field)} is {_shown(value)}, not {expected}; the pod cannot be "
                      "used (fix or delete it)")


def _mapping_of_strings(pod: dict[str, Any], obj: dict[str, Any], key: str, field: Field) -> None:
    value = obj.get(key)
    if value is None:
        return
    if type(value) is not dict or not all(type(k) is str and type(v) is str for k, v in value.items()):
        raise _fail(pod, field, value, "a map of strings")


def _dict(pod: dict[str, Any], obj: dict[str, Any], key: str, field: Field, *,
          required: bool = False) -> dict[str, Any]:
    # Absent is fine (the API omits empty fields); present and null is not what the API sends.
    if key not in obj and not required:
        return {}
    value = obj.get(key)
    if type(value) is not dict:
        raise _fail(pod, field, value, "an object")
    return value


def _list_of_dicts(pod: dict[str, Any], obj: dict[str, Any], key: str, field: Field) -> list[dict[str, Any]]:
    if key not in obj:
        return []
    value = obj.get(key)
    if type(value) is not list or not all(type(item) is dict for item in value):
        raise _fail(pod, field, value, "a list of objects")
    return value


def _string(pod: dict[str, Any], obj: dict[str, Any], key: str, field: Field) -> None:
    if key in obj and type(obj[key]) is not str:
        raise _fail(pod, field, obj[key], "a string")


def check_pod(pod: object, *, seen: set[int] | None = None) -> dict[str, Any]:
    """The pod if the fields the core reads have the shapes the API gives them; else one ``InputError``.

    On the hot path of the sidecar and of init at 16384 pods: no message or path is built unless a check fails.
    Init containers are not read by the core, so not checked. ``seen``: ids of container objects checked
    already, which the caller keeps alive (the published rows' pods share one container object per shape)."""
    if type(pod) is not dict:
        raise InputError(f"a pod is {_shown(pod)}, not an object; the pod list cannot be used")
    meta = _dict(pod, pod, "metadata", "metadata", required=True)
    name = meta.get("name")
    if type(name) is not str or not DNS_SUBDOMAIN.fullmatch(name):
        raise _fail(pod, "metadata.name", name, "a DNS-1123 subdomain (what Kubernetes allows for pod names)")
    if "namespace" in meta and (type(meta["namespace"]) is not str or not DNS_LABEL.fullmatch(meta["namespace"])):
        raise _fail(pod, "metadata.namespace", meta["namespace"], "a DNS-1123 label")
    for key in ("uid", "resourceVersion", "deletionTimestamp"):
        _string(pod, meta, key, ("metadata", key))
    _mapping_of_strings(pod, meta, "labels", "metadata.labels")
    _mapping_of_strings(pod, meta, "annotations", "metadata.annotations")
    for i, ref in enumerate(_list_of_dicts(pod, meta, "ownerReferences", "metadata.ownerReferences")):
        for key in ("apiVersion", "kind", "name", "uid"):
            _string(pod, ref, key, ("metadata", "ownerReferences", i, key))
    spec = _dict(pod, pod, "spec", "spec")
    for key in ("hostname", "subdomain"):
        if key in spec and (type(spec[key]) is not str or not DNS_LABEL.fullmatch(spec[key])):
            raise _fail(pod, ("spec", key), spec[key], "a DNS-1123 label")
    if spec.get("nodeName", "") != "" and (type(spec["nodeName"]) is not str
                                           or not DNS_SUBDOMAIN.fullmatch(spec["nodeName"])):
        raise _fail(pod, ("spec", "nodeName"), spec["nodeName"], "a DNS-1123 subdomain (a Node name)")
    for i, container in enumerate(_list_of_dicts(pod, spec, "containers", "spec.containers")):
        if seen is not None and id(container) in seen:
            continue
        _string(pod, container, "image", ("spec", "containers", i, "image"))
        cname = container.get("name")
        if "name" in container and (type(cname) is not str or not DNS_LABEL.fullmatch(cname)):
            raise _fail(pod, ("spec", "containers", i, "name"), cname, "a DNS-1123 label (a container name)")
        for key in ("command", "args"):
            value = container.get(key)
            if key in container and (type(value) is not list or not all(type(a) is str for a in value)):
                raise _fail(pod, ("spec", "containers", i, key), value, "a list of strings")
        env = _list_of_dicts(pod, container, "env", ("spec", "containers", i, "env"))
        if all(type(e.get("name")) is str and type(e.get("value", "")) is str and type(e.get("valueFrom", {})) is dict
               for e in env):
            env = []  # all good: the loop below finds the bad entry when there is one
        for j, entry in enumerate(env):
            if type(entry.get("name")) is not str:
                raise _fail(pod, ("spec", "containers", i, "env", j, "name"), entry.get("name"), "a string")
            if "value" in entry and type(entry["value"]) is not str:
                raise _fail(pod, ("spec", "containers", i, "env", j, "value"), entry["value"], "a string")
            if "valueFrom" in entry and type(entry["valueFrom"]) is not dict:
                raise _fail(pod, ("spec", "containers", i, "env", j, "valueFrom"), entry["valueFrom"], "an object")
        resources = _dict(pod, container, "resources", ("spec", "containers", i, "resources"))
        for key in ("limits", "requests"):
            quantities = _dict(pod, resources, key, ("spec", "containers", i, "resources", key))
            for resource, quantity in quantities.items():
                if type(quantity) not in (str, int):
                    raise _fail(pod, ("spec", "containers", i, "resources", key, resource), quantity, "a quantity")
        for j, port in enumerate(_list_of_dicts(pod, container, "ports", ("spec", "containers", i, "ports"))):
            _string(pod, port, "name", ("spec", "containers", i, "ports", j, "name"))
            number = port.get("containerPort")
            if number is not None and (type(number) is not int or not 1 <= number <= 65535):
                raise _fail(pod, ("spec", "containers", i, "ports", j, "containerPort"), number,
                            "a port from 1 to 65535")
        if seen is not None:
            seen.add(id(container))  # only once every check passed
    status = _dict(pod, pod, "status", "status")
    for key in ("phase", "podIP"):
        _string(pod, status, key, ("status", key))
    for i, entry in enumerate(_list_of_dicts(pod, status, "podIPs", "status.podIPs")):
        _string(pod, entry, "ip", ("status", "podIPs", i, "ip"))
    return pod


def index_value(pod: dict[str, Any], key: str, raw: str, *, fix: str) -> int:
    """A controller index: ASCII digits, at most nine of them."""
    text = raw.strip()
    if raw != text or not text.isascii() or not text.isdigit() or len(text) > MAX_INDEX_DIGITS:
        raise InputError(f"{pod_label(pod)}: label '{key}' is {_shown(raw)}, not a whole number below 10^9; {fix}")
    return int(text)


def role_value(pod: dict[str, Any], key: str, raw: str, *, fix: str) -> str:
    """A role (task, replica type, replicated job): a label value, so it is safe in every file."""
    if not LABEL_VALUE.fullmatch(raw):
        raise InputError(f"{pod_label(pod)}: label '{key}' is {_shown(raw)}, not a Kubernetes label value "
                         f"(letters, digits, '-', '_', '.'; at most 63); {fix}")
    return raw


def dns_value(pod: dict[str, Any], name: str, *, field: str) -> str:
    if not DNS_SUBDOMAIN.fullmatch(name):
        raise InputError(f"{pod_label(pod)}: {field} makes the address {_shown(name)}, not a DNS name; fix the "
                         "pod's hostname/subdomain or the job's name, or use --address ip")
    return name


_CANONICAL_IPV4 = re.compile(r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
                             r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])")


def ip_value(pod: dict[str, Any], raw: str) -> str | None:
    """The canonical text of an IP address (RFC 5952), or None when the field holds none. A dotted quad without
    leading zeros is its own canonical text (one regex, where ipaddress takes 6 us: init at 4096 pods parses
    each). An IPv4-mapped IPv6 address keeps its dotted tail (RFC 5952 section 5), as OpenSSH and Python 3.13
    write it; Python 3.11 writes ``::ffff:0:0``, which ``ssh -G`` reads back as ``::ffff:0.0.0.0``."""
    if _CANONICAL_IPV4.fullmatch(raw):
        return raw
    try:
        address = ipaddress.ip_address(raw.strip())
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        return f"::ffff:{mapped}" if mapped is not None else str(address)
    except ValueError:
        raise InputError(f"{pod_label(pod)}: status.podIP is {_shown(raw)}, not an IP address; the pod cannot be "
                         "used (its status was not written by a kubelet)") from None


def split_pods(items: list[Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The items of a LIST or watch event that have the shape of a pod, and one line for each that has not
    (the shells log those and leave the pods out: one broken object must not stop the agent)."""
    usable, refused = [], []
    for item in items:
        try:
            usable.append(check_pod(item))
        except InputError as err:
            refused.append(str(err))
    return usable, refused
