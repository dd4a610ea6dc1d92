"""PaddlePaddle: ``paddle.env`` for ``python -m paddle.distributed.launch``.

The launcher maps ``PADDLE_MASTER``, ``PADDLE_NNODES``, ``PADDLE_RANK``, ``PADDLE_JOB_ID``,
``PADDLE_NPROC_PER_NODE`` and ``POD_IP`` to its options (paddle/distributed/launch/context/args_envs.py). Its HTTP
master starts its key-value server only in the pod whose own IP (or 127.0.0.1) is the master's, so rank 0 is
given its own IP there, as PaddleJob does (pkg/controller.v1/paddlepaddle/envvar.go), and ``POD_IP`` the same
address. ``PADDLE_RANK`` is the agent's NODE_RANK: PaddleJob writes no rank, so ranks followed whichever pod
reached the master first. Paddle's launcher starts the pod's processes itself, one per device
(``PADDLE_NPROC_PER_NODE``: the pod's GPUs, else one, unless NPROC_PER_NODE is set explicitly; the CPU limit does
not count): every other value here is per pod.

Parameter-server mode (a PaddleJob with a Master spec: its masters are Paddle's servers, its workers the
trainers) adds ``PADDLE_SERVER_NUM`` to a server's file and ``PADDLE_TRAINER_NUM`` to a trainer's: the servers or
trainers the launcher starts in that pod, one, as PaddleJob writes them (envvar.go).
"""

from __future__ import annotations

from agent.core.files.frameworks.base import Context, Framework, Port, process_notes, processes, role_map
from agent.core.files.variables import Variable
from agent.core.model import bracketed


class Paddle(Framework):
    key, title, env_file = "paddle", "PaddlePaddle", "paddle.env"
    default_port = 36543
    port_meaning = "the master's port (on node rank 0)"
    default_port_source = "PaddleJob's default 36543"
    process_rule = "devices"

    def variables(self, ctx: Context, port: Port | None) -> list[Variable]:
        assert port is not None
        topo, me = ctx.topology, ctx.me
        rank0 = topo.training[0]
        own = me.ip or me.address
        if me.node_rank == 0:
            host, where = own, ("this pod's own IP: Paddle's master starts its server only where the master is "
                                "the pod's own address" if me.ip else "this pod's address (its IP is not known)")
        else:
            host, where = rank0.address, f"address of node rank 0, pod '{rank0.name}'"
        job_id = topo.job.replace("/", "-")
        count = processes(ctx, self.process_rule)
        assert count is not None
        out = [
            Variable("PADDLE_MASTER", f"{bracketed(host)}:{port.number}", f"{where} : {port.source}"),
            Variable("PADDLE_NNODES", str(topo.nnodes), "number of training pods"),
            Variable("PADDLE_RANK", str(me.node_rank), "NODE_RANK (PaddleJob writes none)"),
            Variable("PADDLE_JOB_ID", job_id, "the job's name, as PaddleJob writes it (envvar.go)"),
            Variable("PADDLE_NPROC_PER_NODE", str(count.mine), f"the launcher starts them: {count.mine_rule}"),
            Variable("POD_IP", own, "this pod's IP (the launcher's --host)" if me.ip else
                     "this pod's address (its IP is not known)"),
        ]
        return out + self.ps_mode(ctx)

    def ps_mode(self, ctx: Context) -> list[Variable]:
        """Parameter-server mode's counts for this pod, when some role of the job is Paddle's server."""
        roles = role_map(ctx, self.key) or {}
        servers = [r for r in ctx.topology.roles if roles.get(r) == "server"]
        if not servers:
            return []
        kind = roles.get(ctx.me.role)
        why = f"parameter-server mode (role{'s' if len(servers) > 1 else ''} {', '.join(servers)}: servers)"
        if kind == "server":
            return [Variable("PADDLE_SERVER_NUM", "1", f"{why}: one server in this pod, as PaddleJob starts")]
        if kind == "trainer":
            return [Variable("PADDLE_TRAINER_NUM", "1", f"{why}: one trainer in this pod, as PaddleJob starts")]
        return []

    def notes(self, ctx: Context) -> tuple[str, ...]:
        return process_notes(ctx, self.process_rule, "PADDLE_NPROC_PER_NODE")[:1]


PADDLE = Paddle()
