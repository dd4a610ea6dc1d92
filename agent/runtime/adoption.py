"""`topology-agent inject`: manifests in, the same manifests with the agent added out (core/injection.py is the
transform; the admission webhook applies it to Pods).

YAML goes through ruamel.yaml's round-trip mode, so the user's comments, key order, quoting and anchors stay;
JSON in gives JSON out. A document of a kind the agent does not know passes through unchanged.

Input is bounded before anything walks it: YAML aliases as kubectl's decoder bounds them (go-yaml's "excessive
aliasing" rule, CVE-2019-11253), counted as the document is composed so a bomb is refused without being
expanded; nesting to MAX_DEPTH collections in YAML and JSON alike.
"""

from __future__ import annotations

import functools
import io
import itertools
import json
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agent.core.injection import INIT, SIDECAR, Settings, inject_document
from agent.errors import InputError

if TYPE_CHECKING:
    from ruamel.yaml.composer import Composer

CheckArgs = Callable[[list[str], str], None]  # the CLI's parser: refuses a flag or value init/sidecar refuse

# Collections nested deeper than this are refused. The deepest objects Kubernetes tools write are CRDs whose
# schemas embed a PodTemplateSpec (JobSet's CRD: 38 levels; a TrainingRuntime's, which embeds a JobSet, a few
# more); 100 is well past them, and well inside what ruamel's recursive composer, representer and serializer
# (about 4 frames a level) and json's encoder reach under Python's default recursion limit of 1000.
MAX_DEPTH = 100
# go-yaml's aliasing bound (gopkg.in/yaml.v2 and v3 decode.go, the fix for CVE-2019-11253), which kubectl applies to
# every document: past 100 alias-driven nodes and 1000 decoded nodes, at most 99% of the decoded nodes may come
# from alias expansion up to 400,000 decoded nodes, a share falling linearly to 10% at 4,000,000.
ALIAS_RATIO_LOW, ALIAS_RATIO_HIGH = 400_000, 4_000_000


def allowed_alias_ratio(decoded: int) -> float:
    """The share of a document's decoded nodes that may come from aliases, by how many were decoded."""
    if decoded <= ALIAS_RATIO_LOW:
        return 0.99
    if decoded >= ALIAS_RATIO_HIGH:
        return 0.10
    return 0.99 - 0.89 * (decoded - ALIAS_RATIO_LOW) / (ALIAS_RATIO_HIGH - ALIAS_RATIO_LOW)


def excessive_aliasing(decoded: int, aliased: int) -> bool:
    return aliased > 100 and decoded > 1000 and aliased / decoded > allowed_alias_ratio(decoded)


@functools.cache
def _bounded_composer() -> type[Composer]:
    """ruamel's Composer, refusing nesting past MAX_DEPTH and counting what go-yaml's decoder would decode while
    the document is composed.

    go-yaml counts one node per unmarshal call, expanding every alias (the alias node, then the whole anchored
    node again, each of those counted as alias-driven), and checks the rule at each. Here each composed node
    knows its expanded size (1 + its children's, an alias child counting 1 + its target's), so an alias adds
    its whole expansion at once: within such a run both counts grow together, the ratio only rises and the
    allowed ratio only falls, so checking at the end of the run decides as go-yaml's per-node check does, and a
    bomb is refused after composing its few real nodes, never expanding them. An alias of an anchor still being
    composed (a document that contains itself) is refused, as go-yaml refuses it.
    """
    from ruamel.yaml.composer import Composer
    from ruamel.yaml.events import AliasEvent

    class BoundedComposer(Composer):
        def __init__(self, loader: Any = None) -> None:
            super().__init__(loader)
            self.warn_double_anchors = False  # YAML lets an anchor be defined again; the last one counts
            self._reset()

        def _reset(self) -> None:
            self.decoded, self.aliased = 1, 0  # go-yaml counts the document node first
            self.sizes: dict[int, int] = {}  # id(anchored node) -> its expanded size, once composed
            self.open_sizes: list[int] = []  # the expanded size so far of each node being composed

        def compose_document(self) -> Any:
            self._reset()
            return super().compose_document()

        def _tally(self, decoded: int, aliased: int, mark: Any) -> None:
            self.decoded += decoded
            self.aliased += aliased
            if excessive_aliasing(self.decoded, self.aliased):
                raise InputError(f"the input's YAML aliases expand past what kubectl accepts ('excessive "
                                 f"aliasing', CVE-2019-11253): by line {mark.line + 1}, {self.aliased} of the "
                                 f"document's {self.decoded} nodes come from aliases, more than "
                                 f"{allowed_alias_ratio(self.decoded):.0%}; write the objects out, or alias less")

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.parser.check_event(AliasEvent):
                event = self.parser.peek_event()
                node = super().compose_node(parent, index)
                size = self.sizes.get(id(node))
                if size is None:
                    raise InputError(f"the input's YAML anchor {event.anchor!r} contains an alias of itself at "
                                     f"line {event.start_mark.line + 1}: it would never end; write it out")
                self._tally(1, 0, event.start_mark)  # the alias node, then the anchored node again
                self._tally(size, size, event.start_mark)
                self.open_sizes[-1] += 1 + size
                return node
            mark = self.parser.peek_event().start_mark
            if len(self.open_sizes) >= MAX_DEPTH + 1:  # as deep as a scalar under MAX_DEPTH collections
                raise InputError(f"{TOO_DEEP} (line {mark.line + 1})")
            self._tally(1, 0, mark)
            self.open_sizes.append(1)
            node = super().compose_node(parent, index)
            size = self.open_sizes.pop()
            if self.open_sizes:
                self.open_sizes[-1] += size
            if node.anchor is not None:
                self.sizes[id(node)] = size
            return node

    return BoundedComposer


class _Refused(ValueError):
    """JSON that Python's parser takes and kubectl's does not (raised from inside json.loads)."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different: Python keeps the last of two (a first `spec` dropped without a
    word), the API server's strict field validation (kubectl's default) refuses them, and so does ruamel in YAML."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _Refused(f"the input's JSON has the key {key!r} twice in one object; keep one (the same YAML is "
                           "refused too)")
        obj[key] = value
    return obj


def _no_constant(name: str) -> Any:
    """NaN and Infinity are Python's extension of JSON; no Kubernetes client writes or reads them."""
    raise _Refused(f"the input's JSON has {name}, which is not a JSON number; write a number or a string")


def _too_deep(data: Any) -> bool:
    """Whether JSON data nests deeper than MAX_DEPTH collections, counted as for YAML (every value one level
    below its collection, a scalar too: an empty collection may sit one level deeper), without recursion."""
    pending: list[tuple[Any, int]] = [(data, 1)]
    while pending:
        value, depth = pending.pop()
        if depth > MAX_DEPTH + 1:
            return True
        if isinstance(value, dict):
            pending.extend((child, depth + 1) for child in value.values())  # a key is as deep as its value
        elif isinstance(value, list):
            pending.extend((child, depth + 1) for child in value)
    return False


TOO_DEEP = (f"the input nests objects and lists more than {MAX_DEPTH} deep, deeper than any Kubernetes object "
            "(a CRD's schema nests about 40); flatten it, or leave that document out of inject's input")


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
            data = json.loads(text, object_pairs_hook=_object, parse_constant=_no_constant)
        except _Refused as err:
            raise InputError(str(err)) from None
        except ValueError as err:
            raise InputError(f"the input starts like JSON but is not JSON: {err}") from None
        except RecursionError:
            raise InputError(TOO_DEEP) from None
        if _too_deep(data):
            raise InputError(TOO_DEEP)
        docs = data if isinstance(data, list) else [data]
        changed = _inject_all(docs, defaults, version, check)
        return json.dumps(data, indent=2) + "\n", changed
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    yaml = YAML(typ="rt")
    yaml.Composer = _bounded_composer()
    yaml.preserve_quotes = True
    yaml.width = 4096  # never fold a user's long line
    yaml.indent(**_indentation(text))
    try:
        docs = list(yaml.load_all(text))
    except YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or err
        line = f"line {mark.line + 1}" if mark else "an unknown line"
        raise InputError(f"the input is not YAML: {_one_line(problem)} at {line}") from None
    except InputError:
        raise
    except Exception as err:  # ruamel's round-trip constructor fails outside YAMLError on some input (a mapping
        # as a key: TypeError; comments it cannot place: NotImplementedError); none of it is a manifest
        raise InputError(f"the input is YAML that inject cannot read ({type(err).__name__}: {_one_line(err)}); "
                         "write keys as plain strings, as kubectl needs them") from None
    changed = _inject_all(docs, defaults, version, check)
    out = io.StringIO()
    yaml.dump_all(docs, out)
    return out.getvalue(), changed


def _one_line(problem: object) -> str:
    """A parser's message on one line, at most 200 characters (some span lines, and quote the input)."""
    text = " ".join(str(problem).split())
    return text if len(text) <= 200 else text[:197] + "..."


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
        with warnings.catch_warnings():  # a reused anchor is valid YAML: no warning on stderr
            warnings.simplefilter("ignore")
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
