"""Topology and variables -> the bytes of every file the agent writes. Pure: the writer does the I/O.

File formats are the consumers' own: ``torch.env`` is POSIX sh (``export KEY='value'``, so a value from pod
data such as ``$(rm -rf /)`` stays inert text); ``hostfile`` is DeepSpeed's and OpenMPI's
``<host> slots=<n>`` (``slots``, plural: DeepSpeed's parser rejects ``slot=``); ``<task>.host`` files are
Volcano's one-host-per-line lists; ``topology.json`` is the machine-readable whole.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import operator
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

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


_NAME_OF, _DOMAINS_OF = member_fields("name"), member_fields("domains")
_BEFORE_RANKS, _AFTER_RANKS = member_span(None, "node_rank"), member_span("running", None)
_NODE_RANK_OF, _RANK_OF = member_fields("node_rank"), member_fields("first_rank")
# The three parts of a ``bytes.partition``: the text before the separator, the separator if found, the text after.
_BEFORE, _FOUND, _AFTER = (operator.itemgetter(part) for part in range(3))
_NODE_RANK, _RUNNING = b'"nodeRank": ', b', "running": '
_RANKS = b'%s"nodeRank": %d, "rank": %d, "running": %s'  # a text's head, its two ranks and its tail
RERANK_FROM = 256  # moved members from which they are matched by name (a dict of the last generation's)
# Members whose texts are cut apart at once: every moved member's pieces at once were ~0.7 KB each, ~11 MB over
# what the change holds when a pod near the start of a 16384-pod job leaves.
RERANK_CHUNK = 1024


def _reranked(olds: Sequence[Member], heads: Sequence[bytes], members: Sequence[Member]) -> list[bytes | None]:
    """Where ``members[i]`` is ``olds[i]`` but for ``node_rank`` and ``first_rank`` (both numbers), the old head
    ``heads[i]`` with the two numbers replaced; None elsewhere. In C-level passes: a pod that leaves a 16384-pod
    job moves every member after it, and encoding them one by one was most of such a change. Every value before
    ``"nodeRank": `` is a number, a literal or an escaped string, so its first occurrence is the key, and only the
    two numbers stand between it and ``, "running": ``. The domains are among the fields compared: the tails
    stand."""
    same = map(operator.and_, map(operator.eq, map(_BEFORE_RANKS, olds), map(_BEFORE_RANKS, members)),
               map(operator.eq, map(_AFTER_RANKS, olds), map(_AFTER_RANKS, members)))
    numbered = map(operator.and_, map(operator.is_not, map(_NODE_RANK_OF, members), itertools.repeat(None)),
                   map(operator.is_not, map(_RANK_OF, members), itertools.repeat(None)))
    places = list(itertools.compress(range(len(members)), map(operator.and_, same, numbered)))
    found: list[bytes | None] = [None] * len(members)
    new = list(map(members.__getitem__, places))
    befores = list(map(bytes.partition, map(heads.__getitem__, places), itertools.repeat(_NODE_RANK)))
    afters = list(map(bytes.partition, map(_AFTER, befores), itertools.repeat(_RUNNING)))
    if not (all(map(_FOUND, befores)) and all(map(_FOUND, afters))):
        return found  # not a text of ours: encoded member by member
    replaced = map(_RANKS.__mod__, zip(map(_BEFORE, befores), map(_NODE_RANK_OF, new), map(_RANK_OF, new),
                                       map(_AFTER, afters), strict=True))
    collections.deque(map(found.__setitem__, places, replaced), maxlen=0)  # each at its place, in C
    return found


class MemberTexts:
    """Each member's topology.json text between the sidecar's generations, as bytes (the file is joined from them
    without a 4.5 MB encode at 16384 pods) in two parts: the head, all but its domains, its own bytes; the tail,
    its domains and the closing brace, one object for every member of those domains.

    A generation's members are matched with the last one's by place and identity (one C-level pass: most places
    of a change hold the same member object), the rest by name when many moved: a member equal to its last one
    keeps that text, one that only moved in rank (a pod before it left or came back: every later member) gets its
    last text with the two numbers replaced (``_reranked``), and only the others are encoded. Each last text is
    let go as its place is made, so one generation of texts is held, not two; and nothing but the lists of one
    generation is kept (a cache of entries by member identity would be ~2 MB more at 16384 pods). The same members
    asked again (the document served) take no pass."""

    def __init__(self) -> None:
        self._last: _Looked | None = None
        self._tails: dict[tuple[str, ...] | None, bytes] = {}  # by domains, for ``_levels``
        self._levels: Sequence[Level] = ()

    def texts(self, members: Sequence[Member], levels: Sequence[Level]) -> tuple[list[bytes], list[bytes]]:
        """Each member's text as two lists, place by place: the heads and the tails; a member's text is its
        head and its tail joined. The lists are the cache's: read, not changed."""
        last = self._last
        if last is not None and last.members is members and levels == self._levels:
            return last.heads, last.tails
        self._last = None  # its lists are let go of text by text as the next generation's are made
        if levels != self._levels:
            self._tails, self._levels = {}, levels
            last = None  # every tail anew
        if last is None:
            heads, tails = list(map(self._head, members)), list(map(self._tail, map(_DOMAINS_OF, members)))
        else:
            heads, tails = self._carried(last, members)
        self._last = _Looked(members, heads, tails)
        return heads, tails

    def _carried(self, last: _Looked, members: Sequence[Member]) -> tuple[list[bytes], list[bytes]]:
        """``members``' texts made from the last generation's (``last``: its lists emptied as they are taken)."""
        olds, old_heads, old_tails = last
        size = len(members)
        moved = list(itertools.compress(range(size), itertools.chain(map(operator.is_not, members, olds),
                                                                     itertools.repeat(True, size - len(olds)))))
        heads: list[Any] = old_heads[:size]  # a place past the last generation's: None until made below
        tails: list[Any] = old_tails[:size]
        heads += itertools.repeat(None, size - len(heads))
        tails += itertools.repeat(None, size - len(tails))
        if size == len(olds) and len(moved) < RERANK_FROM:  # a few places changed: each against its last member
            for at in moved:
                if members[at] != olds[at]:
                    heads[at], tails[at] = self._head(members[at]), self._tail(members[at].domains)
            return heads, tails
        gone = itertools.compress(range(len(olds)), itertools.chain(map(operator.is_not, olds, members),
                                                                    itertools.repeat(True, len(olds) - size)))
        before = {_NAME_OF(olds[at]): at for at in gone}  # the last generation's moved places, by name
        for start in range(0, len(moved), RERANK_CHUNK):  # each chunk's last texts let go before the next
            chunk = moved[start:start + RERANK_CHUNK]
            found = self._found(list(map(members.__getitem__, chunk)), last, before)
            for at, member, pair in zip(chunk, map(members.__getitem__, chunk), found, strict=True):
                heads[at], tails[at] = pair if pair is not None else (self._head(member), self._tail(member.domains))
        return heads, tails

    @staticmethod
    def _found(now: list[Member], last: _Looked, before: dict[str, int]) -> list[tuple[bytes, bytes] | None]:
        """Each of ``now``'s texts from its pod's last one (``before``: its last place by name), kept or its ranks
        replaced; None where it is to be encoded. The last texts taken are let go (None in ``last``'s lists)."""
        olds = last.members
        old_heads: list[Any] = last.heads
        old_tails: list[Any] = last.tails
        was = list(map(before.pop, map(_NAME_OF, now), itertools.repeat(-1)))  # -1: a pod new since
        known = list(itertools.compress(range(len(now)), map(operator.ne, was, itertools.repeat(-1))))
        places = list(map(was.__getitem__, known))
        pods, kin = list(map(now.__getitem__, known)), list(map(olds.__getitem__, places))
        heads, tails = list(map(old_heads.__getitem__, places)), list(map(old_tails.__getitem__, places))
        for place in places:
            old_heads[place] = old_tails[place] = None  # held by ``heads`` alone
        equal = list(map(operator.eq, pods, kin))
        replaced = _reranked(kin, heads, pods)
        found: list[tuple[bytes, bytes] | None] = [None] * len(now)
        for i, same, head, text, tail in zip(known, equal, heads, replaced, tails, strict=True):
            if same:
                found[i] = (head, tail)
            elif text is not None:
                found[i] = (text, tail)
        return found

    @staticmethod
    def _head(member: Member) -> bytes:
        return json.dumps(_member_head_json(member))[:-1].encode()  # open: its domains close it

    def _tail(self, domains: tuple[str, ...] | None) -> bytes:
        """The text after a member's head: its domains and the closing brace, one object per distinct domains (a
        member's entry with the domains of ten levels was ~520 bytes, ~200 of them the domains)."""
        tail = self._tails.get(domains)
        if tail is None:
            tail = self._tails[domains] = \
                f', "domains": {json.dumps(_domains_json(domains, self._levels))}}}'.encode()
        return tail


class _Looked(NamedTuple):
    """One generation's members and, place by place, their texts' heads and tails (the next takes them over)."""

    members: Sequence[Member]
    heads: list[bytes]
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
    frameworks' files say). It holds the members, not a tuple of fields per member (those would be ~2.4 MB more
    at 16384 pods, in every sidecar that renders the whole job): two keys compare the fields only at the places whose
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
