"""XGBoost (and LightGBM through XGBoostJob's names): ``xgboost.env`` and ``xgboost.json``.

xgboost 3 reads no ``DMLC_*`` from the environment: the collective takes them as arguments
(``CommunicatorContext(**args)``), so ``xgboost.json`` holds exactly those arguments. ``DMLC_NUM_WORKER`` is the
tracker's ``n_workers`` and counts processes, and ``DMLC_TASK_ID`` is the pod's first process's global id (a
base: each process adds its local rank), so the count and the ids always agree (Trainer v2 writes GPUs x pods
workers but one id per pod, and the group never forms). A pod runs one worker per GPU, else one (Trainer v2's
rule, pkg/runtime/framework/plugins/xgboost/xgboost.go), unless NPROC_PER_NODE is set explicitly: the CPU limit
does not count. Start the tracker with ``sortby="task"`` so that the rank is the task id.

XGBoost re-forms its group in the same process between rounds, with a new tracker on a new port. The port is
derived from the membership so that every pod computes the same one without talking to the others (their
generation numbers are their own). The job's first membership, as many training pods as the job starts with
(``FrameworkOptions.first``, from its objects; without them, the count the controller wrote into this pod:
XGBoostJob's ``WORLD_SIZE``, Trainer v2's ``DMLC_NUM_WORKER``), gets the base port itself (``--xgboost-port``, the
controller's, else 9999), where the controller puts its tracker. Any other membership gets the base plus one plus
a stable hash (SHA-256) of the training members' names, addresses, node ranks and process counts, modulo
``TRACKER_PORTS`` - 1 (fewer where the range would pass 65535), so never the first's. Every field hashed is part
of the membership key the sidecar compares, so a change that alters the port always rewrites the files. Where the
first membership is not known (a job read from its pods alone), every membership's port is hashed.

XGBoostJob's ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/``RANK``/``WORKER_ADDRS``/``WORKER_PORT``
(training-operator v1.9 pkg/controller.v1/xgboost/xgboost.go) are written per pod, one LightGBM machine per pod,
with every worker listed (XGBoostJob lists ``replicas - 1`` names, assuming exactly one master).
"""

from __future__ import annotations

import hashlib

from agent.core.files.frameworks.base import (
    Context,
    Framework,
    Port,
    compact_json,
    process_notes,
    processes,
    resolve_port,
)
from agent.core.files.variables import Variable, trainer_env
from agent.core.model import ADDRESS, Member, Options
from agent.core.plan.layout import Plan

TRACKER_PORTS = 1024


# What a controller writes into its XGBoost pods that counts the job's first membership, and in what: training
# pods (training-operator v1.9 pkg/controller.v1/xgboost/xgboost.go SetPodEnv: WORLD_SIZE, the replicas of master
# and workers) or XGBoost workers (Trainer v2.3.0 pkg/runtime/framework/plugins/xgboost/xgboost.go:
# DMLC_NUM_WORKER, numNodes x GPUs per node).
INJECTED_FIRST = {"xgboostjob": ("WORLD_SIZE", "pods"), "trainjob": ("DMLC_NUM_WORKER", "workers")}


def tracker_port(base: int, training: tuple[Member, ...]) -> int:
    """``base`` + 1 + a stable hash of the training members, in [base + 1, base + TRACKER_PORTS) and at most
    65535 (``base`` itself where no port is above it)."""
    text = "\n".join(f"{m.name} {m.address} {m.node_rank} {m.slots}" for m in training)
    span = min(TRACKER_PORTS, 65536 - base) - 1
    if span < 1:
        return base
    return base + 1 + int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % span


def first_membership(plan: Plan, options: Options) -> tuple[bool, str] | None:
    """Whether the plan's training members are the job's first membership, and what says how many that is; None:
    nothing says."""
    training = plan.topology.training
    found = options.frameworks.first
    if found is not None:
        return len(training) == found[0], f"{found[1]}: {found[0]} training pods"
    name, unit = INJECTED_FIRST.get(plan.controller.key, ("", ""))
    said = trainer_env(plan, options)[1].get(name, "") if name else ""
    if not (said.isascii() and said.isdigit()):
        return None
    where = f"{name}={said} that {plan.controller.title} wrote into pod '{plan.topology.self_name}'"
    if unit == "pods":
        return len(training) == int(said), where
    count = processes(Context(plan, options, {}, {}, None), XGBOOST.process_rule)
    return count is not None and count.total == int(said), where


class XGBoost(Framework):
    key, title, env_file = "xgboost", "XGBoost / LightGBM", "xgboost.env"
    other_files = ("xgboost.json",)
    default_port = 9999
    port_meaning = f"the base of the tracker's port (+ a hash of the members, mod {TRACKER_PORTS})"
    default_port_source = "XGBoostJob's default 9999 (xgboost's tracker has no fixed port)"
    process_rule = "devices"

    def port(self, plan: Plan, options: Options) -> Port | None:
        """The tracker's port: the base port chosen as for any framework, moved by the membership's hash. A
        --view own plan takes the leader's (it needs every member)."""
        if plan.published_ports is not None:
            found = plan.published_ports.get(self.key)
            return Port(found[0], f"{found[1]} (published by the job's leader)") if found else None
        base = resolve_port(self, plan, options)
        if base is None or not plan.topology.training:
            return None
        first = first_membership(plan, options)
        if first is not None and first[0]:
            return Port(base.number, f"{base.source}: the job's first membership ({first[1]}); a later one moves "
                        "it by a hash of its members")
        span = min(TRACKER_PORTS, 65536 - base.number) - 1
        why = f"not the job's first membership ({first[1]})" if first is not None else \
            "the job's first membership is not known"
        return Port(tracker_port(base.number, plan.topology.training),
                    f"base {base.number} ({base.source}) + 1 + hash of the training members mod {span}: the same on "
                    f"every pod, new with each membership; {why}")

    def variables(self, ctx: Context, port: Port | None) -> list[Variable]:
        assert port is not None
        topo, me = ctx.topology, ctx.me
        rank0 = topo.training[0]
        count = processes(ctx, self.process_rule)
        assert count is not None
        where = f"address of node rank 0, pod '{rank0.name}' (the tracker runs there)"
        out = [
            Variable("DMLC_TRACKER_URI", rank0.address, where),
            Variable("DMLC_TRACKER_PORT", str(port.number), port.source),
            Variable("DMLC_TASK_ID", str(count.first), count.first_rule),
            Variable("DMLC_NUM_WORKER", str(count.total), count.total_rule),
            Variable("MASTER_ADDR", rank0.address, "XGBoostJob's name: = DMLC_TRACKER_URI"),
            Variable("MASTER_PORT", str(port.number), "XGBoostJob's name: = DMLC_TRACKER_PORT"),
            Variable("WORLD_SIZE", str(topo.nnodes), "XGBoostJob's name: training pods (one LightGBM machine each)"),
            Variable("RANK", str(me.node_rank), "XGBoostJob's name: NODE_RANK"),
        ]
        if topo.nnodes > 1:
            if ctx.partial:
                out.append(Variable("WORKER_ADDRS", "", "XGBoostJob's name: every training pod but rank 0; --view "
                                    "own holds rank 0 and this pod only: not written", written=False))
            else:
                out.append(Variable("WORKER_ADDRS", ",".join(map(ADDRESS, topo.training[1:])),
                                    "XGBoostJob's name: addresses of the training pods after rank 0, rank order"))
            out.append(Variable("WORKER_PORT", str(port.number), "XGBoostJob's name: = MASTER_PORT"))
        return out

    def extra_files(self, ctx: Context, port: Port | None) -> dict[str, bytes]:
        assert port is not None
        count = processes(ctx, self.process_rule)
        assert count is not None
        return {"xgboost.json": compact_json({"dmlc_tracker_uri": ctx.topology.training[0].address,
                                              "dmlc_tracker_port": port.number,
                                              "dmlc_task_id": str(count.first)})}

    def notes(self, ctx: Context) -> tuple[str, ...]:
        return ("xgboost.json goes straight into xgboost.collective.CommunicatorContext(**...); rank 0 starts "
                "RabitTracker(n_workers=DMLC_NUM_WORKER, port=DMLC_TRACKER_PORT, sortby='task')",
                *process_notes(ctx, self.process_rule, "DMLC_TASK_ID"))


XGBOOST = XGBoost()
