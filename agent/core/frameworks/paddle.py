"""PaddlePaddle: ``paddle.env`` for ``python -m paddle.distributed.launch``.

The launcher maps ``PADDLE_MASTER``, ``PADDLE_NNODES``, ``PADDLE_RANK``, ``PADDLE_JOB_ID``,
``PADDLE_NPROC_PER_NODE`` and ``POD_IP`` to its options (paddle/distributed/launch/context/args_envs.py). Its HTTP
master starts its key-value server only in the pod whose own IP (or 127.0.0.1) is the master's, so rank 0 is
given its own IP there, as PaddleJob does (pkg/controller.v1/paddlepaddle/envvar.go), and ``POD_IP`` the same
address. ``PADDLE_RANK`` is the agent's NODE_RANK: PaddleJob writes no rank, so ranks followed whichever pod
reached the master first. Paddle's launcher starts the pod's processes itself: every value here is per pod.
"""

from __future__ import annotations

from agent.core.frameworks.base import Context, Framework, Port
from agent.core.variables import Variable, bracketed


class Paddle(Framework):
    key, title, env_file = "paddle", "PaddlePaddle", "paddle.env"
    default_port = 36543
    port_meaning = "the master's port (on node rank 0)"
    default_port_source = "PaddleJob's default 36543"

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
        job_id = topo.job_uid or topo.job.replace("/", "-")
        return [
            Variable("PADDLE_MASTER", f"{bracketed(host)}:{port.number}", f"{where} : {port.source}"),
            Variable("PADDLE_NNODES", str(topo.nnodes), "number of training pods"),
            Variable("PADDLE_RANK", str(me.node_rank), "NODE_RANK (PaddleJob writes none)"),
            Variable("PADDLE_JOB_ID", job_id, "uid of the job object" if topo.job_uid else "job name"),
            Variable("PADDLE_NPROC_PER_NODE", str(me.slots), "= NPROC_PER_NODE (the launcher starts them)"),
            Variable("POD_IP", own, "this pod's IP (the launcher's --host)" if me.ip else
                     "this pod's address (its IP is not known)"),
        ]


PADDLE = Paddle()
