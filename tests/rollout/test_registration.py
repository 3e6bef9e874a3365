"""The agent loops register through the ``verl.plugins`` entry point, idempotently.

Nothing is installed here (tests/adapters/test_plugin.py checks the installed
entry point); the fresh interpreter imports this checkout through the PYTHONPATH
that tests/conftest.py sets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json
import verl  # loads the verl.plugins entry points; nothing else is imported by hand
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
import verl_evidence.agent_loops as loops
before = dict(_agent_loop_registry)
loops.register_all()
same = before == dict(_agent_loop_registry)
print(json.dumps({"registry": before, "same_after_second_call": same, "loops_file": loops.__file__}))
"""


@pytest.mark.slow  # a fresh interpreter importing verl
def test_import_verl_registers_the_loops(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_PLUGINS"}  # verl's default: load all
    env["HF_HUB_OFFLINE"] = "1"
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["registry"]["evidence_search"] == {
        "_target_": "verl_evidence.agent_loops.search_loop.EvidenceSearchAgentLoop"
    }
    assert report["registry"]["eviomni"] == {"_target_": "verl_evidence.agent_loops.eviomni_loop.EviOmniAgentLoop"}
    assert report["same_after_second_call"]
    assert report["loops_file"] == str(REPO / "verl_evidence" / "agent_loops" / "__init__.py")


def test_register_all_keeps_a_users_entry():
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    import verl_evidence.agent_loops as loops

    saved = dict(_agent_loop_registry)
    try:
        user_entry = {"_target_": "verl_evidence.agent_loops.search_loop.EvidenceSearchAgentLoop", "max_turns": 2}
        other = {"_target_": "my_pkg.MyLoop"}
        _agent_loop_registry["evidence_search"] = user_entry
        _agent_loop_registry["eviomni"] = other
        loops.register_all()
        assert _agent_loop_registry["evidence_search"] == user_entry
        assert _agent_loop_registry["eviomni"] == other
        del _agent_loop_registry["eviomni"]
        loops.register_all()
        assert _agent_loop_registry["eviomni"] == {"_target_": loops.LOOPS["eviomni"]}
    finally:
        _agent_loop_registry.clear()
        _agent_loop_registry.update(saved)
