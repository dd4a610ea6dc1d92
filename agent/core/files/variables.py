"""Plan -> the environment variables of one pod, each with the rule that produced it.

Every variable carries its provenance, so ``explain`` and ``render`` share one computation: ``explain``
prints all of them, ``render`` writes those with ``written``. Three rules shape the list:

* WORLD_SIZE and RANK describe one process per training pod (= NNODES, = NODE_RANK). Every launcher sets each
  process's own, so only a trainer started without one reads them, and it runs one process per pod: a world of
  NNODES x NPROC_PER_NODE would keep it waiting for ranks that never start. NPROC_PER_NODE and its twins carry
  the per-pod process count to the launchers.

* Training variables (MASTER_*, WORLD_SIZE, RANK, NODE_RANK, PET_*) go to training pods only. Volcano's and
  training-operator's plugins inject them into every container of every task, so a parameter server or a
  data loader believes it is a rank; here it gets host information and nothing else.
* What the user set in the trainer container is theirs: it is not written, and the variables derived from it
  follow it (a user-set MASTER_PORT=12345 gives PET_MASTER_PORT=12345).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from agent.core.injected import TRAINING_NAMES
from agent.core.model import Options, Topology, bracketed
from agent.core.plan.grouping import group_variables
from agent.core.plan.layout import Plan, elastic_range, injected_values
from agent.core.plan.spares import spare_lines
from agent.core.pods.containers import UserValue, pick_trainer_container, user_env

# Each group names one fact under several variable names; a user value for any of them is the fact.
_ALIASES: tuple[tuple[str, ...], ...] = (
    ("MASTER_ADDR", "PET_MASTER_ADDR"),
    ("MASTER_PORT", "PET_MASTER_PORT"),
    ("NODE_RANK", "PET_NODE_RANK"),
    ("NNODES", "PET_NNODES"),
)


@dataclass(frozen=True)
class Variable:
    """One variable for ``torch.env``. ``reference`` values are shell expansions of a user variable."""

    name: str
    value: str
    source: str
    written: bool = True
    reference: bool = False
    unset: bool = False


def env_key(role: str) -> str:
    """Volcano's env spelling of a task name: upper case, '-' (and anything else not a name char) -> '_'."""
    return re.sub(r"[^A-Za-z0-9_]", "_", role).upper()


def host_file_name(role: str) -> str:
    """Volcano's ``/etc/volcano/<task>.host`` spelling: '-' -> '_', case kept."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", role) + ".host"


@dataclass(frozen=True)
class Elastic:
    """torchrun's elastic rendezvous, from --elastic or from what the controller wrote (PET_NNODES=MIN:MAX)."""

    low: int
    high: int
    port: int
    rule: str
    max_restarts: tuple[str, str] = ("100", "elastic: a change of members fails some pods' workers (a pod that "
                                            "leaves, or one whose workers restart first), and each failure uses one "
                                            "of torchrun's --max-restarts (default 0: the job ends at the first); "
                                            "set PET_MAX_RESTARTS to change")


_WHOLE = re.compile(r"[0-9]{1,7}")
DEFAULT_RDZV_PORT = 29400

# Who reads torch.env's WORLD_SIZE and RANK: only a trainer started without a launcher, one process per pod (every
# launcher, torchrun, deepspeed, mpirun, accelerate, sets each process's own). Lightning's KubeflowEnvironment takes
# them as the world size and global rank; pytorch/examples' ImageNet script as the number of nodes and the node's
# rank, spawning its own processes on each. Volcano's pytorch plugin and training-operator write the pods' world too.
LAUNCHERLESS = ("python running init_process_group('env://'), Lightning's KubeflowEnvironment, the ImageNet "
                "example's nodes")
LAUNCHERS = "torchrun, deepspeed, mpirun and accelerate set each process's own from NNODES x NPROC_PER_NODE"


def elastic_of(plan: Plan, options: Options, injected: dict[str, str]) -> Elastic | None:
    """--elastic wins; else an elastic job the controller set up (training-operator's elasticPolicy) stays
    elastic, on the controller's rendezvous port, instead of silently becoming fixed-size."""
    restarts = injected.get("PET_MAX_RESTARTS", "")
    kept = (restarts, f"elasticPolicy.maxRestarts, as {plan.controller.title} wrote it") \
        if _WHOLE.fullmatch(restarts) else Elastic.max_restarts
    if options.elastic is not None:
        return Elastic(*options.elastic, port=options.ports.rdzv or DEFAULT_RDZV_PORT,
                       rule=f"{options.label('elastic')} MIN:MAX", max_restarts=kept)
    found = elastic_range(injected.get("PET_NNODES", ""))
    if found is None:
        return None
    port = options.ports.rdzv
    endpoint_port = injected.get("PET_RDZV_ENDPOINT", "").rpartition(":")[2]
    if port is None:
        port = int(endpoint_port) if endpoint_port.isdigit() and 0 < int(endpoint_port) < 65536 \
            else DEFAULT_RDZV_PORT
    rule = f"PET_NNODES={found[0]}:{found[1]} injected by {plan.controller.title} (its elastic policy)"
    return Elastic(*found, port=port, rule=rule, max_restarts=kept)


def _training_variables(plan: Plan, options: Options, elastic: Elastic | None) -> list[Variable]:
    topo = plan.topology
    me = topo.me
    rank0 = topo.training[0]
    nnodes = topo.nnodes
    slots_rule = plan.slots_source[me.name]
    order_rule = f"position in rank order (roles {', '.join(topo.training_roles) or '-'}, then index)"
    if topo.rank_order == "topology":
        order_rule = "position in topology order (pods of each domain contiguous, rank 0 kept; --rank-order)"
    c10d = topo.rank_order == "c10d"
    if c10d:
        order_rule = ("position in the order of the training pods' addresses (PET_LOCAL_ADDR) as strings: torchrun's "
                      "c10d rendezvous numbers its nodes so (GROUP_RANK)")
    out = [
        Variable("MASTER_ADDR", rank0.address, f"address of node rank 0, pod '{rank0.name}'"),
        Variable("MASTER_PORT", str(plan.master_port), plan.master_port_source),
        Variable("WORLD_SIZE", str(nnodes), f"= NNODES: one process per training pod, the world of a trainer "
                 f"started without a launcher ({LAUNCHERLESS}); {LAUNCHERS} ({topo.processes} processes)"),
        Variable("RANK", str(me.node_rank), f"= NODE_RANK: this pod's rank among the training pods, one process "
                 f"each, for a trainer started without a launcher ({LAUNCHERLESS}); {LAUNCHERS} (this pod's first: "
                 f"rank {me.first_rank})"),
        Variable("NODE_RANK", str(me.node_rank), order_rule),
        Variable("NNODES", str(nnodes), "number of training pods"),
        Variable("NPROC_PER_NODE", str(me.slots), slots_rule),
        Variable("LOCAL_WORLD_SIZE", str(me.slots), "= NPROC_PER_NODE"),
        Variable("PET_MASTER_ADDR", rank0.address, "= MASTER_ADDR (torchrun --master-addr)"),
        Variable("PET_MASTER_PORT", str(plan.master_port), "= MASTER_PORT (torchrun --master-port)"),
        Variable("PET_NPROC_PER_NODE", str(me.slots), "= NPROC_PER_NODE (torchrun --nproc-per-node)"),
    ]
    if not c10d:  # c10d ignores --node-rank (and torchrun warns on every pod but rank 0)
        out.append(Variable("PET_NODE_RANK", str(me.node_rank), "= NODE_RANK (torchrun --node-rank)"))
    local_addr = Variable("PET_LOCAL_ADDR", me.address, "this pod's own address: c10d would otherwise advertise an "
                          "unresolvable hostname, and it orders the pods by it")
    if elastic is None:
        out.append(Variable("PET_NNODES", str(nnodes), "= NNODES (torchrun --nnodes)"))
        if c10d:
            out.append(local_addr)
    else:
        host = plan.rendezvous_host
        rdzv_id = topo.job_uid or topo.job.replace("/", "-")
        id_rule = "uid of the job object" if topo.job_uid else "job name (the pods' owner is not the job)"
        out += [
            Variable("PET_NNODES", f"{elastic.low}:{elastic.high}", f"{elastic.rule} (torchrun --nnodes)"),
            Variable("PET_RDZV_BACKEND", "c10d", "elastic: torchrun's c10d rendezvous"),
            Variable(
                "PET_RDZV_ENDPOINT", f"{bracketed(host.address)}:{elastic.port}",
                f"address of pod '{host.name}', : rendezvous port "
                + ("(the first training pod in index order: the endpoint does not move with c10d's rank 0)" if c10d
                   else "(node rank 0)"),
            ),
            Variable("PET_RDZV_ID", rdzv_id, id_rule),
            local_addr,
            Variable("PET_MAX_RESTARTS", elastic.max_restarts[0], elastic.max_restarts[1]),
            Variable(
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1",
                "elastic: since torch 2.5 (pytorch#128096) the c10d rendezvous store is shared with the workers, "
                "and a node that joins a running job then waits forever (pytorch#135712); ignored by older torch",
            ),
        ]
    return out


def _host_variables(plan: Plan) -> list[Variable]:
    topo = plan.topology
    me = topo.me
    out = [
        Variable("TOPOLOGY_ROLE", me.role, "this pod's role"),
        Variable("TOPOLOGY_TRAINING", "1" if me.training else "0", "is the role a training role"),
        Variable("VC_TASK_INDEX", str(me.ordinal), f"this pod's index within role '{me.role}' (Volcano)"),
    ]
    keys: dict[str, str] = {}
    for role in topo.roles:
        count, hosts = topo.index_hosts(role)
        key = env_key(role)
        if key in keys:
            # "worker" and "WORKER" are one variable name: a second export would win in bash. A job object's
            # roles never collide (task names are DNS labels); pods with only labels can (docs/security.md).
            for name in (f"VC_{key}_HOSTS", f"VC_{key}_NUM"):
                out.append(Variable(name, "", f"role '{role}' is spelled as role '{keys[key]}' in variable names: "
                                    f"not written for '{role}'", written=False))
            continue
        keys[key] = role
        if hosts is None:
            out.append(Variable(f"VC_{key}_HOSTS", "", f"role '{role}' has {count} pods: this pod's own view holds "
                                f"no list that long (--view full writes it, in {host_file_name(role)})",
                                written=False))
        else:
            out.append(Variable(f"VC_{key}_HOSTS", ",".join(hosts), f"addresses of role '{role}' in index order "
                                "(Volcano's: VC_TASK_INDEX indexes it, whatever the rank order)"))
        out.append(Variable(f"VC_{key}_NUM", str(count), f"number of live pods of role '{role}' (Volcano)"))
    return out + _placement_variables(plan)


def _placement_variables(plan: Plan) -> list[Variable]:
    """Where this pod landed, when Node labels were asked for (--topology-levels or --rank-order topology)."""
    topo = plan.topology
    if not topo.levels:
        return []
    me = topo.me
    out = [
        Variable("TOPOLOGY_NODE", me.node, "spec.nodeName of this pod"),
        Variable("TOPOLOGY_LEVELS", ",".join(level.name.lower() for level in topo.levels),
                 "levels read from Node labels, outermost first (--topology-levels)"),
    ]
    if me.domains is not None:
        out += [Variable(f"TOPOLOGY_{level.name}", value, f"label {level.label} of node '{me.node}'"
                         + ("" if value else " (not set on the node)"))
                for level, value in zip(topo.levels, me.domains, strict=True)]
    out.append(Variable("TOPOLOGY_RANK_ORDER", topo.rank_order, topo.order_note or "--rank-order"))
    return out


def _respect_user(variables: list[Variable], env: dict[str, UserValue],
                  aliases: tuple[tuple[str, ...], ...] = _ALIASES) -> list[Variable]:
    """Leave user-set variables alone, and make their aliases follow the user's value."""
    result: list[Variable] = []
    for var in variables:
        user = env.get(var.name)
        if user is not None and user.value == "auto" and var.name in ("PET_NPROC_PER_NODE", "NPROC_PER_NODE"):
            # torchrun's auto counts the host's CPUs (or all GPUs of the node); the container's own count wins.
            result.append(Variable(var.name, var.value, f"user asked for 'auto' in container '{user.container}': "
                                   f"resolved from the container, not the host ({var.source})"))
            continue
        if user is not None:
            shown = user.value if user.value is not None else "(valueFrom)"
            result.append(Variable(var.name, shown, f"set by user in container '{user.container}': left alone",
                                   written=False))
            continue
        group = next((g for g in aliases if var.name in g), ())
        leader = next((name for name in group if name in env), None)
        if leader is not None:
            user = env[leader]
            if user.value is None or "\0" in user.value:
                # valueFrom, or a value no environment can hold (a NUL ends a C string: the runtime cuts it, and
                # bash drops it from a file silently): follow what the process really has.
                why = "valueFrom" if user.value is None else "its value holds a NUL"
                result.append(Variable(var.name, f"${{{leader}}}", f"follows user-set {leader} ({why})",
                                       reference=True))
            else:
                result.append(Variable(var.name, user.value,
                                       f"follows {leader}={user.value} set by user in container '{user.container}'"))
            continue
        result.append(var)
    return result




def respect_user(variables: list[Variable], env: dict[str, UserValue], injected: dict[str, str], title: str, *,
                 aliases: tuple[tuple[str, ...], ...] = _ALIASES) -> list[Variable]:
    """What the user set in the trainer container stays theirs (not written; the other names of the same fact
    in ``aliases`` follow it); a value the controller injected and the agent replaces says so. Every file of
    variables (torch.env and each framework's) goes through here."""
    result = []
    for var in _respect_user(variables, env, aliases):
        if var.written and var.name in injected and injected[var.name] != var.value:
            var = Variable(var.name, var.value, f"{var.source}; replaces {var.name}={injected[var.name]} "
                           f"injected by {title}", reference=var.reference)
        result.append(var)
    return result


def trainer_env(plan: Plan, options: Options) -> tuple[dict[str, UserValue], dict[str, str]]:
    """The user's variables in this pod's trainer container, and those its controller injected."""
    container = pick_trainer_container(plan.self_pod, options.processes.container)
    return user_env(container, controller=plan.controller.key), _injected_values(plan, options)


def _injected_values(plan: Plan, options: Options) -> dict[str, str]:
    """Variables the controller wrote into the trainer container (the last entry of a name wins, as in a
    container's environment)."""
    return injected_values(plan.self_pod, plan.controller, options)


ENV_BUDGET = 60 * 1024  # torch.env stays under 64 KiB whatever the job size (Linux: 128 KiB per string, ~2 MiB all)


def _env_line_size(var: Variable) -> int:
    return len(var.name) + len(var.value.encode()) + 12  # export NAME='value'\n, quotes escaped rarely


def _fit_environment(variables: list[Variable], files_dir: str | None, roles: dict[str, str]) -> list[Variable]:
    """Move the longest host lists out of the environment until the file fits ``ENV_BUDGET``: at 4096 pods with
    --cluster-domain, VC_WORKER_HOSTS alone is ~190 KB and ``exec`` fails with "Argument list too long". The
    lists stay in ``<role>.host``; ``VC_<ROLE>_HOSTS_FILE`` names that file."""
    total = sum(_env_line_size(v) for v in variables if v.written and not v.unset)
    if total <= ENV_BUDGET:
        return variables
    longest = sorted((v for v in variables if v.written and v.name in roles), key=lambda v: len(v.value),
                     reverse=True)
    moved: dict[str, Variable] = {}
    for var in longest:
        if total <= ENV_BUDGET:
            break
        role = roles[var.name]
        path = f"{files_dir.rstrip('/')}/{host_file_name(role)}" if files_dir else host_file_name(role)
        moved[var.name] = Variable(
            var.name, f"({len(var.value.encode())} bytes)", f"{var.source}: too long for the environment; the list "
            f"is in {path} (torch.env stays under 64 KiB)", written=False)
        pointer = Variable(f"{var.name}_FILE", path, f"file with the addresses of role '{role}', one per line")
        total += _env_line_size(pointer) - _env_line_size(var)
        moved[f"{var.name}+"] = pointer
    out: list[Variable] = []
    for var in variables:
        out.append(moved.get(var.name, var))
        if f"{var.name}+" in moved:
            out.append(moved[f"{var.name}+"])
    return out


def compute_variables(plan: Plan, options: Options, *, generation: int, files_dir: str | None = None) -> list[Variable]:
    """Every variable for the plan's own pod, written or not, in the order ``torch.env`` lists them.
    ``files_dir`` is where the files will be (for the paths torch.env names)."""
    me = plan.topology.me
    container = pick_trainer_container(plan.self_pod, options.processes.container)
    env = user_env(container, controller=plan.controller.key)
    injected = _injected_values(plan, options)
    variables: list[Variable] = []
    if me.training:
        variables += _training_variables(plan, options, elastic_of(plan, options, injected))
    variables += _host_variables(plan)
    if plan.groups is not None:
        variables += [Variable(name, value, why) for name, value, why in group_variables(plan, options)]
    variables += spare_variables(plan.topology)
    variables.append(Variable("TOPOLOGY_GENERATION", str(generation), "generation of these files"))
    result = respect_user(variables, env, injected, plan.controller.title)
    if me.training and plan.topology.rank_order == "c10d" and "PET_NODE_RANK" in injected \
            and "PET_NODE_RANK" not in env:
        result.append(Variable("PET_NODE_RANK", "", f"PET_NODE_RANK={injected['PET_NODE_RANK']} injected by "
                               f"{plan.controller.title}: unset, c10d ignores it (NODE_RANK is c10d's)", unset=True))
    if not me.training:
        # The controller put training variables into a pod that does not train: take them back out, or a
        # data loader or parameter server believes it is a rank.
        result += [
            Variable(name, "", f"{name}={value} injected by {plan.controller.title} into a non-training pod: "
                     "unset", unset=True)
            for name, value in sorted(injected.items()) if name in TRAINING_NAMES
        ]
    hosts_of: dict[str, str] = {}
    for role in plan.topology.roles:  # the first role of a spelling names the variable (_host_variables)
        hosts_of.setdefault(f"VC_{env_key(role)}_HOSTS", role)
    return _fit_environment(result, files_dir, hosts_of)


def spare_variables(topology: Topology) -> list[Variable]:
    """``--world-size``: whether this pod is a hot spare, and who holds the seats. A spare gets no training
    variables (variables.py), so a launcher or torchrun started on it has no world to join (``python -m
    agent.trainer run`` waits). ``TOPOLOGY_SEATS`` changes whenever a seat changes hands: every pod's files
    change, so every trainer of the world is signalled and restarts with a world of the same size."""
    if topology.world_size is None:
        return []
    seats = Variable("TOPOLOGY_SEATS", topology.seats, "digest of the pods on the world's seats in NODE_RANK "
                     "order: it changes when a spare takes a member's place (every trainer restarts)")
    if topology.is_spare:
        return [Variable("TOPOLOGY_SPARE", "1", f"a hot spare: the world keeps {topology.world_size} training pods "
                         "(--world-size) and this one waits, without training variables, to take the place of "
                         "the first member that leaves"), seats]
    taken = topology.takeover_of(topology.self_name)
    why = f"a member of the world of {topology.world_size} training pods (--world-size)"
    if taken is not None:
        why += f", promoted from the spares to node rank {taken.node_rank}" + \
            (f" in place of pod '{taken.replaced}'" if taken.replaced else "")
    return [Variable("TOPOLOGY_SPARE", "0", why), seats]


def repeated_hosts_warning(topology: Topology) -> str | None:
    """One line naming the training pods the hostfile leaves out because an earlier pod holds their address."""
    repeated = topology.repeated_hosts
    if not repeated:
        return None
    first: dict[str, str] = {}
    for member in topology.training:
        first.setdefault(member.address, member.name)
    shown = ", ".join(f"'{m.name}' ({m.address}, as '{first[m.address]}')" for m in repeated[:8])
    more = f" and {len(repeated) - 8} more" if len(repeated) > 8 else ""
    return (f"pods {shown}{more} share an address with an earlier pod (hostNetwork pods on one node share its IP; "
            "pods given one hostname and subdomain share a DNS name): torch.env counts them, but the hostfile and "
            "discover_hosts.sh name each address once, for the first pod; for SSH launchers (DeepSpeed, MPI) run one "
            "training pod per node (podAntiAffinity) and give each pod its own hostname")


def warnings_for(plan: Plan, variables: Sequence[Variable]) -> list[str]:
    """Where a value the user set (and the agent kept) contradicts the topology, or a host list cannot say what
    the topology says: explain, init and the sidecar say so."""
    topo = plan.topology
    hosts = repeated_hosts_warning(topo)
    if not topo.me.training:
        return [hosts] if hosts else []
    kept = {v.name: v.value for v in variables if not v.written and "set by user" in v.source}
    c10d = c10d_warnings(topo, kept)
    computed = {"WORLD_SIZE": str(topo.nnodes), "NNODES": str(topo.nnodes), "PET_NNODES": str(topo.nnodes)}
    return [
        f"{name}={kept[name]} set by the user is kept, but the job's pods make {name}={value}; torchrun and "
        "torch.distributed will wait for ranks that never come (or refuse extra ones)"
        for name, value in computed.items()
        if name in kept and kept[name] not in (value, "(valueFrom)")
        and not (name == "PET_NNODES" and ":" in kept[name])
    ] + c10d + ([hosts] if hosts else [])


def c10d_warnings(topology: Topology, kept: dict[str, str]) -> list[str]:
    """Where torchrun's c10d rendezvous may number the pods otherwise than the agent (core/plan/rank.py
    ``RankRule``): the topology order asked for, a ``PET_LOCAL_ADDR`` of the user's, addresses shared by pods."""
    if topology.rank_order != "c10d":
        return []
    out = []
    if topology.order_note:
        out.append(f"--rank-order topology not applied: {topology.order_note}")
    if "PET_LOCAL_ADDR" in kept:
        out.append(f"PET_LOCAL_ADDR={kept['PET_LOCAL_ADDR']} set by the user is kept: c10d orders the pods by each "
                   "one's PET_LOCAL_ADDR, the agent by the addresses it would write (NODE_RANK, RANK and "
                   "topology.json may differ from torch's GROUP_RANK and RANK)")
    shared: dict[str, list[str]] = {}
    for member in topology.training:
        shared.setdefault(member.address, []).append(member.name)
    names = [name for group in shared.values() if len(group) > 1 for name in group]
    if names:
        shown = ", ".join(f"'{n}'" for n in names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        out.append(f"pods {shown} share an address: c10d tells them apart by their torchrun's process id, so their "
                   "order among themselves is torch's to choose (the agent keeps index order there), and two "
                   "whose torchrun has one pid (pid 1 in each container) are one node to c10d; give each training "
                   "pod an address of its own (no hostNetwork, or --address dns with a hostname per pod)")
    return out


def explain_exclusions(plan: Plan) -> list[str]:
    """Lines for ``explain`` about what is not written and why."""
    topo = plan.topology
    lines = []
    if topo.is_spare:
        lines.append(f"pod is a hot spare (--world-size {topo.world_size}): no training variables (MASTER_*, "
                     "WORLD_SIZE, RANK, NODE_RANK, PET_*) until it takes the place of a member that leaves")
    elif not topo.me.training:
        roles = ", ".join(topo.training_roles) or "none"
        lines.append(
            f"pod is role '{topo.me.role}', not a training role ({roles}): no training variables "
            "(MASTER_*, WORLD_SIZE, RANK, NODE_RANK, PET_*)"
        )
    if topo.order_note and topo.rank_order != "c10d":  # under c10d a warning says it (c10d_warnings)
        lines.append(f"--rank-order topology not applied: {topo.order_note}")
    if topo.levels and topo.me.domains is None:
        lines.append(f"node '{topo.me.node or '(none)'}' labels unknown: no TOPOLOGY_<LEVEL> variables")
    lines += [f"pod '{e.name}' is not a member: {e.reason}" for e in topo.excluded]
    lines += spare_lines(topo)
    return lines

