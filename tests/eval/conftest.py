"""Checkpoints of a real training run for the checkpoint evaluation tests: the session's shared smoke run."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smoke_checkpoints(eviomni_smoke_run) -> Path:
    """``global_step_1/`` and ``global_step_2/`` (FSDP actor shards) of a 2-step EviOmni smoke run; their parent.

    The run is the session's one ``eviomni_smoke_run`` (tests/conftest.py: verl's own trainer through
    ``recipes/eviomni_grpo.sh --smoke``, a checkpoint every step), shared with tests/recipes; read it only.
    """
    checkpoints = eviomni_smoke_run.checkpoints
    for step in (1, 2):
        actor = checkpoints / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt"
        assert actor.is_file(), eviomni_smoke_run.output[-4000:]
    return checkpoints
