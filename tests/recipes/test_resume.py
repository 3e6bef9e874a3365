"""A stopped run continues from its last checkpoint: the recipes pass trainer.resume_mode=auto (Slurm: --requeue).

On CPU: a smoke run saving every step is stopped (SIGTERM to its process group, as Slurm preempts) once step 2's
checkpoint exists, then started again with the same command; verl must report step 3 next, never step 1, and
finish the run there (3 steps: the resumed run trains one step, enough to show where it resumed).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
STEP_LINE = re.compile(r"\bstep:(\d+) - ")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


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


def stop_session(process: subprocess.Popen, grace_s: float = 60) -> None:
    """SIGTERM to the whole session (Slurm's preemption signal), then SIGKILL whatever is left."""
    os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while session_processes(process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in session_processes(process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=30)


def test_a_stopped_run_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PYTHONUNBUFFERED": "1",
        "CHECKPOINT_DIR": str(checkpoints),
        "RESUME_MODE": "auto",  # what every recipe passes outside --smoke
        "SAVE_FREQ": "1",
        "SMOKE_STEPS": "3",
        "EPOCHS": "3",
        "EXPERIMENT": "resume-test",
    }
    env.pop("RAY_ADDRESS", None)
    command = ["bash", str(RECIPES / "eviomni_grpo.sh"), "--smoke"]
    latest = checkpoints / "latest_checkpointed_iteration.txt"

    first_log = tmp_path / "first.log"
    with first_log.open("w") as log:
        first = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline and first.poll() is None:
            if latest.exists() and latest.read_text().strip() == "2":
                break
            time.sleep(0.1)
    finally:
        stop_session(first)
    output = first_log.read_text()
    assert latest.exists() and latest.read_text().strip() == "2", output[-4000:]
    assert {int(s) for s in STEP_LINE.findall(output)} <= {1, 2, 3}, "the first run was to stop after step 2"

    # Step 3 may have been under way when the signal came; its checkpoint was not written.
    second = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1500)
    resumed = second.stdout + second.stderr
    assert second.returncode == 0, resumed[-6000:]
    steps = [int(s) for s in STEP_LINE.findall(resumed)]
    assert steps and steps[0] == 3, f"expected verl to report step 3 first, got {steps}:\n{resumed[-4000:]}"
    assert 1 not in steps and 2 not in steps
    assert "global_step_2" in resumed  # verl names the checkpoint it loads
    assert latest.read_text().strip() == "3"  # and checkpointed its last step
