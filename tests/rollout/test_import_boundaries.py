"""A production rollout needs neither the local (CPU) training mode nor EviPath's synthesis code."""

from __future__ import annotations

import pytest

# EviPath's text protocol is the contract its SFT data and the planner rollout share; the rest is synthesis.
# The local package's __init__ is what the plugin asks whether the CPU mode is selected (os.environ only).
ALLOWED = {"verl_evidence.evipath", "verl_evidence.evipath.protocol", "verl_evidence.local"}
FORBIDDEN_PREFIXES = ("verl_evidence.local", "verl_evidence.evipath.")


@pytest.mark.slow  # the session's fresh interpreter importing verl (tests/conftest.py: verl_import_probe)
def test_production_rollout_imports_no_local_mode_or_synthesis_code(verl_import_probe) -> None:
    # The probe imported verl, its registries, then the modules verl's workers import for a rollout and its rewards.
    rollout = verl_import_probe["rollout"]
    assert verl_import_probe["returncode"] == 0 and rollout is not None, verl_import_probe["stderr"]
    loaded = set(rollout["ours"])
    assert set(rollout["imported"]) <= loaded
    wrong = sorted(m for m in loaded - ALLOWED if m.startswith(FORBIDDEN_PREFIXES))
    assert not wrong, f"a production rollout imports {wrong}"
