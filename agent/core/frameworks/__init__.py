"""Every framework's spelling of the one plan: one module per framework, one row in ``FRAMEWORKS``.

The plan that decides RANK, rank 0, the addresses, the processes per pod and the generation for torch.env
decides every framework's values too (docs/frameworks.md). A pod gets a framework's files when the framework is
selected, by the setting (``--frameworks``) or by the job (``Controller.frameworks``: an MPIJob implies mpi),
and when the framework's own rule gives them to the pod (``Framework.refusal``). Nothing is selected for a
torch-only job, and then nothing here runs.
"""

from __future__ import annotations

from agent.core.frameworks.base import Context, Framework, Port, Rendition
from agent.core.frameworks.jax import JAX
from agent.core.frameworks.mlx import MLX
from agent.core.frameworks.mpi import MPI
from agent.core.frameworks.paddle import PADDLE
from agent.core.frameworks.ray import RAY
from agent.core.frameworks.tf import TF
from agent.core.frameworks.xgboost import XGBOOST
from agent.core.model import Options
from agent.core.topology import Plan
from agent.core.variables import trainer_env

# The order is the files' write order and explain's.
FRAMEWORKS: dict[str, Framework] = {f.key: f for f in (JAX, TF, XGBOOST, PADDLE, MLX, MPI, RAY)}
PORTED = tuple(key for key, f in FRAMEWORKS.items() if f.has_port)  # the frameworks with a --<key>-port


def selected(plan: Plan, options: Options) -> list[tuple[Framework, str]]:
    """The frameworks this pod's job renders, each with what selected it, in registry order."""
    chosen = options.frameworks
    implied = plan.controller.frameworks(())
    if not chosen.names and not chosen.implied and not implied:
        return []
    why: dict[str, str] = {}
    for name in chosen.names:
        why.setdefault(name, options.label("frameworks"))
    for name, reason in chosen.implied:
        why.setdefault(name, reason)
    for name in implied:
        why.setdefault(name, f"{plan.controller.title} jobs")
    return [(framework, why[key]) for key, framework in FRAMEWORKS.items() if key in why]


def render_frameworks(plan: Plan, options: Options, *, files_dir: str | None = None) -> tuple[Rendition, ...]:
    """Each selected framework's variables and files for the plan's own pod (empty for a torch-only job)."""
    chosen = selected(plan, options)
    if not chosen:
        return ()
    user, injected = trainer_env(plan, options)
    context = Context(plan, options, user, injected, files_dir, frozenset(options.frameworks.names))
    return tuple(framework.render(context, why) for framework, why in chosen)


def published_ports(plan: Plan, options: Options) -> dict[str, tuple[int, str]]:
    """The ports a ``--view own`` pod cannot find itself (rank 0's container, the whole membership), as the
    leader's plan gives them: the summary carries them (core/summary.py)."""
    found = {}
    for framework, _ in selected(plan, options):
        port = framework.port(plan, options)
        if port is not None:
            found[framework.key] = (port.number, port.source)
    return found


__all__ = ["FRAMEWORKS", "PORTED", "Context", "Framework", "Port", "Rendition", "published_ports",
           "render_frameworks", "selected"]
