"""Topology and variables -> the bytes of every file the agent writes. Pure: the writer does the I/O.

File formats are the consumers' own: ``torch.env`` is POSIX sh (``export KEY='value'``, so a value from pod
data such as ``$(rm -rf /)`` stays inert text); ``hostfile`` is DeepSpeed's and OpenMPI's
``<host> slots=<n>`` (``slots``, plural: DeepSpeed's parser rejects ``slot=``); ``<task>.host`` files are
Volcano's one-host-per-line lists; ``topology.json`` is the machine-readable whole.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import operator
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from agent.core.files.variables import Variable, host_file_name
from agent.core.jsonstream import decode_streamed
from agent.core.model import ADDRESS, RUNNING, SLOTS, Member, Topology, member_fields, member_span
from agent.core.plan.grouping import key_of_document
from agent.core.plan.layout import Plan
from agent.core.pods.placement import Level

if TYPE_CHECKING:
    from agent.core.files.frameworks.base import Rendition

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TOPOLOGY_SCHEMA = 1


def shell_quote(value: str) -> str:
    """Single-quote for sh: nothing inside single quotes is expanded, and ' is closed, escaped, reopened."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


def render_env(variables: Sequence[Variable], *, name: str = "torch.env", notes: Sequence[str] = ()) -> str:
    """``name``: the file's own name, for the line that says how to source it; ``notes``: comment lines."""
    lines = [f"# Written by topology-agent. Source it: . /shared/{name}", *(f"# {n}" for n in notes)]
    for var in variables:
        if not var.written:
            continue
        if not _NAME.match(var.name):  # pragma: no cover - names are built from env_key()
            raise ValueError(var.name)
        if var.unset:
            lines.append(f"unset {var.name}")
            continue
        value = f'"{var.value}"' if var.reference else shell_quote(var.value)
        lines.append(f"export {var.name}={value}")
    return "\n".join(lines) + "\n"


def _lines(members: Sequence[Member], tail: str, slots: frozenset[int] | None = None,
           addresses: Sequence[str] | None = None) -> str:
    """``<address><tail>\n`` per member, with ``:<slots>``/`` slots=<slots>`` in ``tail`` ("{}" stands for the
    slots; ``slots``: the members' process counts when known; ``addresses``: theirs, when known). When every
    member has the same slots (the common case) one C-level join makes it."""
    if not members:
        return ""
    if slots is None:
        slots = frozenset(map(SLOTS, members))
    if len(slots) == 1:
        end = tail.format(next(iter(slots))) + "\n"
        return end.join(addresses if addresses is not None else map(ADDRESS, members)) + end
    return "".join(f"{m.address}{tail.format(m.slots)}\n" for m in members)


def hosts_lines(topology: Topology, tail: str) -> str:
    """``<address><tail>\n`` per training member, each address once (``{}`` in ``tail``: its slots); in an own
    view that lists the hosts, from the summary (``Topology.summary_hosts``)."""
    listed = topology.summary_hosts if topology.whole is not None else None
    if listed is not None:
        addresses, slots = listed
        sizes = set(slots)
        if len(sizes) == 1:
            end = tail.format(next(iter(sizes))) + "\n"
            return end.join(addresses) + end
        return "".join(f"{address}{tail.format(size)}\n" for address, size in zip(addresses, slots, strict=True))
    hosts = topology.hosts
    return _lines(hosts, tail, topology.slot_sizes if hosts is topology.training else None, topology.host_addresses)


def render_hostfile(topology: Topology) -> str:
    return hosts_lines(topology, " slots={}")


def hosts_digest(topology: Topology) -> str:
    """What an own view's host lists say, in topology.json (``"hosts"``): a change of them is a new generation
    even where no variable changes (a pod left and another came, between two summaries). Of the hosts and their
    process counts (``Topology.summary_hosts``, computed once per plan), not of the rendered file."""
    listed = topology.summary_hosts
    addresses, slots = listed if listed is not None else ((), ())
    text = "\n".join(addresses) + "\n" + ",".join(map(str, slots))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def render_role_hosts(topology: Topology) -> dict[str, str]:
    """Volcano's ``<role>.host``: one address per line, in index order (as Volcano's svc plugin writes them, and
    as VC_<ROLE>_HOSTS lists them), whatever the rank order."""
    files = {}
    for role in topology.roles:
        hosts = topology.index_addresses(role) or ()
        files[host_file_name(role)] = "\n".join(hosts) + "\n" if hosts else ""
    return files


def _member_json(member: Member, levels: Sequence[Level] = ()) -> dict[str, Any]:
    return {**_member_head_json(member), "domains": _domains_json(member.domains, levels)}


def _member_head_json(member: Member) -> dict[str, Any]:
    """A member's topology.json entry but its domains (which come last: ``_domains_json``)."""
    return {
        "name": member.name,
        "role": member.role,
        "index": list(member.index),
        "ordinal": member.ordinal,
        "address": member.address,
        "dnsName": member.dns_name,
        "ip": member.ip,
        "training": member.training,
        "slots": member.slots,
        "nodeRank": member.node_rank,
        "rank": member.first_rank,
        "running": member.running,
        "node": member.node,
    }


def _domains_json(domains: tuple[str, ...] | None, levels: Sequence[Level]) -> dict[str, str] | None:
    return None if domains is None or not levels else \
        {level.name.lower(): value for level, value in zip(levels, domains, strict=True)}


def topology_document(plan: Plan, variables: Sequence[Variable], *, generation: int, members: bool = True,
                      frameworks: Sequence[Rendition] = ()) -> dict[str, Any]:
    topo = plan.topology
    training = topo.training
    return {
        "schema": TOPOLOGY_SCHEMA,
        "generation": generation,
        "controller": topo.controller,
        "namespace": topo.namespace,
        "job": topo.job,
        "jobUid": topo.job_uid,
        "self": topo.self_name,
        "trainingRoles": list(topo.training_roles),
        "masterAddr": training[0].address if training else None,
        "masterPort": plan.master_port if training else None,
        # Two worlds, named apart: the training pods (torch.env's WORLD_SIZE, the world of a trainer started
        # without a launcher) and their processes (the world torchrun, deepspeed or mpirun forms from the slots).
        "nnodes": topo.nnodes,
        "processes": topo.processes,
        "topology": {"levels": [{"name": level.name.lower(), "label": level.label} for level in topo.levels],
                     "rankOrder": topo.rank_order, "note": topo.order_note},
        "members": [_member_json(m, topo.levels) for m in topo.members] if members else [],
        **({"view": "own"} if topo.whole is not None else {}),
        **({"hosts": hosts_digest(topo)} if topo.whole is not None and topo.whole.hosts else {}),
        "excluded": [{"name": e.name, "reason": e.reason} for e in topo.excluded],
        **(spares_document(topo) if topo.world_size is not None else {}),
        "env": {v.name: v.value for v in variables if v.written and not v.unset},
        **({"frameworks": {r.key: r.document() for r in frameworks}} if frameworks else {}),
        # --replica-groups: the members above are this pod's group's world; every group of the job is listed here
        **({"replicaGroups": plan.groups.document()} if plan.groups is not None else {}),
    }


def spares_document(topology: Topology) -> dict[str, Any]:
    """``--world-size``: the world's size asked for, whether this pod is a spare, the spares (in the order they
    would be promoted) and the promoted spares with the node rank each holds and the pod it replaced."""
    return {"worldSize": topology.world_size, "spare": topology.is_spare,
            "spares": [{"name": m.name, "address": m.address, "node": m.node} for m in topology.spares],
            "takeovers": [{"name": t.name, "nodeRank": t.node_rank, "replaced": t.replaced}
                          for t in topology.takeovers]}


# A member's entry: the member, its topology.json text in two parts (the head, all but its domains: its own
# bytes; the tail, its domains and the closing brace: one object for every member of those domains) and its
# membership key (``_KEY_FIELDS``), read through these names. A plain tuple: when members move, zip makes thousands
# in one C-level pass, where a NamedTuple is made in about four times the time.
Entry = tuple[Member, bytes, bytes]
_MEMBER, _TEXT, _TAIL = (operator.itemgetter(field) for field in range(3))
_NAME_OF = member_fields("name")
_BEFORE_RANKS, _AFTER_RANKS = member_span(None, "node_rank"), member_span("running", None)
_NODE_RANK_OF, _RANK_OF = member_fields("node_rank"), member_fields("first_rank")
# The three parts of a ``bytes.partition``: the text before the separator, the separator if found, the text after.
_BEFORE, _FOUND, _AFTER = (operator.itemgetter(part) for part in range(3))
_NODE_RANK, _RUNNING = b'"nodeRank": ', b', "running": '
_RANKS = b'%s"nodeRank": %d, "rank": %d, "running": %s'  # a text's head, its two ranks and its tail
RERANK_FROM = 256  # moved members from which the bulk pass pays (a dict of the last generation by name)
# Members whose texts are cut apart at once: every moved member's pieces at once were ~0.7 KB each, ~11 MB over
# what the change holds when a pod near the start of a 16384-pod job leaves.
RERANK_CHUNK = 1024


def _reranked(entries: Sequence[Entry], members: Sequence[Member]) -> tuple[list[int], list[Entry]]:
    """Where ``members[i]`` is the member of ``entries[i]`` but for ``node_rank`` and ``first_rank`` (both numbers), its
    entry, the old text with the two numbers replaced: the places i and their entries. In C-level passes: a pod that
    leaves a 16384-pod job moves every member after it, and encoding them one by one was most of such a change. Every
    value before ``"nodeRank": `` is a number, a literal or an escaped string, so its first occurrence is the key, and
    only the two numbers stand between it and ``, "running": ``."""
    olds = list(map(_MEMBER, entries))  # the domains are among the fields compared: the tails stand
    same = map(operator.and_, map(operator.eq, map(_BEFORE_RANKS, olds), map(_BEFORE_RANKS, members)),
               map(operator.eq, map(_AFTER_RANKS, olds), map(_AFTER_RANKS, members)))
    numbered = map(operator.and_, map(operator.is_not, map(_NODE_RANK_OF, members), itertools.repeat(None)),
                   map(operator.is_not, map(_RANK_OF, members), itertools.repeat(None)))
    places = list(itertools.compress(range(len(members)), map(operator.and_, same, numbered)))
    placed: list[int] = []
    found: list[Entry] = []
    for at in range(0, len(places), RERANK_CHUNK):  # each chunk's pieces let go before the next is cut
        chunk = places[at:at + RERANK_CHUNK]
        new = list(map(members.__getitem__, chunk))
        old_entries = list(map(entries.__getitem__, chunk))
        heads = list(map(bytes.partition, map(_TEXT, old_entries), itertools.repeat(_NODE_RANK)))
        tails = list(map(bytes.partition, map(_AFTER, heads), itertools.repeat(_RUNNING)))
        if not (all(map(_FOUND, heads)) and all(map(_FOUND, tails))):
            return [], []  # not a text of ours: encoded member by member
        texts = list(map(_RANKS.__mod__, zip(map(_BEFORE, heads), map(_NODE_RANK_OF, new), map(_RANK_OF, new),
                                             map(_AFTER, tails), strict=True)))
        placed += chunk
        found += zip(new, texts, map(_TAIL, old_entries), strict=True)
    return placed, found


class MemberTexts:
    """Each member's topology.json text (as bytes: the file is joined from them without a 4.5 MB encode at 16384
    pods) between the sidecar's generations, found by the member object's identity (its id; the entry holds the
    member, so no other object can take that id while the entry lives): a C-level lookup per member, where hashing
    4096 members by value would cost 5 ms per change. A member equal to the last one at its place but a new object
    (a plan made from scratch) keeps that text, and a member that only moved in rank (a pod before it left or came
    back: every later member) gets its last text with the two numbers replaced (``_reranked``), not encoded again.
    Entries of earlier generations are let go at each change that moves members: one generation of texts held, not
    two. The last lookup is kept: the same members' texts asked again (the document served) take no pass."""

    def __init__(self) -> None:
        self._by_id: dict[int, Entry] = {}
        self._last: _Looked | None = None
        self._tails: dict[tuple[str, ...] | None, bytes] = {}  # by domains, for ``_levels``
        self._levels: Sequence[Level] = ()

    def _entries(self, members: Sequence[Member], levels: Sequence[Level]) -> _Looked:
        last = self._last
        if last is not None and last.members is members:
            return last
        entries: list[Any]  # None where a member is yet to be found
        reranked = False
        if last is not None and len(last.members) == len(members):
            # Most changes keep every member in its place: compare the two tuples' pointers (no member is
            # touched) and look up only the places that changed; a lookup of all 16384 is ~4 ms of cache misses.
            moved = list(itertools.compress(range(len(members)), map(operator.is_not, members, last.members)))
            if len(moved) >= RERANK_FROM:  # a burst (every pod Running): each last entry let go as it is replaced
                reranked = True
                entries = last.entries
                self._last, self._by_id = None, {}
                del last  # its members and texts with it: each place's last entry is held by ``entries`` alone
                self._replace(entries, moved, members, levels)
                texts, tails = list(map(_TEXT, entries)), list(map(_TAIL, entries))
            else:
                entries, texts, tails = list(last.entries), list(last.texts), list(last.tails)
                self._replace(entries, moved, members, levels)
                for at in moved:
                    texts[at], tails[at] = _TEXT(entries[at]), _TAIL(entries[at])
        else:
            entries = list(map(self._by_id.get, map(id, members)))  # C-level; None for the members new since
            moved = list(itertools.compress(range(len(entries)), map(operator.is_, entries, itertools.repeat(None))))
            if last is not None and len(moved) >= RERANK_FROM:  # a pod joined or left: the members after it moved
                reranked = True
                before = self._let_go(last)
                del last  # the last generation's entries are now held by ``before`` alone
                self._rerank(entries, moved, members, before)
            for at in moved:
                if entries[at] is None:
                    entries[at] = self._entry(members[at], levels)
            texts, tails = list(map(_TEXT, entries)), list(map(_TAIL, entries))
        if moved and (reranked or len(self._by_id) > len(members) + 64):  # let go of earlier generations' members
            self._by_id = {id(m): e for m, e in zip(members, entries, strict=True)}
        self._last = _Looked(members, entries, texts, tails)
        return self._last

    def _replace(self, entries: list[Entry], moved: list[int], members: Sequence[Member],
                 levels: Sequence[Level]) -> None:
        """Each ``moved`` place's entry made over the last one; a member equal to the last one at its place keeps
        that text and key. In a burst the cache was emptied first, so each last entry is freed as its place is
        made: a burst that changes every member would otherwise hold two generations of texts at once, ~12 MB over
        what a change of a 16384-pod job holds."""
        for at in moved:
            member, last = members[at], entries[at]
            if _MEMBER(last) == member:
                entries[at] = self._by_id[id(member)] = (member, _TEXT(last), _TAIL(last))
            else:
                entries[at] = self._entry(member, levels)

    def _let_go(self, last: _Looked) -> dict[str, Entry]:
        """The last generation's entries by member name, now held there alone: the cache is emptied (and made
        again from the new generation's entries), so that each moved member's last entry is freed as soon as its
        new one is made (``_rerank``). Every moved member's last and new text at once were ~9 MB over what a change
        holds at 16384 pods, when a pod near the start of the job leaves."""
        before = dict(zip(map(_NAME_OF, last.members), last.entries, strict=True))
        self._last, self._by_id = None, {}
        return before

    def _rerank(self, entries: list[Any], moved: list[int], members: Sequence[Member],
                before: dict[str, Entry]) -> None:
        """Fill ``entries`` at the ``moved`` places whose pod's last entry (in ``before``, taken out of it)
        differs only in its ranks (``_reranked``), ``RERANK_CHUNK`` places at a time."""
        for at in range(0, len(moved), RERANK_CHUNK):
            chunk = moved[at:at + RERANK_CHUNK]
            new = list(map(members.__getitem__, chunk))
            olds = list(map(before.pop, map(_NAME_OF, new), itertools.repeat(None)))
            known = list(itertools.compress(range(len(new)), olds))  # pods that were members: not None
            places, found = _reranked(cast("list[Entry]", list(itertools.compress(olds, olds))),
                                      list(itertools.compress(new, olds)))
            for place, entry in zip(places, found, strict=True):
                entries[chunk[known[place]]] = entry

    def _entry(self, member: Member, levels: Sequence[Level]) -> Entry:
        """The member's entry, found by identity, else encoded (and remembered)."""
        entry = self._by_id.get(id(member))
        if entry is None:
            head = json.dumps(_member_head_json(member))[:-1].encode()  # open: its domains close it
            entry = self._by_id[id(member)] = (member, head, self._tail(member.domains, levels))
        return entry

    def _tail(self, domains: tuple[str, ...] | None, levels: Sequence[Level]) -> bytes:
        """The text after a member's head: its domains and the closing brace, one object per distinct domains (a
        member's entry with the domains of ten levels was ~520 bytes, ~200 of them the domains)."""
        if levels != self._levels:
            self._tails, self._levels = {}, levels
        tail = self._tails.get(domains)
        if tail is None:
            tail = self._tails[domains] = f', "domains": {json.dumps(_domains_json(domains, levels))}}}'.encode()
        return tail

    def texts(self, members: Sequence[Member], levels: Sequence[Level]) -> tuple[list[bytes], list[bytes]]:
        """Each member's text as two lists, place by place: the heads and the tails (``Entry``); a member's text
        is its head and its tail joined."""
        looked = self._entries(members, levels)
        return looked.texts, looked.tails


class _Looked(NamedTuple):
    """One generation's members and, place by place, their entries and texts (the next is patched)."""

    members: Sequence[Member]
    entries: list[Entry]
    texts: list[bytes]
    tails: list[bytes]


def render_topology_json(plan: Plan, variables: Sequence[Variable], *, generation: int,
                         texts: MemberTexts | None = None, frameworks: Sequence[Rendition] = ()) -> bytes:
    """topology.json's bytes: ``topology_json_parts`` joined."""
    return b"".join(topology_json_parts(plan, variables, generation=generation, texts=texts, frameworks=frameworks))


def topology_json_parts(plan: Plan, variables: Sequence[Variable], *, generation: int,
                        texts: MemberTexts | None = None, frameworks: Sequence[Rendition] = ()) -> list[bytes]:
    """topology.json in parts, one after another: the members' texts as ``texts`` keeps them, so the sidecar
    writes the file without joining it (4.6 MB at 16384 pods). One line of JSON (the C encoder is ~20x faster
    than indent=2). ``texts`` keeps each member's JSON between the sidecar's evaluations: encoding the member
    objects would take 15 ms a change at 4096 pods. Without it, members are encoded 1024 at a time: one dict per
    member of a 16384-pod job at once would be ~20 MB of init's peak. The parts joined are exactly ``json.dumps``
    of the whole document (ASCII: it escapes the rest)."""
    document = topology_document(plan, variables, generation=generation, members=False, frameworks=frameworks)
    document["members"] = []
    head = json.dumps(document)
    # Keys and strings before "members" are JSON-escaped, so the first '"members": []' is the key itself.
    before, _, after = head.partition('"members": []')
    topo = plan.topology
    if texts is None:  # one-shot (render, init): an encoder call per 1024 members, not one member dict per pod
        listed = [json.dumps([_member_json(m, topo.levels) for m in topo.members[at:at + 1024]])[1:-1].encode()
                  for at in range(0, len(topo.members), 1024)]
        parts = [b", "] * (2 * len(listed) + 1) if listed else [b"", b""]
        parts[1:-1:2] = listed
    else:  # each member's head, its tail, a comma
        heads, tails = texts.texts(topo.members, topo.levels)
        parts = [b", "] * (3 * len(heads) + 1) if heads else [b"", b""]
        parts[1::3], parts[2::3] = heads, tails
    parts[0], parts[-1] = before.encode() + b'"members": [', b"]" + after.encode() + b"\n"
    return parts


def render_discover_hosts(topology: Topology) -> str:
    """Horovod elastic's ``--host-discovery-script``: prints ``host:slots`` for each training pod that can run a
    process now (phase Running, and this pod itself), as the MPI operator's discover_hosts.sh lists only
    Running pods (updateDiscoverHostsInConfigMap, pkg/controller/mpi_job_controller.go, v0.5.0+); each address
    once, as in the hostfile."""
    hosts, addresses = topology.hosts, topology.host_addresses
    running = list(map(RUNNING, hosts))
    if not all(running):
        hosts, addresses = tuple(itertools.compress(hosts, running)), tuple(itertools.compress(addresses, running))
    sizes = topology.slot_sizes
    lines = _lines(hosts, ":{}", sizes if len(sizes) == 1 else None,  # the running pods' sizes: one if all have one
                   addresses)
    return f"#!/bin/sh\n# Written by topology-agent: live training pods as host:slots.\ncat <<'EOF'\n{lines}EOF\n"


MARKERS = ("topology.json", "generation")  # written last, in this order: a reader that sees them sees the rest
EXECUTABLE = frozenset({"discover_hosts.sh"})


class Files(Mapping[str, bytes]):
    """One generation's files by name, in write order, each held as parts (topology.json: the members' texts as
    ``MemberTexts`` keeps them, and what stands between them). Read, a file is its parts joined; ``parts`` gives
    them to the writer, which writes them one after another: no file of the sidecar's is joined to be written."""

    __slots__ = ("_parts",)

    def __init__(self, parts: Mapping[str, Sequence[bytes]]) -> None:
        self._parts = dict(parts)

    def __getitem__(self, name: str) -> bytes:
        return b"".join(self._parts[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)

    def parts(self) -> dict[str, Sequence[bytes]]:
        """Each file's parts by name, in write order (a new dict: the caller may add and remove names)."""
        return dict(self._parts)


def render_files(plan: Plan, variables: Sequence[Variable], *, generation: int, texts: MemberTexts | None = None,
                 frameworks: Sequence[Rendition] = ()) -> Files:
    """Every file of one generation, by name relative to the output directory, in write order: the frameworks'
    files (agent/core/frameworks) before the markers. A view of part of the job (--view own) writes no host
    list (its pod knows only rank 0 and itself) but the SSH launcher's, from the summary (``Whole.hosts``)."""
    files: dict[str, Sequence[bytes]] = {"torch.env": (render_env(variables).encode(),)}
    whole = plan.topology.whole
    if whole is None or whole.hosts:  # an own view lists hosts only for the SSH launcher (view_choice.py)
        files["hostfile"] = (render_hostfile(plan.topology).encode(),)
        files.update((name, (text.encode(),)) for name, text in render_role_hosts(plan.topology).items())
    if whole is None:  # it lists the Running pods, which only the full view knows
        files["discover_hosts.sh"] = (render_discover_hosts(plan.topology).encode(),)
    for rendition in frameworks:
        files.update((name, (data,)) for name, data in rendition.files.items())
    files["topology.json"] = topology_json_parts(plan, variables, generation=generation, texts=texts,
                                                 frameworks=frameworks)
    files["generation"] = (f"{generation}\n".encode(),)
    return Files(files)


# What a change must alter to be worth a rewrite and a signal: who is in, where, with what rank.
_KEY_FIELDS = member_fields("name", "role", "address", "training", "slots", "node_rank", "running", "node", "domains")


class MembershipKey:
    """A plan's membership key: each member's ``_KEY_FIELDS``, then ``extras`` (what the replica groups and the
    frameworks' files say). It holds the members, not a tuple of fields per member (at 16384 pods those were
    ~2.4 MB of every sidecar that renders the whole job): two keys compare the fields only at the places whose
    members are not the same object, as most of a change's are. Iterated, it gives its parts in order, as
    ``membership_key_of_document`` reads them back from topology.json (``key_digest``)."""

    __slots__ = ("extras", "members")

    def __init__(self, members: Sequence[Member], extras: tuple[object, ...] = ()) -> None:
        self.members, self.extras = members, extras

    def __iter__(self) -> Iterator[object]:
        return itertools.chain(map(_KEY_FIELDS, self.members), self.extras)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MembershipKey):
            return NotImplemented
        mine, theirs = self.members, other.members
        if len(mine) != len(theirs) or self.extras != other.extras:
            return False
        moved = list(itertools.compress(range(len(mine)), map(operator.is_not, mine, theirs)))
        return all(map(operator.eq, map(_KEY_FIELDS, map(mine.__getitem__, moved)),
                       map(_KEY_FIELDS, map(theirs.__getitem__, moved))))

    __hash__ = None  # type: ignore[assignment]  # compared, never a dict key


def member_key(m: dict[str, Any]) -> tuple[object, ...]:
    """One member's part of the membership key, read back from its ``topology.json`` entry."""
    return (m["name"], m["role"], m["address"], m["training"], m["slots"], m["nodeRank"], m.get("running", True),
            m.get("node", ""), tuple(m["domains"].values()) if isinstance(m.get("domains"), dict) else None)


def membership_key_of_document(document: dict[str, Any]) -> tuple[tuple[object, ...], ...]:
    """The same key read back from a ``topology.json`` (the sidecar continues where init left off)."""
    key = tuple(map(member_key, document.get("members", [])))
    return with_frameworks(with_groups(key, document.get("replicaGroups")), document.get("frameworks"))


class KeyDigest(NamedTuple):
    """A membership key as its digest (``key_digest``): what the sidecar keeps of the key it reads back from
    ``topology.json`` until its first plan, instead of a copy of every member's strings."""

    value: bytes


def key_digest(parts: Iterable[object]) -> KeyDigest:
    """The digest of a membership key. Its parts hold JSON's types only (strings, whole numbers, booleans, None,
    tuples of them), whose ``repr`` is one text per value: equal keys, equal digests."""
    hasher = hashlib.blake2b(digest_size=16)
    _hashed(hasher, parts)
    return KeyDigest(hasher.digest())


def _hashed(hasher: Any, parts: Iterable[object]) -> None:
    for part in parts:
        hasher.update(repr(part).encode())
        hasher.update(b"\n")


def read_topology_json(text: str) -> tuple[dict[str, Any], KeyDigest]:
    """A ``topology.json``'s document without its members, and its membership key's digest (``key_digest``), the
    members read one at a time (``decode_streamed``) and let go once hashed: every member's dict at once would
    be ~25 MB of the sidecar's start at 16384 pods, and every member's key ~5 MB held until its first plan."""
    hasher = hashlib.blake2b(digest_size=16)
    document = decode_streamed(text, "members", lambda m: _hashed(hasher, (member_key(m),)))
    _hashed(hasher, with_frameworks(with_groups((), document.get("replicaGroups")), document.get("frameworks")))
    return document, KeyDigest(hasher.digest())


def with_groups(key: tuple[tuple[object, ...], ...], groups: dict[str, Any] | None) -> tuple[tuple[object, ...], ...]:
    """A membership key that also says this pod's group, the groups' count and the lighthouse
    (``grouping.ReplicaGroups.key``), read back from topology.json's ``replicaGroups``."""
    found = key_of_document(groups)
    return key if found is None else (*key, found)


def with_frameworks(key: tuple[tuple[object, ...], ...], frameworks: dict[str, Any] | None
                    ) -> tuple[tuple[object, ...], ...]:
    """A membership key that also changes when a framework's files do (their ports, a member's IP in
    mlx_hostfile.json: not in the members' key), by their digests in topology.json's ``frameworks``; a
    torch-only job's key is the members' alone."""
    return (*key, *frameworks_key(frameworks))


def frameworks_key(frameworks: dict[str, Any] | None) -> tuple[tuple[object, ...], ...]:
    """The frameworks' part of a membership key (``with_frameworks``): none for a torch-only job."""
    if not frameworks:
        return ()
    return (("frameworks", *sorted((name, str(entry["digest"])) for name, entry in frameworks.items())),)
