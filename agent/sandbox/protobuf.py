"""Kubernetes protobuf bodies, read into the JSON shape, for the objects kubectl sends that way.

kubectl 1.32+ sends protobuf for its typed ``create`` commands (``kubectl create namespace``, ``configmap``,
``secret``, ``serviceaccount``): client-go's generated clients prefer it (rest/request.go
``UseProtobufAsDefault``) and fall back to JSON only for CBOR, not for protobuf. The envelope is the 4 bytes
``k8s\\0`` and a ``runtime.Unknown`` (k8s.io/apimachinery pkg/runtime/serializer/protobuf/protobuf.go,
pkg/runtime/generated.proto); the messages and field numbers below are read from the generated.proto files of
k8s.io/apimachinery (pkg/apis/meta/v1) and k8s.io/api (core/v1). Other kinds get 415, and the caller says to
send JSON (``kubectl apply -f``).
"""

from __future__ import annotations

import base64
from typing import Any

MAGIC = b"k8s\x00"


class Unsupported(Exception):
    """A body this reader cannot turn into JSON (another kind, or not protobuf at all)."""


# message -> field number -> (JSON name, kind): "string", "bool", "int", "bytes" (base64 in JSON, as the API
# writes []byte), "map" (map<string,string>), "map-bytes", "<Message>" (nested), "*<kind>" (repeated).
SCHEMAS: dict[str, dict[int, tuple[str, str]]] = {
    "Unknown": {1: ("typeMeta", "TypeMeta"), 2: ("raw", "raw"), 3: ("contentEncoding", "string"),
                4: ("contentType", "string")},
    "TypeMeta": {1: ("apiVersion", "string"), 2: ("kind", "string")},
    "ObjectMeta": {1: ("name", "string"), 2: ("generateName", "string"), 3: ("namespace", "string"),
                   5: ("uid", "string"), 6: ("resourceVersion", "string"), 7: ("generation", "int"),
                   11: ("labels", "map"), 12: ("annotations", "map"), 13: ("ownerReferences", "*OwnerReference"),
                   14: ("finalizers", "*string")},
    "OwnerReference": {1: ("kind", "string"), 3: ("name", "string"), 4: ("uid", "string"),
                       5: ("apiVersion", "string"), 6: ("controller", "bool"), 7: ("blockOwnerDeletion", "bool")},
    "Namespace": {1: ("metadata", "ObjectMeta"), 2: ("spec", "NamespaceSpec")},
    "NamespaceSpec": {1: ("finalizers", "*string")},
    "ConfigMap": {1: ("metadata", "ObjectMeta"), 2: ("data", "map"), 3: ("binaryData", "map-bytes"),
                  4: ("immutable", "bool")},
    "Secret": {1: ("metadata", "ObjectMeta"), 2: ("data", "map-bytes"), 3: ("type", "string"),
               4: ("stringData", "map"), 5: ("immutable", "bool")},
    "ServiceAccount": {1: ("metadata", "ObjectMeta"), 2: ("secrets", "*ObjectReference"),
                       3: ("imagePullSecrets", "*LocalObjectReference"),
                       4: ("automountServiceAccountToken", "bool")},
    "ObjectReference": {1: ("kind", "string"), 2: ("namespace", "string"), 3: ("name", "string"),
                        4: ("uid", "string"), 5: ("apiVersion", "string")},
    "LocalObjectReference": {1: ("name", "string")},
}
KINDS = ("Namespace", "ConfigMap", "Secret", "ServiceAccount")  # the top-level kinds read


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise Unsupported("truncated varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value): a varint's int, or a length-delimited field's bytes."""
    out, at = [], 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 2:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise Unsupported("truncated field")
            value, at = data[at:at + size], at + size
        elif wire == 1:
            value, at = data[at:at + 8], at + 8
        elif wire == 5:
            value, at = data[at:at + 4], at + 4
        else:
            raise Unsupported(f"wire type {wire}")
        out.append((number, wire, value))
    return out


def _value(kind: str, raw: Any) -> Any:
    if kind == "string":
        return bytes(raw).decode()
    if kind == "bool":
        return bool(raw)
    if kind == "int":
        return raw
    if kind in ("bytes", "raw"):
        return bytes(raw)
    return decode_message(kind, raw)


def decode_message(name: str, data: bytes) -> dict[str, Any]:
    schema = SCHEMAS[name]
    out: dict[str, Any] = {}
    for number, _, raw in _fields(data):
        if number not in schema:
            continue  # a field the sandbox does not keep (times, status, managed fields)
        key, kind = schema[number]
        if kind in ("map", "map-bytes"):
            entry = {n: v for n, _, v in _fields(raw)}
            value = bytes(entry.get(2, b""))
            out.setdefault(key, {})[bytes(entry.get(1, b"")).decode()] = \
                base64.b64encode(value).decode() if kind == "map-bytes" else value.decode()
        elif kind.startswith("*"):
            out.setdefault(key, []).append(_value(kind[1:], raw))
        else:
            out[key] = _value(kind, raw)
    return out


def decode(body: bytes) -> dict[str, Any]:
    """The JSON object of a protobuf request body, or ``Unsupported``."""
    if not body.startswith(MAGIC):
        raise Unsupported("no k8s protobuf envelope")
    try:
        unknown = decode_message("Unknown", body[len(MAGIC):])
        type_meta = unknown.get("typeMeta", {})
        kind = type_meta.get("kind", "")
        if kind not in KINDS:
            raise Unsupported(f"kind {kind or '?'}")
        obj = decode_message(kind, unknown.get("raw", b""))
    except (UnicodeDecodeError, KeyError) as err:
        raise Unsupported(type(err).__name__) from None
    return {"apiVersion": type_meta.get("apiVersion", "v1"), "kind": kind, **obj}
