"""No import circles among our modules, from the source (fast tier, nothing imported).

The graph has an edge for every import of one of our modules (``verl_evidence``, ``retrieval_server``) by
another, at module level (including under ``if``/``try``) or inside a function: a circle hidden in a function
is still a circle, it only fails later. ``if TYPE_CHECKING:`` blocks do not run and do not count. Imports of
other packages (a function-level import of verl, torch, ray or faiss) are not edges. Any strongly connected
component of more than one module is a circle, named in the failure with its edges.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("verl_evidence", "retrieval_server")


def module_files() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _imports(tree: ast.Module):
    """Every import statement that can run, wherever it is, except under ``if TYPE_CHECKING:``."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


@functools.cache  # parsed once per session (~1 s)
def import_graph() -> dict[str, frozenset[str]]:
    modules = module_files()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            graph[name].update(target for target in targets if target in modules and target != name)
    return {name: frozenset(targets) for name, targets in graph.items()}  # cached: read-only


def cycles(graph: dict[str, frozenset[str]] | dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_our_modules_and_their_imports():
    graph = import_graph()
    assert "retrieval_server.app" in graph and "verl_evidence.registration" in graph
    assert "verl_evidence.registration" in graph["verl_evidence"]  # `from verl_evidence.registration import ...`


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_type_checking_imports_are_not_edges():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\ndef f():\n    import b\n")
    assert sorted(alias.name for node in _imports(tree) for alias in node.names) == ["TYPE_CHECKING", "b"]


def test_no_import_circles():
    graph = import_graph()
    circles = []
    for component in cycles(graph):
        members = set(component)
        edges = sorted(f"{a} -> {b}" for a in component for b in sorted(graph[a] & members))
        circles.append("{" + ", ".join(component) + "}: " + ", ".join(edges))
    assert circles == [], "import circles (break each by moving the shared piece):\n" + "\n".join(circles)


def test_no_benchmark_imports_from_tests():
    # The tests may load a benchmark script (tests/benchmark_scripts.py); a benchmark never reaches into tests/.
    benchmark_modules = {path.stem for path in (REPO / "benchmarks").rglob("*.py")}
    test_modules = ({path.stem for path in (REPO / "tests").rglob("*.py")} - benchmark_modules) | {"tests"}
    reaching = []
    for path in sorted((REPO / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Constant) and node.value == "tests":  # a path into tests/ put on sys.path
                reaching.append(f"{path.name}: the path component 'tests'")
            reaching += [f"{path.name}: import {name}" for name in names if name.split(".")[0] in test_modules]
    assert reaching == [], "benchmarks reaching into tests/: " + "; ".join(reaching)
