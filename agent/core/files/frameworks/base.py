"""What every framework renderer shares: the context it renders from, its port, and the one rendering path.

A framework is one more spelling of the plan that torch.env spells (rank 0, RANK, the processes per pod, the
members in rank order): a subclass says which pods get its files (``refusal``), which port it needs
(``port``), what its variables are (``variables``, each with the rule behind it) and what other files it writes
(``extra_files``). ``Framework.render`` does the rest the same way for all of them: the user's own values in the
trainer container are kept (``respect_user``, as for torch.env), a variable too long for an environment is left
out, and a pod that gets the files while the values cannot be known (``withheld``: e.g. a view of two members for
a file that names every member) gets files that say so, never the values of an earlier membership.
"""

from __future__ import annotations

import abc
import functools
import hashlib
import itertools
import json
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from agent.core.files.rendering import render_env
from agent.core.files.variables import ENV_BUDGET, Variable, respect_user
from agent.core.model import NAME, SLOTS, Member, Options, RawPod, Topology
from agent.core.plan.layout import Plan
from agent.core.pods.containers import UserValue, nproc_kind, pick_trainer_container
from agent.core.pods.pod import pod_name


@dataclass(frozen=True)
class Port:
    """A port a framework writes and the rule that chose it (explain and topology.json show it)."""

    number: int
    source: str


@dataclass(frozen=True)
class Context:
    """What a framework renders from: the plan, the options, the trainer container's env as the user and as the
    controller wrote it, and the directory the files go to (for the paths a file names)."""

    plan: Plan
    options: Options
    user: Mapping[str, UserValue]
    injected: Mapping[str, str]
    files_dir: str | None
    asked: frozenset[str] = frozenset()  # the frameworks the setting names (not only the job)
    memo: dict[str, Any] = field(default_factory=dict)  # what a framework computes once per rendering

    @property
    def topology(self) -> Topology:
        return self.plan.topology

    @property
    def me(self) -> Member:
        return self.plan.topology.me

    @property
    def partial(self) -> bool:
        """The plan holds rank 0 and this pod only (--view own)."""
        return self.plan.topology.whole is not None

    def path(self, name: str) -> str:
        return f"{self.files_dir.rstrip('/')}/{name}" if self.files_dir else name


@dataclass(frozen=True)
class Rendition:
    """One framework's part of this pod's generation: its variables, its files' bytes, its port, and lines that
    say who gets the files and why this pod got what it got."""

    key: str
    selected_by: str
    variables: tuple[Variable, ...] = ()
    files: Mapping[str, bytes] = field(default_factory=dict)
    port: Port | None = None
    notes: tuple[str, ...] = ()
    withheld: str | None = None  # the pod gets the files, without values: why

    @functools.cached_property
    def digest(self) -> str:
        """Stands for the files' bytes, so that the sidecar, continuing from topology.json, knows whether a new
        rendering changes them (an IP in mlx_hostfile.json is in no membership key)."""
        digest = hashlib.sha256()
        for name, data in self.files.items():
            digest.update(f"{name}\0{len(data)}\0".encode())
            digest.update(data)
        return digest.hexdigest()[:32]

    def document(self) -> dict[str, Any]:
        """Its entry under ``frameworks`` in topology.json."""
        return {"selectedBy": self.selected_by, "files": list(self.files),
                "port": self.port.number if self.port else None, "portSource": self.port.source if self.port else None,
                "env": {v.name: v.value for v in self.variables if v.written and not v.unset},
                "withheld": self.withheld, "notes": list(self.notes), "digest": self.digest}


def host_ports(addresses: Iterable[str], port: int) -> list[str]:
    """``<address>:<port>`` for each address, IPv6 in brackets (one pass over thousands of members per change)."""
    tail = f":{port}"
    return [f"[{a}]{tail}" if ":" in a else a + tail for a in addresses]


_PRINTABLE = re.compile(rb"[ -~]*")  # printable ASCII: JSON writes it as it is, but '"' and '\\'


def hosts_json(addresses: Sequence[str], port: int) -> list[bytes]:
    """``json.dumps(host_ports(addresses, port))`` (compact) as bytes, in parts for the caller's one join: made
    by one join of the addresses where each is plain text without a ':' (a DNS name, an IPv4 address). Python's
    encoder holds a string per host and another per value until it joins them, and each step after it a copy:
    this way a TF pod's render of 16384 workers peaks 1.5 MB over what it holds (bench/transients_bench.py)."""
    tail = f":{port}"
    joined = f'{tail}","'.join(addresses).encode()
    between = len(addresses) - 1  # the separators' ':' and '"' are the only ones, and no '\\'
    if not addresses or joined.count(b":") != between or joined.count(b'"') != 2 * between or b"\\" in joined \
            or _PRINTABLE.fullmatch(joined) is None:
        return [json.dumps(host_ports(addresses, port), separators=(",", ":")).encode()]
    return [b'["', joined, f'{tail}"]'.encode()]


def compact_json(value: Any) -> bytes:
    """A JSON file as the frameworks write them: one line, no spaces, keys in the order built (deterministic)."""
    return json.dumps(value, separators=(",", ":")).encode() + b"\n"


def named_port(pod: RawPod, name: str, options: Options, *, container: str | None = None) -> Port | None:
    """The port called ``name`` of the pod's trainer container (``container``: of the container so named, as a
    controller that names one reads it), or None when it declares none."""
    holder: Mapping[str, Any] = {}
    if container is None:
        holder = pick_trainer_container(pod, options.processes.container) or {}
    else:
        holder = next((c for c in pod.get("spec", {}).get("containers", []) if c.get("name") == container), {})
    for entry in holder.get("ports", []):
        if entry.get("name") == name and entry.get("containerPort"):
            return Port(int(entry["containerPort"]), f"port '{name}' of container '{holder.get('name')}' in pod "
                        f"'{pod_name(pod)}'")
    return None


def resolve_port(framework: Framework, plan: Plan, options: Options, *, pod: RawPod | None = None) -> Port | None:
    """A framework's port, as MASTER_PORT's: the setting (``--<framework>-port``), else what the leader published
    (``--view own``), else the job's (a Volcano plugin's ``--port``), else the controller's container port by its
    name on the trainer container of ``pod`` (rank 0's unless given), else the controller's convention, else the
    framework's own default. None when only rank 0's container can say and a ``--view own`` plan does not hold
    it."""
    key = framework.key
    asked = options.frameworks.port(key)
    if asked is not None:
        return Port(asked, options.label(f"{key}_port"))
    published = plan.published_ports
    if published is not None and key in published:
        number, source = published[key]
        return Port(number, f"{source} (published by the job's leader)")
    from_job = options.frameworks.job_port(key)
    if from_job is not None:
        return Port(*from_job)
    name, default = plan.controller.framework_port(key) or (None, None)
    if name is not None:
        holder = pod if pod is not None else plan.rank0_pod
        if holder is not None:
            found = named_port(holder, name, options)
            if found is not None:
                return found
        elif published is not None:
            return None
    if default is not None:
        return Port(default, f"{plan.controller.title} convention {default}")
    if framework.default_port is not None:
        return Port(framework.default_port, framework.default_port_source)
    return None


def role_map(ctx: Context, framework: str) -> Mapping[str, str] | None:
    """The job's roles as ``framework``'s roles: what the job's objects said (a Volcano plugin's task names), else
    the controller's own naming (PaddleJob's Master is a parameter server); None: the role names themselves."""
    found = ctx.options.frameworks.role_map(framework)
    return found if found is not None else ctx.plan.controller.framework_roles(framework)


# How many of a framework's processes a training pod runs (docs/frameworks.md, "Processes per pod"):
# "plan": NPROC_PER_NODE as torch.env has it; "explicit": one per pod unless NPROC_PER_NODE was set (a
# setting, a variable in the container, the job's slots); "devices": as "explicit", and one per accelerator
# the container asks for. Neither of the last two counts the CPU limit (torchrun's rule for CPU pods).
ProcessRule = Literal["plan", "explicit", "devices"]
_KEPT: dict[str, frozenset[str]] = {"plan": frozenset({"explicit", "devices", "cpu", "none"}),
                                    "explicit": frozenset({"explicit"}), "devices": frozenset({"explicit", "devices"})}
_RULE_SAYS = {"explicit": "one process per pod unless NPROC_PER_NODE is set", "devices": "one process per "
              "accelerator, else one per pod, unless NPROC_PER_NODE is set"}


@dataclass(frozen=True)
class Processes:
    """A framework's processes under its rule: this pod's, its first process's global id, the job's total, each
    with the rule that gave it (explain shows them); ``counts``: every training pod's, in rank order (None: not
    known to a --view own pod, whose pods then all run ``mine``)."""

    mine: int
    first: int
    total: int
    mine_rule: str
    first_rule: str
    total_rule: str
    counts: tuple[int, ...] | None


def processes(ctx: Context, rule: ProcessRule) -> Processes | None:
    """The processes of every training pod under ``rule`` (computed once per rendering); None when a --view own
    pod cannot know them (its pods differ in process counts)."""
    key = f"processes.{rule}"
    if key in ctx.memo:
        return ctx.memo[key]
    ctx.memo[key] = found = _processes(ctx, rule)
    return found


def _processes(ctx: Context, rule: ProcessRule) -> Processes | None:
    topo, me, sources = ctx.topology, ctx.me, ctx.plan.slots_source
    keep = _KEPT[rule]
    everyone = rule == "plan" or topo.slot_sizes == {1}  # the plan's counts stand
    kept_me = everyone or _kind(sources.get(me.name, "")) in keep
    mine = me.slots if kept_me else 1
    mine_rule = f"NPROC_PER_NODE: {sources.get(me.name, '')}" if kept_me else \
        f"1 ({_RULE_SAYS[rule]}; NPROC_PER_NODE {me.slots} is the CPU limit's)"
    counts: tuple[int, ...] | None
    if ctx.partial:
        if len(topo.slot_sizes) != 1:
            return None
        counts, total, first = None, topo.nnodes * mine, (me.node_rank or 0) * mine
        total_rule = f"NNODES {topo.nnodes} x {mine} (--view own: every pod runs as many as this one)"
        ones = mine == 1
    else:
        counts = _counts(topo.training, sources, None if everyone else keep)
        total, first = sum(counts), sum(counts[:me.node_rank or 0])
        same = len(set(counts)) == 1
        total_rule = f"NNODES {topo.nnodes} x {mine}" if same else "sum of every training pod's processes (pods differ)"
        ones = set(counts) == {1}
    first_rule = "NODE_RANK" if ones else "the global id of this pod's first process: each process adds its local rank"
    return Processes(mine, first, total, mine_rule, first_rule, f"processes: {total_rule}", counts)


_kind = functools.lru_cache(maxsize=256)(nproc_kind)  # a job's pods share a few rules


def _counts(training: Sequence[Member], sources: Mapping[str, str], keep: frozenset[str] | None) -> tuple[int, ...]:
    """Each training pod's processes: its NPROC_PER_NODE where ``keep`` holds the kind of rule that gave it (None:
    every pod's), else 1. C-level passes (4096 members per change: a Python loop per framework costs ~1 ms)."""
    slots = list(map(SLOTS, training))
    if keep is None:
        return tuple(slots)
    kept = map(keep.__contains__, map(_kind, map(sources.__getitem__, map(NAME, training))))
    return tuple(map(operator.add, itertools.repeat(1), map(operator.mul, map(operator.sub, slots,
                                                                                itertools.repeat(1)), kept)))


def process_notes(ctx: Context, rule: ProcessRule, name: str, more: str = "") -> tuple[str, ...]:
    """explain's lines on this pod's processes under ``rule``: the rule, and what each process adds to ``name``
    when the pod runs several."""
    count = processes(ctx, rule)
    if count is None:
        return ()
    lines = [f"processes in this pod: {count.mine_rule}"]
    if count.mine > 1:
        lines.append(f"{count.mine} processes in this pod: {name} is the first's; process i uses {name} + i"
                     + (f" {more}" if more else ""))
    return tuple(lines)


class Framework(abc.ABC):
    """One framework's spelling of the plan. ``env_file`` is the sourced file; ``other_files`` the others (written
    empty, JSON ones as ``null``, while withheld); ``recipients`` says in one line which pods get them."""

    key: ClassVar[str]
    title: ClassVar[str]
    env_file: ClassVar[str]
    other_files: ClassVar[tuple[str, ...]] = ()
    recipients: ClassVar[str] = "training pods"
    has_port: ClassVar[bool] = True
    default_port: ClassVar[int | None] = None
    default_port_source: ClassVar[str] = ""
    port_meaning: ClassVar[str] = ""  # what the port is, for --help and docs
    # Its files name every member: a --view own plan (rank 0 and this pod) cannot make them.
    needs_every_member: ClassVar[bool] = False
    # One of its variables says node rank 0's IP: a pod in its own view takes it from the published summary.
    reads_rank0_ip: ClassVar[bool] = False
    aliases: ClassVar[tuple[tuple[str, ...], ...]] = ()  # names of one fact: a user value for one is the fact
    process_rule: ClassVar[ProcessRule] = "plan"  # how many of its processes a pod runs (``processes``)

    def refusal(self, ctx: Context) -> str | None:
        """Why this pod gets none of the files (None: it gets them). By default: training pods only."""
        if ctx.me.training:
            return None
        roles = ", ".join(ctx.topology.training_roles) or "none"
        return f"role '{ctx.me.role}' is not a training role ({roles}); {self.env_file} goes to {self.recipients}"

    def port(self, plan: Plan, options: Options) -> Port | None:
        return resolve_port(self, plan, options) if self.has_port else None

    def published_port(self, plan: Plan, options: Options) -> Port | None:
        """The port the job's leader publishes for the pods in their own view (None: none, so they cannot write
        the files in it)."""
        return self.port(plan, options)

    def own_view_serves(self, ctx: Context) -> bool:
        """Whether a pod in its own view (rank 0, this pod and the summary's job-wide facts) can write the files
        of a framework that names every member (``needs_every_member``); asked of the own view's plan, or of a
        whole plan for the own view it would make. None can, but one that needs only addresses the summary
        gives (TF_CONFIG)."""
        return False

    def blocked(self, ctx: Context, port: Port | None) -> str | None:
        """Why the values cannot be known for this plan (the files are then written without them)."""
        if self.needs_every_member and ctx.partial and not self.own_view_serves(ctx):
            return (f"{self.env_file} names every member and --view own holds rank 0 and this pod only; use "
                    "--view full for this pod")
        if self.has_port and port is None:
            return (f"the job's leader published no {self.key} port and --view own does not read rank 0's "
                    f"container; set --{self.key}-port")
        if self.process_rule != "plan" and processes(ctx, self.process_rule) is None:
            return ("the job's training pods run different numbers of processes and --view own holds two of them; "
                    "use --view full for this pod")
        return None

    @abc.abstractmethod
    def variables(self, ctx: Context, port: Port | None) -> list[Variable]:
        """Every variable of the env file, in its order, each with the rule behind it."""

    def extra_files(self, ctx: Context, port: Port | None) -> dict[str, bytes]:
        """The other files (``other_files``), from the agent's values."""
        return {}

    def notes(self, ctx: Context) -> tuple[str, ...]:
        """Lines for explain about what the pod must add itself (per-process values)."""
        return ()

    def render(self, ctx: Context, selected_by: str) -> Rendition:
        refusal = self.refusal(ctx)
        if refusal is not None:
            return Rendition(self.key, selected_by, notes=(f"not written to this pod: {refusal}",))
        port = self.port(ctx.plan, ctx.options)
        why = self.blocked(ctx, port)
        if why is not None:
            files = {self.env_file: render_env((), name=self.env_file, notes=(f"not written: {why}",)).encode(),
                     **{name: b"null\n" if name.endswith(".json") else b"" for name in self.other_files}}
            return Rendition(self.key, selected_by, files=files, port=port, withheld=why,
                             notes=(f"written without values: {why}",))
        made = respect_user(self.variables(ctx, port), dict(ctx.user), dict(ctx.injected),
                            ctx.plan.controller.title, aliases=self.aliases)
        variables = tuple(_fit(made))
        files = {self.env_file: render_env(variables, name=self.env_file).encode(), **self.extra_files(ctx, port)}
        return Rendition(self.key, selected_by, variables, files, port, self.notes(ctx))


def _fit(variables: Sequence[Variable]) -> list[Variable]:
    """A value longer than an environment holds (TF_CONFIG, WORKER_ADDRS of thousands of pods: ``exec`` fails with
    "Argument list too long") is not written; the JSON file holds it."""
    return [Variable(v.name, f"({len(v.value.encode())} bytes)", f"{v.source}: too long for the environment, not "
                     "written", written=False) if v.written and len(v.value.encode()) > ENV_BUDGET else v
            for v in variables]
