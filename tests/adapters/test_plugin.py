"""Registration through the ``verl.plugins`` entry point, proven in fresh interpreters.

verl swallows plugin import errors at DEBUG level, so only a fresh process that
does nothing but ``import verl`` shows whether the managers really register: the
session's one such process is ``verl_import_probe`` (tests/conftest.py).
Nothing is installed here: the entry point is read from the installed
distribution's metadata (``make install`` wrote it), and the fresh interpreters
import this checkout (``tests/conftest.py`` puts it on their PYTHONPATH).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


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


# Ours that a plain `import verl` may load: the plugin and what it needs to defer its registrations.
LOADED_BY_IMPORT_VERL = {"verl_evidence", "verl_evidence.local", "verl_evidence.plugin", "verl_evidence.registration"}


@pytest.mark.slow  # the session's fresh interpreter importing verl (tests/conftest.py: verl_import_probe)
def test_import_verl_loads_the_plugin_from_this_checkout_and_defers_the_rest(verl_import_probe):
    plugin = verl_import_probe["plugin"]
    assert plugin is not None, verl_import_probe["stderr"]
    assert plugin["error"] is None, plugin["error"]  # the traceback verl would have swallowed
    assert plugin["file"] == str(REPO / "verl_evidence" / "plugin.py")  # loaded by verl, from this checkout
    # Each registration waits for its registry: a process that never imports verl's reward loop, agent loop or
    # trainer loads none of our managers, loops, estimator or patches, and no CPU mode unless selected.
    assert set(plugin["ours_after_import_verl"]) == LOADED_BY_IMPORT_VERL


@pytest.mark.slow  # the session's fresh interpreter importing verl (tests/conftest.py: verl_import_probe)
def test_plain_import_verl_registers_managers_and_estimator(verl_import_probe):
    registries = verl_import_probe["registries"]
    assert verl_import_probe["returncode"] == 0 and registries is not None, verl_import_probe["stderr"]
    assert registries["managers"] == dict.fromkeys(
        ("eviomni", "evinote", "grace", "composite"), "verl_evidence.reward_managers.managers"
    )
    assert registries["estimator"] == "verl_evidence.trainer.advantage"


# verl's public registration functions: (module they are imported from, name)
VERL_REGISTER_FUNCTIONS = {
    ("verl.experimental.agent_loop", "register"),
    ("verl.experimental.agent_loop.agent_loop", "register"),
    ("verl.experimental.reward_loop.reward_manager", "register"),
    ("verl.experimental.reward_loop.reward_manager.registry", "register"),
    ("verl.trainer.ppo.core_algos", "register_adv_est"),
}


def test_one_module_registers_every_adapter():
    # One registration path: only verl_evidence/registration.py reaches verl's registration functions (no
    # decorators on the classes, no self-registration at the end of a loop module), and its table names them all.
    import ast

    from verl_evidence.registration import ADAPTERS

    registering = set()
    for path in sorted((REPO / "verl_evidence").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and any(
                (node.module, alias.name) in VERL_REGISTER_FUNCTIONS for alias in node.names
            ):
                registering.add(str(path.relative_to(REPO)))
    assert registering == {"verl_evidence/registration.py"}
    assert {(adapter.registry.rsplit(".", 1)[-1], adapter.name) for adapter in ADAPTERS} == {
        ("agent_loop", "evidence_search"),
        ("agent_loop", "eviomni"),
        ("reward_manager", "eviomni"),
        ("reward_manager", "evinote"),
        ("reward_manager", "grace"),
        ("reward_manager", "composite"),
        ("core_algos", "grpo_clipstd"),
    }
