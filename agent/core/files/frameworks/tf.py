"""TensorFlow: ``tf_config.json`` and ``tf.env`` (``TF_CONFIG``), from the live members.

TF 2 accepts only the cluster keys ``chief``, ``worker``, ``ps`` and ``evaluator``, at most one chief and one
evaluator (tensorflow/python/distribute/multi_worker_util.py ``_validate_cluster_spec``). A role named
``master`` (a TFJob ``Master`` replica) is written as ``chief``: TFJob writes ``master``, which
MultiWorkerMirroredStrategy refuses (tensorflow#27058). Every live member of those roles is listed, in rank
order within its type, in every pod's file, the chief too (TFJob's ``enableDynamicWorker`` left the chief out
of its own cluster, kubeflow/trainer#1763), and the sidecar rewrites it when members change (TFJob and Volcano
set TF_CONFIG once, at pod creation: kubeflow/trainer#2070). TF reads it once, when the strategy is built: a
new membership needs a new process.

Who gets it: the pods whose role is one of those types, training or not (a parameter server does not train
in torch's sense, but is a TF task). A role is a type by its name, or by the job's naming where the job names
them (a Volcano job's tensorflow plugin: ``--ps``, ``--worker``, ``--chief``, ``--evaluator``). A pod of any
other role gets no TF file: TF refuses a task type outside its cluster. One TF task per pod (TF runs one server
per host and uses its local devices). Fields a controller writes beside ``cluster`` and ``task`` (TFJob's
``environment``) are written as it writes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from agent.core.files.frameworks.base import (
    Context,
    Framework,
    Port,
    compact_json,
    host_ports,
    hosts_json,
    resolve_port,
    role_map,
)
from agent.core.files.variables import Variable
from agent.core.model import LISTED_HOSTS, Options
from agent.core.plan.layout import Plan

TASK_TYPES = ("chief", "worker", "ps", "evaluator")  # TF's cluster keys, in the order they are written
ROLE_TYPES = {"chief": "chief", "master": "chief", "worker": "worker", "ps": "ps", "evaluator": "evaluator"}
SINGLE = ("chief", "evaluator")  # TF allows at most one of each


def task_type(role: str, named: Mapping[str, str] | None = None) -> str | None:
    """The TF task type of a role: the job's naming when it has one (its roles -> TF's types), else the name."""
    if named is not None:
        found = named.get(role)
        return found if found in TASK_TYPES else None
    return ROLE_TYPES.get(role.lower())


def types_of(ctx: Context) -> Mapping[str, str] | None:
    return role_map(ctx, "tf")


class Tf(Framework):
    key, title, env_file = "tf", "TensorFlow", "tf.env"
    other_files = ("tf_config.json",)
    recipients = "the pods of roles chief, master (as chief), worker, ps and evaluator"
    default_port = 2222
    port_meaning = "the port every TF task listens on"
    default_port_source = "TFJob's and Volcano's tensorflow plugin's default 2222"
    needs_every_member = True

    def own_view_serves(self, ctx: Context) -> bool:
        """TF_CONFIG names the tasks by address: a pod in its own view writes it when the summary gives every TF
        role's addresses (the list of a small role, the template of a large one: ``Topology.address_templates``)
        and its own among them."""
        topo, named = ctx.topology, types_of(ctx)
        roles = [role for role in topo.roles if task_type(role, named) is not None]
        if not ctx.partial:
            port = self.port(ctx.plan, ctx.options)
            if port is not None and len({p.number for p in self.role_ports(ctx, port).values()}) > 1:
                return False  # the roles' own ports: the summary publishes one
            return all(len(topo.role_members(role)) <= LISTED_HOSTS or topo.address_templates.get(role) is not None
                       for role in roles)
        if any(topo.role_addresses(role) is None for role in roles):
            return False
        return ctx.me.address in (topo.role_addresses(ctx.me.role) or ())

    def refusal(self, ctx: Context) -> str | None:
        if task_type(ctx.me.role, types_of(ctx)) is not None:
            return None
        return f"role '{ctx.me.role}' is no TensorFlow task type; {self.env_file} goes to {self.recipients}"

    def addresses(self, ctx: Context) -> dict[str, list[tuple[str, Sequence[str]]]]:
        """Each type's roles with their addresses in rank order (once per rendering)."""
        found: dict[str, list[tuple[str, Sequence[str]]]] | None = ctx.memo.get("tf.addresses")
        if found is None:
            topo, named = ctx.topology, types_of(ctx)
            found = {}
            for kind in TASK_TYPES:
                for role in topo.roles:
                    if task_type(role, named) == kind:
                        found.setdefault(kind, []).append((role, topo.role_addresses(role) or ()))
            ctx.memo["tf.addresses"] = found
        return found

    def role_ports(self, ctx: Context, port: Port) -> dict[str, Port]:
        """Each TF role's port. TFJob reads each replica type's own, the port 'tfjob-port' of that type's template
        (pkg/controller.v1/tensorflow/util.go GetPortFromTFJob, called per type by genClusterSpec), so a role's
        tasks listen where its own pods say: found on the role's first pod, else the convention. A setting, the
        job's one port (Volcano's tensorflow plugin's --port) or the leader's published port holds for every
        role."""
        found: dict[str, Port] | None = ctx.memo.get("tf.ports")
        if found is None:
            plan, options, topo, named = ctx.plan, ctx.options, ctx.topology, types_of(ctx)
            name = (plan.controller.framework_port(self.key) or (None, None))[0]
            one = name is None or ctx.partial or options.frameworks.port(self.key) is not None \
                or options.frameworks.job_port(self.key) is not None
            found = {}
            for role in topo.roles:
                if task_type(role, named) is None:
                    continue
                members = () if one else topo.role_members(role)
                pod = plan.pods.get(members[0].name) if members else None
                found[role] = port if pod is None else (resolve_port(self, plan, options, pod=pod) or port)
            ctx.memo["tf.ports"] = found
        return found

    def published_port(self, plan: Plan, options: Options) -> Port | None:
        """None where the TF roles listen on different ports: a pod in its own view knows only the one published,
        so it writes every member (the view choice asks ``own_view_serves``)."""
        port = self.port(plan, options)
        if port is None or plan.published_ports is not None:
            return port
        ports = self.role_ports(Context(plan, options, {}, {}, None), port)
        return port if len({p.number for p in ports.values()}) <= 1 else None

    def blocked(self, ctx: Context, port: Port | None) -> str | None:
        why = super().blocked(ctx, port)
        if why is not None or port is None:
            return why
        topo, named = ctx.topology, types_of(ctx)  # counts only: the cluster's 16384 host:ports are made once
        counts = {kind: sum(topo.role_hosts(role)[0] for role in topo.roles if task_type(role, named) == kind)
                  for kind in SINGLE}
        crowded = [kind for kind in SINGLE if counts[kind] > 1]
        if crowded:
            return (f"{counts[crowded[0]]} pods are TF task type '{crowded[0]}', and TF allows one; give the "
                    "role one replica")
        return None

    def config(self, ctx: Context) -> dict[str, object]:
        """TF_CONFIG with None for its cluster, in its place (``text`` writes the lists), unless the controller's
        fields give one."""
        me, topo, named = ctx.me, ctx.topology, types_of(ctx)
        kind = task_type(me.role, named)
        assert kind is not None
        roles = [r for r in topo.roles if task_type(r, named) == kind]
        before = 0
        for role in roles:  # 'chief' and 'master' are one type: the first role's pods come first
            if role == me.role:
                before += _position(ctx)
                break
            before += len(topo.role_addresses(role) or ())
        return {"cluster": None, "task": {"type": kind, "index": before},
                **dict(ctx.plan.controller.framework_fields(self.key))}

    def alone(self, ctx: Context, port: Port) -> bool:
        """The job is one TF task: TFJob (util.go isDistributed) and Volcano's plugin (OnPodCreate) set no TF_CONFIG
        then, since TF's Estimator takes a TF_CONFIG of one worker for a distributed job (kubeflow/trainer#1078)."""
        return sum(len(addresses) for roles in self.addresses(ctx).values() for _, addresses in roles) == 1

    def text(self, ctx: Context, port: Port) -> bytes:
        """tf_config.json: ``config``, its cluster each type's ``<address>:<port>`` in rank order (``hosts_json``)."""
        found: bytes | None = ctx.memo.get("tf.config")
        if found is None:
            found = ctx.memo["tf.config"] = b"{}\n" if self.alone(ctx, port) else self._config_text(ctx, port)
        return found

    def _config_text(self, ctx: Context, port: Port) -> bytes:
        config = self.config(ctx)
        if config["cluster"] is not None:  # a controller's own cluster field: written as the encoder writes it
            return compact_json(config)
        parts = [b'{"cluster":{']
        ports = self.role_ports(ctx, port)
        for kind, roles in self.addresses(ctx).items():
            parts += [b"," if len(parts) > 1 else b"", json.dumps(kind).encode(), b":"]
            numbers = {ports[role].number for role, _ in roles}
            if len(numbers) == 1:  # one port: the type's addresses in one list (one join, ``hosts_json``)
                everyone = roles[0][1] if len(roles) == 1 else [a for _, addresses in roles for a in addresses]
                parts += hosts_json(everyone, numbers.pop())
            else:  # 'chief' and 'master' roles at their own ports
                parts.append(json.dumps([h for role, addresses in roles for h in host_ports(addresses,
                                                                                             ports[role].number)],
                                        separators=(",", ":")).encode())
        rest = compact_json({k: v for k, v in config.items() if k != "cluster"})  # "task" first, then the fields
        return b"".join([*parts, b"},", rest[1:]])

    def variables(self, ctx: Context, port: Port | None) -> list[Variable]:
        assert port is not None
        named = types_of(ctx)
        kind = task_type(ctx.me.role, named)
        text = str(memoryview(self.text(ctx, port))[:-1], "utf-8")  # without its newline, in one copy
        if self.alone(ctx, port):
            return [Variable("TF_CONFIG", "", "not written: this pod is the job's one TF task, which TF runs alone "
                             "without it (as TFJob and Volcano, kubeflow/trainer#1078); tf_config.json is {}",
                             written=False)]
        roles = ", ".join(sorted(named or ROLE_TYPES))
        ports = self.role_ports(ctx, port)
        if len({p.number for p in ports.values()}) <= 1:
            where = f"each <address>:{port.number} ({port.source})"
        else:
            where = "each role's tasks at its own port: " + ", ".join(f"{role} {p.number} ({p.source})"
                                                                      for role, p in ports.items())
        return [Variable("TF_CONFIG", text, f"the live members of roles {roles} in rank order, {where}; this pod is "
                         f"task '{kind}' (= tf_config.json)")]

    def extra_files(self, ctx: Context, port: Port | None) -> dict[str, bytes]:
        assert port is not None
        return {"tf_config.json": self.text(ctx, port)}


TF = Tf()


def _position(ctx: Context) -> int:
    """This pod's place among its role's members in rank order: found by name in the full view, by its address
    in its own (a DNS name, one per pod: ``own_view_serves``)."""
    topo, me = ctx.topology, ctx.me
    if not ctx.partial:
        return next(i for i, m in enumerate(topo.role_members(me.role)) if m.name == me.name)
    return (topo.role_addresses(me.role) or ()).index(me.address)
