"""Changes to the published topology, so that a follower receives O(changed pods) per change, not the whole job.

The leader keeps two ConfigMaps per job, and is the only writer of both:

- the snapshot ``<job>-topology``: every member as a compact row, gzip-compressed (see published.py), at
  sequence number S;
- the journal ``<job>-topology-journal``: the last few changes, each ``(seq, rows put, names gone, new container
  shapes)``, as plain JSON under ``JOURNAL_BYTES``, covering the sequence numbers (base, seq].

Followers WATCH only the journal, so a single-pod change costs each of them one event of at most a few KiB
(it cost the whole 90 KiB snapshot at 4096 pods). A follower at sequence f applies the changes after f. When
base > f (it was away longer than the journal reaches: a relist after a 410) it reads the snapshot, whose S is
always >= base, and applies the changes after S. The leader rewrites the snapshot whenever trimming the journal
would move base past S, so that always holds; the snapshot is never sent to a follower that keeps up.

A pod's row is published again only when its content changes (its resourceVersion alone does not count):
status updates that move no member make no journal entry. Nothing here does I/O.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any

from agent.core.compact import same_but_version, sharing
from agent.core.model import Options, RawPod
from agent.core.pods.pod import node_name, object_name, pod_name
from agent.core.pods.validation import check_pod
from agent.core.publication.blocks import PART_LABEL, summary_key
from agent.core.publication.published import (
    LABELS_KEY,
    SCHEMA,
    SELECT_LABEL,
    Col,
    LabelSets,
    SharedStrings,
    _refuse,
    _row,
    bounded_loads,
    check_row,
    compact_of,
    decode_configmap,
    label_sets_of,
    node_labels_of,
    pack_text,
    resolve_labels,
    select_value,
    shape_lists,
)

JOURNAL_KEY = "changes.json"
JOURNAL_BYTES = 1024  # changes kept in the journal (the newest one is kept whatever its size)
MAX_JOURNAL = 1024 * 1024  # a ConfigMap cannot hold more; anything near it is not our journal
MAX_ENTRY = MAX_JOURNAL // 2  # bytes of one entry: a larger change goes out in parts (``MAX_PARTS``)
# A change of up to this many entries' worth (a burst of the kubelet's Running writes: ~2600 rows, ~0.9 MB at
# 16384 pods) goes out as that many journal versions, one part each, written in turn: a follower applies each
# instead of listing the whole snapshot again and decoding it beside what it holds. A larger one
# (a relist after a 410, thousands of pods joining) goes in the snapshot alone: the journal is left empty after it.
MAX_PARTS = 4
MAX_JOURNAL_VALUES = 150_000  # ~7500 changes of ~20 values (published.bounded_loads): <= ~11 MB parsed


BLOCK_ROWS = 256  # rows per gzip member of the snapshot, about (published.py reads any number of members)
_TAIL = pack_text("]}")  # the snapshot's last member

JOURNAL_LAG = 64  # changes a journal may lag the snapshot it is read with (the leader's two writes are adjacent)


def journal_name(snapshot_name: str) -> str:
    """``<job>-topology-journal`` beside the snapshot ``<job>-topology``."""
    return f"{snapshot_name}-journal"


def summary_name(snapshot_name: str) -> str:
    """``<job>-topology-summary``: the summary (core/publication/summary.py) with the journal's header and no changes,
    written only when what it says changes, so that a pod in its own view receives nothing while other pods' rows
    move."""
    return f"{snapshot_name}-summary"


@dataclass(frozen=True)
class Entry:
    seq: int
    put: tuple[list[Any], ...]  # rows (published.py's row shape; their Node labels as a table when encoded)
    gone: tuple[str, ...]  # pod names
    shapes: tuple[tuple[int, dict[str, Any]], ...]  # container shapes first used by these rows: (index, shape)

    def encoded(self) -> str:
        """The entry as JSON, keys sorted; its rows a block at a time. Python's encoder makes one string per
        value before it joins them: this way an entry of 4096 rows (a burst of the kubelet's writes) peaks 1.5 MB
        over its rows (bench/transients_bench.py). The rows' Node labels are said once per distinct set, as in
        the snapshot (``LabelSets``), in the entry's own table (absent: none)."""
        text = self.encoded_within(None)
        assert text is not None
        return text

    def encoded_within(self, limit: int | None) -> str | None:
        """``encoded``, or None once its rows alone pass ``limit`` characters: an entry the journal cannot carry
        is not made whole (every row of a 16384-pod job is ~3.5 MB of text, held in three copies while joined)."""
        sets = LabelSets()
        blocks: list[str] = []
        size = 0
        for at in range(0, len(self.put), BLOCK_ROWS):
            blocks.append(_dumps([sets.wire(row) for row in self.put[at:at + BLOCK_ROWS]])[1:-1])
            size += len(blocks[-1]) + 1
            if limit is not None and size > limit:
                return None
        put = ",".join(blocks)
        del blocks
        labels = f'"{LABELS_KEY}":{_dumps(sets.sets)},' if sets.sets else ""
        return (f'{{"gone":{_dumps(list(self.gone))},{labels}"put":[{put}],"seq":{_dumps(self.seq)},'
                f'"shapes":{_dumps({str(i): s for i, s in self.shapes})}}}')


def _parts(entry: Entry) -> list[tuple[Entry, str | None]]:
    """``entry`` as consecutive entries, each with its JSON under ``MAX_ENTRY``: itself when it is, else its rows
    cut into the fewest parts of equal row counts that are (its names gone and new shapes in the first: a row
    reads its shape from a part at or before its own), at most ``MAX_PARTS``; past that, itself (the snapshot
    carries it), its text None once its rows pass ``MAX_PARTS`` entries' worth (not made whole)."""
    encoded = entry.encoded_within(MAX_PARTS * MAX_ENTRY)
    if encoded is None or len(encoded) <= MAX_ENTRY or not entry.put:
        return [(entry, encoded)]
    size = len(encoded)
    del encoded  # not held beside its parts' texts (~1 MB at the leader's peak)
    for count in range(-(-size // MAX_ENTRY), min(MAX_PARTS, len(entry.put)) + 1):
        step = -(-len(entry.put) // count)
        parts = [Entry(seq=entry.seq + k, put=entry.put[at:at + step], gone=entry.gone if k == 0 else (),
                       shapes=entry.shapes if k == 0 else ())
                 for k, at in enumerate(range(0, len(entry.put), step))]
        texts = [part.encoded() for part in parts]
        if all(len(text) <= MAX_ENTRY for text in texts):
            return list(zip(parts, texts, strict=True))
    return [(entry, None)]


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


STANDBYS = 2  # pods that watch the pods too and take over from the publisher (leading.standbys names them)
# Where the publication stands in the pods' history (journal data): the pods' resourceVersion its rows are
# current to, and what the rows were cut for (``rows_options``). The publisher's own sidecar starts from the
# rows and watches the pods from there, instead of listing every pod again.
PODS_RV_KEY, ROWS_KEY = "podsResourceVersion", "rowsOptions"


@dataclass(frozen=True)
class Journal:
    leader: str
    standby: tuple[str, ...]  # the pods that stand by to take over (the leader names them)
    base: int  # the entries cover (base, seq]
    seq: int
    entries: tuple[Entry, ...]
    pods_rv: str = ""  # the pods' resourceVersion the rows are current to ("": not said)
    rows_options: str = ""  # ``rows_options`` of the options the rows were cut with


def rows_options(options: Options) -> str:
    """What a row keeps of a pod depends on (published._row): a reader that cuts pods otherwise cannot take the
    rows for its own."""
    levels = [level.label for level in options.levels] if options.levels is not None else None
    return json.dumps([SCHEMA, options.choice.selector, options.choice.index_label, options.processes.container,
                       levels], separators=(",", ":"))


def _same_content(row: list[Any], published: list[Any] | None) -> bool:
    """Equal but for the resourceVersion: followers need not hear about the pod again. Rows hold only
    JSON types, so a row read back from the snapshot compares equal to the one built from the pod."""
    if published is None or row[Col.NAME] != published[Col.NAME]:
        return False
    if len(published) == _COMPARED_LEN:
        return published[_KEY_AT] == _content_key(row)
    return row[Col.LABELS:] == published[Col.LABELS:]


_COMPARED_LEN = 3  # name, resourceVersion, content key; a full row has Col.WIDTH values
_KEY_AT = 2


def _compared(row: list[Any]) -> list[Any]:
    """A row as a new leader keeps it until it compares it with its own: name, resourceVersion, content key."""
    return [row[Col.NAME], row[Col.VERSION], _content_key(row)]


def _content_key(row: list[Any]) -> bytes:
    """A row's content but its resourceVersion, as 16 bytes (keys sorted: any writer's key order compares)."""
    text = json.dumps([row[Col.NAME], *row[Col.LABELS:]], sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


@dataclass
class PublishedState:
    """What the published objects say: the members as rows and as pods, the container shapes, the sequence.

    Followers hold one (built from the snapshot, moved forward by the journal), with its pods and, by Node, the
    labels the rows carry (``node_labels``), not the rows. A leader holds one for what it has published, rows
    only; a new leader continues from what it reads back (rows as content keys)."""

    job: str
    namespace: str
    seq: int = 0
    snapshot_seq: int = 0
    rows: dict[str, list[Any]] = field(default_factory=dict)  # none while it keeps pods (a follower's)
    shapes: list[dict[str, Any]] = field(default_factory=list)
    pods: dict[str, RawPod] = field(default_factory=dict)
    keep_pods: bool = True  # the rows as pods too (followers render from them; a publisher needs only rows)
    compare_only: bool = False  # rows read are kept as ``_compared`` ones (a new leader's read-back)
    _checked: set[int] = field(default_factory=set, repr=False, compare=False)  # ids of shapes checked (held in
    #                                                                              ``shapes`` for the state's life)
    _lists: list[list[dict[str, Any]]] = field(default_factory=list, repr=False, compare=False)  # shape_lists
    _strings: SharedStrings = field(default_factory=SharedStrings, repr=False, compare=False)
    _label_sets: list[dict[str, str]] = field(default_factory=list, repr=False, compare=False)  # the snapshot's
    _node_labels: dict[str, dict[str, str]] = field(default_factory=dict, repr=False, compare=False)  # with pods

    def hand_over_pods(self) -> dict[str, RawPod]:
        """The pods read, for the view that holds them from now on; this state keeps rows alone. The table of
        the values the pods repeat goes too: the view shares its own among the pods it takes in later, so this one
        would only keep each value of the pods read alive after the pods are replaced (at 16384 pods a 0.9 MB
        table and 2.8 MB of strings once the kubelet has written every pod)."""
        pods, self.pods, self.keep_pods, self._strings = self.pods, {}, False, SharedStrings()
        return pods

    def hand_over_node_labels(self) -> dict[str, dict[str, str]]:
        """The labels of the Nodes the pods read run on, as the rows carried them, for the sidecar that holds those
        pods (a leader's own read-back: it reads no Node again); this state keeps the rows' content keys alone."""
        labels, self._node_labels = self._node_labels, {}
        return labels

    def node_labels(self) -> dict[str, dict[str, str]]:
        """The labels of the Nodes the members run on, as the publisher read them (rows carry them): by the
        latest row of each Node (a follower's, kept as read), else from the rows held."""
        return {**node_labels_of(self.rows.values()), **self._node_labels}

    @classmethod
    def from_document(cls, document: dict[str, Any], *, pods: bool = True) -> PublishedState:
        """From a decoded snapshot (``published.decode``), each row checked like any pod from the API.
        ``pods=False``: rows only (the publisher never reads the pods: 4.4 MB at 4096 pods)."""
        rows = document.get("pods", [])
        if not isinstance(rows, list):
            raise _refuse("namespace or pods has the wrong type")
        state = cls._from_header(document, pods=pods)
        for row in rows:
            state._put(resolve_labels(row, state._label_sets))
        return state

    @classmethod
    def from_configmap(cls, configmap: dict[str, Any], *, pods: bool = True, compare_only: bool = False,
                       held: Mapping[str, RawPod] | None = None) -> PublishedState | None:
        """From the snapshot ConfigMap (None while it holds none), each row checked like any pod from the API,
        decoded one at a time (16384 decoded rows held at once would cost 25 MB). ``compare_only``: each row is
        kept as its content key alone (``_compared``), for a new leader that only compares the rows published
        with its own. With ``pods`` too, each row's pod is kept (a leader that starts from what it published: the
        pods for its view, the keys for its publisher, from one streamed read). ``held``: the pods a follower
        holds already (a snapshot read again): a row that says nothing new keeps the held object, so that the
        job's pods are not held twice while the snapshot is read."""
        made: list[PublishedState] = []

        def begin(header: dict[str, Any]) -> Callable[[Any], object]:
            state = cls._from_header(header, pods=pods, compare_only=compare_only)
            made.append(state)
            sets = state._label_sets
            return lambda row: state._put(resolve_labels(row, sets), own_keys=True, held=held)

        return made[0] if decode_configmap(configmap, begin) is not None else None

    @classmethod
    def _from_header(cls, header: dict[str, Any], *, pods: bool, compare_only: bool = False) -> PublishedState:
        shapes, namespace = header.get("containers", []), header.get("namespace", "default")
        if not isinstance(shapes, list) or not all(isinstance(x, dict) for x in shapes):
            raise _refuse("containers is not a list of objects")
        if not isinstance(namespace, str):
            raise _refuse("namespace or pods has the wrong type")
        job = header.get("job", "")
        seq = header.get("generation", 0)
        return cls(job=job if isinstance(job, str) else "", namespace=namespace, seq=seq, snapshot_seq=seq,
                   shapes=list(shapes), keep_pods=pods, compare_only=compare_only,
                   _label_sets=label_sets_of(header.get(LABELS_KEY)))

    def _put(self, row: Any, *, own_keys: bool = False, held: Mapping[str, RawPod] | None = None) -> str:
        """One row in. ``own_keys``: it was decoded on its own (no parse shared its labels' keys); ``held``: see
        ``from_configmap``."""
        check_row(row, len(self.shapes))
        if self.keep_pods:  # held for the pod's life: the values every pod repeats, once (and the labels' keys
            self._strings.row(row, keys=own_keys)  # of rows decoded one at a time: no parse shared them)
        # held as a CompactPod: the row's own values, ~0.7 KB less than the pod's dicts, checked from its slots
        made = check_pod(compact_of(row, shape_lists(self.shapes, self._lists), self.namespace), seen=self._checked)
        before = held.get(row[Col.NAME]) if held is not None else None
        # what it says as the pod held said is held once: a relist does not hold two copies of each value
        pod: Any = before if before is not None and same_but_version(before, made) else \
            sharing(made, before if before is not None else self.pods.get(row[Col.NAME]))
        if self.keep_pods:
            # keyed by the pod's own strings: after a relist they are the held pod's, not a second copy of each
            self.pods[pod_name(pod)] = pod
            node = node_name(pod)
            if node and row[Col.NODE_LABELS] is not None:  # the pod says all the row does but its Node's labels:
                self._node_labels[node] = row[Col.NODE_LABELS]  # kept by Node (a leader's own read-back hands them
            elif node:  # over with the pods: ``hand_over_node_labels``)
                self._node_labels.pop(node, None)
            if not self.compare_only:
                return row[Col.NAME]
        self.rows[row[Col.NAME]] = _compared(row) if self.compare_only else row
        return row[Col.NAME]

    def apply(self, journal: Journal) -> set[str] | None:
        """Move forward by the journal: the names of the pods that changed (empty: nothing new), or None when the
        journal no longer reaches back to this state (read the snapshot, then apply the journal again)."""
        if journal.seq <= self.seq:
            # The leader writes a new snapshot before the journal that follows it, so a journal may lag the
            # snapshot read with it by a change or two. Far behind, it is another history (a forged snapshot
            # with a sequence of 2**53-1 made every later journal look old, and was followed forever): read again.
            return set() if self.seq - journal.seq <= JOURNAL_LAG else None
        if journal.base > self.seq:
            return None
        changed: set[str] = set()
        for entry in journal.entries:
            if entry.seq <= self.seq:
                continue
            if entry.seq != self.seq + 1:
                return None  # a hole: not written by our leader
            for index, shape in entry.shapes:
                if index == len(self.shapes):
                    self.shapes.append(shape)
                elif index > len(self.shapes) or self.shapes[index] != shape:
                    raise _refuse(f"change {entry.seq} redefines container shape {index}")
            for row in entry.put:
                changed.add(self._put(row))
            for name in entry.gone:
                self.rows.pop(name, None)
                self.pods.pop(name, None)
                changed.add(name)
            self.seq = entry.seq
        return changed


class _Blocks:
    """The snapshot's rows as gzip members, one per block of names in the document's order: each block's names,
    its compressed bytes while no row of it changed, and the names changed since the last snapshot. Compressing
    one block of ~256 rows costs the leader ~0.5 ms; a 16384-pod snapshot (3 MB) whole would cost ~25 ms."""

    __slots__ = ("blocks", "bounds", "packed", "stale")

    def __init__(self, names: Iterable[str]) -> None:
        self.bounds: list[str] = []  # the first name of each block but the first
        self.blocks: list[set[str]] = []  # the names in each block
        self.packed: dict[int, tuple[bool, bytes]] = {}  # block -> (first member?, its gzip member)
        self.stale: set[str] = set(names)

    def changed(self, names: Iterable[str]) -> None:
        """Rows put or gone since the last snapshot: their blocks are compressed again."""
        self.stale.update(names)

    def members(self, rows: Mapping[str, Any], encode: Callable[[list[str]], str]) -> list[bytes]:
        """The gzip members of ``rows`` in name order; ``encode`` gives a block's rows as text (names sorted)."""
        if not self.blocks or len(rows) > 2 * BLOCK_ROWS * len(self.blocks) \
                or (len(self.blocks) > 1 and len(rows) * 4 < BLOCK_ROWS * len(self.blocks)):
            self._cut(rows)  # first, or the job grew or shrank a lot: blocks of BLOCK_ROWS names again
        self._place_stale(rows)
        if any(len(block) > 2 * BLOCK_ROWS for block in self.blocks):
            self._cut(rows)  # names crowded into one range (a job scaling up): cut again
        parts = []
        first = True
        for at, block in enumerate(self.blocks):
            if not block:
                continue
            kept = self.packed.get(at)
            if kept is None or kept[0] != first:
                text = encode(sorted(block))
                kept = self.packed[at] = (first, pack_text(text if first else "," + text))
            parts.append(kept[1])
            first = False
        return parts

    def _place_stale(self, rows: Mapping[str, Any]) -> None:
        """The rows changed since the last snapshot into their blocks (gone ones out); their blocks to compress."""
        for name in self.stale:
            at = bisect.bisect_right(self.bounds, name)
            if name in rows:
                self.blocks[at].add(name)
            else:
                self.blocks[at].discard(name)
            self.packed.pop(at, None)
        self.stale = set()

    def _cut(self, rows: Mapping[str, Any]) -> None:
        """Blocks of ``BLOCK_ROWS`` names in name order, all to compress."""
        names = sorted(rows)
        self.bounds = names[BLOCK_ROWS::BLOCK_ROWS]
        self.blocks = [set(names[at:at + BLOCK_ROWS]) for at in range(0, max(1, len(names)), BLOCK_ROWS)]
        self.packed.clear()
        self.stale = set()


@dataclass
class _Staged:
    """Rows built ahead of the first change (``Publisher.stage``): name -> (the pod object it was built from, its
    row, the row's JSON), and the container shapes as text meanwhile."""

    rows: dict[str, tuple[RawPod, list[Any], str]] = field(default_factory=dict)
    texts: dict[int, tuple[object, str]] = field(default_factory=dict)


class Publisher:
    """The leader's side: which rows changed, the journal to write, and when the snapshot must be rewritten."""

    def __init__(self, state: PublishedState, options: Options, *, leader: str, leader_uid: str = "",
                 journal: tuple[Entry, ...] = ()) -> None:
        self.state = state
        self.options = options
        self.leader, self.leader_uid = leader, leader_uid  # the writer, as readers check it (provenance.py)
        self.standby: tuple[str, ...] = ()
        self.pods_rv = ""  # the pods' resourceVersion the rows are current to (PODS_RV_KEY), when known
        self.entries: list[Entry] = list(journal)
        self._encoded: list[str] = [e.encoded() for e in self.entries]
        self._shape_index = {json.dumps(s, sort_keys=True, separators=(",", ":")): i
                             for i, s in enumerate(state.shapes)}
        self.snapshot_due = state.snapshot_seq < self.base
        self._blocks = _Blocks(state.rows)
        self._staged = _Staged()  # rows built ahead of the first change (``stage``)
        # Once published, the staged rows by name: (the row, its JSON) until the next snapshot is packed.
        self._encoded_rows: dict[str, tuple[list[Any], str]] = {}
        self._labels = LabelSets()  # the snapshot's Node label sets: packed blocks hold indices into it
        self._lead_in: list[tuple[Entry, str]] = []  # the parts of a large change the journal shows before its last

    @property
    def base(self) -> int:
        return self.entries[0].seq - 1 if self.entries else self.state.seq

    def stage(self, pod: RawPod) -> None:
        """Build ``pod``'s row now, for the next ``change`` given this very object. The leader's init stages each
        pod as it arrives, while it waits for the gang: building 16384 rows after the last pod's IP would cost ~0.1 s.
        Rows that carry their Node's labels (``levels``) wait for the Nodes, read once the gang is complete."""
        if self.options.levels is None:
            row = _row(pod, self.options, self._shape_index, None, self._staged.texts)
            self._staged.rows[object_name(pod)] = (pod, row, json.dumps(row, separators=(",", ":")))

    def change(self, pods: Mapping[str, RawPod], names: Iterable[str],
               nodes: Mapping[str, Mapping[str, str] | None] | None = None, *, journal: bool = True) -> Entry | None:
        """Publish what became of ``names`` (present in ``pods``: put if the row's content changed; absent: gone
        if published). Returns the new journal entry, or None when followers have nothing to learn. ``journal``
        False: the first publication, which only the snapshot carries (encoding every row as an entry as well
        would cost the leader's init ~40 ms at 16384 pods, after the last pod's IP)."""
        assert journal or not self.entries, "only a publisher with an empty journal may leave a change out of it"
        state = self.state
        put: list[list[Any]] = []
        gone: list[str] = []
        known = len(state.shapes)  # shapes past these are new (staged rows may have added some already)
        texts: dict[int, tuple[object, str]] = {}
        staged, self._staged = self._staged.rows, _Staged()
        for name in sorted(set(names)):
            pod = pods.get(name)
            if pod is None:
                if name in state.rows:
                    gone.append(name)
                continue
            ready = staged.get(name)
            if ready is not None and ready[0] is pod:
                row = ready[1]
                self._encoded_rows[name] = (row, ready[2])
            else:
                row = _row(pod, self.options, self._shape_index, nodes, texts)
            published = state.rows.get(name)
            if not _same_content(row, published):
                put.append(row)
            else:  # the same row, built from the pod held: a row read back from the snapshot is let go (or a
                # new leader would hold every row twice, ~7 MB at 16384 pods); its resourceVersion stays the
                # published one, written into the row just built (no other holds it but its staged text, which
                # says the pod's version: dropped)
                if row[Col.VERSION] != published[Col.VERSION]:  # type: ignore[index]
                    row[Col.VERSION] = published[Col.VERSION]  # type: ignore[index]
                    self._encoded_rows.pop(name, None)
                state.rows[name] = row
        if not put and not gone:
            return None
        shapes = [(index, json.loads(encoded)) for encoded, index in list(self._shape_index.items())[known:]]
        entry = Entry(seq=state.seq + 1, put=tuple(put), gone=tuple(gone), shapes=tuple(shapes))
        parts: list[tuple[Entry, str | None]] = _parts(entry) if journal else [(entry, None)]
        entry = replace(entry, seq=parts[-1][0].seq)  # the whole change, at the sequence it brings the state to
        for index, shape in shapes:
            if index == len(state.shapes):
                state.shapes.append(shape)
        for row in put:
            state.rows[row[Col.NAME]] = row
        for name in gone:
            state.rows.pop(name, None)
        self._blocks.changed(row[Col.NAME] for row in put)
        self._blocks.changed(gone)
        state.seq = entry.seq
        if journal:
            self._append(parts)
        else:
            self.snapshot_due = True
        return entry

    def _append(self, parts: list[tuple[Entry, str | None]]) -> None:
        """A change's parts into the journal: each but the last for the writer to put first (``take_lead_in``),
        the last kept with the entries before it that fit in ``JOURNAL_BYTES``; a change past ``MAX_PARTS``
        (its text None: not made whole) leaves the journal empty (readers would refuse it: the snapshot carries
        the change)."""
        self._lead_in.extend((entry, text) for entry, text in parts[:-1] if text is not None)
        last, encoded = parts[-1]
        if encoded is None or len(encoded) > MAX_ENTRY:
            self.entries.clear()
            self._encoded.clear()
        else:
            self.entries.append(last)
            self._encoded.append(encoded)
            while len(self.entries) > 1 and sum(map(len, self._encoded)) > JOURNAL_BYTES:
                self.entries.pop(0)
                self._encoded.pop(0)
        if self.base > self.state.snapshot_seq:
            self.snapshot_due = True  # a follower that falls behind must find a snapshot the journal reaches

    def snapshot_packed(self) -> bytes:
        """``pack(self.snapshot_document())`` as gzip members (gzip's own framing: a reader inflates them one after
        another), one per block of rows (``_Blocks``). The inflated text is the whole document's, byte for byte."""
        state = self.state
        if len(self._labels.sets) > 2 * len(state.rows) + BLOCK_ROWS:  # mostly sets no row names any more
            self._labels = LabelSets()
            self._blocks.packed.clear()  # their indices were into the table let go
        members = self._blocks.members(state.rows, self._encode)  # the table is complete once they are encoded
        head = json.dumps({"schema": SCHEMA, "job": state.job, "namespace": state.namespace,
                           "generation": state.seq, "containers": state.shapes, LABELS_KEY: self._labels.sets},
                          separators=(",", ":"))
        self._encoded_rows = {}
        return b"".join([pack_text(head[:-1] + ',"pods":['), *members, _TAIL])

    def _encode(self, names: list[str]) -> str:
        """The rows of ``names`` as the document has them, comma-separated: the text staged with each row when
        every one is the row published (the leader's first snapshot), else one encoder call for the block
        ('[row,row]' without its brackets)."""
        rows, encoded = self.state.rows, self._encoded_rows
        texts = []
        for name in names:
            held = encoded.get(name)
            if held is None or held[0] is not rows[name] or rows[name][Col.NODE_LABELS] is not None:
                wire = self._labels.wire
                return json.dumps([wire(rows[name]) for name in names], separators=(",", ":"))[1:-1]
            texts.append(held[1])
        return ",".join(texts)

    def snapshot_document(self) -> dict[str, Any]:
        """The snapshot at the current sequence; the caller writes it, then calls ``snapshot_written``."""
        state = self.state
        pods = [self._labels.wire(state.rows[name]) for name in sorted(state.rows)]
        return {"schema": SCHEMA, "job": state.job, "namespace": state.namespace, "generation": state.seq,
                "containers": state.shapes, LABELS_KEY: self._labels.sets, "pods": pods}

    def start_from_snapshot(self) -> None:
        """After the first snapshot: an empty journal (the first change held every pod: no follower needs it)."""
        self.entries.clear()
        self._encoded.clear()
        self.snapshot_due = False

    def snapshot_written(self, seq: int) -> None:
        self.state.snapshot_seq = seq
        self.snapshot_due = self.base > seq

    def journal_data(self) -> dict[str, str]:
        """The journal ConfigMap's ``data``."""
        data = self._header(self.base, self.state.seq, self._encoded)
        if self.pods_rv:
            data[PODS_RV_KEY], data[ROWS_KEY] = self.pods_rv, rows_options(self.options)
        return data

    def take_lead_in(self) -> list[dict[str, str]]:
        """The journal's ``data`` for each part of the last change but its last, in order: the writer puts each
        before ``journal_data``'s, so that a follower reads the change a part at a time. They do not say where
        the rows stand in the pods' history (``PODS_RV_KEY``): a standby that takes over between two parts
        lists the pods."""
        lead_in, self._lead_in = self._lead_in, []
        return [self._header(entry.seq - 1, entry.seq, [encoded]) for entry, encoded in lead_in]

    def _header(self, base: int, seq: int, encoded: list[str]) -> dict[str, str]:
        return {"leader": self.leader, "leaderUid": self.leader_uid, "standby": ",".join(self.standby),
                "base": str(base), "seq": str(seq), JOURNAL_KEY: "[" + ",".join(encoded) + "]"}


def journal_body(snapshot_name: str, data: dict[str, str], *, owner: dict[str, Any] | None,
                 resource_version: str = "", name: str = "") -> dict[str, Any]:
    """The journal ConfigMap, or with ``name`` the summary's (labelled like the snapshot, so one LIST by label
    reads them all; the summary also by its key, which a pod lists with its block: core/publication/blocks.py)."""
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name or journal_name(snapshot_name),
                     "labels": {"app.kubernetes.io/managed-by": "topology-agent",
                                SELECT_LABEL: select_value(snapshot_name)}},
        "data": data,
    }
    if name and name == summary_name(snapshot_name):
        body["metadata"]["labels"][PART_LABEL] = summary_key(snapshot_name)
    if owner:
        body["metadata"]["ownerReferences"] = [{**owner, "controller": False}]
    if resource_version:
        body["metadata"]["resourceVersion"] = resource_version
    return body


def journal_of(items: list[dict[str, Any]], snapshot_name: str) -> Journal | None:
    """The journal's header (who publishes, who stands by, its entries) from one LIST of the publication, without
    the snapshot; without the journal, the summary's."""
    by_name = {object_name(item): item for item in items if isinstance(item, dict)}  # any object's name, or ""
    header = by_name.get(journal_name(snapshot_name)) or by_name.get(summary_name(snapshot_name))
    return read_journal(header) if header is not None else None


def state_from(items: list[dict[str, Any]], snapshot_name: str, *, pods: bool = True,
               compare_only: bool = False, held: Mapping[str, RawPod] | None = None,
               ) -> tuple[PublishedState | None, Journal | None]:
    """The snapshot's state brought forward by the journal, from one LIST of both objects; the state is None
    when there is no snapshot yet or the journal has moved past it (read again). ``pods``: keep the pods too;
    ``compare_only`` and ``held``: see ``PublishedState.from_configmap``. Without the journal, the summary's
    header (who publishes, who stands by) is the journal: a pod in its own view lists the summary alone."""
    journal = journal_of(items, snapshot_name)
    snapshot = next((item for item in items if isinstance(item, dict) and object_name(item) == snapshot_name), None)
    state = PublishedState.from_configmap(snapshot, pods=pods, compare_only=compare_only, held=held) \
        if snapshot is not None else None
    if state is None:
        return None, journal
    if journal is not None and state.apply(journal) is None:
        return None, journal
    return state, journal


MAX_SEQ = 2**53 - 1  # the largest integer every JSON reader holds exactly (those that read numbers as doubles)
_JSON_TYPES = {str: "a string", float: "a floating-point number", bool: "a boolean", list: "a list", dict: "an object",
               type(None): "null"}


def _whole(value: Any, what: str) -> int:
    """A sequence number: a JSON integer from 0 to ``MAX_SEQ``. Out of range, the refusal names the value, so
    a sequence moved past every reader's reach is not taken for a malformed one."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise _refuse(f"{what} is not a whole number but {_JSON_TYPES.get(type(value), 'a value')}")
    if not 0 <= value <= MAX_SEQ:
        shown = str(value) if value.bit_length() <= 128 else f"of {value.bit_length()} bits"
        raise _refuse(f"{what} {shown} is out of range: a sequence number is from 0 to 2**53-1 ({MAX_SEQ}), "
                      "the largest whole number every JSON reader holds exactly")
    return value


def read_journal(configmap: dict[str, Any]) -> Journal | None:
    """The journal a ConfigMap holds, checked like any data from the API; None while it holds none."""
    data = configmap.get("data")
    if not isinstance(data, dict) or JOURNAL_KEY not in data:
        return None
    raw, leader, standby = data.get(JOURNAL_KEY), data.get("leader", ""), data.get("standby", "")
    if not isinstance(raw, str) or not isinstance(leader, str) or not isinstance(standby, str) or \
            len(raw) > MAX_JOURNAL:
        raise _refuse("the journal is not a string under 1 MiB")
    try:
        base, seq = int(data.get("base", "")), int(data.get("seq", ""))
        items = bounded_loads(raw, MAX_JOURNAL_VALUES, "the journal")
    except (ValueError, TypeError, RecursionError):
        raise _refuse("the journal does not decode") from None
    if not isinstance(items, list):
        raise _refuse("the journal is not a list")
    entries = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("put"), list) or \
                not isinstance(item.get("gone"), list) or not isinstance(item.get("shapes"), dict) or \
                not all(isinstance(n, str) for n in item["gone"]):
            raise _refuse("a journal entry has the wrong shape")
        shapes = []
        for key, shape in item["shapes"].items():
            if not key.isdigit() or not isinstance(shape, dict):
                raise _refuse("a journal entry's container shapes have the wrong shape")
            shapes.append((int(key), shape))
        sets = label_sets_of(item.get(LABELS_KEY))
        put = tuple(resolve_labels(row, sets) for row in item["put"])
        entries.append(Entry(seq=_whole(item.get("seq"), "a journal entry's seq"), put=put,
                             gone=tuple(item["gone"]), shapes=tuple(sorted(shapes, key=lambda x: x[0]))))
    if entries and (entries[0].seq != base + 1 or entries[-1].seq != seq or
                    any(b.seq != a.seq + 1 for a, b in pairwise(entries))):
        raise _refuse("the journal's sequence numbers do not follow each other")
    pods_rv, cut = data.get(PODS_RV_KEY, ""), data.get(ROWS_KEY, "")
    return Journal(leader=leader, standby=tuple(n for n in standby.split(",")[:STANDBYS] if n),
                   base=_whole(base, "base"), seq=_whole(seq, "seq"), entries=tuple(entries),
                   pods_rv=pods_rv if isinstance(pods_rv, str) and len(pods_rv) <= 64 else "",
                   rows_options=cut if isinstance(cut, str) and len(cut) <= 4096 else "")

