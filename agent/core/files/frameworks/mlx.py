"""MLX's ring backend: ``mlx_hostfile.json`` and ``mlx.env``, so MLX runs without mpirun, sshd or a launcher pod.

The ring backend reads a JSON hostfile, one list of ``"ip:port"`` per rank (the same file for every rank), and
its rank from ``MLX_RANK`` (mlx/_distributed_utils/launch.py, ``launch_ring``); ``mlx.launch`` refuses host
names there ("The ring backend requires IPs"). One rank per process: a pod runs one per GPU (mlx[cuda]), else
one (the CPU limit does not count), unless NPROC_PER_NODE is set explicitly; a pod with several has that many
entries, on ports ``base + local rank`` (base: ``--mlx-port``, else 32323, mlx.launch's ``--starting-port``),
and ``MLX_RANK`` is its first process's rank (each process adds its local rank). The existing ``hostfile`` keeps
serving MLX's MPI backend (Trainer v2's mlx runtime). MLX's NCCL backend (mlx[cuda]) reads ``NCCL_HOST_IP``
(rank 0's IP), ``NCCL_PORT``, ``MLX_WORLD_SIZE`` and ``MLX_RANK`` (mlx/distributed/nccl/nccl.cpp ``init``;
mlx.launch ``launch_nccl`` sets them, the port from ``--nccl-port``, default 12345).
"""

from __future__ import annotations

from agent.core.files.frameworks.base import (
    Context,
    Framework,
    Port,
    compact_json,
    host_ports,
    process_notes,
    processes,
)
from agent.core.files.variables import Variable
from agent.core.model import bracketed

NCCL_PORT = 12345  # mlx.launch --nccl-port's default (mlx/_distributed_utils/launch.py, v0.32)


class Mlx(Framework):
    key, title, env_file = "mlx", "MLX (ring)", "mlx.env"
    other_files = ("mlx_hostfile.json",)
    default_port = 32323
    port_meaning = "the ring's first port (+ each process's local rank)"
    default_port_source = "mlx.launch's --starting-port default 32323"
    needs_every_member = True
    reads_rank0_ip = True  # NCCL_HOST_IP
    process_rule = "devices"

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
        count = processes(ctx, self.process_rule)
        assert count is not None and count.counts is not None
        if port.number + max(count.counts) - 1 > 65535:
            return f"ports {port.number} + the processes of a pod pass 65535; set a lower --mlx-port"
        return None

    def hosts(self, ctx: Context, port: Port) -> list[list[str]]:
        """One ``[ip:port]`` per training process, in rank order (the ports of a pod's processes follow)."""
        training = ctx.topology.training
        ips = [m.ip or "" for m in training]
        count = processes(ctx, self.process_rule)
        assert count is not None and count.counts is not None
        if set(count.counts) == {1}:
            return [[entry] for entry in host_ports(ips, port.number)]
        return [[f"{bracketed(ip)}:{port.number + local}"] for ip, n in zip(ips, count.counts, strict=True)
                for local in range(n)]

    def variables(self, ctx: Context, port: Port | None) -> list[Variable]:
        assert port is not None
        count = processes(ctx, self.process_rule)
        assert count is not None
        rank0 = ctx.topology.training[0]
        return [
            Variable("MLX_HOSTFILE", ctx.path("mlx_hostfile.json"), "the ring's hostfile: each training process's "
                     f"IP:port in rank order, port {port.number} + local rank ({port.source})"),
            Variable("MLX_RANK", str(count.first), count.first_rule),
            Variable("MLX_WORLD_SIZE", str(count.total), count.total_rule),
            Variable("NCCL_HOST_IP", rank0.ip or "", f"IP of node rank 0, pod '{rank0.name}' (MLX's NCCL backend)"),
            Variable("NCCL_PORT", str(NCCL_PORT), f"mlx.launch's --nccl-port default {NCCL_PORT} (MLX's NCCL "
                     "backend; set NCCL_PORT in the container for another)"),
        ]

    def extra_files(self, ctx: Context, port: Port | None) -> dict[str, bytes]:
        assert port is not None
        return {"mlx_hostfile.json": compact_json(self.hosts(ctx, port))}

    def notes(self, ctx: Context) -> tuple[str, ...]:
        return process_notes(ctx, self.process_rule, "MLX_RANK", "(with NCCL: CUDA_VISIBLE_DEVICES=i)")


MLX = Mlx()
