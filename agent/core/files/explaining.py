"""`explain`'s text: the dry run of init, printed (every variable, its value and the rule behind it; the members
in rank order and, with Node labels, their domains)."""

from __future__ import annotations

from collections.abc import Sequence

from agent.core import Rendered
from agent.core.files.frameworks import Rendition
from agent.core.files.variables import Variable, explain_exclusions, warnings_for
from agent.core.plan.grouping import ReplicaGroups


def format_explanation(rendered: Rendered) -> str:
    """This pod's variables, each with its value and the rule behind it, then the members in rank order."""
    plan = rendered.plan
    topo = plan.topology
    me = topo.me
    lines = [
        f"pod '{me.name}' of {plan.controller.title} '{topo.job}' in namespace '{topo.namespace}': role "
        f"'{me.role}' ({'hot spare' if topo.is_spare else 'training' if me.training else 'not training'}), "
        f"address {me.address}",
        "",
        "variables (torch.env):",
    ]
    width = min(48, max((len(f"{v.name}={v.value}") for v in rendered.variables), default=0))
    lines += _variable_lines(rendered.variables, width)
    for rendition in rendered.frameworks:
        lines += _framework_lines(rendition, width)
    warnings = warnings_for(plan, rendered.variables)
    if warnings:
        lines += ["", "warnings:", *[f"  {w}" for w in warnings]]
    notes = explain_exclusions(plan)
    if notes:
        lines += ["", "notes:", *[f"  {n}" for n in notes]]
    if plan.groups is not None:
        lines += ["", *_group_lines(plan.groups, me.name)]
    order = f" ({topo.rank_order} order)" if topo.levels else ""
    world = f", this pod's replica group {plan.groups.own}" if plan.groups is not None and me.training else ""
    lines += ["", f"members in rank order{order}{world}:"]
    where = "  NODE: DOMAINS" if topo.levels else ""
    # NODE_RANK is also torch.env's RANK; a launcher numbers the pod's processes from its first rank
    lines.append(f"  {'NODE_RANK':>9}  {'PROCESS RANKS':>13}  {'SLOTS':>5}  {'ROLE':<12} {'POD':<32} "
                 f"{'ADDRESS':<16}{where}")
    for m in topo.members:
        node_rank = "-" if m.node_rank is None else str(m.node_rank)
        rank = "-" if m.first_rank is None else str(m.first_rank) if m.slots == 1 else \
            f"{m.first_rank}-{m.first_rank + m.slots - 1}"
        place = ""
        if topo.levels:
            domains = "unknown" if m.domains is None else ",".join(
                f"{level.name.lower()}={value}" for level, value in zip(topo.levels, m.domains, strict=True) if value)
            place = f"  {m.node or '-'}: {domains}"
        lines.append(f"  {node_rank:>9}  {rank:>13}  {m.slots:>5}  {m.role:<12} {m.name:<32} {m.address:<16}{place}")
    lines += ["", f"files: {', '.join(rendered.files)}", "('- ' marks a variable that is not written)"]
    return "\n".join(lines)


def _group_lines(groups: ReplicaGroups, me: str) -> list[str]:
    """Every replica group of the job, this pod's marked: its id, its first pod's address and its pods."""
    rule = groups.rule
    lines = [f"replica groups (--replica-groups {rule.name}: label {rule.key}), {groups.count} in the job "
             f"({groups.count_source}); each its own world:"]
    for group in groups.groups:
        mark = "*" if me in group.members else " "
        lines.append(f"  {mark} group {group.id}: MASTER_ADDR {group.master}, pods {', '.join(group.members)}")
    lines.append(f"  lighthouse: {groups.lighthouse[0]} ({groups.lighthouse[1]})" if groups.lighthouse else
                 "  lighthouse: none (no pod of role lighthouse: TORCHFT_LIGHTHOUSE is not written)")
    return lines


def explain_with_options(rendered: Rendered, from_pod: Sequence[str]) -> str:
    """``format_explanation``, with the options the pod's init container gave (as flags) after the pod's line:
    the values below are read as its init's."""
    explanation = format_explanation(rendered)
    if not from_pod:
        return explanation
    first, _, rest = explanation.partition("\n")
    return f"{first}\noptions from its init container: {' '.join(from_pod)}\n{rest}"


def _variable_lines(variables: Sequence[Variable], width: int) -> list[str]:
    lines = []
    for var in variables:
        text = f"unset {var.name}" if var.unset else f"{var.name}={var.value}"
        mark = "  " if var.written else "- "
        lines.append(f"  {mark}{text.ljust(width)}  # {var.source}")
    return lines


def _framework_lines(rendition: Rendition, width: int) -> list[str]:
    """A selected framework: what selected it, its files and port, its variables, and what the pod must know."""
    files = ", ".join(rendition.files) or "none"
    port = f"; port {rendition.port.number} ({rendition.port.source})" if rendition.port else ""
    lines = ["", f"framework {rendition.key} (selected by {rendition.selected_by}): files {files}{port}"]
    lines += _variable_lines(rendition.variables, width)
    return lines + [f"  note: {note}" for note in rendition.notes]
