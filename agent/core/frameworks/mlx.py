"""MLX's ring backend: ``mlx_hostfile.json`` and ``mlx.env``, so MLX runs without mpirun, sshd or a launcher pod.

The ring backend reads a JSON hostfile, one list of ``"ip:port"`` per rank (the same file for every rank), and
its rank from ``MLX_RANK`` (mlx/_distributed_utils/launch.py, ``launch_ring``); ``mlx.launch`` refuses host
names there ("The ring backend requires IPs"). One rank per process: a pod with NPROC_PER_NODE > 1 has that many
entries, on ports ``base + local rank`` (base: ``--mlx-port``, else 32323, mlx.launch's ``--starting-port``), and
``MLX_RANK`` is its first process's rank (each process adds its local rank). The existing ``hostfile`` keeps
serving MLX's MPI backend (Trainer v2's mlx runtime). ``MLX_WORLD_SIZE`` is the process count its NCCL backend
reads.
"""

from __future__ import annotations

from agent.core.frameworks.base import Context, Framework, Port, compact_json, host_ports
from agent.core.frameworks.jax import process_rules
from agent.core.variables import Variable, bracketed


class Mlx(Framework):
    key, title, env_file = "mlx", "MLX (ring)", "mlx.env"
    other_files = ("mlx_hostfile.json",)
    default_port = 32323
    port_meaning = "the ring's first port (+ each process's local rank)"
    default_port_source = "mlx.launch's --starting-port default 32323"
    needs_every_member = True

    def blocked(self, ctx: Context, port: Port | None) -> str | None:
        why = super().blocked(ctx, port)
        if why is not None or port is None:
            return why
        topo = ctx.topology
        without = [m.name for m in topo.training if not m.ip]
        if without:
            return f"training pod '{without[0]}' has no IP yet, and the ring backend needs IPs"
        seen: set[str | None] = set()
        for member in topo.training:
            if member.ip in seen:
                return (f"training pod '{member.name}' shares its IP with another (hostNetwork): their ring ports "
                        "would clash; run one training pod per node")
            seen.add(member.ip)
        if port.number + max(topo.slot_sizes) - 1 > 65535:
            return f"ports {port.number} + NPROC_PER_NODE pass 65535; set a lower --mlx-port"
        return None

    def hosts(self, ctx: Context, port: Port) -> list[list[str]]:
        """One ``[ip:port]`` per training process, in rank order (the ports of a pod's processes follow)."""
        training = ctx.topology.training
        ips = [m.ip or "" for m in training]
        if ctx.topology.slot_sizes == {1}:
            return [[entry] for entry in host_ports(ips, port.number)]
        return [[f"{bracketed(ip)}:{port.number + local}"] for ip, m in zip(ips, training, strict=True)
                for local in range(m.slots)]

    def variables(self, ctx: Context, port: Port | None) -> list[Variable]:
        assert port is not None
        count_rule, id_rule = process_rules(ctx)
        return [
            Variable("MLX_HOSTFILE", ctx.path("mlx_hostfile.json"), "the ring's hostfile: each training process's "
                     f"IP:port in rank order, port {port.number} + local rank ({port.source})"),
            Variable("MLX_RANK", str(ctx.me.first_rank), id_rule),
            Variable("MLX_WORLD_SIZE", str(ctx.topology.world_size), count_rule),
        ]

    def extra_files(self, ctx: Context, port: Port | None) -> dict[str, bytes]:
        assert port is not None
        return {"mlx_hostfile.json": compact_json(self.hosts(ctx, port))}

    def notes(self, ctx: Context) -> tuple[str, ...]:
        if ctx.me.slots == 1:
            return ()
        return (f"{ctx.me.slots} processes in this pod: MLX_RANK is the first's; process i uses MLX_RANK + i",)


MLX = Mlx()
