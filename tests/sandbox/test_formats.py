"""The sandbox's wire formats: Kubernetes protobuf bodies (kubectl's typed create commands) and table ages."""

from __future__ import annotations

import pytest

from agent.sandbox import protobuf
from agent.sandbox.tables import human_duration


def _field(number: int, payload: bytes | int) -> bytes:
    if isinstance(payload, int):
        return bytes([number << 3]) + _varint(payload)
    return bytes([number << 3 | 2]) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = _field(1, api_version.encode()) + _field(2, kind.encode())
    return protobuf.MAGIC + _field(1, type_meta) + _field(2, raw) + _field(4, b"application/vnd.kubernetes.protobuf")


def test_a_secret_in_protobuf_reads_as_its_json():
    meta = _field(1, b"creds") + _field(3, b"team-a") + _field(11, _field(1, b"app") + _field(2, b"x"))
    secret = (_field(1, meta) + _field(2, _field(1, b"token") + _field(2, b"\x00\xff"))
              + _field(3, b"Opaque") + _field(4, _field(1, b"user") + _field(2, b"me")) + _field(5, 1))
    assert protobuf.decode(_envelope("v1", "Secret", secret)) == {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds", "namespace": "team-a",
                                                           "labels": {"app": "x"}},
        "data": {"token": "AP8="}, "type": "Opaque", "stringData": {"user": "me"}, "immutable": True}


@pytest.mark.parametrize("body", [b"{}", protobuf.MAGIC + b"\xff", _envelope("apps/v1", "Deployment", b"")])
def test_other_bodies_are_unsupported_not_a_crash(body):
    with pytest.raises(protobuf.Unsupported):
        protobuf.decode(body)


# TestHumanDuration and TestHumanDurationBoundaries, k8s.io/apimachinery pkg/util/duration/duration_test.go
# (commit eed236ceee2c19c2753a3d93ac0631dc20750454), in seconds.
H, D, Y = 3600, 86400, 365 * 86400
AGES = [(1, "1s"), (70, "70s"), (190, "3m10s"), (70 * 60, "70m"), (47 * H, "47h"), (49 * H, "2d1h"),
        ((8 * 24 + 2) * H, "8d"), (367 * D, "367d"), (2 * Y + 25 * H, "2y1d"), (8 * Y + 2 * H, "8y"),
        (-2, "<invalid>"), (-1.999999999, "0s"), (0, "0s"), (0.999, "0s"), (119.999, "119s"), (120, "2m"),
        (121, "2m1s"), (599.999, "9m59s"), (600, "10m"), (601, "10m"), (3 * H - 0.001, "179m"), (3 * H, "3h"),
        (3 * H + 60, "3h1m"), (8 * H - 0.001, "7h59m"), (8 * H, "8h"), (8 * H + 59 * 60, "8h"),
        (2 * D - 0.001, "47h"), (2 * D, "2d"), (2 * D + H, "2d1h"), (8 * D - 0.001, "7d23h"), (8 * D, "8d"),
        (8 * D + 23 * H, "8d"), (2 * Y - 0.001, "729d"), (2 * Y, "2y"), (2 * Y + 23 * H, "2y"),
        (2 * Y + D, "2y1d"), (3 * Y, "3y"), (5 * Y, "5y")]


@pytest.mark.parametrize(("seconds", "shown"), AGES)
def test_ages_read_as_kubectl_shows_them(seconds, shown):
    assert human_duration(seconds) == shown
