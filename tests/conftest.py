from __future__ import annotations

from typing import Any

from agent.core import Options, Rendered, render_pod


def env_of(rendered: Rendered) -> dict[str, str]:
    """The variables ``torch.env`` exports (unset ones excluded)."""
    return {v.name: v.value for v in rendered.variables if v.written and not v.unset}


def render(pods: list[dict[str, Any]], self_name: str, **options: Any) -> Rendered:
    return render_pod(pods, self_name, Options(**options))
