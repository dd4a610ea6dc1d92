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

from agent.core.compact import quick_check
from agent.errors import InputError

# The API server's grammars, transcribed from k8s.io/apimachinery (pkg/api/validate/content: dns.go, kube.go;
# commit eed236ceee2c19c2753a3d93ac0631dc20750454) and tested with the cases of its own test files: everything it
# accepts is accepted here, because a real cluster can produce it.
_DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = re.compile(_DNS1123_LABEL_FMT)  # IsDNS1123Label, with its 63 characters (is_dns1123_label)
DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL_FMT}(\.{_DNS1123_LABEL_FMT})*")  # with 253 (is_dns1123_subdomain)
_LABEL_KEY_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
# A DNS host name as written in a file for a resolver (RFC 1123): each dot-free part a label of at most 63.
DNS_NAME = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")  # a non-empty label value
MAX_INDEX_DIGITS = 9  # a controller index below 10^9; int() of thousands of digits is refused or slow


def is_dns1123_label(value: str) -> bool:
    """A namespace, a container name, ``spec.hostname`` and ``spec.subdomain`` (IsDNS1123Label)."""
    return len(value) <= 63 and DNS1123_LABEL.fullmatch(value) is not None


def is_dns1123_subdomain(value: str) -> bool:
    """An object name (pods, Nodes, ...): 253 characters in all, with no limit per dot-free part
    (IsDNS1123Subdomain): a JobSet pod's name is 64-69 characters when its hostname is 63."""
    return len(value) <= 253 and DNS1123_SUBDOMAIN.fullmatch(value) is not None


def is_label_key(value: str) -> bool:
    """A label key or qualified name: [DNS-1123 subdomain prefix '/'] name of at most 63 (IsLabelKey)."""
    prefix, slash, name = value.rpartition("/")
    if slash and (not prefix or not is_dns1123_subdomain(prefix)):
        return False
    return "/" not in prefix and len(name) <= 63 and _LABEL_KEY_NAME.fullmatch(name) is not None


def is_label_value(value: str) -> bool:
    """A label value: empty, or at most 63 letters, digits, '-', '_', '.' with an alphanumeric at each end."""
    return value == "" or LABEL_VALUE.fullmatch(value) is not None


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
    quick = quick_check(pod, seen, label=is_dns1123_label, subdomain=is_dns1123_subdomain)
    if quick is not None:  # a compact pod: its slots checked at once
        if not quick:
            check_pod(dict(pod), seen=seen)  # type: ignore[call-overload]  # its sections as the dicts readers get
        return pod  # type: ignore[return-value]
    if type(pod) is not dict:
        raise InputError(f"a pod is {_shown(pod)}, not an object; the pod list cannot be used")
    _check_metadata(pod, _dict(pod, pod, "metadata", "metadata", required=True))
    spec = _dict(pod, pod, "spec", "spec")
    for key in ("hostname", "subdomain"):
        if key in spec and (type(spec[key]) is not str or not is_dns1123_label(spec[key])):
            raise _fail(pod, ("spec", key), spec[key], "a DNS-1123 label")
    if spec.get("nodeName", "") != "" and (type(spec["nodeName"]) is not str
                                           or not is_dns1123_subdomain(spec["nodeName"])):
        raise _fail(pod, ("spec", "nodeName"), spec["nodeName"], "a DNS-1123 subdomain (a Node name)")
    for i, container in enumerate(_list_of_dicts(pod, spec, "containers", "spec.containers")):
        if seen is not None and id(container) in seen:
            continue
        _check_container(pod, container, i)
        if seen is not None:
            seen.add(id(container))  # only once every check passed
    status = _dict(pod, pod, "status", "status")
    for key in ("phase", "podIP"):
        _string(pod, status, key, ("status", key))
    for i, entry in enumerate(_list_of_dicts(pod, status, "podIPs", "status.podIPs")):
        _string(pod, entry, "ip", ("status", "podIPs", i, "ip"))
    return pod


def _check_metadata(pod: dict[str, Any], meta: dict[str, Any]) -> None:
    name = meta.get("name")
    if type(name) is not str or not is_dns1123_subdomain(name):
        raise _fail(pod, "metadata.name", name, "a DNS-1123 subdomain (what Kubernetes allows for pod names)")
    if "namespace" in meta and (type(meta["namespace"]) is not str or not is_dns1123_label(meta["namespace"])):
        raise _fail(pod, "metadata.namespace", meta["namespace"], "a DNS-1123 label")
    for key in ("uid", "resourceVersion", "deletionTimestamp"):
        _string(pod, meta, key, ("metadata", key))
    _mapping_of_strings(pod, meta, "labels", "metadata.labels")
    _mapping_of_strings(pod, meta, "annotations", "metadata.annotations")
    for i, ref in enumerate(_list_of_dicts(pod, meta, "ownerReferences", "metadata.ownerReferences")):
        for key in ("apiVersion", "kind", "name", "uid"):
            _string(pod, ref, key, ("metadata", "ownerReferences", i, key))


def _check_container(pod: dict[str, Any], container: dict[str, Any], i: int) -> None:
    """Container ``i`` of ``spec.containers``, field by field."""
    _string(pod, container, "image", ("spec", "containers", i, "image"))
    cname = container.get("name")
    if "name" in container and (type(cname) is not str or not is_dns1123_label(cname)):
        raise _fail(pod, ("spec", "containers", i, "name"), cname, "a DNS-1123 label (a container name)")
    for key in ("command", "args"):
        value = container.get(key)
        if key in container and (type(value) is not list or not all(type(a) is str for a in value)):
            raise _fail(pod, ("spec", "containers", i, key), value, "a list of strings")
    env = _list_of_dicts(pod, container, "env", ("spec", "containers", i, "env"))
    if not all(type(e.get("name")) is str and type(e.get("value", "")) is str and type(e.get("valueFrom", {})) is dict
               for e in env):  # all good is the common case: only then is each entry looked at to say which
        for j, entry in enumerate(env):
            if type(entry.get("name")) is not str:
                raise _fail(pod, ("spec", "containers", i, "env", j, "name"), entry.get("name"), "a string")
            if "value" in entry and type(entry["value"]) is not str:
                raise _fail(pod, ("spec", "containers", i, "env", j, "value"), entry["value"], "a string")
            if "valueFrom" in entry and type(entry["valueFrom"]) is not dict:
                raise _fail(pod, ("spec", "containers", i, "env", j, "valueFrom"), entry["valueFrom"], "an object")
    resources = _dict(pod, container, "resources", ("spec", "containers", i, "resources"))
    for key in ("limits", "requests"):
        for resource, quantity in _dict(pod, resources, key, ("spec", "containers", i, "resources", key)).items():
            if type(quantity) not in (str, int):
                raise _fail(pod, ("spec", "containers", i, "resources", key, resource), quantity, "a quantity")
    for j, port in enumerate(_list_of_dicts(pod, container, "ports", ("spec", "containers", i, "ports"))):
        _string(pod, port, "name", ("spec", "containers", i, "ports", j, "name"))
        number = port.get("containerPort")
        if number is not None and (type(number) is not int or not 1 <= number <= 65535):
            raise _fail(pod, ("spec", "containers", i, "ports", j, "containerPort"), number, "a port from 1 to 65535")


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
    """A DNS name peers resolve: each dot-free part at most 63 (RFC 1123), which names the API server builds from
    hostname and subdomain (both labels) always are."""
    if not DNS_NAME.fullmatch(name):
        raise InputError(f"{pod_label(pod)}: {field} makes the address {_shown(name)}, not a DNS name; fix the "
                         "pod's hostname/subdomain or the job's name, or use --address ip")
    return name


_CANONICAL_IPV4 = re.compile(r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
                             r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])")
_BIG = 0xFFFFFF
_HEX = {c: int(c, 16) for c in "0123456789abcdefABCDEF"}


def _decimal(text: str, at: int) -> tuple[int, int] | None:
    """Go's dtoi as Kubernetes' forked parser has it: decimal digits from ``at``, leading zeros allowed."""
    n, i = 0, at
    while i < len(text) and "0" <= text[i] <= "9":
        n = n * 10 + ord(text[i]) - 48
        if n >= _BIG:
            return None
        i += 1
    return (n, i) if i > at else None


def _hexadecimal(text: str, at: int) -> tuple[int, int] | None:
    n, i = 0, at
    while i < len(text) and text[i] in _HEX:
        n = n * 16 + _HEX[text[i]]
        if n >= _BIG:
            return None
        i += 1
    return (n, i) if i > at else None


def _ipv4_bytes(text: str, at: int = 0) -> bytes | None:
    out = bytearray()
    for part in range(4):
        if part:
            if at >= len(text) or text[at] != ".":
                return None
            at += 1
        found = _decimal(text, at)
        if found is None or found[0] > 0xFF:
            return None
        out.append(found[0])
        at = found[1]
    return bytes(out) if at == len(text) else None


def _ipv6_bytes(text: str) -> bytes | None:
    """Go 1.16's parseIPv6, as Kubernetes keeps it: no zone, no brackets, a dotted IPv4 tail allowed."""
    ip = bytearray(16)
    ellipsis, at, i = -1, 0, 0
    if text.startswith("::"):
        ellipsis, at = 0, 2
        if at == len(text):
            return bytes(ip)
    while i < 16:
        found = _hexadecimal(text, at)
        if found is None or found[0] > 0xFFFF:
            return None
        n, end = found
        if end < len(text) and text[end] == ".":
            if (ellipsis < 0 and i != 12) or i + 4 > 16:
                return None
            tail = _ipv4_bytes(text, at)
            if tail is None:
                return None
            ip[i:i + 4] = tail
            at, i = len(text), i + 4
            break
        ip[i], ip[i + 1] = n >> 8, n & 0xFF
        i, at = i + 2, end
        if at == len(text):
            break
        if text[at] != ":" or at + 1 == len(text):
            return None
        at += 1
        if text[at] == ":":
            if ellipsis >= 0:
                return None
            ellipsis, at = i, at + 1
            if at == len(text):
                break
    if at != len(text):
        return None
    if i < 16:
        if ellipsis < 0:
            return None
        shift = 16 - i
        ip[ellipsis + shift:16] = ip[ellipsis:i]
        ip[ellipsis:ellipsis + shift] = bytes(shift)
    elif ellipsis >= 0:
        return None
    return bytes(ip)


def parse_ip(text: str) -> bytes | None:
    """The address ``status.podIPs`` can hold, as Kubernetes parses it (ParseIPSloppy: k8s.io/utils/net, a fork
    of Go 1.16's net.ParseIP kept for compatibility, commit cf1189d6abe3a7522bbd54a1bc1068a0a56011c8): 4 bytes for
    IPv4 (leading zeros read as decimal), 16 for IPv6; None for anything else, zone ids included."""
    for c in text:
        if c == ".":
            return _ipv4_bytes(text)
        if c == ":":
            return _ipv6_bytes(text)
    return None


def canonical_ip(address: bytes) -> str:
    """RFC 5952 text. An IPv4-mapped IPv6 address keeps its dotted tail (section 5), as OpenSSH and Python 3.13
    write it; Python 3.11 writes ``::ffff:0:0``, which ``ssh -G`` reads back as ``::ffff:0.0.0.0``."""
    if len(address) == 4:
        return ".".join(map(str, address))
    if address[:12] == b"\0" * 10 + b"\xff\xff":
        return "::ffff:" + ".".join(map(str, address[12:]))
    return str(ipaddress.IPv6Address(address))


def ip_value(pod: dict[str, Any], raw: str) -> str | None:
    """The canonical text of a pod IP, or ``InputError`` for a value the API server would not have stored. A
    dotted quad without leading zeros is its own canonical text (one regex, where parsing takes microseconds:
    init at 4096 pods reads each)."""
    if _CANONICAL_IPV4.fullmatch(raw):
        return raw
    address = parse_ip(raw)
    if address is None:
        raise InputError(f"{pod_label(pod)}: status.podIP is {_shown(raw)}, not an IP address; the pod cannot be "
                         "used (its status was not written by a kubelet)")
    return canonical_ip(address)


def json_values(raw: bytes | bytearray) -> int:
    """At least the number of values in a JSON text, counted at C speed before any is made (every value but a
    document's first follows a ',', a ':', a '{' or a '['): a text of a million `{}` is refused before a million
    dicts are made. Characters inside strings count too: an upper bound."""
    return raw.count(b",") + raw.count(b":") + raw.count(b"{") + raw.count(b"[")


def not_json(name: str) -> float:
    """``json.loads(..., parse_constant=not_json)``: NaN, Infinity and -Infinity are Python's, not JSON."""
    raise ValueError(f"{name} is not JSON")


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
