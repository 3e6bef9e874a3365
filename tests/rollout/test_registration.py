"""The agent loops register through the ``verl.plugins`` entry point, idempotently.

Nothing is installed here (tests/adapters/test_plugin.py checks the installed
entry point); the fresh interpreter imports this checkout through the PYTHONPATH
that tests/conftest.py sets.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # the session's fresh interpreter importing verl (tests/conftest.py: verl_import_probe)
def test_import_verl_registers_the_loops(verl_import_probe):
    report = verl_import_probe["registries"]
    assert verl_import_probe["returncode"] == 0 and report is not None, verl_import_probe["stderr"]
    assert report["loop_registry"]["evidence_search"] == {
        "_target_": "verl_evidence.agent_loops.search_loop.EvidenceSearchAgentLoop"
    }
    assert report["loop_registry"]["eviomni"] == {"_target_": "verl_evidence.agent_loops.eviomni_loop.EviOmniAgentLoop"}
    assert report["loops_registered_once"]  # a second register_all(AGENT_LOOPS) changes nothing
    assert report["loops_file"] == str(REPO / "verl_evidence" / "agent_loops" / "__init__.py")


def test_registering_again_keeps_a_users_entry():
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    from verl_evidence.registration import AGENT_LOOPS, names, register_all

    saved = dict(_agent_loop_registry)
    try:
        user_entry = {"_target_": "verl_evidence.agent_loops.search_loop.EvidenceSearchAgentLoop", "max_turns": 2}
        other = {"_target_": "my_pkg.MyLoop"}
        _agent_loop_registry["evidence_search"] = user_entry
        _agent_loop_registry["eviomni"] = other
        register_all(AGENT_LOOPS)
        assert _agent_loop_registry["evidence_search"] == user_entry
        assert _agent_loop_registry["eviomni"] == other
        del _agent_loop_registry["eviomni"]
        register_all(AGENT_LOOPS)
        assert _agent_loop_registry["eviomni"] == {"_target_": names(AGENT_LOOPS)["eviomni"]}
    finally:
        _agent_loop_registry.clear()
        _agent_loop_registry.update(saved)
