"""verl_evidence.registration: a registration waits for its registry module, and runs exactly once.

Pure Python (fast tier): throwaway modules written to tmp_path stand in for verl's registries.
That verl's own registries get filled is proven in fresh interpreters by tests/adapters/test_plugin.py.
"""

from __future__ import annotations

import importlib
import inspect
import sys

import pytest

from verl_evidence.registration import when_imported


@pytest.fixture
def registry_package(tmp_path, monkeypatch):
    package = tmp_path / "fake_registry_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("ENTRIES = []\nfrom . import helpers\n")
    (package / "helpers.py").write_text("def helper():\n    return 'helper'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fake_registry_pkg"
    for name in [m for m in sys.modules if m.startswith("fake_registry_pkg")]:
        del sys.modules[name]


def test_registration_waits_for_the_module_and_then_runs_once(registry_package):
    calls = []

    def register():
        module = sys.modules[registry_package]
        module.ENTRIES.append("ours")  # the module is fully executed: its names and submodules exist
        calls.append(module.helpers.helper())

    when_imported(registry_package, register)
    assert calls == []  # nothing imported yet, nothing registered
    module = importlib.import_module(registry_package)
    assert calls == ["helper"] and module.ENTRIES == ["ours"]
    importlib.import_module(registry_package)  # a second import registers nothing more
    assert calls == ["helper"]
    assert "def helper" in inspect.getsource(module.helpers)  # the real loader still answers


def test_an_already_imported_module_is_registered_at_once(registry_package):
    module = importlib.import_module(registry_package)
    when_imported(registry_package, lambda: module.ENTRIES.append("now"))
    assert module.ENTRIES == ["now"]


def test_a_failing_registration_surfaces_in_the_import(registry_package):
    def broken():
        raise RuntimeError("our registration failed")

    when_imported(registry_package, broken)
    with pytest.raises(RuntimeError, match="our registration failed"):
        importlib.import_module(registry_package)


@pytest.mark.slow  # the session's fresh interpreter importing verl (tests/conftest.py: verl_import_probe)
def test_plain_import_verl_does_not_import_the_registries_for_us(verl_import_probe):
    # The point of waiting: in a fresh `import verl`, our plugin pulls in none of the heavy registry modules.
    plugin = verl_import_probe["plugin"]
    assert plugin is not None and "verl_evidence.plugin" in plugin["ours_after_import_verl"], verl_import_probe
    assert plugin["registries_after_import_verl"] == []


@pytest.mark.slow  # fresh interpreters importing verl
@pytest.mark.parametrize(
    "first_import",
    [
        "verl_evidence.agent_loops.search_loop",
        "verl_evidence.agent_loops.eviomni_loop",
        "verl_evidence.reward_managers",
    ],
)
def test_importing_one_of_our_modules_first_still_registers_everything(first_import):
    # That module is what imports verl's registry, so the registration fires while it is half-executed.
    import subprocess

    code = (
        f"import {first_import}\n"
        "import verl.experimental.agent_loop, verl.trainer.ppo.core_algos\n"
        "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry\n"
        "from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls\n"
        "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
        "print(sorted(k for k in _agent_loop_registry if k in ('eviomni', 'evidence_search')),\n"
        "      get_reward_manager_cls('evinote').__name__, get_adv_estimator_fn('grpo_clipstd').__module__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == (
        "['evidence_search', 'eviomni'] EviNoteRewardManager verl_evidence.trainer.advantage"
    )
