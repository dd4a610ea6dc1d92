"""Which plain YAML scalars a YAML 1.1 reader takes for something other than a string.

`inject` writes YAML with ruamel.yaml, which follows YAML 1.2 and quotes only what 1.2 would misread. The readers of
its output follow YAML 1.1's implicit types: kubectl decodes manifests with go-yaml v2 (sigs.k8s.io/yaml's fork),
where ``on``, ``y``, ``0o17`` and ``1_000`` are a bool and ints; PyYAML (kubernetes-validate, Ansible, most Python
tools) reads ``1:2`` as the base-60 int 62 and ``2001-01-01`` as a date. A string the agent writes is quoted when
either reader would misread it plain. The two readers' rules are their own: PyYAML's is its resolver, asked
directly; go-yaml v2's is the table and patterns below.
"""

from __future__ import annotations

import functools
import re
from typing import Any

# The plain scalars go-yaml v2 looks up by their whole text, by the type it gives them (sigs.k8s.io/yaml,
# goyaml.v2/resolve.go: resolveMapList, commit 742f5e6f06b9847d2d7e4efa2fe6587f64897ad0).
GO_YAML_V2_WORDS: dict[str, tuple[str, ...]] = {
    "bool": ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON",
             "n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"),
    "null": ("", "~", "null", "Null", "NULL"),
    "float": (".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF"),
    "merge": ("<<",),
}
# The same file's resolve(), for a scalar that starts with a sign, a digit or a dot: underscores dropped, an int
# as Go's strconv.ParseInt / ParseUint / big.Int read base 0 (0x, 0o, 0b prefixes in either case; a leading 0 is
# octal, and a decimal that fails as octal is then a float), a float as its yamlStyleFloat pattern; and, before
# either, a timestamp in one of its allowedTimestampFormats (YYYY-M-D, alone or with a time), whose shape is
# matched here. A timestamp decoded into an untyped value (kubectl's) is given back as its text, and one decoded
# into a typed field is not: quoting it costs nothing either way.
GO_YAML_V2_FIRST = frozenset("+-.0123456789")
GO_YAML_V2_INT = re.compile(r"[-+]?(?:0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|[0-9]+)")
GO_YAML_V2_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
GO_YAML_V2_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:[Tt ].*)?", re.DOTALL)
_WORDS = frozenset(word for words in GO_YAML_V2_WORDS.values() for word in words)
_STR = "tag:yaml.org,2002:str"


def is_misread_plain(text: str) -> bool:
    """Whether ``text``, written as a plain scalar, is read as something other than this string by PyYAML or by
    go-yaml v2 (kubectl)."""
    return is_misread_by_go_yaml_v2(text) or is_misread_by_pyyaml(text)


def is_misread_by_go_yaml_v2(text: str) -> bool:
    """Whether go-yaml v2 resolves ``text``, written plain, to another type than a string (a timestamp too)."""
    if text in _WORDS:
        return True
    if not text or text[0] not in GO_YAML_V2_FIRST:
        return False
    plain = text.replace("_", "")
    return bool(GO_YAML_V2_TIMESTAMP.fullmatch(text) or GO_YAML_V2_INT.fullmatch(plain)
                or GO_YAML_V2_FLOAT.fullmatch(plain))


def is_misread_by_pyyaml(text: str) -> bool:
    """Whether PyYAML's loaders resolve ``text``, written plain, to another type than a string."""
    import yaml

    return bool(_pyyaml_resolver().resolve(yaml.ScalarNode, text, (True, False)) != _STR)


@functools.cache
def _pyyaml_resolver() -> Any:
    """PyYAML's resolver: YAML 1.1's implicit types (bool, int and float with base 60, null, timestamp, merge,
    value), as PyYAML's loaders apply them to a plain scalar."""
    from yaml.resolver import Resolver

    return Resolver()
