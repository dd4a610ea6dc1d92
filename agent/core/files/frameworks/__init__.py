"""Every framework's spelling of the one plan: one module per framework, one row in ``FRAMEWORKS``.

The plan that decides RANK, rank 0, the addresses, the processes per pod and the generation for torch.env
decides every framework's values too (docs/frameworks.md). A pod gets a framework's files when the framework is
selected, by the setting (``--frameworks``) or by the job (``Controller.frameworks``: an MPIJob implies mpi),
and when the framework's own rule gives them to the pod (``Framework.refusal``). Nothing is selected for a
torch-only job, and then nothing here runs.

The registry names each framework's module and imports it (with ``base``, what they share) the first time the
framework is looked up: a torch-only job's pods, most pods of most jobs, never load a renderer, and every
``topology-agent`` process starts without them (bench/import_bench.py). What is known without a renderer: the
keys, their order, and which frameworks have a port of their own (``--<key>-port``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from agent.core.files.variables import trainer_env

if TYPE_CHECKING:
    from agent.core.files.frameworks.base import Context, Framework, Port, Rendition
    from agent.core.model import Options
    from agent.core.plan.layout import Plan


class Row(NamedTuple):
    """One framework: its key (its module is ``agent/core/files/frameworks/<key>.py``), the name of its instance there,
    and whether it has a port of its own (its ``has_port``; a test holds the two together)."""

    key: str
    instance: str
    ported: bool


class Registry(Mapping[str, "Framework"]):
    """The frameworks by key, in the rows' order; a framework's module is imported when it is first looked up
    (iterating, ``len`` and ``in`` import nothing)."""

    def __init__(self, rows: tuple[Row, ...]) -> None:
        self.rows = {row.key: row for row in rows}
        self._loaded: dict[str, Framework] = {}

    def __getitem__(self, key: str) -> Framework:
        found = self._loaded.get(key)
        if found is None:
            row = self.rows[key]
            found = getattr(importlib.import_module(f"{__name__}.{row.key}"), row.instance)
            self._loaded[key] = found
        return found

    def __contains__(self, key: object) -> bool:
        return key in self.rows

    def __iter__(self) -> Iterator[str]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


# The order is the files' write order and explain's.
FRAMEWORKS = Registry((
    Row("jax", "JAX", ported=True),
    Row("tf", "TF", ported=True),
    Row("xgboost", "XGBOOST", ported=True),
    Row("paddle", "PADDLE", ported=True),
    Row("mlx", "MLX", ported=True),
    Row("mpi", "MPI", ported=False),
    Row("ray", "RAY", ported=True),
))
# The role mpirun runs in (an MPIJob's, a TrainJob's on an MPI runtime): mpi's rule and the view choice read it.
LAUNCHER_ROLE = "launcher"
PORTED = tuple(row.key for row in FRAMEWORKS.rows.values() if row.ported)  # the frameworks with a --<key>-port


def __getattr__(name: str) -> Any:
    """What every framework shares, from ``base``, loaded with the first framework that needs it."""
    if name in ("Context", "Framework", "Port", "Rendition"):
        return getattr(importlib.import_module(f"{__name__}.base"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    if "mlx" in why and plan.topology.me.role == LAUNCHER_ROLE:  # the pod's own role: it keeps the file or never has it
        why.setdefault("mpi", f"MLX from a '{LAUNCHER_ROLE}' pod runs over mpirun (Trainer v2's mlx runtime); mlx "
                              f"by {why['mlx']}")
    return [(FRAMEWORKS[key], why[key]) for key in FRAMEWORKS if key in why]


def render_frameworks(plan: Plan, options: Options, *, files_dir: str | None = None) -> tuple[Rendition, ...]:
    """Each selected framework's variables and files for the plan's own pod (empty for a torch-only job)."""
    chosen = selected(plan, options)
    if not chosen:
        return ()
    context = new_context(plan, options, trainer=True, files_dir=files_dir)
    return tuple(framework.render(context, why) for framework, why in chosen)


def new_context(plan: Plan, options: Options, *, trainer: bool, files_dir: str | None = None) -> Context:
    """What the selected frameworks render from; ``trainer``: with the trainer container's env, as rendering needs
    (the view choice asks only who gets which files). ``base`` is imported here, once a job has selected one."""
    from agent.core.files.frameworks.base import Context

    user, injected = trainer_env(plan, options) if trainer else ({}, {})
    return Context(plan, options, user, injected, files_dir, frozenset(options.frameworks.names))


def published_ports(plan: Plan, options: Options) -> dict[str, tuple[int, str]]:
    """The ports a ``--view own`` pod cannot find itself (rank 0's container, the whole membership), as the
    leader's plan gives them: the summary carries them (core/publication/summary.py)."""
    found = {}
    for framework, _ in selected(plan, options):
        port = framework.published_port(plan, options)
        if port is not None:
            found[framework.key] = (port.number, port.source)
    return found


__all__ = ["FRAMEWORKS", "LAUNCHER_ROLE", "PORTED", "Context", "Framework", "Port", "Rendition", "new_context",
           "published_ports", "render_frameworks", "selected"]
