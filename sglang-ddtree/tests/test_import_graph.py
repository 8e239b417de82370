"""The package's modules import each other without a cycle, lazy (function-level) imports included: each file
holds one concern, and a cycle (hooks -> spec_algo -> worker -> hooks, before 12-04) means two of them do not."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "sglang_ddtree"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set[str]:
    """Every sglang_ddtree module ``path`` imports, at any depth of the file (``from . import x`` resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in _imports(path, name) if m in modules and m != name} for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_import_graph_reads_the_package():
    graph = _graph()
    assert "sglang_ddtree.sglang.worker" in graph["sglang_ddtree.sglang.spec_algo"]  # lazy imports are seen
    assert "sglang_ddtree.tree" in graph["sglang_ddtree.sglang.worker"]


def test_no_import_cycle_between_the_package_modules():
    graph = _graph()
    # a package's __init__ importing its own submodules is how it exposes them, not a cycle between concerns
    for name in graph:
        if name.count(".") >= 1 and (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists():
            graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
