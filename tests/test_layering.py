"""The package layering of docs/architecture.md, checked over the source tree's import graph.

planner at the bottom; learned_cost and profiling above it (independent of each other);
search (strategies, tune loop, CLI) on top. Imports go downward only, no module-level
import cycles inside the library, the runtime path imports neither optuna nor
scikit-learn, and no module outgrows the line budget.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# package -> the packages it may import
LAYERS: dict[str, frozenset[str]] = {
    "planner": frozenset(),
    "zoo": frozenset({"planner"}),
    "learned_cost": frozenset({"planner", "zoo"}),
    "profiling": frozenset({"planner", "zoo"}),
    "search": frozenset({"planner", "zoo", "learned_cost", "profiling"}),
    "cli": frozenset({"planner", "zoo", "learned_cost", "profiling", "search"}),
}
HEAVY = frozenset({"optuna", "sklearn"})
MAX_LINES = 800  # style.md: a file that passes 800 lines is asking to be split


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in LAYERS:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            name = ".".join(rel.parts).removesuffix(".__init__")
            out[name] = path
    return out


MODULES = _modules()


def _imports(path: Path, top_level_only: bool) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: list[tuple[int, str]] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            # `from package import submodule` runs the submodule, not the package's names
            if not all(s in MODULES for s in subs):
                found.append((node.lineno, node.module))
            found += [(node.lineno, s) for s in subs]
    return found


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_downward_only(module: str) -> None:
    pkg = module.split(".")[0]
    bad = [
        f"line {line}: {name}"
        for line, name in _imports(MODULES[module], top_level_only=False)
        if name.split(".")[0] in LAYERS
        and name.split(".")[0] != pkg
        and name.split(".")[0] not in LAYERS[pkg]
    ]
    assert not bad, f"{module} ({pkg}) imports a layer above it: {bad}"


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _edges(m: str, p: Path) -> set[str]:
    """What importing `m` runs first: each module it imports, and the packages above that
    module (their `__init__` runs before it) except the packages `m` itself sits in."""
    own = set(_ancestors(m))
    out = set()
    for _, n in _imports(p, top_level_only=True):
        for x in [*_ancestors(n), n]:
            if x in MODULES and x != m and x not in own:
                out.add(x)
    return out


def test_no_module_level_import_cycle() -> None:
    edges = {m: _edges(m, p) for m, p in MODULES.items()}
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                return [*stack[stack.index(n) :], n]
            if n not in state and (cycle := visit(n)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(MODULES):
        if m not in state and (cycle := visit(m)):
            pytest.fail("module-level import cycle: " + " -> ".join(cycle))


def test_runtime_path_needs_neither_optuna_nor_sklearn() -> None:
    """Every planner module (the runtime path's whole world) is free of the heavy
    packages, at module level and inside functions."""
    bad = [
        f"{m} line {line}: {name}"
        for m, p in MODULES.items()
        if m.startswith("planner")
        for line, name in _imports(p, top_level_only=False)
        if name.split(".")[0] in HEAVY
    ]
    assert not bad, bad


def test_modules_stay_within_the_line_budget() -> None:
    long = {
        m: n
        for m, p in MODULES.items()
        if (n := p.read_text(encoding="utf-8").count("\n")) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them): {long}"


def test_the_learned_models_serving_code_stays_apart_from_its_study_code() -> None:
    """What loading and applying a trained correction needs (learned_cost outside
    learned_cost/study) imports neither scikit-learn nor matplotlib at module level, and
    never imports the study code."""
    bad = [
        f"{m} line {line}: {name}"
        for m, p in MODULES.items()
        if m.startswith("learned_cost") and not m.startswith("learned_cost.study")
        for line, name in _imports(p, top_level_only=True)
        if name.split(".")[0] in {"sklearn", "matplotlib"} or name.startswith("learned_cost.study")
    ]
    assert not bad, bad
