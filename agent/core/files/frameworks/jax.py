"""JAX: ``jax.env`` for ``jax.distributed.initialize``.

jax reads ``JAX_COORDINATOR_ADDRESS`` itself and needs it as ``host:port`` (jax 0.10 splits at the last ':'; an
address without a port fails with ``IndexError``, which is what JAXJob's bare ``COORDINATOR_ADDRESS`` gives when
copied there). ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` it does not read: the trainer passes them to
``initialize``, as Trainer v2's jax runtime asks. JAXJob's own names (training-operator v1.9
pkg/controller.v1/jax/envvar.go) are written too, with the same facts, so a script written for JAXJob runs.

One JAX process per pod, driving all the pod's devices, as Trainer v2's jax plugin counts (JAX_NUM_PROCESSES =
numNodes, pkg/runtime/framework/plugins/jax/jax.go) and JAXJob does (NUM_PROCESSES = replicas): the CPU limit
that gives torchrun its processes does not count. Where NPROC_PER_NODE is set explicitly (a setting, the
container's variable, the job's slots) the count is of processes and the id is the pod's first process's (a
base: each process adds its local rank), as RANK is.
"""

from __future__ import annotations

from typing import ClassVar

from agent.core.files.frameworks.base import Context, Framework, Port, process_notes, processes
from agent.core.files.variables import Variable
from agent.core.model import bracketed


class Jax(Framework):
    key, title, env_file = "jax", "JAX", "jax.env"
    default_port = 55527
    port_meaning = "the coordinator's port (on node rank 0)"
    default_port_source = "jax's own Kubernetes port 55527 (jax/_src/clusters/k8s_cluster.py)"
    aliases: ClassVar[tuple[tuple[str, ...], ...]] = (("JAX_NUM_PROCESSES", "NUM_PROCESSES"),
                                                     ("JAX_PROCESS_ID", "PROCESS_ID"))
    process_rule = "explicit"

    def variables(self, ctx: Context, port: Port | None) -> list[Variable]:
        assert port is not None
        rank0 = ctx.topology.training[0]
        count = processes(ctx, self.process_rule)
        assert count is not None
        where = f"address of node rank 0, pod '{rank0.name}'"
        return [
            Variable("JAX_COORDINATOR_ADDRESS", f"{bracketed(rank0.address)}:{port.number}",
                     f"{where} : {port.source}"),
            Variable("JAX_NUM_PROCESSES", str(count.total), count.total_rule),
            Variable("JAX_PROCESS_ID", str(count.first), count.first_rule),
            Variable("COORDINATOR_ADDRESS", rank0.address, f"JAXJob's name: {where}, without the port"),
            Variable("COORDINATOR_PORT", str(port.number), f"JAXJob's name: {port.source}"),
            Variable("NUM_PROCESSES", str(count.total), "JAXJob's name: = JAX_NUM_PROCESSES"),
            Variable("PROCESS_ID", str(count.first), "JAXJob's name: = JAX_PROCESS_ID"),
        ]

    def notes(self, ctx: Context) -> tuple[str, ...]:
        return process_notes(ctx, self.process_rule, "JAX_PROCESS_ID", "(and its own JAX_LOCAL_DEVICE_IDS)")


JAX = Jax()
