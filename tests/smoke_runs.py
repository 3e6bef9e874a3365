"""Smoke trainings for the tests: ``recipes/<name>.sh --smoke`` (verl's own trainer, 2 steps on CPU), read back.

Importable by every test module (pytest puts ``tests/`` on sys.path for tests/conftest.py). The session's one
shared EviOmni run is the ``eviomni_smoke_run`` fixture of tests/conftest.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from verl_evidence.local.smoke.logs import read_metrics

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
# The session's shared EviOmni run: one GRPO group of 8 per step instead of the recipe's two. EviOmni's F1-based
# score spreads within a single group (each of the 10 EviOmni groups in the rollout dumps seen here had 2-7 of 8
# samples above 0), and each step then costs about half: ~25 CPU-s less per run on this 2-core machine. GRACE and
# EviNote keep two groups: their gated scores often tie across a group.
EVIOMNI_SHARED_RUN_ENV = {"BATCH": "1", "MINI_BATCH": "1"}


@dataclass
class SmokeRun:
    """What a finished smoke run left: its console output, verl's file-logger metrics, rollout dump, checkpoints."""

    returncode: int
    output: str
    metrics_file: Path  # VERL_FILE_LOGGER_PATH
    dump: Path  # trainer.rollout_data_dir
    checkpoints: Path  # trainer.default_local_dir (global_step_N/ when SAVE_FREQ is set)

    def check_finished(self) -> SmokeRun:
        assert self.returncode == 0, self.output[-6000:]
        assert self.metrics_file.is_file(), (
            f"verl's file logger wrote nothing at {self.metrics_file}:\n" + (self.output[-4000:])
        )
        return self

    @property
    def metrics(self) -> dict[int, dict[str, float]]:
        """verl's file logger, per step."""
        return read_metrics(self.metrics_file)

    def step(self, step: int) -> dict[str, float]:
        metrics = self.metrics.get(step)
        assert metrics, f"no metrics for step {step} in verl's file logger:\n{self.output[-4000:]}"
        return metrics

    def dumped(self, step: int) -> list[dict]:
        path = self.dump / f"{step}.jsonl"
        assert path.is_file(), f"no rollout dump for step {step} in {self.dump}"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def smoke_paths(run_dir: Path) -> tuple[Path, Path, Path]:
    """Where a run under ``run_dir`` writes: verl's metrics file, its rollout dump, its checkpoints."""
    return run_dir / "metrics.jsonl", run_dir / "rollouts", run_dir / "checkpoints"


def run_smoke(recipe: str, run_dir: Path, *overrides: str, env: dict[str, str] | None = None) -> SmokeRun:
    """Run ``recipes/<recipe> --smoke`` with everything it writes under ``run_dir``; the console in training.log."""
    run_dir.mkdir(parents=True, exist_ok=True)
    run = SmokeRun(0, "", *smoke_paths(run_dir))
    environment = {
        **os.environ,
        "PYTHON": sys.executable,
        "VERL_FILE_LOGGER_PATH": str(run.metrics_file),
        "CHECKPOINT_DIR": str(run.checkpoints),  # not the recipes' shared /tmp default: runs may overlap
        **(env or {}),
    }
    environment.pop("RAY_ADDRESS", None)  # the trainer's own Ray instance, never the test session's
    result = subprocess.run(
        ["bash", str(RECIPES / recipe), "--smoke", f"trainer.rollout_data_dir={run.dump}", *overrides],
        env=environment,
        capture_output=True,
        text=True,
        timeout=1700,
    )
    run.returncode, run.output = result.returncode, result.stdout + result.stderr
    (run_dir / "training.log").write_text(run.output)
    return run
