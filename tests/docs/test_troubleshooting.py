"""docs/troubleshooting.md's plugin checks do what the page says, each in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every check is a fresh interpreter importing verl

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"


def _python_one_liners() -> list[str]:
    """The ``python -c "..."`` lines of the page's first shell block."""
    block = PAGE.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split('python -c "', 1)[1].split('"', 1)[0] for line in block.splitlines() if 'python -c "' in line]


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run(
        [sys.executable, "-c", code], check=False, env=environment, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def broken_plugin_path(tmp_path_factory) -> str:
    """A distribution whose ``verl.plugins`` entry point cannot be imported."""
    root = tmp_path_factory.mktemp("broken_plugin")
    dist = root / "broken_demo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-demo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[verl.plugins]\nbroken_demo = broken_demo_missing_module\n")
    return str(root)


def test_the_registration_check_prints_the_manager() -> None:
    check = _python_one_liners()[0]
    result = _run(check)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "EviNoteRewardManager" in result.stdout


def test_a_failing_plugin_is_silent_by_default_and_shown_at_debug(broken_plugin_path: str) -> None:
    pythonpath = os.pathsep.join(filter(None, [broken_plugin_path, os.environ.get("PYTHONPATH")]))
    silent = _run("import verl", PYTHONPATH=pythonpath)
    assert silent.returncode == 0
    assert "broken_demo" not in silent.stdout + silent.stderr

    debug_line = _python_one_liners()[1]
    assert debug_line.index("basicConfig") < debug_line.index("import verl")
    shown = _run(debug_line, PYTHONPATH=pythonpath)
    assert "Failed to load plugin 'broken_demo': No module named 'broken_demo_missing_module'" in shown.stderr


def test_external_modules_variable_registers_without_entry_points() -> None:
    check = _python_one_liners()[0]
    disabled = _run(check, VERL_USE_EXTERNAL_PLUGINS="none")
    assert disabled.returncode != 0 and "Unknown reward manager: evinote" in disabled.stderr
    forced = _run(check, VERL_USE_EXTERNAL_PLUGINS="none", VERL_USE_EXTERNAL_MODULES="verl_evidence.plugin")
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert "EviNoteRewardManager" in forced.stdout
