"""The summary's topology form: a job whose pods write where they landed (``--topology-levels``), or whose ranks follow
its Nodes' domains (``--rank-order topology``), told to a pod in its own view in a few KiB.

A pod learns its own domains from its own Node (one metadata-only GET): the summary names the levels by a digest of
their labels and names (``levels_digest``: a pod holds its own --topology-levels, which must be the leader's; the
default ten labels would be ~370 B of every read of the summary) and, when the asked order was not applied, says
why (``order_note``). Under the topology order a pod's place is not a function of
its index, so the leader, which holds every member, cuts the rank order into *blocks*: the domains of one level
(the deepest with at most ``MAX_BLOCKS`` domains), each contiguous in the order (``rank.topology_order`` keeps
every domain's members together at every level). The summary lists the blocks in rank order: member count,
process count (left off where it is the member count: one process per member) and the digest of their text; node
ranks and ranks add up from the first. It does not list their domain values, which every pod would read for
nothing: a pod lists the blocks its own domains could be in (``part_selector``: one label key per depth), each
block's text holds its values, and the summary names each block by its digest, so a pod's block is the one it
holds whose digest the summary lists and whose values begin the pod's own domains (``Layout.block_of``). In a job
of several training roles the section also lists, for each training role but the last, the blocks that hold its
members and how many (``roleBlocks``); the last role's are the rest of each block's count (a master and its
workers: one pair, not a pair per block, in a summary every pod reads at each change). Each block's members, in
rank order, are one small ConfigMap (``<job>-topology-block-<key>``, ``block_name``). A pod reads its own Node, the
summary and its own block: ~1/64 of the job, whatever its size, never every pod. The digest ties a block to the
summary that names it: a block written before or after that summary is not read as its (the pod waits for the
pair).

Inside a block the members are runs, as the index form's (summary.py): consecutive node ranks of one role, index
prefix and process count with consecutive last indices, each written ``[role, first, last, slots, prefix]`` with
the defaults left off (``last`` = ``first``, the block's usual ``slots``, no prefix); the role is its position in
the training roles. A run of one member with the role, process count and prefix of the run before it is written
as a number alone: its index less the last index of the run before (a spreading scheduler places most members
so, each its own run: a few bytes each, not a list). Ranks inside a run are ``ranks_in_run``'s, as in the index
form. A block's text holds nothing that depends on the blocks before it: its first node rank and rank, and the
members of each role before it (the ordinals a controller does not give), add up from the summary's entries, which
name each block's members per training role when the job has more than one. So a member that joins or leaves one
block changes that block's text and the summary, and leaves every other block's text (and ConfigMap) as it was.
Pure.
"""

from __future__ import annotations

import base64
import collections
import functools
import hashlib
import itertools
import json
import operator
import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.core.model import ROLE, SLOTS, Topology, member_fields, run_starts_of
from agent.core.plan.rank import ranks_in_run
from agent.core.pods.placement import Level
from agent.core.pods.validation import is_label_value
from agent.core.publication.published import bounded_loads
from agent.errors import InputError

BLOCK_KEY = "block.json"
BLOCK_SCHEMA = 3  # 3: no ``seen`` in the text (the summary's entries give each block's members per role)
MAX_BLOCKS = 64  # blocks in a summary: ~16 B each, read by every pod; a block is then ~1/64 of the members
MAX_BLOCK = 900 * 1024  # bytes of one block's text (a ConfigMap holds at most 1 MiB)
MAX_LEVELS = 16
DIGEST_CHARS = 11  # block_digest's 64 bits in base64url
_DIGEST = re.compile(f"[A-Za-z0-9_-]{{{DIGEST_CHARS}}}")
_DOMAINS = member_fields("domains")
_NUMBER = re.compile(r"[0-9]{1,10}")
PART_LABEL = "topology-agent.io/part"  # the summary's and each block's key: a pod lists its two by this label


def block_digest(text: str) -> str:
    """What the summary names a block's text by: a pod holds the blocks it reads by this, so that only the text
    its summary names is read as its block (64 bits: no writer of another text finds one with the same digest),
    in base64url: 11 characters, not 16 in hex, in a summary every pod reads."""
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()[:8]).decode().rstrip("=")


def levels_digest(levels: Sequence[Level]) -> str:
    """What the summary names its levels by: the digest of their labels and names, in order."""
    return block_digest(json.dumps([[level.label, level.name] for level in levels], separators=(",", ":")))


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, separators=(",", ":")).encode()).hexdigest()[:16]


def block_key(snapshot_name: str, values: Sequence[str]) -> str:
    """The label value (and name suffix) of the block of the domains ``values`` (outermost first)."""
    return _digest(snapshot_name, list(values))


def summary_key(snapshot_name: str) -> str:
    """The label value of the summary: a pod in its own view lists it with its block by ``PART_LABEL``."""
    return _digest(snapshot_name)


def block_name(snapshot_name: str, values: Sequence[str]) -> str:
    """``<job>-topology-block-<key>``."""
    return f"{snapshot_name}-block-{block_key(snapshot_name, values)}"


def part_selector(snapshot_name: str, domains: Sequence[str]) -> str:
    """The label selector of the summary and of every block a pod of these domains could be in (one per depth:
    which depth the leader cuts at, only the summary says)."""
    keys = [summary_key(snapshot_name), *(block_key(snapshot_name, domains[:depth])
                                          for depth in range(1, len(domains) + 1))]
    return f"{PART_LABEL} in ({','.join(keys)})"


@dataclass(frozen=True)
class Made:
    """A block as the leader makes it: its domain values, its member and process counts, its text, and its
    members per training role (in the training roles' order)."""

    values: tuple[str, ...]
    count: int
    processes: int
    text: str
    roles: tuple[int, ...] = ()

    @functools.cached_property
    def digest(self) -> str:  # read by the summary, the leader's own view and the block writer
        return block_digest(self.text)


_INDEX = member_fields("index")


class BlockMaker:
    """The blocks of one job's successive plans, held by the one that makes them (a leader's sidecar, or init): a
    plan's blocks are made once, for the leader's own files (summary.own_view) and for the summary it publishes;
    a change makes anew only the blocks whose members it altered (a member's text is ~1 us of Python: every
    block's, at each change of a 16384-pod job, would be ~27 ms)."""

    def __init__(self) -> None:
        # the blocks of the plan last made into blocks, by a reference that does not keep that plan
        self._last: tuple[weakref.ref[Topology], list[Made] | None] | None = None
        # each block last made, by its domain values, with what its text was made of (the training roles, and
        # each member's role, index and process count)
        self._kept: dict[tuple[str, ...], tuple[tuple[tuple[str, ...], list[list[Any]]], Made]] = {}

    def make(self, topology: Topology) -> list[Made] | None:
        """The blocks of a topology-ordered plan, in rank order; None when they cannot state it: a training
        member without an index or its domains, more than ``MAX_BLOCKS`` domains at every level, or a block too
        large for a ConfigMap. The passes over every member are C-level (the publisher makes them at each change
        that alters the summary: a Python loop per member would cost ~0.4 s at 16384 pods)."""
        if self._last is not None and self._last[0]() is topology:
            return self._last[1]
        made = self._make(topology)
        self._last = (weakref.ref(topology), made)
        return made

    def _make(self, topology: Topology) -> list[Made] | None:
        training, levels = topology.training, topology.levels
        paths = list(map(_DOMAINS, training))
        if topology.rank_order != "topology" or not training or not levels or None in paths:
            return None
        distinct = set(paths)  # a few hundred at most where MAX_BLOCKS is met: the depth is sought among these
        depth = next((d for d in range(len(levels), 0, -1) if len({p[:d] for p in distinct}) <= MAX_BLOCKS), 0)
        if not depth:
            return None
        prefix = {p: p[:depth] for p in distinct}
        keys = list(map(prefix.__getitem__, paths))
        positions = range(1, len(training))
        cuts = [0, *itertools.compress(positions, map(operator.ne, keys[1:], keys[:-1])), len(training)]
        if len(cuts) - 1 != len(set(keys)):  # a domain in two places: not the topology order
            return None
        said = (list(map(ROLE, training)), list(map(_INDEX, training)), list(map(SLOTS, training)))
        roles = topology.training_roles
        kept, self._kept = self._kept, {}
        made: list[Made] = []
        for start, stop in itertools.pairwise(cuts):
            members = [each[start:stop] for each in said]  # what its text says of its members
            carried = kept.get(keys[start])
            block = carried[1] if carried is not None and carried[0] == (roles, members) else \
                _block(training[start:stop], keys[start], roles)
            if block is None:
                return None
            self._kept[keys[start]] = ((roles, members), block)
            made.append(block)
        return made


def _block(members: Sequence[Any], values: tuple[str, ...], training_roles: tuple[str, ...]) -> Made | None:
    """The block of ``members`` (training members in rank order); None when one has no index, or when its text is
    too large for a ConfigMap. Its runs are its own (``run_starts_of``): only the blocks a change altered are made,
    so the runs of the whole job are not sought at each change (~10 ms at 16384 pods)."""
    starts = run_starts_of(members)
    if starts is None:
        return None
    position = {role: at for at, role in enumerate(training_roles)}
    sizes = collections.Counter(map(SLOTS, members))
    slots = sizes.most_common(1)[0][0]
    entries: list[Any] = []
    before: tuple[Any, ...] | None = None  # the run before: role, slots, prefix, last index
    for start, stop in zip(starts, [*starts[1:], len(members)], strict=True):
        first, last = members[start], members[stop - 1]
        entry: list[Any] = [position[first.role], first.index[-1], last.index[-1], first.slots,
                            list(first.index[:-1])]
        if before is not None and entry[1] == entry[2] and before[:3] == (entry[0], entry[3], entry[4]):
            entries.append(entry[1] - before[3])  # one member, as the run before: its index's step
        else:
            while len(entry) > 2 and entry[-1] == [entry[1], entry[1], slots, []][len(entry) - 2]:
                entry.pop()  # the defaults left off, from the end
            entries.append(entry)
        before = (position[first.role], first.slots, list(first.index[:-1]), last.index[-1])
    text = json.dumps({"schema": BLOCK_SCHEMA, "values": list(values), "slots": slots, "members": entries},
                      separators=(",", ":"))
    if len(text) > MAX_BLOCK:
        return None
    roles = collections.Counter(map(ROLE, members))
    return Made(values, len(members), sum(size * count for size, count in sizes.items()), text,
                tuple(roles[role] for role in training_roles))


def topology_section(topology: Topology, blocks: list[Made] | None) -> dict[str, Any]:
    """The summary's ``topology``: the levels' digest, the order applied and why not the one asked, and
    the blocks (topology order), with the members per block of each training role but the last (``roleBlocks``)
    when the job has more than one (with one, a block's count says it)."""
    entries = [[block.count, *([block.processes] if block.processes != block.count else []), block.digest]
               for block in blocks or ()]  # processes left off where there is one per member
    several = blocks is not None and len(topology.training_roles) > 1
    return {"levelsDigest": levels_digest(topology.levels), "order": topology.rank_order,
            "note": topology.order_note, **({"blocks": entries_text(entries)} if blocks is not None else {}),
            **({"roleBlocks": _role_blocks(blocks or [])} if several else {})}


def entries_text(entries: list[list[Any]]) -> str:
    """The summary's block entries as one line of text: ``count[,processes],digest``, the entries apart by ``;``.
    No count or base64url digest holds ``,`` or ``;``; as JSON lists each entry's two quotes would be escaped in
    the ConfigMap's data."""
    return ";".join(",".join(map(str, entry)) for entry in entries)


def text_entries(text: Any) -> list[list[Any]]:
    """``entries_text``'s entries as lists, their numbers as int (the digests are checked by ``read_layout``). An
    entry that is not numbers then one more field (one with domain values, ``shared/value/...`` first: another
    release's form) is refused, never read as this one."""
    if not isinstance(text, str) or not text or len(text) > 64 * 1024:
        raise _refuse("the topology order without its blocks")
    entries: list[list[Any]] = []
    for item in text.split(";"):
        fields = item.split(",")
        if not 2 <= len(fields) <= 3 or not all(map(_NUMBER.fullmatch, fields[:-1])):
            raise _refuse(f"a block is {item[:60]!r}, not count,processes,digest")
        entries.append([*map(int, fields[:-1]), fields[-1]])
    return entries


def _role_blocks(blocks: list[Made]) -> list[list[list[int]]]:
    """For each training role but the last, the blocks that hold its members: [position, members]."""
    roles = len(blocks[0].roles) if blocks else 0
    return [[[at, block.roles[k]] for at, block in enumerate(blocks) if block.roles[k]] for k in range(roles - 1)]


@dataclass(frozen=True)
class Entry:
    """One block as the summary lists it: its members per training role (``roles``) and those of the blocks
    before it (``seen``), in the training roles' order. Its domain values are in its text (``Layout.block_of``)."""

    node_rank: int
    first_rank: int
    count: int
    processes: int
    digest: str
    roles: tuple[int, ...]
    seen: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """The summary's topology section, read: ``levels`` is the levels' digest (``levels_digest``)."""

    levels: str
    order: str
    note: str | None
    blocks: tuple[Entry, ...] = ()

    def block_of(self, domains: Sequence[str], held: Mapping[str, str]) -> tuple[Entry, dict[str, Any]] | None:
        """The block of a pod of ``domains`` (its Node's value at each of its levels): among the blocks it holds
        (``held``: their texts by digest; at most one per depth), the one whose digest this summary lists and
        whose values begin ``domains``, with its text read (``read_block``); None while the pod holds none."""
        found = []
        for entry in self.blocks:
            text = held.get(entry.digest)
            if text is not None:
                raw = read_block(text, entry, levels=len(domains))
                if tuple(domains[:len(raw["values"])]) == tuple(raw["values"]):
                    found.append((entry, raw))
        if len(found) > 1:
            raise _refuse(f"it lists {len(found)} blocks of this pod's domains, not one")
        return found[0] if found else None


def _refuse(what: str) -> InputError:
    return InputError(f"the published summary is not valid ({what}); this pod reads the whole topology instead")


def _number(value: Any, what: str, *, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= 2**31 - 1:
        raise _refuse(f"{what} is {str(value)[:40]}")
    return value


def _role_counts(raw: dict[str, Any], counts: list[int], roles: int) -> list[tuple[int, ...]]:
    """Each block's members per training role: from ``roleBlocks`` with several roles (the last role's are the
    rest of the block's count), each block's count with one. A section with ``roleCounts`` (every role's members
    of every block: another release's form) is refused, never read as this one."""
    if "roleCounts" in raw:
        raise _refuse("roleCounts, of a leader of another release: not this summary's roleBlocks")
    if roles == 1:
        if "roleBlocks" in raw:
            raise _refuse("roleBlocks for one training role")
        return [(count,) for count in counts]
    listed = raw.get("roleBlocks")
    if not isinstance(listed, list) or len(listed) != roles - 1 or not all(
            isinstance(pairs, list) and len(pairs) <= len(counts) for pairs in listed):
        raise _refuse(f"roleBlocks is not the blocks of each of the {roles} training roles but the last")
    out = [[0] * roles for _ in counts]
    for k, pairs in enumerate(listed):
        last = -1
        for pair in pairs:
            if not isinstance(pair, list) or len(pair) != 2:
                raise _refuse("a role's block is not [position, members]")
            at, members = _number(pair[0], "a block's position"), _number(pair[1], "a block's members of a role",
                                                                          low=1)
            if not last < at < len(counts):
                raise _refuse(f"roleBlocks names block {at} out of order or past the last")
            out[at][k], last = members, at
    for count, each in zip(counts, out, strict=True):
        if sum(each) > count:
            raise _refuse(f"a block's members per role make {sum(each)}, more than its count {count}")
        each[-1] = count - sum(each)
    return [tuple(each) for each in out]


def read_layout(raw: Any, *, nnodes: int, processes: int, roles: int) -> Layout:
    """The summary's topology section, checked: the levels' digest, and the blocks one after another from node
    rank 0 to ``nnodes`` (their first ranks rising to ``processes``), each digest once, their members per role
    (``roles`` training roles) adding up to their counts. A section that lists the levels (``levels``: another
    release's form) is refused, never read as this one."""
    if not isinstance(raw, dict) or "levels" in raw or raw.get("order") not in ("index", "topology"):
        raise _refuse("topology is not {levelsDigest, order, note, blocks}")
    levels = raw.get("levelsDigest")
    if not isinstance(levels, str) or len(levels) != DIGEST_CHARS:
        raise _refuse(f"the levels' digest is {str(levels)[:40]}")
    note = raw.get("note")
    if note is not None and not (isinstance(note, str) and len(note) <= 1024 and note.isprintable()):
        raise _refuse("the order's note is not a line of text")
    if raw["order"] == "index":
        if "blocks" in raw:
            raise _refuse("blocks for the index order")
        return Layout(levels, "index", note)
    blocks_raw = text_entries(raw.get("blocks"))
    if note is not None or not 0 < len(blocks_raw) <= MAX_BLOCKS:
        raise _refuse("the topology order without its blocks")
    for item in blocks_raw:
        if not _DIGEST.fullmatch(item[-1]):
            raise _refuse(f"a block's digest is {item[-1][:40]!r}, not {DIGEST_CHARS} base64url characters")
    per_role = _role_counts(raw, [_number(item[0], "a block's count", low=1) for item in blocks_raw], roles)
    blocks: list[Entry] = []
    node_rank = first_rank = 0
    seen = (0,) * roles
    for item, counts in zip(blocks_raw, per_role, strict=True):
        count = item[0]
        run = _number(item[1], "a block's processes", low=count) if len(item) == 3 else count
        entry = Entry(node_rank, first_rank, count, run, item[-1], counts, seen)
        blocks.append(entry)
        node_rank, first_rank = node_rank + entry.count, first_rank + entry.processes
        seen = tuple(map(operator.add, seen, counts))
    if node_rank != nnodes or first_rank != processes or len({b.digest for b in blocks}) != len(blocks):
        raise _refuse(f"the blocks make {node_rank} pods and {first_rank} processes, not {nnodes} and {processes}, "
                      "or name a block twice")
    return Layout(levels, "topology", None, tuple(blocks))


def _run(item: Any, before: tuple[int, int, tuple[int, ...], int] | None, usual: int,
         roles: int) -> tuple[int, int, int, int, tuple[int, ...]]:
    """A block's member entry as (role, first, last, slots, prefix): a list, or a number (one member as the run
    ``before``, its index that many past that run's last)."""
    if isinstance(item, int) and not isinstance(item, bool):
        if before is None:
            raise _refuse("a block's first member is a number, not [role, first, last, slots, prefix]")
        at, slots, prefix, last = before
        index = _number(last + item, "a block's index")
        return at, index, index, slots, prefix
    if not isinstance(item, list) or not 2 <= len(item) <= 5:
        raise _refuse("a block's member is not [role, first, last, slots, prefix]")
    at, first = _number(item[0], "a block's role"), _number(item[1], "a block's index")
    last = _number(item[2], "a block's index") if len(item) > 2 else first
    slots = _number(item[3], "a block's slots", low=1) if len(item) > 3 else usual
    raw_prefix = item[4] if len(item) > 4 else []
    if at >= roles or last < first or not isinstance(raw_prefix, list) or len(raw_prefix) > 4:
        raise _refuse(f"a block's member is {str(item)[:60]}")
    return at, first, last, slots, tuple(_number(p, "a block's index") for p in raw_prefix)


@dataclass(frozen=True)
class Place:
    """A member's numbers from its block: NODE_RANK, RANK, ordinal and process count."""

    node_rank: int
    first_rank: int
    ordinal: int
    slots: int


def read_block(text: str, entry: Entry, *, levels: int) -> dict[str, Any]:
    """The text of the block the summary lists as ``entry``, read: of its digest, this format, its domain values
    label values no more than ``levels`` (the pod's). ``InputError`` for anything else."""
    if len(text) > MAX_BLOCK or block_digest(text) != entry.digest:
        raise _refuse("its block is not the one the summary names")
    try:
        raw = bounded_loads(text, 6 * entry.count + 64 + len(entry.seen), "a block")
    except ValueError as err:
        raise _refuse(f"a block is not JSON: {err}") from None
    if not isinstance(raw, dict) or raw.get("schema") != BLOCK_SCHEMA or not isinstance(raw.get("members"), list):
        raise _refuse("a block is not the one its summary lists")
    values = raw.get("values")
    if not isinstance(values, list) or not 0 < len(values) <= MAX_LEVELS \
            or not all(isinstance(v, str) and is_label_value(v) for v in values):
        raise _refuse(f"a block's values are {str(values)[:60]}, not label values")
    if len(values) > levels:
        raise _refuse("its blocks are deeper than its levels")
    return raw


def place_in_block(raw: dict[str, Any], entry: Entry, training_roles: Sequence[str], role: str,
                   index: tuple[int, ...], *, domains: Sequence[str], ordinal: int = -1) -> Place | None:
    """Where the member of ``role`` and ``index`` (on a Node of ``domains``) is in the block listed as ``entry``
    (``raw``: its text read by ``read_block``), or None when the block does not hold it. ``InputError`` when the
    block is not of these domains, or does not add up to its entry."""
    if tuple(domains[:len(raw["values"])]) != tuple(raw["values"]) or len(entry.seen) != len(training_roles):
        raise _refuse("a block is not the one its summary lists")
    usual = _number(raw.get("slots"), "a block's slots", low=1)
    seen = dict(zip(training_roles, entry.seen, strict=True))
    node_rank, first_rank, found = entry.node_rank, entry.first_rank, None
    before: tuple[int, int, tuple[int, ...], int] | None = None  # the run before: role, slots, prefix, last index
    for item in raw["members"]:
        at, first, last, slots, prefix = _run(item, before, usual, len(training_roles))
        before = (at, slots, prefix, last)
        run_role, count = training_roles[at], last - first + 1
        if found is None and run_role == role and index[:-1] == prefix and first <= index[-1] <= last:
            found = Place(*ranks_in_run(node_rank=node_rank, first_rank=first_rank, slots=slots,
                                        seen=seen.get(run_role, 0), offset=index[-1] - first, ordinal=ordinal),
                          slots)
        node_rank, first_rank = ranks_in_run(node_rank=node_rank, first_rank=first_rank, slots=slots, seen=0,
                                             offset=count)[:2]
        seen[run_role] = seen.get(run_role, 0) + count
    if node_rank != entry.node_rank + entry.count or first_rank != entry.first_rank + entry.processes:
        raise _refuse(f"a block makes {node_rank - entry.node_rank} pods, not {entry.count}")
    if tuple(seen[role] - before for role, before in zip(training_roles, entry.seen, strict=True)) != entry.roles:
        raise _refuse("a block's members per role are not the ones its summary lists")
    return found
