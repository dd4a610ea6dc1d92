"""Ray: ``ray.env`` with what KubeRay gives its pods (kuberay pod.go setContainerEnvVars, v1.7).

Ray follows membership itself (a raylet that reaches the GCS joins), so every training pod gets the head's
address: the head gets ``RAY_ADDRESS=127.0.0.1:<port>`` as KubeRay's head does, the others ``<head>:<port>``. A
pod that does not train (a Volcano job's client task, which submits to the cluster) is no Ray node and gets no
file, as no framework's files go to such a pod. The head is the first pod of role ``head`` (a KubeRay head group),
or of the task a Volcano job's ray plugin names ``--head`` (default ``head``), else node rank 0.

The port is where the head listens. Volcano's ray plugin starts the head, with its ``--port``, only in the head
pod's container named by ``--headContainer`` (default ``head``), and opens the port there, named ``gcs``
(volcano ray.go OnPodCreate, openHeadContainerPort): the agent reads that container's ``gcs`` port, and a head
pod without the container, which the plugin leaves alone, listens on Ray's own default.
"""

from __future__ import annotations

from agent.core.files.frameworks.base import Context, Framework, Port, named_port, resolve_port
from agent.core.files.variables import Variable
from agent.core.model import Member, Options, RawPod, bracketed
from agent.core.plan.layout import Plan
from agent.core.pods.pod import pod_name

HEAD_ROLE = "head"


def head_role(ctx: Context) -> str:
    """The role whose first pod is the head: the job's naming (a Volcano ray plugin's --head), else 'head'."""
    return _head_role(ctx.plan, ctx.options)


def _head_role(plan: Plan, options: Options) -> str:
    found = options.frameworks.role_map("ray")
    named = found if found is not None else plan.controller.framework_roles("ray") or {}
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


def _head_pod(plan: Plan, options: Options) -> RawPod | None:
    """The head's pod in a whole plan (None in an own view's, or without a head)."""
    topo = plan.topology
    role = _head_role(plan, options)
    head: Member | None = topo.role_members(role)[0] if role in topo.roles else \
        (topo.training[0] if topo.training else None)
    return plan.pods.get(head.name) if head is not None else None


class Ray(Framework):
    key, title, env_file = "ray", "Ray", "ray.env"
    default_port = 6379
    port_meaning = "the head's GCS port"
    default_port_source = "Ray's GCS port 6379 (KubeRay DefaultGcsServerPort)"

    def port(self, plan: Plan, options: Options) -> Port | None:
        """As any framework's, but where the controller names the head's container (Volcano's ray plugin): that
        container's port on the head's pod; where the job's plugin is known to run (the job object was read), Ray's
        default when the head pod has no such container, which the plugin leaves alone."""
        plugin = options.frameworks.container(self.key)
        container = plugin if plugin is not None else plan.controller.framework_container(self.key)
        name = (plan.controller.framework_port(self.key) or (None, None))[0]
        pod = _head_pod(plan, options) if container is not None and options.frameworks.port(self.key) is None \
            and plan.published_ports is None else None
        if pod is None or name is None:
            return resolve_port(self, plan, options)
        if plugin is not None and not any(c.get("name") == plugin for c in pod.get("spec", {}).get("containers", [])):
            return Port(self.default_port, f"{self.default_port_source}: {plan.controller.title}'s ray plugin "
                        f"starts the head only in container '{plugin}', which pod '{pod_name(pod)}' has not")
        found = named_port(pod, name, options, container=container)
        if found is not None:
            return Port(found.number, f"{found.source}, where {plan.controller.title}'s ray plugin starts the head")
        return resolve_port(self, plan, options)

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
