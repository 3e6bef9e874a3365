"""Registration through the ``verl.plugins`` entry point, proven in fresh interpreters.

verl swallows plugin import errors at DEBUG level, so only a fresh process that
does nothing but ``import verl`` shows whether the managers really register.
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
loaded = "verl_evidence.plugin" in sys.modules
print(json.dumps({"managers": managers, "estimator": estimator, "plugin_loaded": loaded}))
"""


def _entry_point_installed() -> bool:
    return any(ep.value == "verl_evidence.plugin" for ep in importlib.metadata.entry_points(group="verl.plugins"))


@pytest.fixture(scope="module")
def installed_package():
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-e", str(REPO), "--no-deps", "-q"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    importlib.invalidate_caches()
    assert _entry_point_installed()


def _fresh_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VERL_USE_EXTERNAL_PLUGINS")}
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_plugin_module_imports_without_error(installed_package, tmp_path):
    # the import verl would swallow: run it bare so a failure shows its traceback here
    result = _fresh_python("import verl_evidence.plugin", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


def test_plain_import_verl_registers_managers_and_estimator(installed_package, tmp_path):
    result = _fresh_python(PROBE, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["plugin_loaded"] is True
    assert set(report["managers"].values()) == {"verl_evidence.reward_managers.managers"}
    assert report["estimator"] == "verl_evidence.advantage"
