"""The compact form of a job's pods that the publisher shares, so the other pods need not read every pod.

Every pod listing every pod costs N x ~4 KB per pod, N^2 for the job: 63 GiB through the API server at 4096
pods. Instead one pod lists the pods and publishes them cut to the fields the core reads: one row per pod,
container shapes stored once, gzip-compressed, in ConfigMap ``<job>-topology`` (the snapshot; the changes after
it go to a journal, see journal.py). The others run the same core over the same rows, so files and rank rules
are identical in both modes; the pods-watching sidecars hold their peers in this form too (``Compactor``).

Who publishes is decided by a Lease, taken by the first training pod whose init runs (leading.py).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from agent.core import controllers as c
from agent.core.compact import CompactPod, conditions_section
from agent.core.jsonstream import DECODER, RowSink, skip, stream_array, walk_object
from agent.core.model import Options, RawPod
from agent.core.plan.grouping import parse_rule
from agent.core.pods.containers import pick_trainer_container
from agent.core.pods.lost import lost_conditions, node_lost_of, with_node_lost
from agent.core.pods.validation import json_values, not_json
from agent.errors import InputError

SCHEMA = 5  # 2: rows carry the pod's node and its level labels; 3: the conditions that say it is lost; 4: its
# creationTimestamp (hot spares tell a pod made again from the one it replaced: spares.py); 5: the Node labels
# said once per distinct set (``LabelSets``)


class Col:
    """A row's columns by name. The wire form is a JSON array, so these positions are the format ``SCHEMA``
    names: a new column is a new schema."""

    NAME, VERSION, LABELS, ANNOTATIONS, HOSTNAME, SUBDOMAIN, CONTAINER, PHASE, IP, DELETED, NODE, NODE_LABELS, \
        CONDITIONS, CREATED = range(14)
    WIDTH = 14


_TEXTS = (Col.NAME, Col.VERSION, Col.HOSTNAME, Col.SUBDOMAIN, Col.PHASE, Col.IP, Col.DELETED, Col.NODE, Col.CREATED)
_REPEATED = (Col.SUBDOMAIN, Col.PHASE, Col.NODE, Col.CREATED)  # values many pods of a job share: one object each
DATA_KEY = "topology.json.gz"
LABELS_KEY = "nodeLabels"  # the document's (and a journal entry's) table of Node label sets
MAX_LABEL_SETS = 65536  # distinct label sets in one table: at most one per Node, and a job has fewer Nodes
_NPROC_ENV = frozenset({"PET_NPROC_PER_NODE", "NPROC_PER_NODE"})


def configmap_name(job: str) -> str:
    """``<job>-topology``, made a valid object name (LWS jobs are ``name/group``)."""
    name = re.sub(r"[^a-z0-9.-]", "-", job.lower()).strip("-.")
    return f"{name[:240]}-topology"


def _trainer(pod: RawPod, options: Options) -> dict[str, Any]:
    trainer = pick_trainer_container(pod, options.processes.container)
    if trainer is None:
        return {}
    ports = [p for p in trainer.get("ports", []) if p.get("name") == "pytorchjob-port"]
    env = [e for e in trainer.get("env", []) if e.get("name") in _NPROC_ENV]
    return {k: v for k, v in (("name", trainer.get("name")), ("resources", trainer.get("resources")),
                              ("ports", ports), ("env", env)) if v}


def _shape(pod: RawPod, options: Options, shapes: dict[int, tuple[object, str]] | None) -> str:
    """The trainer container's shape as text (the key rows share it by). ``shapes`` remembers it per container
    object for one pass: compact pods share their container object, and encoding it for each of 4096 pods was
    a third of the leader's publication."""
    if shapes is None:
        return json.dumps(_trainer(pod, options), sort_keys=True, separators=(",", ":"))
    containers = pod.get("spec", {}).get("containers") or []
    key = id(containers[0]) if len(containers) == 1 else None
    if key is not None and key in shapes:
        return shapes[key][1]
    text = json.dumps(_trainer(pod, options), sort_keys=True, separators=(",", ":"))
    if key is not None:
        shapes[key] = (containers[0], text)  # the entry holds the container: its id is not reused meanwhile
    return text


# A row's annotations and lost conditions when it has none, one object for every such row (most rows: a row is
# never written into, only replaced), instead of two empty containers per pod the publisher holds a row of.
_NO_ANNOTATIONS: dict[str, str] = {}
_NO_CONDITIONS: list[list[str]] = []


def _row(pod: RawPod, options: Options, containers: dict[str, int],
         nodes: Mapping[str, Mapping[str, str] | None] | None = None,
         shapes: dict[int, tuple[object, str]] | None = None) -> list[Any]:
    """One pod as a row: [name, resourceVersion, labels, annotations, hostname, subdomain, container, phase, ip,
    deletionTimestamp, nodeName, the node's level labels (None: not read), the conditions that say the pod is lost
    ([type, status, reason] each, lost.py: usually none), creationTimestamp]. Containers are stored once per
    distinct shape (a job's pods share templates). The Node labels ride with the pod, so only the publisher
    reads Nodes and a follower learns a new node from the journal entry that brings its pod."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    extra = {options.choice.index_label} if options.choice.index_label else set()
    if options.replica_groups is not None:  # the labels a pod's replica group is read from (core/plan/grouping.py)
        rule = parse_rule(options.replica_groups)
        extra |= {rule.key, *([rule.count] if rule.count else [])}
    held = meta.get("labels") or {}
    labels = {k: v for k, v in held.items()
              if c.is_read_label(k) or k in extra or (options.choice.selector and k in options.choice.selector)}
    if len(labels) == len(held):
        labels = held  # a compact pod's labels: the publisher's row shares the dict (never changed in place)
    noted = meta.get("annotations")
    noted = noted if isinstance(noted, dict) else {}
    annotations = {k: v for k, v in noted.items() if (k in c.ALL_LABELS or k in extra) and k not in labels}
    if not annotations:
        annotations = _NO_ANNOTATIONS
    elif len(annotations) == len(noted):
        annotations = noted  # a compact pod's (as its labels above)
    shape = _shape(pod, options, shapes)
    index = containers.setdefault(shape, len(containers))
    ip = status.get("podIP") or next((e.get("ip") for e in status.get("podIPs", []) if e.get("ip")), "")
    node = spec.get("nodeName") or ""
    node_labels: Mapping[str, str] | None = None
    read = nodes.get(node) if options.levels is not None and nodes is not None else None
    if read is not None:
        wanted = {level.label for level in options.levels}  # type: ignore[union-attr]
        # The Node's labels as read when they are the levels' alone (runtime/nodes.py reads no others, one dict per
        # distinct set): the rows share it as the Nodes do (never changed in place; 16384 rows, 3 MB of copies).
        shared = type(read) is dict and read.keys() <= wanted
        node_labels = read if shared else {k: v for k, v in read.items() if k in wanted}
    return [meta.get("name", ""), meta.get("resourceVersion", ""), labels, annotations, spec.get("hostname", ""),
            spec.get("subdomain", ""), index, status.get("phase", ""), ip, meta.get("deletionTimestamp", ""), node,
            node_labels, [list(condition) for condition in lost_conditions(status.get("conditions"))] or _NO_CONDITIONS,
            str(meta.get("creationTimestamp") or "")]


def _pod_of(row: list[Any], containers: list[dict[str, Any]], namespace: str) -> RawPod:
    name, rv, labels, annotations, hostname, subdomain, index, phase, ip, deleted, node, _, conditions, created = row
    if type(hostname) is str and type(name) is str and hostname == name:
        hostname = name  # one string for both (a JobSet's and Volcano's pods are named as their hostnames)
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations}
    if rv:
        meta["resourceVersion"] = rv
    if deleted:
        meta["deletionTimestamp"] = deleted
    if created:
        meta["creationTimestamp"] = created
    spec: dict[str, Any] = {"containers": [containers[index]] if containers[index] else []}
    if hostname:
        spec["hostname"] = hostname
    if subdomain:
        spec["subdomain"] = subdomain
    if node:
        spec["nodeName"] = node
    status: dict[str, Any] = {"phase": phase}
    if ip:
        status["podIP"] = ip  # the one IP the row keeps; podIPs would repeat it (pods.pod_ip reads podIP first)
    if conditions:
        status["conditions"] = conditions_section(conditions)
    return {"metadata": meta, "spec": spec, "status": status}  # type: ignore[typeddict-item]


def compact_of(row: list[Any], containers: list[list[dict[str, Any]]], namespace: str) -> RawPod:
    """``_pod_of``'s pod, held as a ``CompactPod`` (``containers``: each shape's list, shared by its pods)."""
    name, rv, labels, annotations, hostname, subdomain, index, phase, ip, deleted, node, _, conditions, created = row
    return CompactPod(name, namespace, rv, labels, annotations, containers[index],  # type: ignore[return-value]
                      hostname=name if hostname == name else hostname, subdomain=subdomain, node=node, phase=phase,
                      ip=ip, deleted=deleted, conditions=conditions, created=created)


def shape_lists(shapes: list[dict[str, Any]], lists: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """``lists`` grown to one containers list per shape of ``shapes`` (an empty shape: no container)."""
    for shape in shapes[len(lists):]:
        lists.append([shape] if shape else [])
    return lists


_SHARED_STRINGS = 65536  # distinct label values held once; past this (index labels of a huge job) kept as read


class SharedStrings:
    """The values every pod of a job repeats (its job, role, phase, namespace, a node's name), held once per
    reader: each pod's parse made its own copy. Strings only: a dict would hand back 1 for True."""

    def __init__(self) -> None:
        self._strings: dict[str, str] = {}

    def __call__(self, value: Any) -> Any:
        if type(value) is not str or len(self._strings) >= _SHARED_STRINGS:
            return value
        return self._strings.setdefault(value, value)

    def row(self, row: list[Any], *, keys: bool = False) -> None:
        """A decoded row's repeated values, in place (the row is the reader's own). Its labels and annotations
        keep their keys, which one document's parse shares already; ``keys``: shared too (a row decoded on its own
        has its own copy of each)."""
        for at in (Col.LABELS, Col.ANNOTATIONS):
            part = row[at]
            if type(part) is not dict:
                continue
            if keys:
                row[at] = {self(key): self(value) for key, value in part.items()}
                continue
            for key, value in part.items():
                part[key] = self(value)
        for at in _REPEATED:
            row[at] = self(row[at])


class Compactor:
    """Peers as followers see them: the row's fields only, one shared container object per shape.

    A sidecar that watches the pods (the publisher, its standbys, every pod of a small job) holds every peer for
    the pod's life; cut like this a 4096-pod job's peers take a fraction of the memory (most of a slimmed pod is its
    containers' env, which the core reads only from the pod's own container). Followers render the same files
    from the same form (tested), so this changes no output."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self._index: dict[str, int] = {}
        self._shapes: list[list[dict[str, Any]]] = []  # the containers list of each shape, shared by its pods
        self._shared = SharedStrings()
        self.lost_nodes: Mapping[str, str] = {}  # the lost Nodes the sidecar watches, each with why (lost.py)

    def pod(self, pod: RawPod) -> RawPod:
        """The compact pod, built from fresh strings: holding the parsed LIST page's own strings would keep the
        page's memory arenas from being freed."""
        row = json.loads(json.dumps(_row(pod, self.options, self._index)))
        if len(self._shapes) < len(self._index):  # a new shape: its containers list, shared by its pods
            texts = sorted(self._index, key=self._index.__getitem__)
            shape_lists([json.loads(text) for text in texts], self._shapes)
        shared = self._shared
        # keys and values both: each pod's own parse made its own copy of the same keys (~4 MB at 16384 pods)
        row[Col.LABELS] = {shared(key): shared(value) for key, value in row[Col.LABELS].items()}
        row[Col.ANNOTATIONS] = {shared(key): shared(value) for key, value in row[Col.ANNOTATIONS].items()}
        for at in _REPEATED:
            row[at] = shared(row[at])
        if self.lost_nodes or node_lost_of(row[Col.CONDITIONS]) is not None:
            row[Col.CONDITIONS] = with_node_lost(row[Col.CONDITIONS], self.lost_nodes.get(row[Col.NODE]))
        return compact_of(row, self._shapes, shared(pod.get("metadata", {}).get("namespace", "default")))


def pack(document: dict[str, Any]) -> bytes:
    """A snapshot document as stored in the ConfigMap (``decode`` reads it back)."""
    return pack_text(json.dumps(document, separators=(",", ":")))


def pack_text(text: str) -> bytes:
    return gzip.compress(text.encode(), compresslevel=1, mtime=0)


# What decoding a published document may cost, whatever its bytes say (a gzip bomb of `{}` drove followers to
# 1.75 GB). Parsed JSON costs up to ~72 bytes per value (an empty dict, a short string), whatever its text, so
# both the text and the number of values are capped: text <= CAP/2 (and its strings' copies as much again),
# values <= CAP/72: decoding peaks below 2 x CAP (bench/bomb_bench.py measures it). A 16384-pod job's
# snapshot is 3.0 MB and 328k values (20 per pod): the cap holds ~23k pods.
DOCUMENT_CAP = 32 * 1024 * 1024
MAX_DOCUMENT = DOCUMENT_CAP // 2  # bytes of text, uncompressed
VALUE_COST = 72  # bytes of Python objects per JSON value at most (dict 64 + its slot)


def _refuse(what: str) -> InputError:
    return InputError(f"the published topology is not valid ({what}); delete the ConfigMap so the leader "
                      "publishes it again, and check who else can write ConfigMaps (docs/security.md)")


_HEAD = ("schema", "job", "namespace", "generation", "containers", LABELS_KEY)  # what a row's check needs; first
_ABSENT: Any = object()  # no "pods" key


def decode(data: bytes, rows: Callable[[dict[str, Any]], RowSink] | None = None) -> dict[str, Any]:
    """The document, or ``InputError``: it is data from the API like any pod, and is checked as such (followers
    run the same core over it, pod by pod, through ``check_pod`` and the value grammars).

    ``rows``: the rows are handed over one by one and left out of the document. ``rows(header)`` is called once,
    before the first row, with the keys read so far (every key a row's check needs); the function it returns
    takes each row in order. When the header keys come before
    the rows, as the leader writes them, each row is decoded as the text is read, so the rows are never all
    decoded at once (a new leader reading back a 16384-pod snapshot: 25 MB)."""
    try:
        inflated = _gunzip(data, MAX_DOCUMENT)
        _count_values(inflated, DOCUMENT_CAP // VALUE_COST, "the published topology")
        text = inflated.decode()
        del inflated  # 3 MB at 16384 pods: not held beside its text while the rows are decoded
        document, pods, streamed = _members(text, rows)
    except (OSError, ValueError, EOFError, RecursionError, zlib.error) as err:
        raise _refuse(f"does not decode: {type(err).__name__}") from None
    _check_head(document)
    if rows is None:
        if pods is not _ABSENT:
            document["pods"] = pods
        return document
    if streamed is None:
        if pods is not _ABSENT and not isinstance(pods, list):
            raise _refuse("namespace or pods has the wrong type")
        sink = rows(document)
        for row in pods if pods is not _ABSENT else ():
            sink(row)
    elif any(document.get(key) != streamed.get(key) for key in _HEAD):
        raise _refuse("a header key is repeated after the rows")
    return document


def _check_head(document: Any) -> None:
    if not isinstance(document, dict):
        raise _refuse("not an object")
    if document.get("schema") != SCHEMA:
        shown = json.dumps(document.get("schema"))[:20]  # one line, whatever a forged document holds
        raise InputError(f"the published topology has schema {shown}, this agent reads {SCHEMA}; run one agent "
                         "version per job")
    if not isinstance(document.get("generation", 0), int) or isinstance(document.get("generation"), bool):
        raise _refuse("generation is not a whole number")


def _members(text: str, rows: Callable[[dict[str, Any]], RowSink] | None,
             ) -> tuple[dict[str, Any], Any, dict[str, Any] | None]:
    """The top-level object's keys but "pods", the "pods" value (``_ABSENT``: none, or streamed), and the header
    as it was when streaming began (None: not streamed). Streams the rows when ``rows`` is given, "pods" is an array and
    every ``_HEAD`` key came before it; JSON's grammar otherwise, as ``json.loads`` reads it (a key given twice
    keeps its last value), but for "pods" twice (refused: a parser would have kept one of them)."""
    decode_at = DECODER.raw_decode
    header: dict[str, Any] = {}
    pods: Any = _ABSENT
    streamed: dict[str, Any] | None = None
    seen_pods = False

    def value(key: str, at: int) -> int:
        nonlocal pods, streamed, seen_pods
        if key != "pods":
            header[key], end = decode_at(text, at)
            return end
        if seen_pods:
            raise ValueError("pods given twice")
        seen_pods = True
        if rows is not None and text[at:at + 1] == "[" and all(k in header for k in _HEAD):
            _check_head(header)  # before any row is read as this schema's
            streamed = dict(header)
            return stream_array(text, skip(text, at + 1), rows(streamed))
        pods, end = decode_at(text, at)
        return end

    walk_object(text, value)
    return header, pods, streamed


MAX_MEMBERS = 4096  # gzip members in one snapshot: the leader writes about one per 256 rows, and two more


def _gunzip(data: bytes, limit: int) -> bytearray:
    """The gzip members' bytes, one member after another (the leader compresses the snapshot by blocks of
    rows), decompressed a chunk at a time and never past ``limit`` in all (refused beyond)."""
    out = bytearray()
    pending = data
    for _ in range(MAX_MEMBERS):
        inflate = zlib.decompressobj(wbits=31)  # gzip framing
        while pending:
            out += inflate.decompress(pending, min(1 << 20, limit + 1 - len(out)))  # 1 MiB at a time: no 2nd copy
            if len(out) > limit:
                raise _refuse(f"more than {limit} bytes uncompressed")
            pending = inflate.unconsumed_tail
            if inflate.eof:
                break
        if not inflate.eof:
            raise EOFError("the gzip stream ends early")
        pending = inflate.unused_data
        if not pending:
            return out  # not copied into bytes: json reads a bytearray, and a copy is one more text's worth
    raise _refuse(f"more than {MAX_MEMBERS} gzip members")


def bounded_loads(text: bytes | bytearray | str, max_values: int, what: str) -> Any:
    """``json.loads`` of text that has at most ``max_values`` values (``_count_values``)."""
    raw = text.encode() if isinstance(text, str) else text
    _count_values(raw, max_values, what)
    return json.loads(raw, parse_constant=not_json)


def _count_values(raw: bytes | bytearray, max_values: int, what: str) -> None:
    """Refused past ``max_values`` values (validation.json_values), before any is made."""
    if json_values(raw) > max_values:
        raise _refuse(f"{what} holds more than {max_values} values")



def check_row(row: Any, shapes: int) -> None:
    """A row has the shape ``_row`` writes (its values are checked as a pod's by ``check_pod`` after)."""
    if not isinstance(row, list) or len(row) != Col.WIDTH:
        raise _refuse("a pod row has the wrong shape")
    container, node_labels, conditions = row[Col.CONTAINER], row[Col.NODE_LABELS], row[Col.CONDITIONS]
    if not isinstance(container, int) or isinstance(container, bool) or not 0 <= container < shapes \
            or not all(isinstance(row[at], str) for at in _TEXTS) \
            or not (node_labels is None or (isinstance(node_labels, dict)
                    and all(isinstance(k, str) and isinstance(v, str) for k, v in node_labels.items()))) \
            or not isinstance(conditions, list) or not all(isinstance(c, list) and len(c) == 3
                                                           and all(isinstance(v, str) for v in c) for c in conditions):
        raise _refuse("a pod row has the wrong shape")


class LabelSets:
    """The wire form of the rows' Node labels: each distinct label set once, in a table, and a row's
    ``NODE_LABELS`` its index there (None: not read). Every pod of a Node, and every Node of a rack, carries the
    same set; said per row, two levels at 16384 pods were 65536 more values than the decoder's bound allows."""

    __slots__ = ("_index", "sets")

    def __init__(self) -> None:
        self.sets: list[Mapping[str, str]] = []
        self._index: dict[tuple[tuple[str, str], ...], int] = {}

    def wire(self, row: list[Any]) -> list[Any]:
        """``row`` as written: its Node labels as their index (a copy when it has any)."""
        labels = row[Col.NODE_LABELS] if len(row) == Col.WIDTH else None
        if labels is None:
            return row
        key = tuple(sorted(labels.items()))
        at = self._index.get(key)
        if at is None:
            at = self._index[key] = len(self.sets)
            self.sets.append(labels)
        wired = list(row)
        wired[Col.NODE_LABELS] = at
        return wired


def label_sets_of(value: Any) -> list[dict[str, str]]:
    """A table of Node label sets as read (absent: empty), checked: a list of at most ``MAX_LABEL_SETS``
    objects of strings."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_LABEL_SETS:
        raise _refuse(f"{LABELS_KEY} is not a list of at most {MAX_LABEL_SETS} label sets")
    if not all(isinstance(labels, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
               for labels in value):
        raise _refuse(f"{LABELS_KEY} holds a label set that is not an object of strings")
    return value


def resolve_labels(row: Any, sets: Sequence[dict[str, str]]) -> Any:
    """A row as read, its Node labels index replaced by the set it names (in place; the set is shared by the rows
    that name it). A row of the wrong shape is left to ``check_row``."""
    if not isinstance(row, list) or len(row) != Col.WIDTH or row[Col.NODE_LABELS] is None:
        return row
    at = row[Col.NODE_LABELS]
    if type(at) is not int or not 0 <= at < len(sets):
        shown = json.dumps(at)[:20] if type(at) is int else "not a whole number"
        raise _refuse(f"a pod row's Node labels index ({shown}) is not one of the {len(sets)} in {LABELS_KEY}")
    row[Col.NODE_LABELS] = sets[at]
    return row


def node_labels_of(rows: Iterable[list[Any]]) -> dict[str, dict[str, str]]:
    """The Node labels the publisher read, by node, from the rows that carry them."""
    return {row[Col.NODE]: row[Col.NODE_LABELS] for row in rows
            if row[Col.NODE] and row[Col.NODE_LABELS] is not None}


SELECT_LABEL = "topology-agent.io/topology"  # on the snapshot and the journal: one LIST reads both


def select_value(snapshot_name: str) -> str:
    """The label value naming a job's published objects (a label value is at most 63 characters)."""
    if len(snapshot_name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", snapshot_name):
        return snapshot_name
    return "h-" + hashlib.sha256(snapshot_name.encode()).hexdigest()[:40]


def configmap_body(name: str, data: bytes, *, generation: int, leader: str,
                   owner: dict[str, Any] | None, resource_version: str = "",
                   standby: Sequence[str] = (), leader_uid: str = "") -> dict[str, Any]:
    """The ConfigMap that carries the compressed topology; owned by the job so it goes with it."""
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "topology-agent",
                                              SELECT_LABEL: select_value(name)}},
        "data": {"generation": str(generation), "leader": leader, "leaderUid": leader_uid,
                 "standby": ",".join(standby)},
        "binaryData": {DATA_KEY: base64.b64encode(data).decode()},
    }
    if owner:
        body["metadata"]["ownerReferences"] = [{**owner, "controller": False}]
    if resource_version:  # overwrite only the version read: a deposed leader's late write fails with 409
        body["metadata"]["resourceVersion"] = resource_version
    return body


def decode_configmap(configmap: dict[str, Any],
                     rows: Callable[[dict[str, Any]], RowSink] | None = None) -> dict[str, Any] | None:
    """The snapshot document a ConfigMap holds (checked as data from the API), or None while it holds none."""
    binary = configmap.get("binaryData") or {}
    raw = binary.get(DATA_KEY) if isinstance(binary, dict) else None
    if not raw:
        return None
    if not isinstance(raw, str):
        raise _refuse("binaryData is not a string")
    try:
        packed = base64.b64decode(raw, validate=True)
    except ValueError:
        raise _refuse("binaryData is not base64") from None
    return decode(packed, rows)
