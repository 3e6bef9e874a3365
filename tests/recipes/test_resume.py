"""A stopped run continues from its last checkpoint: the recipes pass trainer.resume_mode=auto (Slurm: --requeue).

On CPU, from a copy of the session's shared EviOmni smoke run's checkpoints (it saves every step: global_step_1,
global_step_2): the recipe started again with the same command and RESUME_MODE=auto, asked for 4 steps, must load
global_step_2 and report step 3 first, never 1 or 2. Once step 3's checkpoint is written the run is stopped as Slurm
preempts a job (SIGTERM to its process group, during step 4): the whole run goes, and the checkpoint directory still
names step 3, complete, as the next start's resume point (verl writes that name once a checkpoint is whole).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from smoke_runs import EVIOMNI_SHARED_RUN_ENV

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
STEP_LINE = re.compile(r"\bstep:(\d+) - ")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.longest_first(4)]  # reads the shared run


def session_processes(session: int) -> list[int]:
    """Processes still in this session (the recipe, verl, Ray's workers)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def stop_session(process: subprocess.Popen, grace_s: float = 60) -> list[int]:
    """SIGTERM to the whole session (Slurm's preemption signal), then SIGKILL whatever is left; returns what was."""
    os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while session_processes(process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = session_processes(process.pid)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=30)
    return left


def checkpoint_files(step_dir: Path) -> set[str]:
    return {str(path.relative_to(step_dir)) for path in step_dir.rglob("*") if path.is_file()}


def test_a_stopped_run_resumes_from_its_last_checkpoint(eviomni_smoke_run, tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(eviomni_smoke_run.checkpoints, checkpoints)  # never write under the shared run
    latest = checkpoints / "latest_checkpointed_iteration.txt"
    assert latest.read_text().strip() == "2"
    env = {
        **os.environ,
        **EVIOMNI_SHARED_RUN_ENV,  # the batches the shared run was trained with
        "PYTHON": sys.executable,
        "PYTHONUNBUFFERED": "1",
        "CHECKPOINT_DIR": str(checkpoints),
        "RESUME_MODE": "auto",  # what every recipe passes outside --smoke
        "SAVE_FREQ": "1",
        "SMOKE_STEPS": "4",
        "EPOCHS": "4",
        "EXPERIMENT": "resume-test",
    }
    env.pop("RAY_ADDRESS", None)
    log_file = tmp_path / "resumed.log"
    with log_file.open("w") as log:
        run = subprocess.Popen(
            ["bash", str(RECIPES / "eviomni_grpo.sh"), "--smoke"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 1200
        # verl writes step 3's checkpoint before it logs the step: wait for both, then stop it during step 4
        while time.monotonic() < deadline and run.poll() is None:
            if latest.read_text().strip() == "3" and "3" in STEP_LINE.findall(log_file.read_text()):
                break
            time.sleep(0.1)
    finally:
        left = stop_session(run)
    output = log_file.read_text()
    steps = [int(s) for s in STEP_LINE.findall(output)]
    assert steps and steps[0] == 3, f"expected verl to report step 3 first, got {steps}:\n{output[-4000:]}"
    assert set(steps) <= {3, 4}, "the resumed run trained a step before its checkpoint again"
    assert "global_step_2" in output  # verl names the checkpoint it loads
    assert latest.read_text().strip() == "3", output[-4000:]
    assert not left, f"processes outlived SIGTERM to the run's process group for 60 s: {left}"
    # step 4 may have been under way when the signal came: step 3, the resume point now named, is whole
    assert checkpoint_files(checkpoints / "global_step_3") == checkpoint_files(checkpoints / "global_step_2")
