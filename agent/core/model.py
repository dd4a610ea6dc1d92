"""Data the core reads and computes.

``Raw*`` TypedDicts name the few fields of the Kubernetes Pod JSON the core reads (the API sends many more;
they are ignored). Everything the core computes is a frozen dataclass, so a ``Topology`` can be compared,
hashed into a generation decision, and handed to renderers without fear of mutation.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple, TypedDict

from agent.core.pods.claims import Claims
from agent.core.pods.placement import Level
from agent.errors import InputError

AddressMode = Literal["dns", "ip"]
ADDRESS_MODES: tuple[AddressMode, ...] = ("dns", "ip")
_WHOLE = re.compile(r"[0-9]+")


def is_whole_number(text: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts '²' and '٣', which int() then rejects or reads."""
    return bool(_WHOLE.fullmatch(text.strip()))


def parse_owner(raw: str | None, *, label: str = "--ssh-owner") -> tuple[int, int] | None:
    """UID[:GID] of the SSH files (the GID is the UID's when left out); ``label`` names where the text came
    from, a flag or an annotation."""
    if raw is None:
        return None
    uid, sep, gid = raw.partition(":")
    ids = (uid, gid) if sep else (uid,)
    if not all(is_whole_number(i) and len(i.strip()) <= 10 and int(i) < 2**32 - 1 for i in ids):
        raise InputError(f"{label} '{raw}' must be UID:GID in numbers below 4294967295, e.g. 1000:1000")
    return int(uid), int(gid) if sep else int(uid)


class RawEnvVar(TypedDict, total=False):
    name: str
    value: str
    valueFrom: dict[str, Any]


class RawResources(TypedDict, total=False):
    limits: dict[str, str | int | float]
    requests: dict[str, str | int | float]


class RawPort(TypedDict, total=False):
    name: str
    containerPort: int


class RawContainer(TypedDict, total=False):
    name: str
    image: str
    command: list[str]
    args: list[str]
    env: list[RawEnvVar]
    resources: RawResources
    ports: list[RawPort]


class RawPodSpec(TypedDict, total=False):
    nodeName: str
    hostname: str
    subdomain: str
    containers: list[RawContainer]
    initContainers: list[RawContainer]


class RawPodIP(TypedDict, total=False):
    ip: str


class RawPodCondition(TypedDict, total=False):
    type: str
    status: str
    reason: str


class RawPodStatus(TypedDict, total=False):
    phase: str
    podIP: str
    podIPs: list[RawPodIP]
    conditions: list[RawPodCondition]


class RawOwnerReference(TypedDict, total=False):
    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool


class RawMetadata(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    labels: dict[str, str]
    annotations: dict[str, str]
    deletionTimestamp: str
    ownerReferences: list[RawOwnerReference]
    resourceVersion: str


class RawPod(TypedDict, total=False):
    metadata: RawMetadata
    spec: RawPodSpec
    status: RawPodStatus


def bracketed(address: str) -> str:
    """An address as the host part of ``host:port``: IPv6 in brackets."""
    return f"[{address}]" if ":" in address else address


@dataclass(frozen=True)
class ControllerChoice:
    """Whose rules find the job's pods and place each: the controller ``--controller`` names, or the pods a label
    ``selector`` matches, each placed by its ``index_label``; all None: the controller whose labels the pod
    carries."""

    controller: str | None = None
    selector: str | None = None
    index_label: str | None = None


@dataclass(frozen=True)
class FrameworkOptions:
    """Which frameworks' files to write besides torch.env (agent/core/frameworks), and their ports.

    ``names``: the setting's list (``--frameworks``); ``implied``: what the job's objects imply, each with why
    (read by init and the sidecar: an MPIJob's launcher gets mpi); ``ports``: ``--<framework>-port``. What the
    job's objects say of a framework (a Volcano job's tensorflow plugin: its task names and ``--port``):
    ``roles``, the job's role -> the framework's role, per framework; ``job_ports``, a port and where it was
    read; ``containers``, the container whose ports hold a framework's port (a Volcano ray plugin's
    ``--headContainer``); ``first``, how many training pods the job starts with and where that was read (its
    objects), which XGBoost's tracker port follows."""

    names: tuple[str, ...] = ()
    implied: tuple[tuple[str, str], ...] = ()
    ports: tuple[tuple[str, int], ...] = ()
    roles: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    job_ports: tuple[tuple[str, int, str], ...] = ()
    containers: tuple[tuple[str, str], ...] = ()
    first: tuple[int, str] | None = None

    def port(self, framework: str) -> int | None:
        return dict(self.ports).get(framework)

    def job_port(self, framework: str) -> tuple[int, str] | None:
        return next(((port, source) for key, port, source in self.job_ports if key == framework), None)

    def container(self, framework: str) -> str | None:
        return dict(self.containers).get(framework)

    def role_map(self, framework: str) -> dict[str, str] | None:
        found = dict(self.roles).get(framework)
        return dict(found) if found is not None else None


@dataclass(frozen=True)
class Ports:
    """The ports of the job's rendezvous; None: the controller's convention decides."""

    master: int | None = None  # --master-port
    # MASTER_PORT as the job's objects state it, and where (a Volcano pytorch plugin's --port): below --master-port
    # and the port rank 0's container declares by the controller's name, above the controller's convention.
    job_master: tuple[int, str] | None = None
    rdzv: int | None = None  # --rdzv-port (None: the controller's, else 29400)


@dataclass(frozen=True)
class Processes:
    """Which container of a pod trains, and how many processes it runs."""

    # --nproc-per-node; "accelerators": the container's accelerators, else 1 (Trainer's MPI runtimes:
    # numProcPerNode 1); None: the controller's convention
    per_node: int | Literal["auto", "accelerators"] | None = None
    container: str | None = None  # --container (None: the first that is not the agent)
    # The DRA claims of the job's namespace, as the shell read them (core/pods/claims.py), which give a container
    # its accelerators; None: not read.
    claims: Claims | None = None


@dataclass(frozen=True)
class Options:
    """What the user chose; ``None`` means "let the controller's convention decide"."""

    roles: tuple[str, ...] | None = None
    ports: Ports = Ports()
    processes: Processes = Processes()
    address: AddressMode = "dns"
    cluster_domain: str | None = None
    elastic: tuple[int, int] | None = None
    choice: ControllerChoice = ControllerChoice()
    # Node labels to read, outermost first (None: Nodes are not read); ranks by index or by those domains.
    levels: tuple[Level, ...] | None = None
    rank_order: Literal["index", "topology"] = "index"
    # "auto": each pod of a large job reads what its files need (core/publication/view_choice.py): every member for a
    # launcher, a framework whose files name every member, ranks by Node labels; the published summary for the
    # rest. "own": a training pod that follows a large job's publication reads its summary, whatever it writes;
    # "full": every pod reads every member.
    view: Literal["auto", "full", "own"] = "auto"
    # The roles were checked against the job object's replica counts: a training role without live pods is one
    # the controller has not created yet (JobSet dependsOn), not a misspelt --roles.
    roles_checked: bool = False
    # How the user spelled each option given ("roles" -> "TOPOLOGY_ROLES"), so the core's messages name it.
    labels: tuple[tuple[str, str], ...] = ()
    frameworks: FrameworkOptions = FrameworkOptions()
    # --replica-groups: where each training pod's replica group is read (core/plan/grouping.py); None: one world
    replica_groups: str | None = None
    # --world-size: the training pods a static world keeps; those past it are hot spares (core/plan/spares.py)
    world_size: int | None = None

    def label(self, name: str) -> str:
        return dict(self.labels).get(name, f"--{name.replace('_', '-')}")

    def with_controller(self, key: str) -> Options:
        """These options with ``--controller`` set to ``key`` (what the job's objects showed)."""
        return replace(self, choice=replace(self.choice, controller=key))


class Identity(NamedTuple):
    """Where a controller places one pod: its job, its role, and the key that orders it within the role. A
    NamedTuple, not a frozen dataclass: one is made per pod and version, and a NamedTuple is made in about a
    quarter of the time."""

    job: str
    role: str
    index: tuple[int, ...]  # type: ignore[assignment]  # shadows tuple.index, as Member's does
    ordinal: int


class Member(NamedTuple):
    """A live pod of the job, placed. ``node_rank``, ``first_rank`` and ``slots`` are set for training pods.

    A NamedTuple, not a frozen dataclass: the sidecar builds one per pod per change, and a NamedTuple is made in
    about a sixth of the time.
    """

    name: str
    role: str
    index: tuple[int, ...]  # type: ignore[assignment]  # shadows tuple.index: the controller's index reads best
    ordinal: int
    address: str
    dns_name: str | None
    ip: str | None
    training: bool
    slots: int
    node_rank: int | None = None
    first_rank: int | None = None
    running: bool = True  # phase Running: discover_hosts.sh lists only these (and the pod itself)
    node: str = ""  # spec.nodeName ('' while unscheduled)
    domains: tuple[str, ...] | None = None  # the Node's value per level (Options.levels); None: not known


def member_fields(*names: str) -> operator.itemgetter[Any]:
    """A C-level projection of the named ``Member`` fields (one name: the value; several: a tuple), for the passes
    over every member that the sidecar makes per change: named here, read as fast as a position."""
    return operator.itemgetter(*map(Member._fields.index, names))


def member_span(first: str | None, stop: str | None) -> operator.itemgetter[Any]:
    """The ``Member`` fields from ``first`` up to (not including) ``stop`` as one tuple (None: that end)."""
    at = Member._fields.index
    return operator.itemgetter(slice(None if first is None else at(first), None if stop is None else at(stop)))


NAME, ROLE, ADDRESS, TRAINING, SLOTS, RUNNING = map(member_fields, ("name", "role", "address", "training", "slots",
                                                                    "running"))
_INDEX, _LAST, _PREFIX = member_fields("index"), operator.itemgetter(-1), operator.itemgetter(slice(0, -1))
_BY_ORDINAL, _ORDINAL = member_fields("ordinal", "index"), member_fields("ordinal")  # a role's index order


def index_order(members: Sequence[Member]) -> list[Member]:
    """``members`` (one role's) by ordinal, then index: by the ordinals alone (whole numbers, compared in C)
    when no two are equal, as in every role whose index is one number; ~2 ms less than tuples at 16384 pods."""
    ordered = sorted(members, key=_ORDINAL)
    ordinals = list(map(_ORDINAL, ordered))
    return ordered if all(map(operator.lt, ordinals, ordinals[1:])) else sorted(members, key=_BY_ORDINAL)


def run_starts_of(members: Sequence[Member]) -> tuple[int, ...] | None:
    """Where ``members`` (training members in rank order) start a new run: a change of role, of index prefix or of
    process count, or a last index that skips (core/publication/summary.py, blocks.py); None when a member has no
    index. Each comparison is one C-level pass over the members (a Python loop would cost ~8 ms at 16384 pods)."""
    indices = list(map(_INDEX, members))
    if not all(indices):
        return None
    lasts = list(map(_LAST, indices))
    roles_of, slots_of = list(map(ROLE, members)), list(map(SLOTS, members))
    positions = range(1, len(members))
    ends = {*itertools.compress(positions, map(operator.ne, roles_of[1:], roles_of[:-1])),
            *itertools.compress(positions, map(operator.ne, slots_of[1:], slots_of[:-1])),
            *itertools.compress(positions, map(operator.ne, map(operator.sub, lasts[1:], lasts[:-1]),
                                               itertools.repeat(1)))}
    if indices and max(map(len, indices)) > 1:  # prefixes only when some index has one (a JobSet's)
        prefixes = list(map(_PREFIX, indices))
        ends.update(itertools.compress(positions, map(operator.ne, prefixes[1:], prefixes[:-1])))
    return (0, *sorted(ends)) if members else ()


class Takeover(NamedTuple):
    """A spare that holds a seat it was not born to (core/plan/spares.py): its pod, the seat's NODE_RANK, and the pod
    born to that seat (None: no pod of that index is left to name)."""

    name: str
    node_rank: int
    replaced: str | None


@dataclass(frozen=True)
class Excluded:
    """A pod that matched the job but is not a member, and why (shown by ``explain``)."""

    name: str
    reason: str


AddressTemplate = tuple[str | tuple[int, int], ...]  # literal text, and (index part, what is added to it)
LISTED_HOSTS = 16  # a role of at most this many pods keeps its address list in the summary (summary.py)
# Where the agent's containers alone mount a volume of their own (never the trainer's): what init leaves for its
# sidecar goes there, out of the trainer's reach (runtime/publication/handoff.py).
STATE_DIR = "/var/run/topology-agent"
_DIGITS = re.compile(r"[0-9]+")


def template_format(template: AddressTemplate) -> tuple[str, tuple[tuple[int, int], ...]]:
    """The template as a ``str.format`` string over its places' values, and the places: one C-level call per
    member (16384 members: ~10 ms)."""
    places = tuple(part for part in template if type(part) is not str)
    form = "".join(part.replace("{", "{{").replace("}", "}}") if type(part) is str else "{}" for part in template)
    return form, places  # type: ignore[return-value]


def fill(template: AddressTemplate, index: tuple[int, ...]) -> str:
    """The address ``template`` gives the member of ``index`` (a part out of range: ``IndexError``)."""
    form, places = template_format(template)
    return form.format(*[index[k] + add for k, add in places])


def run_addresses(template: AddressTemplate, prefix: tuple[int, ...], first: int, last: int) -> list[str]:
    """The addresses of a run's members (index ``prefix + (i,)`` for i in first..last): the text around the one
    place of the last index part is the same for the whole run, so each address is one concatenation (16384
    members: ~2 ms, against ~10 for a ``format`` each)."""
    lasts = [at for at, part in enumerate(template) if type(part) is not str and part[0] == len(prefix)]
    if len(lasts) != 1:
        return [fill(template, (*prefix, i)) for i in range(first, last + 1)]
    at = lasts[0]
    head, tail = fill(template[:at], prefix), fill(template[at + 1:], prefix)
    place = template[at]
    assert not isinstance(place, str)
    add = place[1]
    return [f"{head}{i + add}{tail}" for i in range(first, last + 1)]


@dataclass(frozen=True)
class RoleAddresses:
    """A large role's addresses in rank order as a pod in its own view learns them from the summary
    (core/publication/summary.py): one template over the indices of the role's runs, each run (prefix, first, last).
    Expanded only by a pod whose files name every member (TF_CONFIG)."""

    template: AddressTemplate
    runs: tuple[tuple[tuple[int, ...], int, int], ...]

    def expand(self) -> tuple[str, ...]:
        return _expand(self)


@functools.lru_cache(maxsize=1)  # one expansion held, as the topology that asks holds it anyway
def _expand(addresses: RoleAddresses) -> tuple[str, ...]:
    """Remembered while the summary says the same (a TF pod renders again at each change of its own, and of the
    publisher's plan, the same 16384 addresses: ~5 ms each time)."""
    return tuple(itertools.chain.from_iterable(run_addresses(addresses.template, prefix, first, last)
                                               for prefix, first, last in addresses.runs))


Run = tuple[tuple[int, ...], int, int, list[str]]  # a run's index prefix, first and last index, its addresses


def address_template(runs: list[Run]) -> AddressTemplate | None:
    """The template that gives each member's address from its index, or None. The controllers name a pod's host
    after its index (``demo-worker-7.demo.default.svc``; a JobSet's ``<jobset>-<job>-<job index>-<pod index>``,
    where the index counts the jobs of every replicated job before): the last numbers of the first member's
    host name are its index's parts, each with what is added to it, checked against every member. IPs, or names
    that do not follow their index, have none. ``runs``: the role's, in rank order."""
    if not runs:
        return None
    prefix, first, _, addresses = runs[0]
    address, index = addresses[0], (*prefix, first)
    host = address.split(".", 1)[0]
    numbers = list(_DIGITS.finditer(host))[-len(index):]
    if len(numbers) < len(index):
        return None
    template: list[str | tuple[int, int]] = []
    cursor = 0
    for part, number in enumerate(numbers):
        if number.start() > cursor:
            template.append(address[cursor:number.start()])
        template.append((part, int(number.group()) - index[part]))
        cursor = number.end()
    if cursor < len(address):
        template.append(address[cursor:])
    found = tuple(template)
    try:
        if any(run_addresses(found, prefix, first, last) != addresses for prefix, first, last, addresses in runs):
            return None
    except IndexError:  # a member with fewer index parts
        return None
    return found


@dataclass(frozen=True)
class Whole:
    """The job-wide facts of a topology that holds only part of the job (``--view own``: rank 0 and this pod).
    ``roles``: every role present in rank order, with its pod count and its addresses (None: not published,
    the role is too large); ``addresses``: the large roles whose addresses follow a template (published only
    for a job whose framework files name every member, or whose rank 0 launches over SSH); ``runs``: the
    summary's runs of node ranks; ``hosts``: this pod writes the host lists from them (``Topology.summary_hosts``)."""

    nnodes: int
    processes: int  # the training processes of the job: the sum of every training pod's slots
    slot_sizes: frozenset[int]
    roles: tuple[tuple[str, int, tuple[str, ...] | None], ...]
    addresses: tuple[tuple[str, RoleAddresses], ...] = ()
    runs: tuple[tuple[str, int, int, int], ...] = ()  # the node ranks in order: (role, seen before, pods, slots)
    hosts: bool = False  # this pod writes the host lists from the summary (the SSH launcher: view_choice.py)
    seats: str = ""  # --world-size: ``Topology.seats`` as the publisher's plan gives it


@dataclass(frozen=True)
class Topology:
    """The whole job as one pod sees it. Members are in rank order: training pods first, then the others."""

    controller: str
    namespace: str
    job: str
    job_uid: str | None
    self_name: str
    training_roles: tuple[str, ...]
    members: tuple[Member, ...]
    excluded: tuple[Excluded, ...] = field(default=())
    levels: tuple[Level, ...] = ()
    rank_order: str = "index"  # what was applied: "topology" only when every training pod's domains are known
    order_note: str | None = None  # why the asked topology order was not applied
    whole: Whole | None = None  # set when ``members`` is only part of the job (--view own)
    # --world-size (core/plan/spares.py): the training pods held back as hot spares, in the order they are promoted,
    # and each member that holds a seat it was not born to: (its name, the seat's node rank, the pod it replaced)
    world_size: int | None = None
    spares: tuple[Member, ...] = ()
    takeovers: tuple[Takeover, ...] = ()

    @functools.cached_property
    def training(self) -> tuple[Member, ...]:
        # Training members come first (the rank order puts them there): a count and a slice, no Python loop.
        return self.members[:sum(map(TRAINING, self.members))]

    @functools.cached_property
    def me(self) -> Member:
        """This pod's member: a member of the world, else one of its hot spares (``is_spare``)."""
        try:
            return self.members[list(map(NAME, self.members)).index(self.self_name)]
        except ValueError:
            spare = next((m for m in self.spares if m.name == self.self_name), None)
            if spare is None:
                raise LookupError(self.self_name) from None  # build_plan guarantees self is a member or a spare
            return spare

    @property
    def is_spare(self) -> bool:
        """This pod is a hot spare: it waits, with no training variables, until a member leaves."""
        return any(m.name == self.self_name for m in self.spares)

    @functools.cached_property
    def seats(self) -> str:
        """--world-size: a digest of who holds each seat (the training members' names in NODE_RANK order). It
        changes whenever a seat changes hands, also where no number of this pod's does: a pod in its own view
        then gets new files too, and its trainer the signal to join the world again."""
        if self.whole is not None:
            return self.whole.seats
        return hashlib.sha256("\n".join(map(NAME, self.training)).encode()).hexdigest()[:16]

    def takeover_of(self, name: str) -> Takeover | None:
        """The seat member ``name`` took over from another pod, if it did."""
        return next((t for t in self.takeovers if t.name == name), None)

    @functools.cached_property
    def nnodes(self) -> int:
        """The job's training pods (not only those held, with --view own)."""
        return self.whole.nnodes if self.whole is not None else len(self.training)

    def role_hosts(self, role: str) -> tuple[int, tuple[str, ...] | None]:
        """How many pods a role has, and their addresses in rank order (None: not known to this view)."""
        if self.whole is not None:
            return next(((n, hosts) for r, n, hosts in self.whole.roles if r == role), (0, ()))
        hosts = self._role_addresses.get(role, ())
        return len(hosts), hosts

    def role_addresses(self, role: str) -> tuple[str, ...] | None:
        """A role's addresses in rank order, as the files that name every member list them; None when this view
        cannot say them (its own view, a large role without a template: see ``Whole.addresses``)."""
        if self.whole is None:
            return self._role_addresses.get(role, ())
        count, hosts = self.role_hosts(role)
        return hosts if hosts is not None or not count else self._expanded.get(role)

    def index_hosts(self, role: str) -> tuple[int, tuple[str, ...] | None]:
        """``role_hosts`` in index order (by ordinal), whatever the rank order: Volcano's convention for
        VC_<TASK>_HOSTS and ``<task>.host`` (its svc plugin lists ``<job>-<task>-<i>`` for i = 0, 1, ...), which
        scripts index with VC_TASK_INDEX. In index rank order a role's members already come by ordinal."""
        if self.whole is not None or self.rank_order == "index":
            return self.role_hosts(role)
        hosts = self._index_addresses.get(role, ())
        return len(hosts), hosts

    def index_addresses(self, role: str) -> tuple[str, ...] | None:
        """``role_addresses`` in index order (``index_hosts``)."""
        if self.whole is not None or self.rank_order == "index":
            return self.role_addresses(role)
        return self._index_addresses.get(role, ())

    @functools.cached_property
    def _index_addresses(self) -> dict[str, tuple[str, ...]]:
        return {role: tuple(map(ADDRESS, index_order(self.role_members(role)))) for role in self.roles}

    @functools.cached_property
    def address_templates(self) -> dict[str, AddressTemplate | None]:
        """Each training role's address template (``address_template``), once per plan: the summary carries the
        large roles' for a job whose files name every member, and a pod decides its view by them."""
        if self.whole is not None:
            return {role: addresses.template for role, addresses in self.whole.addresses}
        starts, training = self.run_starts, self.training
        if not starts:
            return {}
        runs: dict[str, list[Run]] = {}
        for start, stop in zip(starts, [*starts[1:], len(training)], strict=True):
            first, last = training[start], training[stop - 1]
            runs.setdefault(first.role, []).append((first.index[:-1], first.index[-1], last.index[-1],
                                                    list(map(ADDRESS, training[start:stop]))))
        # a role with members that do not train (a launcher that is not a node) has addresses no run gives
        return {role: address_template(found) if sum(len(run[3]) for run in found) == len(self.role_members(role))
                else None for role, found in runs.items()}

    @functools.cached_property
    def summary_hosts(self) -> tuple[tuple[str, ...], tuple[int, ...]] | None:
        """In its own view, every training pod's address and process count in node-rank order, as the full view's
        hostfile lists them, when the summary gives every training role's addresses and no two are one (None:
        only the full view can list them). The runs say which of a role's addresses come where."""
        whole = self.whole
        if whole is None or not whole.runs:
            return None
        addresses: list[str] = []
        slots: list[int] = []
        for role, seen, count, size in whole.runs:
            listed = self.role_addresses(role)
            if listed is None or seen + count > len(listed):
                return None
            addresses += listed[seen:seen + count]
            slots += [size] * count
        if len(set(addresses)) != len(addresses):  # a host list cannot name one host twice (``hosts``)
            return None
        return tuple(addresses), tuple(slots)

    @functools.cached_property
    def _expanded(self) -> dict[str, tuple[str, ...]]:
        assert self.whole is not None
        return {role: addresses.expand() for role, addresses in self.whole.addresses}

    @functools.cached_property
    def _role_addresses(self) -> dict[str, tuple[str, ...]]:
        """Each role's addresses, once: the VC_<ROLE>_HOSTS variables and the <role>.host files both list them
        (a pass over 16384 members is ~0.5 ms, most of it cache misses)."""
        return {role: tuple(map(ADDRESS, self.role_members(role))) for role in self.roles}

    @functools.cached_property
    def roles(self) -> tuple[str, ...]:
        """Every role present, training roles first in their order, then the others by name."""
        if self.whole is not None:
            return tuple(r for r, _, _ in self.whole.roles)
        present = set(map(ROLE, self.members))
        ordered = [r for r in self.training_roles if r in present]
        return (*ordered, *sorted(present - set(ordered)))

    @functools.cached_property
    def _by_role(self) -> dict[str, tuple[Member, ...]]:
        roles = list(map(ROLE, self.members))
        return {role: tuple(itertools.compress(self.members, map(role.__eq__, roles))) for role in self.roles}

    def role_members(self, role: str) -> tuple[Member, ...]:
        return self._by_role.get(role, ())

    @functools.cached_property
    def processes(self) -> int:
        """The job's training processes, the sum of every training pod's slots: the world a launcher (torchrun,
        deepspeed, mpirun) forms from NNODES and NPROC_PER_NODE. torch.env's WORLD_SIZE is ``nnodes``: the world
        of one process per pod, for trainers started without a launcher."""
        if self.whole is not None:
            return self.whole.processes
        return sum(map(SLOTS, self.training))

    @functools.cached_property
    def repeated_hosts(self) -> tuple[Member, ...]:
        """Training members whose address an earlier training member holds (hostNetwork pods on one node share
        its IP): the host lists that name each host once (hostfile, discover_hosts.sh) leave them out."""
        if self.whole is not None:
            return ()  # a view of two members cannot tell; its pod writes no host list
        seen: set[str] = set()
        repeated = []
        for member in self.training:
            if member.address in seen:
                repeated.append(member)
            seen.add(member.address)
        return tuple(repeated)

    @functools.cached_property
    def hosts(self) -> tuple[Member, ...]:
        """The training members, each address once: a host list cannot name one host twice (DeepSpeed refuses
        such a hostfile; MPI would start both pods' processes on the first)."""
        repeated = self.repeated_hosts
        if not repeated:
            return self.training
        left_out = set(map(id, repeated))
        return tuple(m for m in self.training if id(m) not in left_out)

    @functools.cached_property
    def host_addresses(self) -> tuple[str, ...]:
        """The hosts' addresses, once: the hostfile and discover_hosts.sh both list them."""
        return tuple(map(ADDRESS, self.hosts))

    @functools.cached_property
    def slot_sizes(self) -> frozenset[int]:
        """The process counts of the training pods (one value: every pod runs as many)."""
        if self.whole is not None:
            return self.whole.slot_sizes
        return frozenset(map(SLOTS, self.training))

    @functools.cached_property
    def run_starts(self) -> tuple[int, ...] | None:
        """Where the training members (in rank order) start a new run (``run_starts_of``); the planner carries the
        result from one plan to the next while no member arrives or leaves."""
        return run_starts_of(self.training)

    def remember(self, **known: Any) -> None:
        """Seed derived views that the caller already knows (the sidecar's planner, which would otherwise pay a
        pass over 4096 members per view per change). They must equal what the properties compute: the
        planner's property test compares them with a topology planned from scratch."""
        for name in known:
            if not isinstance(getattr(type(self), name, None), functools.cached_property):
                raise AttributeError(f"Topology has no derived view {name!r}")
        self.__dict__.update(known)
