"""A production rollout needs neither the local (CPU) training mode, the test helpers nor EviPath's synthesis code."""

from __future__ import annotations

import subprocess
import sys

# What verl's workers import for a rollout and its rewards.
PRODUCTION_MODULES = (
    "verl_evidence.plugin",
    "verl_evidence.agent_loops.search_loop",
    "verl_evidence.agent_loops.eviomni_loop",
    "verl_evidence.tools.search_tool",
    "verl_evidence.reward_managers.managers",
)
# EviPath's text protocol is the contract its SFT data and the planner rollout share; the rest is synthesis.
# The local package's __init__ is what the plugin asks whether the CPU mode is selected (os.environ only).
ALLOWED = {"verl_evidence.evipath", "verl_evidence.evipath.protocol", "verl_evidence.local"}
FORBIDDEN_PREFIXES = ("verl_evidence.local", "verl_evidence.testing", "verl_evidence.evipath.")


def test_production_rollout_imports_no_local_mode_test_or_synthesis_code() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {PRODUCTION_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('verl_evidence'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = set(out.stdout.split())
    assert set(PRODUCTION_MODULES) <= loaded
    wrong = sorted(m for m in loaded - ALLOWED if m.startswith(FORBIDDEN_PREFIXES))
    assert not wrong, f"a production rollout imports {wrong}"
