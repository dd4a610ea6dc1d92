"""The agent's code stays in pieces a reader can hold: no class keeps more than 15 attributes and no function runs
past 60 lines. Counted with ``ast`` over agent/: a class's attributes are its annotated fields (not ``ClassVar``)
and every ``self.X`` its own methods assign."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "agent"
MOST_ATTRIBUTES = 15
MOST_LINES = 60


def _trees() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(AGENT.rglob("*.py")):
        yield str(path.relative_to(ROOT)), ast.parse(path.read_text(), str(path))


def _targets(node: ast.expr) -> Iterator[ast.expr]:
    if isinstance(node, (ast.Tuple, ast.List)):
        for element in node.elts:
            yield from _targets(element)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)
    else:
        yield node


def _assigned_to_self(node: ast.AST) -> Iterator[str]:
    """The ``self.X`` that ``node``'s code assigns, not counting classes defined inside it."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            continue
        if isinstance(child, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in child.targets if isinstance(child, ast.Assign) else [child.target]:
                for t in _targets(target):
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        yield t.attr
        yield from _assigned_to_self(child)


def attributes(cls: ast.ClassDef) -> set[str]:
    names = {stmt.target.id for stmt in cls.body
             if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
             and "ClassVar" not in ast.unparse(stmt.annotation)}
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.update(_assigned_to_self(stmt))
    return names


def test_the_count_sees_fields_and_what_methods_assign_to_self():
    (cls,) = ast.parse(
        "class A:\n"
        "    x: int\n"
        "    k: ClassVar[int] = 1\n"
        "    def __init__(self):\n"
        "        self.y, (self.z, other) = 1, (2, 3)\n"
        "        self.w: int = 0\n"
        "        self.w += 1\n"
        "        class Inner:\n"
        "            def f(self):\n"
        "                self.inner = 1\n").body
    assert isinstance(cls, ast.ClassDef) and attributes(cls) == {"x", "y", "z", "w"}


def test_no_class_keeps_more_than_15_attributes():
    over = [f"{where}:{node.lineno} {node.name} has {len(names)}: {', '.join(sorted(names))}"
            for where, tree in _trees() for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef) and len(names := attributes(node)) > MOST_ATTRIBUTES]
    assert not over, f"classes over {MOST_ATTRIBUTES} attributes (group cohesive ones in a small frozen " \
                     "dataclass, or split the owner):\n" + "\n".join(over)


def test_no_function_runs_past_60_lines():
    over = [f"{where}:{node.lineno} {node.name} is {node.end_lineno - node.lineno + 1} lines"
            for where, tree in _trees() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > MOST_LINES]
    assert not over, f"functions over {MOST_LINES} lines (split them into steps with names):\n" + "\n".join(over)
