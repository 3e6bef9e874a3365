"""Registration through the ``verl.plugins`` entry point, proven in fresh interpreters.

verl swallows plugin import errors at DEBUG level, so only a fresh process that
does nothing but ``import verl`` shows whether the managers really register.
Nothing is installed here: the entry point is read from the installed
distribution's metadata (``make install`` wrote it), and the fresh interpreters
import this checkout (``tests/conftest.py`` puts it on their PYTHONPATH).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import verl  # loads the verl.plugins entry points, nothing else is imported by hand
from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
managers = {name: get_reward_manager_cls(name).__module__ for name in ("eviomni", "evinote", "grace", "composite")}
estimator = get_adv_estimator_fn("grpo_clipstd").__module__
plugin = sys.modules.get("verl_evidence.plugin")
print(json.dumps({"managers": managers, "estimator": estimator, "plugin_file": plugin and plugin.__file__}))
"""


def declared_plugins() -> dict[str, str]:
    """The ``verl.plugins`` entry points pyproject.toml declares."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
        import tomli as tomllib
    with open(REPO / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["project"]["entry-points"]["verl.plugins"]


def test_installed_distribution_declares_the_plugin_entry_point():
    distribution = importlib.metadata.distribution("verl-evidence")
    installed = {ep.name: ep.value for ep in distribution.entry_points if ep.group == "verl.plugins"}
    assert installed == declared_plugins() == {"verl_evidence": "verl_evidence.plugin"}, (
        f"the installed verl-evidence metadata is stale ({installed}): run `make install`"
    )
    # ...and it is the one verl's `import verl` iterates over
    seen_by_verl = [ep.value for ep in importlib.metadata.entry_points(group="verl.plugins")]
    assert seen_by_verl.count("verl_evidence.plugin") == 1


def _fresh_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_PLUGINS"}  # verl's default: load all
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a fresh interpreter importing verl
def test_plugin_module_imports_without_error(tmp_path):
    # the import verl would swallow: run it bare so a failure shows its traceback here
    result = _fresh_python("import verl_evidence.plugin", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow  # a fresh interpreter importing verl
def test_plain_import_verl_registers_managers_and_estimator(tmp_path):
    result = _fresh_python(PROBE, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["plugin_file"] == str(REPO / "verl_evidence" / "plugin.py")  # loaded by verl, from this checkout
    assert set(report["managers"].values()) == {"verl_evidence.reward_managers.managers"}
    assert report["estimator"] == "verl_evidence.advantage"
