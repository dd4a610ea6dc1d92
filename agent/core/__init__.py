"""The pure core: pod dicts in, file contents out. No I/O, no clock, no environment reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.core.files.frameworks import render_frameworks
from agent.core.files.rendering import Files, MembershipKey, MemberTexts, frameworks_key, render_files
from agent.core.files.variables import Variable, compute_variables
from agent.core.model import Options, RawPod
from agent.core.plan.facts import Memo
from agent.core.plan.grouping import GroupMemo, parse_rule, regroup
from agent.core.plan.layout import NodeLabels, Plan, build_plan
from agent.core.plan.planner import Planner

if TYPE_CHECKING:  # the frameworks' shared module is loaded with the first framework a job selects
    from agent.core.files.frameworks.base import Rendition


@dataclass(frozen=True)
class Rendered:
    """One pod's plan, its variables and the files they make: what ``render`` writes and ``explain`` shows.
    ``frameworks``: the selected frameworks' parts (agent/core/frameworks), none for a torch-only job."""

    plan: Plan
    variables: tuple[Variable, ...]
    files: Files  # read as bytes by name; written from their parts
    frameworks: tuple[Rendition, ...] = ()


@dataclass(frozen=True)
class Staged:
    """A plan as its pod renders it (its replica group's: ``grouped``) and its frameworks' parts: what the
    membership key reads (``Renderer.membership_key``), before the variables and the files are made."""

    plan: Plan
    frameworks: tuple[Rendition, ...] = ()


def render_pod(pods: Sequence[RawPod], self_name: str, options: Options, *, generation: int = 1,
               memo: Memo | None = None, files_dir: str | None = None,
               nodes: NodeLabels | None = None, checked: bool = False) -> Rendered:
    """``checked``: the pods passed ``check_pod`` already (see ``collect``)."""
    plan = build_plan(pods, self_name, options, memo=memo, nodes=nodes, checked=checked)
    return render_plan(plan, options, generation=generation, files_dir=files_dir)


def render_plan(plan: Plan, options: Options, *, generation: int = 1, files_dir: str | None = None) -> Rendered:
    """The variables and files of a plan (the leader publishes the plan before it renders its own files)."""
    plan = grouped(plan, options)
    variables = compute_variables(plan, options, generation=generation, files_dir=files_dir)
    frameworks = render_frameworks(plan, options, files_dir=files_dir)
    files = render_files(plan, variables, generation=generation, frameworks=frameworks)
    return Rendered(plan=plan, variables=tuple(variables), files=files, frameworks=frameworks)


class Renderer:
    """``render_pod`` for a caller that renders the same pod's job after every change (the sidecar): the plan is
    kept between changes (``Planner``) and each member's topology.json text is cached, so the same pods give
    the same bytes as ``render_pod`` at a fraction of the cost."""

    def __init__(self, options: Options, self_name: str, *, checked: bool = False) -> None:
        self.options = options
        self.self_name = self_name
        self.planner = Planner(options, self_name, checked=checked)
        self.texts = MemberTexts()
        self.groups = GroupMemo()  # --replica-groups: each pod's group, read once per pod version

    def render(self, pods: Mapping[str, RawPod], *, generation: int, files_dir: str | None = None,
               nodes: NodeLabels | None = None) -> Rendered:
        return self.render_planned(self.planner.plan(pods, nodes=nodes), generation=generation, files_dir=files_dir)

    def render_planned(self, plan: Plan, *, generation: int, files_dir: str | None = None) -> Rendered:
        """``render_plan`` for a plan of this renderer's planner (its members' texts are cached)."""
        return self.render_staged(self.stage(plan, files_dir=files_dir), generation=generation, files_dir=files_dir)

    def stage(self, plan: Plan, *, files_dir: str | None = None) -> Staged:
        """What ``render_planned`` makes before the variables and the files: the sidecar compares its membership
        key with the files' in place, and renders only when they differ."""
        plan = grouped(plan, self.options, self.groups)
        return Staged(plan, render_frameworks(plan, self.options, files_dir=files_dir))

    def render_staged(self, staged: Staged, *, generation: int, files_dir: str | None = None) -> Rendered:
        plan = staged.plan
        variables = compute_variables(plan, self.options, generation=generation, files_dir=files_dir)
        files = render_files(plan, variables, generation=generation, texts=self.texts, frameworks=staged.frameworks)
        return Rendered(plan=plan, variables=tuple(variables), files=files, frameworks=staged.frameworks)

    @staticmethod
    def membership_key(rendered: Rendered | Staged) -> MembershipKey:
        """Who is in, where, with what rank, in what ``render`` made (or is about to), and what the replica
        groups and the frameworks' files say."""
        groups = () if rendered.plan.groups is None else (rendered.plan.groups.key(),)
        frameworks = frameworks_key({r.key: {"digest": r.digest} for r in rendered.frameworks})
        return MembershipKey(rendered.plan.topology.members, (*groups, *frameworks))


def grouped(plan: Plan, options: Options, memo: GroupMemo | None = None) -> Plan:
    """The plan of this pod's replica group, with ``--replica-groups`` (core/plan/grouping.py); else ``plan``."""
    if options.replica_groups is None or plan.groups is not None:
        return plan
    return regroup(plan, options, parse_rule(options.replica_groups, label=options.label("replica_groups")), memo)


__all__ = ["Memo", "NodeLabels", "Options", "Rendered", "Renderer", "Staged", "build_plan", "render_plan",
           "render_pod"]
