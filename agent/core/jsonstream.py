"""Reading a JSON object whose one large array is handed over value by value as the text is read, never all
decoded at once: a 16384-member topology.json or published snapshot is ~3 MB of text and ~25 MB as dicts. The
grammar is JSON's as ``json.loads`` reads it (the same decoder, NaN and Infinity refused)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agent.core.pods.validation import not_json

RowSink = Callable[[Any], object]
DECODER = json.JSONDecoder(parse_constant=not_json)


def walk_object(text: str, value: Callable[[str, int], int]) -> None:
    """The top-level object's members in order: ``value(key, at)`` reads the value that starts at ``at`` and says
    where it ends; the grammar around them is JSON's, as ``json.loads`` reads it."""
    decode_at = DECODER.raw_decode
    at = skip(text, 0)
    if text[at:at + 1] != "{":
        raise ValueError("not an object")
    at = skip(text, at + 1)
    if text[at:at + 1] == "}":
        at += 1
    else:
        while True:
            key, at = decode_at(text, at)
            if not isinstance(key, str):
                raise ValueError("a key is not a string")
            at = skip(text, at)
            if text[at:at + 1] != ":":
                raise ValueError("':' expected")
            at = skip(text, value(key, skip(text, at + 1)))
            if text[at:at + 1] == "}":
                at += 1
                break
            if text[at:at + 1] != ",":
                raise ValueError("',' or '}' expected")
            at = skip(text, at + 1)
    if skip(text, at) != len(text):
        raise ValueError("extra data")


def decode_streamed(text: str, key: str, sink: RowSink) -> dict[str, Any]:
    """A JSON object's members but ``key``, whose array's values go to ``sink`` one at a time as the text is
    read, never all decoded at once (a 16384-member topology.json: ~25 MB of dicts for a key of ~3 MB). JSON's
    grammar as ``json.loads`` reads it, but for ``key`` given twice or not an array (refused)."""
    decode_at = DECODER.raw_decode
    found: dict[str, Any] = {}
    seen = False

    def value(name: str, at: int) -> int:
        nonlocal seen
        if name != key:
            found[name], end = decode_at(text, at)
            return end
        if seen or text[at:at + 1] != "[":
            raise ValueError(f"{key} given twice or not an array")
        seen = True
        return stream_array(text, skip(text, at + 1), sink)

    walk_object(text, value)
    return found


def skip(text: str, at: int) -> int:
    """Past JSON's whitespace (the leader writes none)."""
    while text[at:at + 1] in _SPACE:
        at += 1
    return at


_SPACE = (" ", "\t", "\n", "\r")


def stream_array(text: str, at: int, sink: RowSink) -> int:
    """Each value of the array whose first value is at ``at`` to ``sink``; where the array ends."""
    decode_at = DECODER.raw_decode
    if text[at:at + 1] == "]":
        return at + 1
    while True:
        value, at = decode_at(text, at)
        sink(value)
        at = skip(text, at)
        if text[at:at + 1] == "]":
            return at + 1
        if text[at:at + 1] != ",":
            raise ValueError("',' or ']' expected")
        at = skip(text, at + 1)
