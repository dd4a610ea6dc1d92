"""`topology-agent inject`: manifests in, the same manifests with the agent added out (core/adoption/injection.py is the
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
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.core.adoption.injection import (
    AGENT_CONTAINERS,
    AGENT_VOLUMES,
    INIT,
    INJECTED,
    SIDECAR,
    Adopted,
    Settings,
    adopt_document,
    left_alone,
    names_registry,
    template_kinds,
)
from agent.errors import InputError
from agent.flags.parser import check_command_line
from agent.runtime.quoting import is_misread_plain

if TYPE_CHECKING:
    from ruamel.yaml.composer import Composer
    from ruamel.yaml.scanner import Scanner

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
    the document is composed (made when first needed: ruamel is loaded only for YAML input).

    go-yaml counts one node per unmarshal call, expanding every alias (the alias node, then the whole anchored
    node again, each of those counted as alias-driven), and checks the rule at each. Here each composed node
    knows its expanded size (1 + its children's, an alias child counting 1 + its target's), so an alias adds
    its whole expansion at once: within such a run both counts grow together, the ratio only rises and the
    allowed ratio only falls, so checking at the end of the run decides as go-yaml's per-node check does, and a
    bomb is refused after composing its few real nodes, never expanding them. An alias of an anchor still being
    composed (a document that contains itself) is refused, as go-yaml refuses it.
    """
    from ruamel.yaml.composer import Composer

    return type("BoundedComposer", (Composer,), {
        "__init__": _composer_init, "_reset": _composer_reset, "compose_document": _compose_document,
        "_tally": _composer_tally, "compose_node": _compose_node,
        "compose_mapping_node": lambda self, anchor: _block_if_multiline(
            Composer.compose_mapping_node(self, anchor), self.loader),
        "compose_sequence_node": lambda self, anchor: _block_if_multiline(
            Composer.compose_sequence_node(self, anchor), self.loader)})


def _composer_init(self: Any, loader: Any = None) -> None:
    from ruamel.yaml.composer import Composer

    Composer.__init__(self, loader)
    self.warn_double_anchors = False  # YAML lets an anchor be defined again; the last one counts
    self._reset()


def _composer_reset(self: Any) -> None:
    self.decoded, self.aliased = 1, 0  # go-yaml counts the document node first
    self.sizes = {}  # id(anchored node) -> its expanded size, once composed
    self.open_sizes = []  # the expanded size so far of each node being composed


def _compose_document(self: Any) -> Any:
    from ruamel.yaml.composer import Composer

    self._reset()
    return Composer.compose_document(self)


def _composer_tally(self: Any, decoded: int, aliased: int, mark: Any) -> None:
    self.decoded += decoded
    self.aliased += aliased
    if excessive_aliasing(self.decoded, self.aliased):
        raise InputError(f"the input's YAML aliases expand past what kubectl accepts ('excessive "
                         f"aliasing', CVE-2019-11253): by line {mark.line + 1}, {self.aliased} of the "
                         f"document's {self.decoded} nodes come from aliases, more than "
                         f"{allowed_alias_ratio(self.decoded):.0%}; write the objects out, or alias less")


def _compose_node(self: Any, parent: Any, index: Any) -> Any:
    from ruamel.yaml.composer import Composer
    from ruamel.yaml.events import AliasEvent

    if self.parser.check_event(AliasEvent):
        event = self.parser.peek_event()
        node = Composer.compose_node(self, parent, index)
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
    node = Composer.compose_node(self, parent, index)
    size = self.open_sizes.pop()
    if self.open_sizes:
        self.open_sizes[-1] += size
    if node.anchor is not None:
        self.sizes[id(node)] = size
    return node


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


def _block_if_multiline(node: Any, loader: Any) -> Any:
    """A flow collection written over several lines (kubectl's KYAML, kubernetes/website's examples) comes back
    in block style: ruamel writes flow style on one line, which would lose the layout and every comment in it.
    Its span goes on the loader's ``spans``: the comments in it are placed again after loading (_place_comments).
    One written on one line (`command: [sh, -c, x]`) stays as it is."""
    if node.flow_style and node.end_mark is not None and node.start_mark.line != node.end_mark.line:
        node.flow_style = False
        spans = getattr(loader, "spans", None)
        if spans is not None:
            spans.append((node.start_mark.line, node.start_mark.column, node.end_mark.line))
    return node


@functools.cache
def _recording_scanner() -> type[Scanner]:
    """ruamel's round-trip scanner, keeping every comment it reads with its position and whether it was inside a
    flow collection, on the loader's ``comments``: its parser drops those in flow collections and a few others
    (after a flow collection's end, after a block scalar's header), which are put back after loading."""
    from ruamel.yaml.scanner import RoundTripScanner

    class RecordingScanner(RoundTripScanner):
        def fetch_comment(self, comment: Any) -> None:
            value, start, _ = comment
            self.loader.comments.append((start.line, start.column, value, bool(self.flow_level)))
            super().fetch_comment(comment)

    return RecordingScanner


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


def check_injected(doc: Mapping[str, Any]) -> None:
    """Every command line the injection wrote must be one the agent accepts, before a pod ever runs it."""
    from agent.core.adoption.injection import templates

    for template in templates(doc):
        spec = template.template.get("spec") or {}
        for container in spec.get("initContainers") or []:
            if isinstance(container, Mapping) and container.get("name") in (INIT, SIDECAR):
                check_command_line([str(a) for a in container.get("args") or []],
                                   f"{template.where} {container['name']}")


@dataclass(frozen=True)
class Report:
    """What inject did with one input: each pod template it found (given the agent, or found with it already), and
    the objects it left alone (no pod template of a kind the agent knows)."""

    adopted: list[Adopted]
    alone: list[str]

    def line(self) -> str:
        """One line for stderr: what was added, what had the agent already, what was left alone and why."""
        added = [a.where for a in self.adopted if a.changed]
        kept = [a.where for a in self.adopted if not a.changed]
        parts = []
        if added:
            parts.append(f"added the agent to {len(added)} pod template(s): {', '.join(added)}")
        if kept:
            parts.append(f"{len(kept)} pod template(s) already have the agent, unchanged: {', '.join(kept)}")
        if self.alone:
            parts.append(f"left alone: {', '.join(self.alone)} (no pod template of a kind the agent knows)")
        return "; ".join(parts) or "no objects"


def run_inject(filenames: Sequence[str], defaults: Settings, *, version: str) -> int:
    """``topology-agent inject``: each file's manifests with the agent added, as one stream on stdout (documents
    apart as the inputs' line ends say), and on stderr one line per file: the templates given the agent, those
    that had it already, the objects left alone. Input with no pod template at all is refused and nothing is
    written: piped to ``kubectl apply -f -``, the empty stream fails the apply too, where passing the input through
    would have applied a job without the agent, or nothing the user meant."""
    from agent.flags.inject import read_manifest

    outputs, lines = [], []
    for name in filenames:
        out, report = inject_report(read_manifest(name), defaults, version=version)
        outputs.append(out)
        lines.append((name, report))
    if not any(report.adopted for _, report in lines):
        where = ", ".join("stdin" if name == "-" else name for name in filenames)
        alone = [name for _, report in lines for name in report.alone]
        raise InputError(f"{where}: no pod template to add the agent to, so nothing is written; "
                         + (f"left alone: {', '.join(alone)}; " if alone else "it holds no objects; ")
                         + f"the agent adds itself to the pod templates of {template_kinds()}")
    for name, report in lines:
        print(f"topology-agent inject: {'stdin' if name == '-' else name}: {report.line()}", file=sys.stderr)
    unpulled = sorted({a.image for _, report in lines for a in report.adopted if not names_registry(a.image)})
    if unpulled:
        print(f"topology-agent inject: warning: image {', '.join(unpulled)} names no registry, so each node pulls "
              "it from Docker Hub, where it is not; push the image you built and name it: --set "
              "image=<registry>/topology-agent:<tag> (or the job's annotation topology-agent.io/image)",
              file=sys.stderr)
    sys.stdout.write("".join((("---\r\n" if out.endswith("\r\n") else "---\n") if i else "") + out
                             for i, out in enumerate(outputs)))
    return 0


def inject_text(text: str, defaults: Settings, *, version: str) -> tuple[str, list[str]]:
    """The manifests in ``text`` with the agent added, and the templates that have it ("Kind name part")."""
    out, report = inject_report(text, defaults, version=version)
    return out, [adopted.where for adopted in report.adopted]


def inject_report(text: str, defaults: Settings, *, version: str) -> tuple[str, Report]:
    """The manifests in ``text`` with the agent added, and what was done (``Report``). The output keeps the
    input's line endings (CRLF stays CRLF) and a leading byte-order mark."""
    bom = "\ufeff" if text.startswith("\ufeff") else ""
    text = text[len(bom):]
    crlf = _crlf(text)
    if crlf:  # YAML reads a CRLF line break as LF (JSON as whitespace); ruamel's comments would keep the CR
        text = text.replace("\r\n", "\n")
    out, report = _inject(text, defaults, version)
    if crlf:  # every line break ruamel or json writes is a line break of the text: none is in a value
        out = out.replace("\n", "\r\n")
    return bom + out, report


def _crlf(text: str) -> bool:
    """Whether most of the text's lines end with CRLF."""
    return text.count("\r\n") * 2 > text.count("\n")


def _inject(text: str, defaults: Settings, version: str) -> tuple[str, Report]:
    if text.lstrip().startswith(("{", "[")):
        try:
            data = _load_json(text)
        except _NotJson as not_json:
            # Flow-style YAML starts the same way (kubectl's KYAML, kubernetes/website's examples): read it as
            # YAML, and say both if it is neither.
            try:
                return _inject_yaml(text, defaults, version)
            except _NotYaml as not_yaml:
                raise InputError(f"the input starts like JSON but is not JSON ({not_json}), nor YAML "
                                 f"({not_yaml})") from None
        docs = data if isinstance(data, list) else [data]
        report = _inject_all(docs, defaults, version)
        return json.dumps(data, indent=2) + "\n", report
    try:
        return _inject_yaml(text, defaults, version)
    except _NotYaml as err:
        raise InputError(f"the input is not YAML: {err}") from None


class _NotJson(InputError):
    """The text does not parse as JSON (it may still be YAML)."""


class _NotYaml(InputError):
    """The text does not parse as YAML."""


def _load_json(text: str) -> Any:
    try:
        data = json.loads(text, object_pairs_hook=_object, parse_constant=_no_constant)
    except _Refused as err:
        raise InputError(str(err)) from None
    except ValueError as err:
        raise _NotJson(str(err)) from None
    except RecursionError:
        raise InputError(TOO_DEEP) from None
    if _too_deep(data):
        raise InputError(TOO_DEEP)
    return data


def _inject_yaml(text: str, defaults: Settings, version: str) -> tuple[str, Report]:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    yaml = YAML(typ="rt")
    yaml.Composer = _bounded_composer()
    yaml.Scanner = _recording_scanner()
    comments: list[tuple[int, int, str, bool]] = []
    spans: list[tuple[int, int, int]] = []
    yaml.comments = comments  # type: ignore[attr-defined]  # the recording scanner's
    yaml.spans = spans  # type: ignore[attr-defined]  # the composer's flow collections made block
    yaml.preserve_quotes = True
    yaml.width = 4096  # never fold a user's long line
    indentation = _indentation(text)
    yaml.indent(**indentation)
    try:
        docs = list(yaml.load_all(text))
    except YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or err
        line = f"line {mark.line + 1}" if mark else "an unknown line"
        raise _NotYaml(f"{_one_line(problem)} at {line}") from None
    except InputError:
        raise
    except Exception as err:  # ruamel's round-trip constructor fails outside YAMLError on some input (a mapping
        # as a key: TypeError; comments it cannot place: NotImplementedError); none of it is a manifest
        raise InputError(f"the input is YAML that inject cannot read ({type(err).__name__}: {_one_line(err)}); "
                         "write keys as plain strings, as kubectl needs them") from None
    # Before injecting: the positions are the input's, and what is inserted shifts the comments along.
    lead = _lead(text)
    if comments:
        dropped = _dropped(docs, comments, spans, lead.count("\n"))
        if dropped:
            _place_comments(docs, dropped, text.splitlines(), indentation)
        _comments_before_what_follows(docs, indentation)
    flows = _flow_sizes(docs)
    as_written = _misread_as_written(docs)
    report = _inject_all(docs, defaults, version)
    if flows:
        _block_where_added(docs, flows)
    _quote_added(docs, as_written)
    out = io.StringIO()
    yaml.dump_all(docs, out)
    return lead + out.getvalue(), report


@dataclass
class _Entry:
    """A key of a mapping, or an item of a sequence, as read: where it was; where its line starts in the output
    (the column a comment before it takes); whether it is a leaf (a scalar, an empty or a one-line flow
    collection: it ends on its own line); the entry a comment after it on its line belongs to (``owner[key]``),
    and the one a comment on the lines before it belongs to (``before[before_key]``: for the first key of a
    mapping that is a sequence's item, the item, whose dash starts the line)."""

    line: int
    col: int
    out_col: int
    leaf: bool
    owner: Any
    key: Any
    before: Any
    before_key: Any
    agent: bool  # in one of the agent's own pieces, which an injection takes out again


def _is_agent_piece(value: Any) -> bool:
    """A list entry the agent adds (its containers, volumes and shared mount go by these names)."""
    name = value.get("name") if isinstance(value, Mapping) else None
    return isinstance(name, str) and (name in AGENT_CONTAINERS or name in AGENT_VOLUMES)


def _is_agent_key(mapping: Mapping[Any, Any], key: Any) -> bool:
    """A key an injection writes after the user's own (a comment the user wrote at the end comes before them):
    the injected annotation, the ServiceAccount settings of a pod spec that holds the agent's init container,
    and a key holding nothing else (`metadata: {annotations: {injected}}`, `volumes` of the agent's alone)."""
    if key == INJECTED:
        return True
    if key in ("serviceAccountName", "automountServiceAccountToken"):
        return any(_is_agent_piece(c) for c in mapping.get("initContainers") or [] if isinstance(c, Mapping))
    return _agent_only(mapping.get(key))


def _agent_only(value: Any) -> bool:
    if isinstance(value, Mapping):
        return bool(value) and all(_is_agent_key(value, k) for k in value)
    if isinstance(value, list):
        return bool(value) and all(_is_agent_piece(v) for v in value)
    return False


def _add_before(entry: _Entry, tokens: list[Any]) -> None:
    """Comments written on the lines before an entry (before a sequence's item, ahead of its dash), ahead of any
    it has: what is moved there was written before them."""
    slot = entry.before.ca.items.setdefault(entry.before_key, [None, None, None, None])
    slot[1] = tokens + (slot[1] or [])


def _entries(root: Any, indentation: Mapping[str, int]) -> list[_Entry]:
    """Every key and item of one document, with the output columns ruamel's block layout gives them."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    mapping, sequence, offset = indentation["mapping"], indentation["sequence"], indentation["offset"]
    found: list[_Entry] = []
    seen: set[int] = set()
    # (collection, column of its keys or dashes, the sequence and index it is an item of, in an agent's piece)
    pending: list[tuple[Any, int, tuple[Any, int] | None, bool]] = [
        (root, offset if isinstance(root, CommentedSeq) else 0, None, False)]
    while pending:
        obj, col, item, agent = pending.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        children = list(obj.items()) if isinstance(obj, CommentedMap) else list(enumerate(obj))
        for n, (key, value) in enumerate(children):
            try:
                line, at = obj.lc.key(key) if isinstance(obj, CommentedMap) else obj.lc.item(key)
            except (KeyError, TypeError, AttributeError):  # a merged key, or a piece with no position
                continue
            block = isinstance(value, (CommentedMap, CommentedSeq)) and bool(value) and not value.fa.flow_style()
            ours = agent or (_is_agent_piece(value) if isinstance(obj, CommentedSeq) else _is_agent_key(obj, key))
            before, before_key, out_col = obj, key, col
            if n == 0 and item is not None:  # the line starts with the item's dash
                before, before_key = item
                out_col = col - (sequence - offset)
            found.append(_Entry(line, at, out_col, not block, obj, key, before, before_key, ours))
            if not block:
                continue
            if isinstance(obj, CommentedMap):
                pending.append((value, col + (offset if isinstance(value, CommentedSeq) else mapping), None, ours))
            else:  # an item's content starts past its dash, on the dash's line
                pending.append((value, col + sequence - offset, (obj, key), ours))
    found.sort(key=lambda e: (e.line, e.col))
    return found


def _tokens(holder: Any) -> Iterator[Any]:
    """The comment tokens in one of ruamel's comment slots (a token, a list of them, or lists of those)."""
    from ruamel.yaml.tokens import CommentToken

    if isinstance(holder, CommentToken):
        yield holder
    elif isinstance(holder, list):
        for part in holder:
            yield from _tokens(part)


def _collections(roots: list[Any], kinds: tuple[type, ...] | None = None) -> Iterator[Any]:
    """Every collection of the documents of ``kinds`` (a mapping and a sequence type; None: the round-trip ones,
    what ruamel read), each once, reached through collections of those kinds."""
    if kinds is None:
        from ruamel.yaml.comments import CommentedMap, CommentedSeq

        kinds = (CommentedMap, CommentedSeq)
    pending: list[Any] = [r for r in roots if isinstance(r, kinds)]
    seen: set[int] = set()
    while pending:
        obj = pending.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        yield obj
        pending.extend(v for v in (obj.values() if isinstance(obj, Mapping) else obj) if isinstance(v, kinds))


def _dropped(docs: list[Any], comments: list[tuple[int, int, str, bool]], spans: list[tuple[int, int, int]],
             lead_lines: int) -> list[tuple[int, int, str]]:
    """The comments to place again, each with its line, column and text: every one in a flow collection made
    block (to the end of its last line: `}  # note`), where ruamel keeps a few at the column it read and in odd
    slots, which are taken out first; and any other that ruamel keeps nowhere."""
    from bisect import bisect_right

    outer: list[tuple[int, int, int]] = []  # the outermost spans, in order
    for span in sorted(spans):
        if not outer or (span[0], span[1]) > (outer[-1][2], 1 << 30):
            outer.append(span)
        else:
            outer[-1] = (outer[-1][0], outer[-1][1], max(outer[-1][2], span[2]))

    def in_span(line: int, col: int) -> bool:
        i = bisect_right(outer, (line, col, 1 << 30)) - 1
        return i >= 0 and line <= outer[i][2]

    def placed_again(part: Any) -> bool:
        mark = getattr(part, "start_mark", None)
        return mark is not None and in_span(mark.line, mark.column)

    def clean(slots: list[Any]) -> None:
        """A comment slot list (its places stay, emptied) holding tokens or lists of tokens (which shrink)."""
        for i, part in enumerate(slots):
            if isinstance(part, list):
                part[:] = [t for t in part if not placed_again(t)]
                if not part:
                    slots[i] = None
            elif placed_again(part):
                slots[i] = None

    kept: set[int] = set()
    for obj in _collections([d for d in docs if getattr(d, "ca", None) is not None]):
        end = getattr(obj.ca, "end", None)
        if outer and isinstance(end, list):  # a list of tokens, not of slots
            end[:] = [t for t in end if not placed_again(t)]
        for holder in [obj.ca.comment, *obj.ca.items.values(), end]:
            if outer and isinstance(holder, list) and holder is not end:
                clean(holder)
            for token in _tokens(holder):
                if token.start_mark is None or not isinstance(token.value, str):
                    continue
                first = token.start_mark.line - (1 if token.value.startswith("\n") else 0)
                kept.update(first + i for i, part in enumerate(token.value.split("\n")) if "#" in part)
                kept.add(token.start_mark.line)
    return [(line, col, value) for line, col, value, in_flow in comments
            if line >= lead_lines and (in_flow or in_span(line, col) or line not in kept)]


def _place_comments(docs: list[Any], comments: list[tuple[int, int, str]], lines: list[str],
                    indentation: Mapping[str, int]) -> None:
    """Put back the comments to place again (_dropped), where ruamel keeps comments in block style: a comment on
    a line of its own before the entry that follows it and is not the agent's (so what the agent appends to a
    list does not come between them), at that entry's column; a comment after content at the end of its line's
    last leaf or key; one with nothing after it in the document after the last leaf."""
    from bisect import bisect_left

    from ruamel.yaml.comments import CommentedBase, CommentedMap
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    def slots(owner: Any, key: Any) -> list[Any]:
        return owner.ca.items.setdefault(key, [None, None, None, None])

    def after(owner: Any, key: Any, text: str, column: int) -> None:
        """A comment after ``owner[key]``: at the end of its line (column 0), or on a line below it."""
        slot = slots(owner, key)
        index = 2 if isinstance(owner, CommentedMap) else 0
        existing = slot[index].value if slot[index] is not None else ""
        line = text if not column else "\n" + " " * column + text if not existing else " " * column + text
        slot[index] = CommentToken(existing + line, CommentMark(0), None)

    roots = [d for d in docs if isinstance(d, CommentedBase) and getattr(d, "lc", None) is not None]
    starts = [d.lc.line for d in roots]
    per_doc = [_entries(d, indentation) for d in roots]
    positions = [[(e.line, e.col) for e in entries] for entries in per_doc]
    for line, col, value in sorted(comments):
        if not roots:
            break
        i = max(0, bisect_left(starts, line + 1) - 1)  # a comment over a document is that document's
        entries = per_doc[i]
        text = value.split("\n", 1)[0].rstrip() + "\n" * max(1, value.count("\n"))  # and the blank lines under it
        position = bisect_left(positions[i], (line, col))
        # after content on its line: the end of its first leaf or key (not an item inside a one-line flow
        # collection; and an item's dash line is its first key's)
        on_line: _Entry | None = None
        at = position
        while at > 0 and entries[at - 1].line == line:
            at -= 1
            if entries[at].leaf or isinstance(entries[at].owner, CommentedMap):
                on_line = entries[at]
        if on_line is not None and lines[line][:col].strip():
            after(on_line.owner, on_line.key, text, 0)
        elif following := next((e for e in entries[position:] if not e.agent), None):
            _add_before(following, [CommentToken(text, CommentMark(following.out_col), None)])
        elif leaves := [e for e in entries if e.leaf]:
            after(leaves[-1].owner, leaves[-1].key, text, leaves[-1].out_col)


def _comments_before_what_follows(docs: list[Any], indentation: Mapping[str, int]) -> None:
    """Give each comment on lines of its own a place that what the agent adds and takes out cannot move.

    ruamel keeps such a comment as the one after the leaf before it (the mountPath of the last volume mount, for a
    comment over `initContainers:`), before the next item of a list (after an item ending in `emptyDir: {}`), or
    at the end of a list. The agent appends to lists and takes its own entries out again, which would put the
    comment between two mounts, or drop it with the agent's mount. So a comment goes before the next entry that
    is not the agent's, where ruamel writes it at the same place; with no such entry after it, after the last
    leaf that is not the agent's (the agent's appended entries then come after it, run after run). A comment at
    the end of its line and blank lines alone stay where they are."""
    from ruamel.yaml.comments import CommentedBase

    for root in docs:
        if not isinstance(root, CommentedBase) or getattr(root, "lc", None) is None:
            continue
        _ends_to_leaves(root)
        entries = _entries(root, indentation)
        nexts: list[_Entry | None] = []  # the first entry after each that is not in an agent's piece
        upcoming: _Entry | None = None
        for entry in reversed(entries):
            nexts.append(upcoming)
            upcoming = upcoming if entry.agent else entry
        nexts.reverse()
        before: dict[int, tuple[_Entry, list[Any]]] = {}
        leaf: _Entry | None = None  # the last leaf so far that is not the agent's
        for entry, following in zip(entries, nexts, strict=True):
            moved = _comments_to_move(entry, following)
            if moved and following is not None:
                before.setdefault(id(following), (following, []))[1].extend(_comment_lines(moved))
            elif moved and leaf is not None and leaf is not entry:
                _after_leaf(leaf, moved)
            if not entry.agent and entry.leaf:
                leaf = entry
        for target, tokens in before.values():
            _add_before(target, tokens)


def _comments_to_move(entry: _Entry, following: _Entry | None) -> list[Any]:
    """The comments on lines of their own that ruamel keeps with ``entry``, taken off it: those before one of the
    agent's items, and those after it when something follows (or it is the agent's)."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    moved: list[Any] = []
    item = entry.owner.ca.items.get(entry.key)
    if entry.agent and item and isinstance(entry.owner, CommentedSeq) and isinstance(item[1], list):
        moved += item[1]  # before one of the agent's items
        item[1] = None
    index = 2 if isinstance(entry.owner, CommentedMap) else 0
    token = item[index] if item and len(item) > index else None
    if token is not None and isinstance(token.value, str) and "#" in token.value.partition("\n")[2]:
        eol, _, rest = token.value.partition("\n")
        lines = rest.splitlines(keepends=True)
        first = next(i for i, line in enumerate(lines) if "#" in line)
        if following is not None or entry.agent:
            item[index] = CommentToken((eol + "\n" if eol else "\n") + "".join(lines[:first]),
                                       token.start_mark, None) if eol or first else None
            moved += [CommentToken("".join(lines[first:]), CommentMark(0), None)]
    return moved


def _after_leaf(leaf: _Entry, moved: list[Any]) -> None:
    """Comments with nothing of the user's after them: after the last leaf that is not the agent's."""
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    slot = leaf.owner.ca.items.setdefault(leaf.key, [None, None, None, None])
    at = 2 if isinstance(leaf.owner, CommentedMap) else 0
    text = "".join(" " * t.start_mark.column + t.value for t in _comment_lines(moved))
    slot[at] = CommentToken((slot[at].value if slot[at] is not None else "\n") + text, CommentMark(0), None)


def _comment_lines(tokens: list[Any]) -> list[Any]:
    """Comment tokens, one a line (with the blank lines under it), each at its own column."""
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    found: list[Any] = []
    for token in tokens:
        column = token.start_mark.column if token.start_mark is not None else 0  # of its first line
        for n, line in enumerate(token.value.splitlines(keepends=True)):
            if line.strip():
                indent = len(line) - len(line.lstrip()) + (column if n == 0 else 0)
                found.append(CommentToken(line.strip() + "\n", CommentMark(indent), None))
            elif found:
                found[-1].value = found[-1].value + "\n"
    return found


def _ends_to_leaves(root: Any) -> None:
    """A comment ruamel keeps at the end of a collection (after its last item, when that ends in a flow
    collection) becomes the one after the collection's last leaf, as it is after any other leaf."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    pending, seen = [root], set()
    while pending:
        obj = pending.pop()
        if id(obj) in seen or not obj:
            continue
        seen.add(id(obj))
        values = list(obj.values()) if isinstance(obj, CommentedMap) else list(obj)
        pending.extend(v for v in values if isinstance(v, (CommentedMap, CommentedSeq)))
        end = [t for t in getattr(obj.ca, "end", None) or [] if isinstance(t, CommentToken)]
        if not end:
            continue
        last = obj
        while True:  # the deepest last entry
            key = list(last.keys())[-1] if isinstance(last, CommentedMap) else len(last) - 1
            value = last[key]
            if not (isinstance(value, (CommentedMap, CommentedSeq)) and value and not value.fa.flow_style()):
                break
            last = value
        slot = last.ca.items.setdefault(key, [None, None, None, None])
        at = 2 if isinstance(last, CommentedMap) else 0
        text = "".join(" " * (t.start_mark.column if t.start_mark is not None else 0) + t.value for t in end)
        slot[at] = CommentToken((slot[at].value if slot[at] is not None else "\n") + text, CommentMark(0), None)
        obj.ca.end = []


def _flow_sizes(docs: list[Any]) -> dict[int, int]:
    """The size of each flow collection left (written on one line), to see afterwards which the agent added to."""
    return {id(obj): len(obj) for obj in _collections(docs) if obj.fa.flow_style()}


def _block_where_added(docs: list[Any], flows: Mapping[int, int]) -> None:
    """What the agent adds is written in block style: a one-line flow collection it added to (`spec:
    {containers: [...]}`), or one holding what it added, turns block, with every collection around it (block
    style cannot sit inside flow style)."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    def added_to(obj: Any) -> bool:
        values = obj.values() if isinstance(obj, Mapping) else obj
        return flows.get(id(obj), len(obj)) != len(obj) or any(
            isinstance(v, (dict, list)) and not isinstance(v, (CommentedMap, CommentedSeq)) for v in values)

    # post-order without recursion: a collection turns block when it, or anything in it, does
    order: list[tuple[Any, list[Any]]] = []
    pending: list[tuple[Any, list[Any]]] = [(d, []) for d in docs if isinstance(d, (CommentedMap, CommentedSeq))]
    seen: set[int] = set()
    while pending:
        obj, path = pending.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        order.append((obj, path))
        values = obj.values() if isinstance(obj, CommentedMap) else obj
        pending.extend((v, [*path, obj]) for v in values if isinstance(v, (CommentedMap, CommentedSeq)))
    for obj, path in order:
        if obj.fa.flow_style() and added_to(obj):
            for outer in [*path, obj]:
                outer.fa.set_block_style()


def _plain_strings(docs: list[Any]) -> Iterator[tuple[Any, Any, str]]:
    """Every string value written plain (a mapping's value or a sequence's item) with its collection and key or
    index, in the user's collections and those the agent added alike; each collection once."""
    from ruamel.yaml.scalarstring import PlainScalarString

    for obj in _collections(docs, (Mapping, list)):
        for key, value in list(obj.items() if isinstance(obj, Mapping) else enumerate(obj)):
            if type(value) is str or type(value) is PlainScalarString:  # the others are quoted or a block
                yield obj, key, value


def _misread_as_written(docs: list[Any]) -> dict[tuple[int, Any], tuple[Any, str]]:
    """The input's plain strings that a YAML 1.1 reader misreads (kubectl reads `on` as a bool, PyYAML `1:2` as
    62), by where they are; they stay as the user wrote them."""
    return {(id(obj), key): (obj, value) for obj, key, value in _plain_strings(docs) if is_misread_plain(value)}


def _quote_added(docs: list[Any], as_written: Mapping[tuple[int, Any], tuple[Any, str]]) -> None:
    """Quote every plain string the injection wrote that a YAML 1.1 reader would misread: ruamel quotes only what
    YAML 1.2 misreads, and kubectl (go-yaml v2) and PyYAML read 1.1. What is the input's, where the input had it,
    stays as written. Where a value is decides, not the object: the agent copies the user's values (a setting's
    annotation, an elastic range from the pod's env) into the arguments it adds."""
    from ruamel.yaml.scalarstring import SingleQuotedScalarString

    added = [(obj, key, value) for obj, key, value in _plain_strings(docs)
             if is_misread_plain(value) and not _same(as_written.get((id(obj), key)), obj, value)]
    for obj, key, value in added:
        obj[key] = SingleQuotedScalarString(value)  # ruamel writes it double-quoted where single quotes cannot


def _same(written: tuple[Any, str] | None, obj: Any, value: str) -> bool:
    return written is not None and written[0] is obj and written[1] is value


def _lead(text: str) -> str:
    """The comments and the `---` that open the stream, which ruamel drops (it keeps what follows a `---`)."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped == "---" or stripped.startswith("--- #"):
            return "".join(lines[:i + 1]).replace("\r\n", "\n")
        if stripped and not stripped.startswith("#"):
            return ""
    return ""


def _one_line(problem: object) -> str:
    """A parser's message on one line, at most 200 characters (some span lines, and quote the input)."""
    text = " ".join(str(problem).split())
    return text if len(text) <= 200 else text[:197] + "..."


def _indentation(text: str) -> dict[str, int]:
    """The user's own indentation (ruamel writes one style per stream): a nested mapping's step, and a block
    sequence's dash offset and step, e.g. 2 / 2+2 in JobSet's examples, 2 / 0+2 in kubectl's. Read from the first
    nested mapping and the first block sequence under a key, as ruamel's load_yaml_guess_indent reads them,
    with comments left out (a comment after `key:` hid the key, and the guess changed from one run to the next)."""
    mapping = offset = sequence = None
    key_indent = 0
    key_only: int | None = None  # the indentation of the line before, when it was a key alone (`key:`)
    for raw in text.splitlines():
        line = _code(raw).rstrip()
        stripped = line.lstrip(" ")
        if not stripped:
            continue
        lead = len(line) - len(stripped)
        if stripped == "-" or stripped.startswith("- "):
            if offset is None and key_only is not None:
                offset = lead - key_indent
                sequence = offset + len(stripped) - len(stripped[1:].lstrip(" "))
            key_only = None
            continue
        if mapping is None and key_only is not None and lead > key_only:
            mapping = lead - key_only
        if line.endswith(":"):
            key_indent = key_only = lead
        else:
            key_only = None
        if mapping is not None and offset is not None:
            break
    mapping = mapping if mapping is not None and 2 <= mapping <= 8 else 2
    offset = offset if offset is not None and 0 <= offset <= 8 else 0
    sequence = sequence if sequence is not None and offset + 2 <= sequence <= offset + 8 else offset + 2
    return {"mapping": mapping, "sequence": sequence, "offset": offset}


def _code(line: str) -> str:
    """A line without its comment: from the first '#' that starts a line or follows a space, outside quotes (a
    guess's reading: the parser decides what a line means)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def _inject_all(docs: list[Any], defaults: Settings, version: str) -> Report:
    adopted: list[Adopted] = []
    alone: list[str] = []
    for doc in docs:
        if isinstance(doc, dict):
            adopted += adopt_document(doc, defaults, version=version)
            alone += left_alone(doc)
            check_injected(doc)
    return Report(adopted, alone)
