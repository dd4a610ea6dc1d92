"""JAX: ``jax.env`` for ``jax.distributed.initialize``.

jax reads ``JAX_COORDINATOR_ADDRESS`` itself and needs it as ``host:port`` (jax 0.10 splits at the last ':'; an
address without a port fails with ``IndexError``, which is what JAXJob's bare ``COORDINATOR_ADDRESS`` gives when
copied there). ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` it does not read: the trainer passes them to
``initialize``, as Trainer v2's jax runtime asks. JAXJob's own names (training-operator v1.9
pkg/controller.v1/jax/envvar.go) are written too, with the same facts, so a script written for JAXJob runs.

One JAX process per pod unless NPROC_PER_NODE > 1: then the count is of processes and the id is the pod's first
process's (a base: each process adds its local rank), as RANK is.
"""

from __future__ import annotations

from typing import ClassVar

from agent.core.frameworks.base import Context, Framework, Port
from agent.core.variables import Variable, bracketed


def process_rules(ctx: Context) -> tuple[str, str]:
    """The rules behind a process count and a pod's first process id, as torch.env states WORLD_SIZE and RANK."""
    topo, me = ctx.topology, ctx.me
    count = f"NNODES {topo.nnodes} x NPROC_PER_NODE {me.slots}" if len(topo.slot_sizes) == 1 \
        else "sum of every training pod's NPROC_PER_NODE (pods differ)"
    first = "NODE_RANK" if me.slots == 1 and topo.slot_sizes == {1} else \
        "the global rank of this pod's first process (= RANK): each process adds its local rank"
    return f"processes: {count}", first


class Jax(Framework):
    key, title, env_file = "jax", "JAX", "jax.env"
    default_port = 55527
    port_meaning = "the coordinator's port (on node rank 0)"
    default_port_source = "jax's own Kubernetes port 55527 (jax/_src/clusters/k8s_cluster.py)"
    aliases: ClassVar[tuple[tuple[str, ...], ...]] = (("JAX_NUM_PROCESSES", "NUM_PROCESSES"),
                                                     ("JAX_PROCESS_ID", "PROCESS_ID"))

    def variables(self, ctx: Context, port: Port | None) -> list[Variable]:
        assert port is not None
        topo, me = ctx.topology, ctx.me
        rank0 = topo.training[0]
        count_rule, id_rule = process_rules(ctx)
        where = f"address of node rank 0, pod '{rank0.name}'"
        return [
            Variable("JAX_COORDINATOR_ADDRESS", f"{bracketed(rank0.address)}:{port.number}",
                     f"{where} : {port.source}"),
            Variable("JAX_NUM_PROCESSES", str(topo.world_size), count_rule),
            Variable("JAX_PROCESS_ID", str(me.first_rank), id_rule),
            Variable("COORDINATOR_ADDRESS", rank0.address, f"JAXJob's name: {where}, without the port"),
            Variable("COORDINATOR_PORT", str(port.number), f"JAXJob's name: {port.source}"),
            Variable("NUM_PROCESSES", str(topo.world_size), "JAXJob's name: = JAX_NUM_PROCESSES"),
            Variable("PROCESS_ID", str(me.first_rank), "JAXJob's name: = JAX_PROCESS_ID"),
        ]

    def notes(self, ctx: Context) -> tuple[str, ...]:
        if ctx.me.slots == 1:
            return ()
        return (f"{ctx.me.slots} processes in this pod: JAX_PROCESS_ID is the first's; process i uses "
                "JAX_PROCESS_ID + i (and its own JAX_LOCAL_DEVICE_IDS)",)


JAX = Jax()
