"""The job in a few hundred bytes, for pods that need no host list (``--view own``).

A training pod of a large torchrun job needs rank 0's address, the job's size and its own place: not the
other 16383 members. The leader derives that from its plan at every publication and writes it to
``<job>-topology-summary`` (``summary.json``) when it says something new: what a pod in its own view watches. The
training members in rank order are cut into *runs*: consecutive node ranks whose pods have one role, one index prefix,
consecutive last indices and one process count. A pod finds its own run from its own identity, and with it
its NODE_RANK, RANK and ordinal; every job-wide number is in the summary. A follower then reads O(1) bytes at
start and per change instead of the whole snapshot (every follower reading the snapshot would make the
job-wide start-up quadratic: 13 GiB through the API server for a 16384-pod job).

Only what a run can state exactly is summarized. With Node labels (``--topology-levels``) the summary also carries
the levels, and a pod reads its own Node for its own domains; under ``--rank-order topology``, where a pod's place
follows its Node, not its index, the runs are cut into blocks of one domain each, every block its own ConfigMap
(blocks.py). A job whose training members make more than ``MAX_RUNS`` runs (pods missing everywhere), or more
domains than ``blocks.MAX_BLOCKS`` at every level, gets no summary; its pods read the snapshot. Roles of at most
``LISTED_HOSTS`` pods keep their address lists (a master, a launcher, parameter servers): larger lists are not
read by such a pod.

Who decides RANK stays the planner (layout.py): the summary carries the results of ``_place``, and a pod finds its
own numbers in its run by ``ranks_in_run``, the planner's statement of what ``_place`` gives inside a run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from agent.core.controllers import Controller, detect_controller, parse_selector
from agent.core.files.frameworks import FRAMEWORKS, published_ports, selected
from agent.core.model import (
    ADDRESS,
    LISTED_HOSTS,
    AddressTemplate,
    Identity,
    Member,
    Options,
    RawPod,
    RoleAddresses,
    Takeover,
    Topology,
    Whole,
    fill,
    member_fields,
)
from agent.core.plan.facts import PodFacts, facts_of
from agent.core.plan.layout import Plan
from agent.core.plan.rank import ranks_in_run
from agent.core.pods.pod import pod_name
from agent.core.pods.validation import DNS_NAME, check_pod, parse_ip
from agent.core.publication.blocks import (
    BlockMaker,
    Layout,
    Made,
    Place,
    levels_digest,
    place_in_block,
    read_layout,
    topology_section,
)
from agent.core.publication.published import bounded_loads
from agent.core.publication.view_choice import choose_view, hosts_listed
from agent.errors import InputError

SUMMARY_KEY = "summary.json"
SUMMARY_SCHEMA = 1
MAX_RUNS = 128  # ~5 KiB: every pod in its own view receives it at each change of what it says
MAX_SUMMARY = 64 * 1024  # bytes; what the leader writes is far below
MAX_VALUES = 8192
BY_ORDINAL = member_fields("ordinal", "index")  # a role's index order (Topology.index_addresses)
_TEXT = re.compile(r"[A-Za-z0-9._:/%-]{1,253}")  # roles, pod names, port sources' names


@dataclass(frozen=True)
class Run:
    """Node ranks ``node_rank`` .. ``node_rank + last - first`` are the pods of ``role`` with index
    ``prefix + (i,)`` for i in first..last, each running ``slots`` processes; ``seen`` pods of the role come
    before the run (their ordinals when the controller gives none)."""

    role: str
    prefix: tuple[int, ...]
    first: int
    last: int
    node_rank: int
    first_rank: int
    slots: int
    seen: int


@dataclass(frozen=True)
class Spares:
    """--world-size in the summary: the size asked for, the digest of who holds the seats (``Topology.seats``),
    the hot spares as runs of indices (role, prefix, first, last), and each promoted spare (its name, the seat's
    node rank, the pod it replaced)."""

    world_size: int
    seats: str
    runs: tuple[tuple[str, tuple[int, ...], int, int], ...]
    takeovers: tuple[Takeover, ...]

    def holds(self, role: str, index: tuple[int, ...]) -> bool:
        return bool(index) and any(r == role and p == index[:-1] and first <= index[-1] <= last
                                   for r, p, first, last in self.runs)


def _spare_runs(spares: tuple[Member, ...]) -> list[list[Any]]:
    """The spares' indices as runs: consecutive last indices of one role and prefix."""
    runs: list[list[Any]] = []
    for member in sorted(spares, key=lambda m: (m.role, m.index)):
        last = runs[-1] if runs else None
        if last is not None and last[0] == member.role and tuple(last[1]) == member.index[:-1] \
                and last[3] + 1 == member.index[-1]:
            last[3] = member.index[-1]
        else:
            runs.append([member.role, list(member.index[:-1]), member.index[-1], member.index[-1]])
    return runs


def _read_spares(raw: Any, training_roles: tuple[str, ...]) -> Spares | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("spares"), list) or len(raw["spares"]) > MAX_RUNS \
            or not isinstance(raw.get("takeovers"), list) or len(raw["takeovers"]) > MAX_RUNS \
            or not isinstance(raw.get("seats"), str) or not re.fullmatch(r"[0-9a-f]{16}", raw["seats"]):
        raise _refuse("hotSpares is not {worldSize, seats, spares, takeovers}")
    runs = []
    for entry in raw["spares"]:
        if not isinstance(entry, list) or len(entry) != 4:
            raise _refuse("a spares run is not [role, prefix, first, last]")
        role = _text(entry[0], "a spare's role")
        if role not in training_roles:
            raise _refuse(f"spares of role '{role}', which does not train")
        runs.append((role, _index(entry[1], "a spares run's prefix"), _whole_number(entry[2], "a spare's index"),
                     _whole_number(entry[3], "a spare's index")))
    takeovers = []
    for entry in raw["takeovers"]:
        if not isinstance(entry, list) or len(entry) != 3:
            raise _refuse("a takeover is not [name, nodeRank, replaced]")
        takeovers.append(Takeover(_text(entry[0], "a promoted spare's name"),
                                  _whole_number(entry[1], "a promoted spare's node rank"),
                                  None if entry[2] is None else _text(entry[2], "a replaced pod's name")))
    return Spares(_whole_number(raw.get("worldSize"), "worldSize", low=1), raw["seats"], tuple(runs),
                  tuple(takeovers))


@dataclass(frozen=True)
class Summary:
    seq: int
    training_roles: tuple[str, ...]
    nnodes: int
    processes: int
    slot_sizes: frozenset[int]
    master_port: int
    master_port_source: str
    rank0: Member
    roles: tuple[tuple[str, int, tuple[str, ...] | None], ...]
    runs: tuple[Run, ...]
    ports: dict[str, tuple[int, str]] = field(default_factory=dict)  # the frameworks' (core/frameworks)
    addresses: tuple[tuple[str, RoleAddresses], ...] = ()  # large roles' address templates (``_templates``)
    spares: Spares | None = None  # --world-size: the hot spares and who holds a seat not born to it
    layout: Layout | None = None  # Node labels asked for: the levels, the order applied and its blocks (blocks.py)

    def run_of(self, role: str, index: tuple[int, ...]) -> Run | None:
        if not index:
            return None
        prefix, last = index[:-1], index[-1]
        return next((r for r in self.runs if r.role == role and r.prefix == prefix and r.first <= last <= r.last),
                    None)


def summarize(plan: Plan, *, seq: int, listed: int = LISTED_HOSTS, options: Options | None = None,
              ssh: bool = False, blocks: BlockMaker | None = None) -> dict[str, Any] | None:
    """The summary of the leader's plan, or None when runs (or blocks, blocks.py) cannot state it (see the
    module's docstring). ``listed``: the largest role whose addresses are kept; ``options``: the job's, whose
    selected frameworks' ports (which rank 0's container or the whole membership decide) the summary carries;
    ``ssh``: the job's pods have its SSH material (rank 0 launches over SSH, on the hostfile: ``_templates``)."""
    return summarize_with_blocks(plan, seq=seq, listed=listed, options=options, ssh=ssh, blocks=blocks)[0]


def summarize_with_blocks(plan: Plan, *, seq: int, listed: int = LISTED_HOSTS, options: Options | None = None,
                          ssh: bool = False, blocks: BlockMaker | None = None,
                          ) -> tuple[dict[str, Any] | None, list[Made]]:
    """``summarize``, and under the topology order the blocks it lists (blocks.py), each its own ConfigMap, made
    by ``blocks`` (the maker of the job's earlier plans' blocks; else a new one)."""
    topo = plan.topology
    if topo.rank_order not in ("index", "topology") or not topo.training or topo.whole is not None:
        return None, []
    training = topo.training
    runs: list[list[Any]] = []
    made = (blocks or BlockMaker()).make(topo) if topo.rank_order == "topology" else None
    if topo.rank_order == "topology":
        if made is None or topo.world_size is not None:
            return None, []
    else:
        starts = topo.run_starts
        if not starts or len(starts) > MAX_RUNS:
            return None, []
        seen: dict[str, int] = {}
        for start, stop in zip(starts, [*starts[1:], len(training)], strict=True):
            first = training[start]
            runs.append([first.role, list(first.index[:-1]), first.index[-1], training[stop - 1].index[-1],
                         first.node_rank, first.first_rank, first.slots, seen.get(first.role, 0)])
            seen[first.role] = seen.get(first.role, 0) + stop - start
    roles = []
    for role in topo.roles:
        count = len(topo.role_members(role))
        hosts = list(map(ADDRESS, topo.role_members(role))) if count <= listed else None
        if hosts is not None and made is not None \
                and hosts != list(map(ADDRESS, sorted(topo.role_members(role), key=BY_ORDINAL))):
            hosts = None  # listed in index order (VC_<ROLE>_HOSTS) and rank order (the frameworks): only if one
        roles.append([role, count, hosts])
    rank0 = topo.training[0]
    spares = None
    if topo.world_size is not None:
        spare_runs = _spare_runs(topo.spares)
        if len(spare_runs) > MAX_RUNS or len(topo.takeovers) > MAX_RUNS:
            return None, []
        spares = {"worldSize": topo.world_size, "seats": topo.seats, "spares": spare_runs,
                  "takeovers": [list(t) for t in topo.takeovers]}
    ports = published_ports(plan, options) if options is not None else {}
    addresses = _templates(plan, options, listed, ssh=ssh) if options is not None and made is None else {}
    return {"schema": SUMMARY_SCHEMA, "seq": seq, "trainingRoles": list(topo.training_roles), "nnodes": topo.nnodes,
            # the job's processes, under the name every published summary has used (a follower of another
            # release reads it); a follower derives its WORLD_SIZE from nnodes
            "worldSize": topo.processes, "slots": sorted(topo.slot_sizes), "masterPort": plan.master_port,
            "masterPortSource": plan.master_port_source,
            "rank0": [rank0.name, rank0.role, list(rank0.index), rank0.ordinal, rank0.address, rank0.dns_name,
                      _rank0_ip(plan, options, ssh=ssh), rank0.slots],
            "roles": roles, "runs": runs,
            **({"ports": {key: list(value) for key, value in ports.items()}} if ports else {}),
            **({"addresses": {role: [p if isinstance(p, str) else list(p) for p in t]
                              for role, t in addresses.items()}} if addresses else {}),
            **({"hotSpares": spares} if spares is not None else {}),
            **({"topology": topology_section(topo, made)} if topo.levels else {})}, made or []


def _rank0_ip(plan: Plan, options: Options | None, *, ssh: bool) -> str | None:
    """Node rank 0's IP as the summary says it: where a pod's own view reads it (its known_hosts, with the SSH
    material; a framework's variable, ``Framework.reads_rank0_ip``) or where it is rank 0's address. Elsewhere
    rank 0 is reached by its name, and its IP, which often comes after the leader's first summary, would send the
    summary to every pod of the job again for nothing their files say (an own view's topology.json then lists
    rank 0 without its IP, as it did when the summary came before the IP)."""
    rank0 = plan.topology.training[0]
    if options is None or ssh or rank0.address == rank0.ip or any(
            framework.reads_rank0_ip for framework, _ in selected(plan, options)):
        return rank0.ip
    return None


def _templates(plan: Plan, options: Options, listed: int, *, ssh: bool = False) -> dict[str, AddressTemplate]:
    """For a job whose framework files name every member (TF_CONFIG), or whose rank 0 launches over SSH (its
    hostfile): each large training role's address template, where one gives every member's address
    (``Topology.address_templates``), so its pods need not read the snapshot to write them."""
    if not ssh and not any(framework.needs_every_member for framework, _ in selected(plan, options)):
        return {}
    topo = plan.topology
    return {role: template for role, template in topo.address_templates.items()
            if template is not None and len(topo.role_members(role)) > listed}


def summary_text(summary: dict[str, Any]) -> str:
    return json.dumps(summary, separators=(",", ":"))


def _refuse(what: str) -> InputError:
    return InputError(f"the published summary is not valid ({what}); this pod reads the whole topology instead")


def _whole_number(value: Any, what: str, *, low: int = 0, high: int = 2**31 - 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _refuse(f"{what} is {str(value)[:40]}")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _TEXT.fullmatch(value):
        raise _refuse(f"{what} is {str(value)[:40]!r}")
    return value


def _address(value: Any, what: str) -> str:
    if not isinstance(value, str) or not (parse_ip(value) is not None or DNS_NAME.fullmatch(value)):
        raise _refuse(f"{what} is {str(value)[:40]!r}, not an address")
    return value


def _index(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > 4:
        raise _refuse(f"{what} is not a list of indices")
    return tuple(_whole_number(i, what) for i in value)


def read_summary(text: str | None) -> Summary | None:
    """The summary as published (None: there is none), checked like any data from the API: every number whole
    and in range, every address an address, and the runs one after another from node rank 0 to NNODES, their
    processes adding up to WORLD_SIZE. ``InputError`` for anything else."""
    if text is None:
        return None
    if len(text) > MAX_SUMMARY:
        raise _refuse(f"{len(text)} bytes")
    try:
        raw = bounded_loads(text, MAX_VALUES, "the summary")
    except ValueError as err:
        raise _refuse(f"not JSON: {err}") from None
    if not isinstance(raw, dict) or raw.get("schema") != SUMMARY_SCHEMA:
        raise _refuse("not a summary of schema 1")
    try:
        roles_raw, runs_raw, rank0_raw = raw["roles"], raw["runs"], raw["rank0"]
        training_roles = tuple(_text(r, "a training role") for r in raw["trainingRoles"])
        nnodes = _whole_number(raw["nnodes"], "nnodes", low=1)
        world = _whole_number(raw["worldSize"], "worldSize", low=1)
        slots = frozenset(_whole_number(s, "slots", low=1) for s in raw["slots"])
        port = _whole_number(raw["masterPort"], "masterPort", low=1, high=65535)
        source = raw["masterPortSource"]
        seq = _whole_number(raw["seq"], "seq", high=2**53)
    except (KeyError, TypeError) as err:
        raise _refuse(f"field {err} missing or of the wrong type") from None
    if not _is_line(source):
        raise _refuse("masterPortSource is not a line of text")
    layout = read_layout(raw["topology"], nnodes=nnodes, processes=world,
                         roles=len(training_roles)) if "topology" in raw else None
    blocks = layout is not None and layout.order == "topology"  # the runs are the blocks' (blocks.py)
    if not isinstance(roles_raw, list) or not isinstance(runs_raw, list) or len(runs_raw) > MAX_RUNS \
            or bool(runs_raw) == blocks or not isinstance(rank0_raw, list) or len(rank0_raw) != 8 \
            or len(roles_raw) > 64:
        raise _refuse("roles, runs or rank0 is not a list of the expected length")
    roles = _read_roles(roles_raw)
    rank0 = _read_rank0(rank0_raw)
    runs = _read_runs(runs_raw, training_roles, slots, nnodes=nnodes, world=world) if not blocks else ()
    first_run = runs[0] if runs else None
    if first_run is not None and (first_run.role != rank0.role or (*first_run.prefix, first_run.first) != rank0.index
                                  or first_run.slots != rank0.slots):
        raise _refuse("rank 0 is not the first pod of the first run")
    return Summary(seq=seq, training_roles=training_roles, nnodes=nnodes, processes=world, slot_sizes=slots,
                   master_port=port, master_port_source=source, rank0=rank0, roles=roles, runs=runs,
                   ports=_read_ports(raw.get("ports", {})),
                   addresses=_read_addresses(raw.get("addresses", {}), roles, runs),
                   spares=_read_spares(raw.get("hotSpares"), training_roles), layout=layout)


def _is_line(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 512 and value.isprintable()


def _read_ports(raw: Any) -> dict[str, tuple[int, str]]:
    """The frameworks' ports: a known framework -> [port, the rule that chose it]."""
    if not isinstance(raw, dict) or len(raw) > len(FRAMEWORKS):
        raise _refuse("ports is not a map of the frameworks' ports")
    ports = {}
    for key, value in raw.items():
        if key not in FRAMEWORKS or not isinstance(value, list) or len(value) != 2 or not _is_line(value[1]):
            raise _refuse(f"ports names {str(key)[:40]!r} with {str(value)[:40]}, not [port, source]")
        ports[key] = (_whole_number(value[0], f"the {key} port", low=1, high=65535), value[1])
    return ports


def _read_roles(roles_raw: list[Any]) -> tuple[tuple[str, int, tuple[str, ...] | None], ...]:
    roles = []
    for entry in roles_raw:
        if not isinstance(entry, list) or len(entry) != 3:
            raise _refuse("a role is not [name, count, hosts]")
        role, count = _text(entry[0], "a role"), _whole_number(entry[1], "a role's count", low=1)
        hosts = entry[2]
        if hosts is not None:
            if not isinstance(hosts, list) or len(hosts) != count or count > LISTED_HOSTS:
                raise _refuse(f"role '{role}' lists {str(hosts)[:40]} for {count} pods")
            hosts = tuple(_address(h, f"a host of role '{role}'") for h in hosts)
        roles.append((role, count, hosts))
    return tuple(roles)


_LITERAL = re.compile(r"[-a-z0-9.]{1,253}")


def _read_addresses(raw: Any, roles: tuple[tuple[str, int, tuple[str, ...] | None], ...],
                    runs: tuple[Run, ...]) -> tuple[tuple[str, RoleAddresses], ...]:
    """The large training roles' address templates: text of a DNS name, and index parts with what is added to
    each, which give a DNS name of non-negative numbers at each end of each of the role's runs (so at every
    index between)."""
    if not isinstance(raw, dict) or len(raw) > 64:
        raise _refuse("addresses is not a map of roles to templates")
    counts = {role: count for role, count, hosts in roles if hosts is None}
    found = []
    for role, value in raw.items():
        mine = [r for r in runs if r.role == role]
        if role not in counts or not mine or sum(r.last - r.first + 1 for r in mine) != counts[role]:
            raise _refuse(f"addresses names {str(role)[:40]!r}, no large training role of the runs")
        template = _template(value, min(len(r.prefix) + 1 for r in mine), role)
        ends = [(*r.prefix, last) for r in mine for last in (r.first, r.last)]
        places = [part for part in template if not isinstance(part, str)]
        if not all(index[k] + add >= 0 for index in ends for k, add in places) \
                or not all(DNS_NAME.fullmatch(fill(template, index)) for index in ends):
            raise _refuse(f"the address template of role '{role}' makes no DNS name")
        found.append((role, RoleAddresses(template, tuple((r.prefix, r.first, r.last) for r in mine))))
    return tuple(found)


def _template(value: Any, width: int, role: str) -> AddressTemplate:
    parts: list[str | tuple[int, int]] = []
    for part in value if isinstance(value, list) and 0 < len(value) <= 9 else ():
        if isinstance(part, str) and _LITERAL.fullmatch(part):
            parts.append(part)
        elif isinstance(part, list) and len(part) == 2 and all(type(n) is int for n in part) \
                and 0 <= part[0] < width and abs(part[1]) < 2**31:
            parts.append((part[0], part[1]))
        else:
            break
    if not parts or len(parts) != len(value) or all(isinstance(p, str) for p in parts):
        raise _refuse(f"the address template of role '{role}' is {str(value)[:60]}")
    return tuple(parts)


def _read_rank0(rank0_raw: list[Any]) -> Member:
    name, role0, index0, ordinal0, address0, dns0, ip0, slots0 = rank0_raw
    return Member(_text(name, "rank 0's name"), _text(role0, "rank 0's role"), _index(index0, "rank 0's index"),
                  _whole_number(ordinal0, "rank 0's ordinal"), _address(address0, "rank 0's address"),
                  None if dns0 is None else _address(dns0, "rank 0's DNS name"),
                  None if ip0 is None else _address(ip0, "rank 0's IP"), True,
                  _whole_number(slots0, "rank 0's slots", low=1), 0, 0)


def _read_runs(runs_raw: list[Any], training_roles: tuple[str, ...], slots: frozenset[int], *, nnodes: int,
               world: int) -> tuple[Run, ...]:
    """The runs, each starting where the rank order puts the pod after the run before it (``ranks_in_run``)."""
    runs: list[Run] = []
    node_rank = first_rank = 0
    for entry in runs_raw:
        if not isinstance(entry, list) or len(entry) != 8:
            raise _refuse("a run is not [role, prefix, first, last, nodeRank, rank, slots, seen]")
        run = Run(_text(entry[0], "a run's role"), _index(entry[1], "a run's prefix"),
                  _whole_number(entry[2], "a run's first index"), _whole_number(entry[3], "a run's last index"),
                  _whole_number(entry[4], "a run's node rank"), _whole_number(entry[5], "a run's rank"),
                  _whole_number(entry[6], "a run's slots", low=1), _whole_number(entry[7], "a run's seen"))
        if run.last < run.first or run.node_rank != node_rank or run.first_rank != first_rank \
                or run.role not in training_roles or run.slots not in slots:
            raise _refuse(f"run {entry!r:.80} does not follow the run before it")
        node_rank, first_rank, _ = ranks_in_run(node_rank=run.node_rank, first_rank=run.first_rank, slots=run.slots,
                                                seen=run.seen, offset=run.last - run.first + 1)
        runs.append(run)
    if node_rank != nnodes or first_rank != world:
        raise _refuse(f"the runs make {node_rank} pods and {first_rank} processes, not {nnodes} and {world}")
    return tuple(runs)


def _own_facts(own: RawPod, controller: Controller, options: Options,
               training_roles: Iterable[str]) -> tuple[PodFacts, Identity]:
    """The own pod's facts and identity; ``InputError`` when it is no training member of its own job."""
    pairs = parse_selector(options.choice.selector) if options.choice.selector else None
    facts = facts_of(own, controller, options, pairs, None, checked=True)
    name = pod_name(own)
    if facts.reason is not None:
        raise InputError(f"pod '{name}' is not a member of its own job ({facts.reason}); nothing to configure")
    ident = facts.ident
    if ident is None:
        raise facts.error or InputError(f"pod '{name}': cannot be identified")
    if ident.role not in training_roles:
        raise InputError(f"pod '{name}' is role '{ident.role}', which does not train: its files list the job's pods "
                         "by role")
    return facts, ident


def _layout_of(summary: Summary, options: Options, domains: tuple[str, ...] | None) -> Layout | None:
    """The summary's topology section, when it is the one this pod's options ask for (``InputError`` if not): its
    levels' digest this pod's levels' (its blocks no deeper than they: ``blocks.read_block``)."""
    layout = summary.layout
    mine = levels_digest(options.levels) if options.levels is not None else None
    if (layout.levels if layout is not None else None) != mine:
        raise InputError("the summary is of other Node label levels than this pod's --topology-levels; this pod "
                         "reads the whole topology instead")
    if layout is not None and domains is None:
        raise InputError("its own Node's labels are not known; this pod reads the whole topology instead")
    return layout


def light_plan(summary: Summary, own: RawPod, options: Options, *, ssh: bool = False,
               domains: tuple[str, ...] | None = None, blocks: Mapping[str, str] | None = None) -> Plan | None:
    """This pod's plan from the summary and its own pod: rank 0 and itself as members, the job-wide numbers from
    the summary. None when the summary does not place this pod (not published yet, or not a training pod);
    ``InputError`` when the pod itself cannot be placed (as ``build_plan`` would say). ``ssh``: the pod has the
    job's SSH material; as rank 0 it launches, and writes the host lists when the summary gives them
    (``view_choice.hosts_listed``). With Node labels (``--topology-levels``): ``domains``, this pod's Node's value
    per level, and under the topology order ``blocks``, the texts of the blocks held by their digests
    (blocks.py): the one of this pod's domains that the summary lists places it (None while none is held)."""
    own = check_pod(own)  # type: ignore[assignment]
    controller = detect_controller(own, options)
    facts, ident = _own_facts(own, controller, options, summary.training_roles)
    name = pod_name(own)
    layout = _layout_of(summary, options, domains)
    placed = None
    if layout is not None and layout.order == "topology":
        assert domains is not None
        mine = layout.block_of(domains, blocks or {})
        if mine is None:
            return None  # not in the leader's view yet, or its block is on its way
        entry, block = mine
        placed = place_in_block(block, entry, summary.training_roles, ident.role, ident.index, domains=domains,
                                ordinal=ident.ordinal)
        if placed is None:
            return None
    run = summary.run_of(ident.role, ident.index)
    hot = summary.spares
    spare = run is None and placed is None and hot is not None and hot.holds(ident.role, ident.index)
    if run is None and placed is None and not spare:
        return None
    if facts.place is None:
        raise facts.place_error or InputError(f"pod '{name}': no address")
    if facts.slots is None:
        raise facts.slots_error or InputError(f"pod '{name}': no process count")
    slots, slots_source = facts.slots
    seated = _seat(summary, placed, run, name, ident, facts, slots, domains)
    if seated is None:
        return None
    me, members = seated
    owner_uid = _owner_uid(own) if controller.owner_is_job else None
    whole = Whole(summary.nnodes, summary.processes, summary.slot_sizes, summary.roles, summary.addresses,
                  tuple((r.role, r.seen, r.last - r.first + 1, r.slots) for r in summary.runs),
                  seats=hot.seats if hot is not None else "")
    topology = Topology(controller=controller.key, namespace=facts.namespace, job=ident.job, job_uid=owner_uid,
                        self_name=name, training_roles=summary.training_roles, members=members, whole=whole,
                        world_size=hot.world_size if hot is not None else None, spares=(me,) if spare else (),
                        takeovers=hot.takeovers if hot is not None else (),
                        levels=(options.levels or ()) if layout is not None else (),
                        rank_order=layout.order if layout is not None else "index",
                        order_note=layout.note if layout is not None else None)
    if ssh and me.node_rank == 0 and hosts_listed(topology):  # rank 0 launches on the hostfile: it writes it
        topology = replace(topology, whole=replace(whole, hosts=True))
    source = summary.master_port_source
    if options.ports.master is not None:
        port, source = options.ports.master, "--master-port"
    else:
        port = summary.master_port
    return Plan(topology=topology, controller=controller, self_pod=own, master_port=port, master_port_source=source,
                slots_source={name: slots_source}, published_ports=dict(summary.ports))


def _owner_uid(own: RawPod) -> str | None:
    """The uid of the object that controls the pod (its job, where the controller's pods are owned by it)."""
    return next((o.get("uid") for o in own.get("metadata", {}).get("ownerReferences", []) if o.get("controller")),
                None)


def _seat(summary: Summary, placed: Place | None, run: Run | None, name: str, ident: Identity, facts: PodFacts,
          slots: int, domains: tuple[str, ...] | None) -> tuple[Member, tuple[Member, ...]] | None:
    """This pod as a member, and the members its own view holds (rank 0 and itself), from its place in its block
    (``placed``), its run, or else as a hot spare; None when the leader saw another process count."""
    rank0 = summary.rank0
    assert facts.place is not None  # light_plan has said why not
    address, dns, ip = facts.place.address, facts.place.dns_name, facts.place.ip
    if placed is not None:
        if slots != placed.slots:
            return None  # the leader saw another container (a pod re-created with another size): not published yet
        me = Member(name, ident.role, ident.index, placed.ordinal, address, dns, ip, True, slots, placed.node_rank,
                    placed.first_rank, True, facts.node, domains)
        members: tuple[Member, ...] = (me,) if rank0.name == name else (rank0, me)
    elif run is None:  # a hot spare: rank 0 is the one member it knows
        me = Member(name, ident.role, ident.index, ident.ordinal if ident.ordinal >= 0 else 0, address, dns, ip,
                    False, slots, None, None, True, facts.node, domains)
        members = (rank0,)
    else:
        if slots != run.slots:
            return None  # the leader saw another container (a pod re-created with another size): not published yet
        node_rank, first_rank, ordinal = ranks_in_run(node_rank=run.node_rank, first_rank=run.first_rank,
                                                      slots=slots, seen=run.seen, offset=ident.index[-1] - run.first,
                                                      ordinal=ident.ordinal)
        me = Member(name, ident.role, ident.index, ordinal, address, dns, ip, True, slots, node_rank, first_rank,
                    True, facts.node, domains)
        members = (me,) if rank0.name == name else (rank0, me)
    return me, members


def own_view(plan: Plan, options: Options, *, ssh: bool, published: bool, listed: int = LISTED_HOSTS,
             blocks: BlockMaker | None = None) -> tuple[Plan | None, str]:
    """The plan a pod renders when it holds the whole job (the leader, a standby, every pod of a job that reads the
    pods) and its view is its own (``choose_view``): made from its plan's summary exactly as a follower makes it
    from the published one, so that every such pod of the job writes files of one shape. (None, why) when it is
    to write every member. ``choose_view`` is asked of the whole plan, then of the own view's (what only that one
    lacks: a port, one process count). ``blocks``: the maker of the blocks the leader publishes (the same plan's
    are made once)."""
    why = choose_view(plan, options, ssh=ssh, published=published)
    if why is not None:
        return None, why
    raw, made = summarize_with_blocks(plan, seq=0, listed=listed, options=options, ssh=ssh, blocks=blocks)
    if raw is None:
        return None, "the job's ranks make no summary (more runs of ranks, or domains, than a summary holds)"
    domains = plan.topology.me.domains
    held = {block.digest: block.text for block in made if (domains or ())[:len(block.values)] == block.values}
    try:  # as a pod holds them: the blocks its own domains could be in (``blocks.part_selector``)
        summary = read_summary(summary_text(raw))
        assert summary is not None
        light = light_plan(summary, plan.self_pod, options, ssh=ssh, domains=domains, blocks=held)
    except InputError as err:
        return None, str(err)
    if light is None:
        return None, "the summary does not place this pod"
    why = choose_view(light, options, ssh=ssh, published=published)  # what only the own view lacks (a port, ...)
    return (light, "") if why is None else (None, why)


def view_key(env: dict[str, str], frameworks: dict[str, Any] | None = None, hosts: str | None = None
             ) -> tuple[tuple[str, str], ...]:
    """What a change must alter to be worth a rewrite and a signal with --view own: the written variables (the
    generation aside), the frameworks' (their ``env`` and whether they are withheld) and the host lists' digest
    (the SSH launcher's), as rendered or as read back from topology.json's ``env``, ``frameworks`` and ``hosts``."""
    items = [(k, v) for k, v in env.items() if k != "TOPOLOGY_GENERATION"]
    if hosts is not None:
        items.append((":hosts", str(hosts)))
    for key, entry in (frameworks or {}).items():
        items += [(f"{key}:{name}", value) for name, value in entry["env"].items()]
        items += [(f"{key}:withheld", str(entry["withheld"])), (f"{key}:digest", str(entry["digest"]))]
    return tuple(sorted(items))
