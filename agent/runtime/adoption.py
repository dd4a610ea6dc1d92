"""`topology-agent inject`: manifests in, the same manifests with the agent added out (core/injection.py is the
transform; the admission webhook applies it to Pods).

YAML goes through ruamel.yaml's round-trip mode, so the user's comments, key order, quoting and anchors stay;
JSON in gives JSON out. A document of a kind the agent does not know passes through unchanged.
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Callable, Mapping
from typing import Any

from agent.core.injection import INIT, SIDECAR, Settings, inject_document
from agent.errors import InputError

CheckArgs = Callable[[list[str], str], None]  # the CLI's parser: refuses a flag or value init/sidecar refuse


def check_injected(doc: Mapping[str, Any], check: CheckArgs) -> None:
    """Every command line the injection wrote must be one the agent accepts, before a pod ever runs it."""
    from agent.core.injection import templates

    for template in templates(doc):
        spec = template.template.get("spec") or {}
        for container in spec.get("initContainers") or []:
            if isinstance(container, Mapping) and container.get("name") in (INIT, SIDECAR):
                check([str(a) for a in container.get("args") or []], f"{template.where} {container['name']}")


def inject_text(text: str, defaults: Settings, *, version: str, check: CheckArgs) -> tuple[str, list[str]]:
    """The manifests in ``text`` with the agent added, and the templates changed ("Kind name part")."""
    if text.lstrip().startswith(("{", "[")):
        try:
            data = json.loads(text)
        except ValueError as err:
            raise InputError(f"the input starts like JSON but is not JSON: {err}") from None
        docs = data if isinstance(data, list) else [data]
        changed = _inject_all(docs, defaults, version, check)
        return json.dumps(data, indent=2) + "\n", changed
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # never fold a user's long line
    yaml.indent(**_indentation(text))
    try:
        docs = list(yaml.load_all(text))
    except YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or err
        line = f"line {mark.line + 1}" if mark else "an unknown line"
        raise InputError(f"the input is not YAML: {problem} at {line}") from None
    changed = _inject_all(docs, defaults, version, check)
    out = io.StringIO()
    yaml.dump_all(docs, out)
    return out.getvalue(), changed


def _indentation(text: str) -> dict[str, int]:
    """The user's own indentation (ruamel writes one style per stream): a nested mapping's step, and a block
    sequence's dash offset and step, e.g. 2 / 2+2 in JobSet's examples, 2 / 0+2 in kubectl's."""
    from ruamel.yaml.util import load_yaml_guess_indent

    mapping = None
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for line, following in itertools.pairwise(lines):
        if line.rstrip().endswith(":") and not following.lstrip().startswith("-"):
            step = (len(following) - len(following.lstrip())) - (len(line) - len(line.lstrip()))
            if 2 <= step <= 8:
                mapping = step
                break
    try:
        _, sequence, offset = load_yaml_guess_indent(text)
    except Exception:  # a guess only: the real parse below says what is wrong
        sequence, offset = None, None
    mapping = mapping or 2
    offset = offset if isinstance(offset, int) and 0 <= offset <= 8 else 0
    sequence = sequence if isinstance(sequence, int) and offset + 2 <= sequence <= offset + 8 else offset + 2
    return {"mapping": mapping, "sequence": sequence, "offset": offset}


def _inject_all(docs: list[Any], defaults: Settings, version: str, check: CheckArgs) -> list[str]:
    changed: list[str] = []
    for doc in docs:
        if isinstance(doc, dict):
            changed += inject_document(doc, defaults, version=version)
            check_injected(doc, check)
    return changed
