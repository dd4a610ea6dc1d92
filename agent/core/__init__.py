"""The pure core: pod dicts in, file contents out. No I/O, no clock, no environment reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent.core.model import Options, RawPod
from agent.core.rendering import render_files
from agent.core.topology import Memo, NodeLabels, Plan, build_plan
from agent.core.variables import Variable, compute_variables


@dataclass(frozen=True)
class Rendered:
    """One pod's plan, its variables and the files they make: what ``render`` writes and ``explain`` shows."""

    plan: Plan
    variables: tuple[Variable, ...]
    files: dict[str, bytes]


def render_pod(pods: Sequence[RawPod], self_name: str, options: Options, *, generation: int = 1,
               memo: Memo | None = None, files_dir: str | None = None,
               nodes: NodeLabels | None = None) -> Rendered:
    plan = build_plan(pods, self_name, options, memo=memo, nodes=nodes)
    variables = compute_variables(plan, options, generation=generation, files_dir=files_dir)
    files = render_files(plan, variables, generation=generation, texts=memo.texts if memo is not None else None)
    return Rendered(plan=plan, variables=tuple(variables), files=files)


__all__ = ["Memo", "NodeLabels", "Options", "Rendered", "render_pod"]
