"""The suite tests this checkout: the session refuses another copy, and subprocesses import this one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PRINT_LOCATIONS = (
    "import json, verl_evidence, retrieval_server; "
    "print(json.dumps([verl_evidence.__file__, retrieval_server.__file__]))"
)


def test_a_plain_subprocess_imports_this_checkout(tmp_path: Path) -> None:
    """What the doc-block, recipe and registration subprocesses do: the test interpreter, our env, cwd elsewhere."""
    result = subprocess.run(
        [sys.executable, "-c", PRINT_LOCATIONS], cwd=tmp_path, env=dict(os.environ), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    evidence, server = (Path(p) for p in json.loads(result.stdout))
    assert evidence == REPO / "verl_evidence" / "__init__.py"
    assert server == REPO / "retrieval_server" / "__init__.py"


def test_the_session_refuses_another_copy_of_the_code(tmp_path: Path) -> None:
    other = tmp_path / "other_clone"
    (other / "verl_evidence").mkdir(parents=True)
    (other / "verl_evidence" / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(other)}  # this copy now comes first on sys.path
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", str(Path(__file__))],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 4, output[-3000:]  # usage error, before anything is collected
    assert f"would test another copy of the code: they import verl_evidence from {other / 'verl_evidence'}" in output
    assert "retrieval_server from" not in output  # that one still comes from this checkout


def test_every_package_data_pattern_ships_a_file() -> None:
    """A ``package-data`` pattern that matches nothing ships nothing: a renamed directory, or one never made."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    package_data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    empty = [f"{package}/{pattern}" for package, patterns in package_data.items() for pattern in patterns
             if not any(p.is_file() for p in (root / package).glob(pattern))]  # fmt: skip
    assert not empty, f"pyproject.toml's package-data patterns that match no file: {empty}"
