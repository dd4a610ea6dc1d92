"""Label and field selectors as the API server parses them (the subset kubectl and the agent send).

Label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``, comma-joined.
Field selectors: ``path=v``, ``path==v``, ``path!=v`` on dotted paths (``metadata.name``, ``status.phase``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

Matcher = Callable[[dict[str, Any]], bool]

_SET = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


class SelectorError(ValueError):
    """The selector does not parse; the server answers 400 with this message."""


def _split(selector: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _has_value_in(key: str, values: set[str], labels: dict[str, str]) -> bool:
    return labels.get(key) in values


def _has_value_not_in(key: str, values: set[str], labels: dict[str, str]) -> bool:
    return labels.get(key) not in values


def _equals(key: str, value: str, labels: dict[str, str]) -> bool:
    return labels.get(key) == value


def _differs(key: str, value: str, labels: dict[str, str]) -> bool:
    return labels.get(key) != value


def _exists(key: str, labels: dict[str, str]) -> bool:
    return key in labels


def _absent(key: str, labels: dict[str, str]) -> bool:
    return key not in labels


def parse_label_selector(selector: str | None) -> Matcher:
    tests: list[Callable[[dict[str, str]], bool]] = []
    for part in _split(selector or ""):
        if match := _SET.match(part):
            key, op, values = match.group(1), match.group(2), {v.strip() for v in match.group(3).split(",")}
            tests.append(functools.partial(_has_value_in if op == "in" else _has_value_not_in, key, values))
        elif "!=" in part:
            key, value = (s.strip() for s in part.split("!=", 1))
            tests.append(functools.partial(_differs, key, value))
        elif "=" in part:
            key, value = (s.strip() for s in part.replace("==", "=").split("=", 1))
            if not key:
                raise SelectorError(f"invalid label selector {selector!r}")
            tests.append(functools.partial(_equals, key, value))
        elif part.startswith("!"):
            tests.append(functools.partial(_absent, part[1:].strip()))
        elif re.fullmatch(r"[A-Za-z0-9_./-]+", part):
            tests.append(functools.partial(_exists, part))
        else:
            raise SelectorError(f"invalid label selector {selector!r}")

    def matches(obj: dict[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(test(labels) for test in tests)

    return matches


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for step in path.split("."):
        value = value.get(step) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _field_equals(path: str, value: str, want: bool, obj: dict[str, Any]) -> bool:
    return (_field(obj, path) == value) == want


def parse_field_selector(selector: str | None) -> Matcher:
    tests: list[Matcher] = []
    for part in _split(selector or ""):
        if "!=" in part:
            path, value = (s.strip() for s in part.split("!=", 1))
            tests.append(functools.partial(_field_equals, path, value, False))
        elif "=" in part:
            path, value = (s.strip() for s in part.replace("==", "=").split("=", 1))
            tests.append(functools.partial(_field_equals, path, value, True))
        else:
            raise SelectorError(f"invalid field selector {selector!r}")
    return lambda obj: all(test(obj) for test in tests)
