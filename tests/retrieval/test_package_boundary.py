"""The server stands alone: no retrieval_server module imports verl_evidence (verl_evidence imports the server's
client, so the reverse would be a package-level circle), and its config imports nothing else of the server.

Read from the source (every import statement, also those inside functions, relative ones made absolute), so an
import that runs only on some path is caught as well as one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import retrieval_server

SERVER_ROOT = Path(retrieval_server.__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` in ``path`` names (relative imports made absolute)."""
    package = ".".join(path.relative_to(SERVER_ROOT.parent).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def server_modules() -> list[Path]:
    return sorted(SERVER_ROOT.rglob("*.py"))


def test_the_scan_sees_imports_inside_functions():
    assert "retrieval_server.encoders.fingerprint" in imported_modules(SERVER_ROOT / "encoders" / "__init__.py")
    assert "retrieval_server.index" in imported_modules(SERVER_ROOT / "launch.py")  # only inside ensure_index


def test_no_server_module_imports_verl_evidence():
    offenders = {}
    for path in server_modules():
        names = sorted(n for n in imported_modules(path) if n.split(".")[0] == "verl_evidence")
        if names:
            offenders[str(path.relative_to(SERVER_ROOT.parent))] = names
    assert offenders == {}


def test_config_imports_nothing_else_of_the_server():
    # The encoders, the index and the launcher import the config; it importing any of them back was a cycle.
    names = imported_modules(SERVER_ROOT / "config.py")
    assert sorted(n for n in names if n.startswith("retrieval_server")) == []
