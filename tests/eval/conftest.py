"""Checkpoints of a real training run, built once per test session for the checkpoint evaluation tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


@pytest.fixture(scope="session")
def smoke_checkpoints(tmp_path_factory) -> Path:
    """``global_step_1/`` and ``global_step_2/`` (FSDP actor shards) of a 2-step EviOmni smoke run; their parent.

    The run is verl's own trainer through ``recipes/eviomni_grpo.sh --smoke`` with a checkpoint every step
    (about 2-4 minutes on a loaded 2-core machine).
    """
    run_dir = tmp_path_factory.mktemp("smoke-run")
    checkpoints = run_dir / "checkpoints"
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "CHECKPOINT_DIR": str(checkpoints),
        "SAVE_FREQ": "1",
        "SMOKE_STEPS": "2",
        "EXPERIMENT": "eval-checkpoints",
    }
    env.pop("RAY_ADDRESS", None)  # its own Ray instance, not the test session's
    result = subprocess.run(
        ["bash", str(RECIPES / "eviomni_grpo.sh"), "--smoke"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=1700,
    )
    output = result.stdout + result.stderr
    (run_dir / "training.log").write_text(output)
    assert result.returncode == 0, output[-6000:]
    for step in (1, 2):
        assert (checkpoints / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt").is_file(), output[
            -4000:
        ]
    return checkpoints
