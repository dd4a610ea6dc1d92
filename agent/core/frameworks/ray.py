"""Ray: ``ray.env`` with what KubeRay gives its pods (kuberay pod.go setContainerEnvVars, v1.7).

Ray follows membership itself (a raylet that reaches the GCS joins), so every pod of the job gets the head's
address, training or not: the head gets ``RAY_ADDRESS=127.0.0.1:<port>`` as KubeRay's head does, the others
``<head>:<port>``. The head is the first pod of role ``head`` (a KubeRay head group), or of the task a Volcano
job's ray plugin names ``--head`` (default ``head``), else node rank 0.
"""

from __future__ import annotations

from agent.core.frameworks.base import Context, Framework, Port, role_map
from agent.core.variables import Variable, bracketed

HEAD_ROLE = "head"


def head_role(ctx: Context) -> str:
    """The role whose first pod is the head: the job's naming (a Volcano ray plugin's --head), else 'head'."""
    named = role_map(ctx, "ray") or {}
    return next((role for role, kind in named.items() if kind == HEAD_ROLE), HEAD_ROLE)


def head_of(ctx: Context) -> tuple[str, bool, str] | None:
    """(the head's address, whether this pod is the head, why it is the head), or None when the view holds no
    head."""
    topo, me = ctx.topology, ctx.me
    role = head_role(ctx)
    if role in topo.roles:
        why = f"the first pod of role '{role}'"
        if ctx.partial:  # rank 0 and this pod: the head's address from the role's published list
            _, hosts = topo.role_hosts(role)
            return (hosts[0], me.role == role and me.address == hosts[0], why) if hosts else None
        head = topo.role_members(role)[0]
        return head.address, head.name == me.name, f"{why}, pod '{head.name}'"
    if topo.training:
        head = topo.training[0]
        return head.address, head.name == me.name, f"node rank 0, pod '{head.name}' (no role 'head')"
    return None


class Ray(Framework):
    key, title, env_file = "ray", "Ray", "ray.env"
    recipients = "every pod of the job"
    default_port = 6379
    port_meaning = "the head's GCS port"
    default_port_source = "Ray's GCS port 6379 (KubeRay DefaultGcsServerPort)"

    def refusal(self, ctx: Context) -> str | None:
        return None

    def blocked(self, ctx: Context, port: Port | None) -> str | None:
        if head_of(ctx) is None:
            return "no head: the job has no pod of role 'head' and no training pod (or the view does not list them)"
        return super().blocked(ctx, port)

    def variables(self, ctx: Context, port: Port | None) -> list[Variable]:
        assert port is not None
        found = head_of(ctx)
        assert found is not None
        head, is_head, why = found
        address = (f"127.0.0.1:{port.number}", f"this pod is the head ({why}), as KubeRay's head") if is_head else \
            (f"{bracketed(head)}:{port.number}", f"address of the head, {why} : {port.source}")
        return [
            Variable("RAY_ADDRESS", address[0], address[1]),
            Variable("RAY_PORT", str(port.number), port.source),
            Variable("FQ_RAY_IP", head, f"address of the head, {why}"),
        ]


RAY = Ray()
