"""`verl-evidence demo --train`: verl's per-step metrics -> training.png + training.md, the CLI options, the launch.

No test here trains (tests/recipes/test_smoke_training.py runs the recipes through
main_ppo); the training run is replaced by the metrics file of verl's own
``FileLogger`` (``trainer.logger=[console,file]``), written here by that class or
recorded from a real ``demo --train`` run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import typer
from PIL import Image
from typer.testing import CliRunner
from verl.utils.tracking import FileLogger

import verl_evidence
from verl_evidence.eval import demo_training, training_report
from verl_evidence.eval.training_report import training_curves, write_training_report
from verl_evidence.local.smoke.logs import read_metrics

REPO = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).with_name("data") / "demo_train_metrics.jsonl"

# Values per step: (train score mean, min, max, advantage min, max, grad norm, step seconds).
TRAIN = {
    1: (0.10, 0.0, 0.40, -1.2, 1.5, 0.31, 41.0),
    2: (0.25, 0.0, 0.90, -0.9, 1.1, 0.52, 19.5),
    3: (0.30, 0.1, 0.80, -0.7, 0.8, 0.27, 18.25),
}
# Validation after each step (step 0: before training), source "bundled": reward, ans, len, format.
VALIDATION = {
    0: (0.05, 0.02, 0.40, 0.0),
    1: (0.12, 0.08, 0.45, 0.25),
    2: (0.20, 0.15, 0.50, 0.5),
    3: (0.35, 0.30, 0.55, 0.75),
}


def validation_metrics(step: int, n: int = 2, source: str = "bundled") -> dict:
    reward, ans, length, fmt = VALIDATION[step]
    # as verl's _val_metrics_update names them: the core variable under val-core, the rest val-aux
    return {
        f"val-core/{source}/reward/mean@{n}": np.float64(reward),
        f"val-aux/{source}/reward/std@{n}": np.float64(0.1),
        f"val-aux/{source}/reward/best@{n}/mean": np.float64(0.9),
        f"val-aux/{source}/score/mean@{n}": np.float64(reward),
        f"val-aux/{source}/ans/mean@{n}": np.float64(ans),
        f"val-aux/{source}/ans_f/mean@{n}": np.float64(ans),
        f"val-aux/{source}/len/mean@{n}": np.float64(length),
        f"val-aux/{source}/format/mean@{n}": np.float64(fmt),
        f"val-aux/{source}/len_p/mean@{n}": np.float64(900.0),
        f"val-aux/{source}/reward_error/mean@{n}": np.float64(0.0),
        "val-aux/num_turns/mean": np.float64(2.0),
    }


def train_metrics(step: int) -> dict:
    mean, low, high, adv_min, adv_max, grad, seconds = TRAIN[step]
    return {
        "actor/entropy": 6.18,
        "actor/grad_norm": grad,
        "actor/lr": 1e-4,
        "critic/score/mean": mean,
        "critic/score/max": high,
        "critic/score/min": low,
        "critic/advantages/mean": 0.0,
        "critic/advantages/max": adv_max,
        "critic/advantages/min": adv_min,
        "response_length/mean": 123.5,
        "num_turns/min": np.int32(2),
        "timing_s/step": seconds,
        "timing_s/testing": 7.5,
        "training/global_step": step,
        # verl-evidence's sampler: the training rollouts' reward components, behaviour and masking
        "reward/eviomni/score/mean": mean,
        "reward/eviomni/ans/mean": ROLLOUT_ANS[step],
        "reward/eviomni/ans_f/mean": ROLLOUT_ANS[step],
        "reward/eviomni/len/mean": 0.5,
        "reward/eviomni/format/mean": ROLLOUT_FORMAT[step],
        "reward/eviomni/len_p/mean": 900.0,
        "reward/eviomni/reward_error/mean": 0.0,
        "rollout/answer_rate": 0.75,
        "masking/retrieved_token_share": 0.0,
        "masking/masked_answer_tokens_trained": 0.0,
    }


ROLLOUT_ANS = {1: 0.1, 2: 0.2, 3: 0.4}
ROLLOUT_FORMAT = {1: 0.25, 2: 0.5, 3: 0.625}


def write_metrics_file(path: Path) -> Path:
    """What verl's FileLogger writes for the run: validation at step 0, then each step's metrics."""
    os.environ["VERL_FILE_LOGGER_PATH"] = str(path)
    try:
        logger = FileLogger("verl-evidence", "demo")
    finally:
        del os.environ["VERL_FILE_LOGGER_PATH"]
    logger.log(validation_metrics(0), step=0)
    for step in TRAIN:
        logger.log({**train_metrics(step), **validation_metrics(step)}, step=step)
    logger.finish()
    return path


def logged_metrics(tmp_path: Path) -> dict:
    return read_metrics(write_metrics_file(tmp_path / "metrics.jsonl"))


def table_rows(markdown: str) -> tuple[list[str], dict[str, list[str]]]:
    """The per-step table of training.md: header cells and {step: cells}."""
    section = markdown.split("## Per step", 1)[1]
    table = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = {}
    for line in table[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0].isdigit():
            rows[cells[0]] = cells
    return header, rows


def check_png(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 10_000  # three panels, not an empty canvas
    with Image.open(path) as image:
        image.verify()
        assert image.format == "PNG"
    with Image.open(path) as image:
        assert image.size == (900, 1000)


def test_verls_logged_metrics_become_a_plot_and_a_per_step_table(tmp_path: Path) -> None:
    metrics = logged_metrics(tmp_path)
    report = write_training_report(metrics, tmp_path, title="Training: 3 GRPO steps on CPU")
    assert report.png == tmp_path / "training.png" and report.markdown == tmp_path / "training.md"
    check_png(report.png)

    markdown = report.markdown.read_text()
    assert markdown.startswith("# Training: 3 GRPO steps on CPU")
    assert "](training.png)" in markdown
    header, rows = table_rows(markdown)
    assert header[:8] == [
        "step",
        "train reward mean",
        "min",
        "max",
        "advantage min",
        "advantage max",
        "grad norm",
        "step s",
    ]
    # the EviOmni components that were logged, in display order (training rollouts, then validation); raw lengths
    # and the error flag are not shown
    assert header[8:] == [
        "train ans",
        "train ans_f",
        "train len",
        "train format",
        "val reward",
        "val ans",
        "val ans_f",
        "val len",
        "val format",
    ]
    assert sorted(rows) == ["0", "1", "2", "3"]
    assert rows["0"][1:12] == ["-"] * 11  # before training: validation only
    assert rows["0"][12:] == ["0.050", "0.020", "0.020", "0.400", "0.000"]
    assert rows["2"] == [
        "2",
        "0.250",
        "0.000",
        "0.900",
        "-0.900",
        "1.100",
        "0.520",
        "19.500",
        "0.200",
        "0.200",
        "0.500",
        "0.500",
        "0.200",
        "0.150",
        "0.150",
        "0.500",
        "0.500",
    ]
    assert rows["3"][8:12] == ["0.400", "0.400", "0.500", "0.625"]
    assert rows["3"][12:] == ["0.350", "0.300", "0.300", "0.550", "0.750"]
    assert report.curves.reward_name == "eviomni"
    assert report.curves.behaviour["rollout/answer_rate"] == {1: 0.75, 2: 0.75, 3: 0.75}


def test_curves_keep_the_mean_over_all_validation_samples_and_every_source() -> None:
    metrics = {
        0: {
            **validation_metrics(0, n=1, source="nq"),
            **validation_metrics(0, n=4, source="nq"),
            **validation_metrics(0, n=4, source="hotpotqa"),
        },
        1: {
            **train_metrics(1),
            **validation_metrics(1, n=4, source="nq"),
            **validation_metrics(1, n=4, source="hotpotqa"),
        },
    }
    curves = training_curves({s: {k: float(v) for k, v in m.items()} for s, m in metrics.items()})
    assert curves.samples_per_validation == 4
    assert sorted(curves.validation) == ["hotpotqa", "nq"]
    assert curves.validation["nq"]["reward"] == {0: 0.05, 1: 0.12}
    assert curves.train["actor/grad_norm"] == {1: 0.31}
    assert curves.train_steps == [1] and curves.validation_steps == [0, 1] and curves.all_steps == [0, 1]
    assert curves.components(["reward", "format", "missing"]) == ["reward", "format"]
    header, rows = table_rows(training_report.training_markdown(curves))
    assert "val hotpotqa: reward" in header and "val nq: format" in header


def test_a_run_without_validation_still_plots_the_training_reward(tmp_path: Path) -> None:
    metrics = {step: {k: float(v) for k, v in train_metrics(step).items()} for step in TRAIN}
    report = write_training_report(metrics, tmp_path)
    check_png(report.png)
    header, rows = table_rows(report.markdown.read_text())
    assert len(header) == 12 and rows["1"][1] == "0.100" and header[8] == "train ans"


def test_progress_lines(tmp_path: Path) -> None:
    metrics = logged_metrics(tmp_path)
    assert training_report.format_step(0, metrics[0]) == "before training, val reward 0.050"
    assert training_report.format_step(2, metrics[2], 3) == (
        "step 2/3, train reward 0.250 (0.000–0.900), grad norm 0.520, val reward 0.200, 20s"
    )


@pytest.mark.skipif(not RECORDED.exists(), reason="no recorded demo --train output")
def test_a_recorded_demo_train_run(tmp_path: Path) -> None:
    """verl's file-logger output of a real `verl-evidence demo --train --train-steps 2` run."""
    metrics = read_metrics(RECORDED)
    report = write_training_report(metrics, tmp_path)
    check_png(report.png)
    curves = report.curves
    assert curves.train_steps == [1, 2] and curves.validation_steps == [0, 1, 2]
    assert curves.samples_per_validation == demo_training.TRAIN_VALIDATION_SAMPLES
    assert set(curves.components()) >= {"reward", "ans", "ans_f", "ans_r", "ans_e", "len", "format"}
    header, rows = table_rows(report.markdown.read_text())
    assert sorted(rows) == ["0", "1", "2"] and "val format" in header and "train format" in header
    assert set(curves.rollout) >= {"score", "ans", "ans_f", "ans_r", "ans_e", "len", "format"}
    assert curves.behaviour["masking/masked_answer_tokens_trained"] == {1: 0.0, 2: 0.0}


# --------------------------------------------------------------------------- the CLI and the launch


def demo_help() -> str:
    from verl_evidence.cli import app

    result = CliRunner().invoke(app, ["demo", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return re.sub(r"\x1b\[[0-9;]*m", "", result.output)


def test_the_demo_advertises_train_and_its_step_count() -> None:
    text = demo_help()
    assert "--train " in text and "--train-steps" in text
    assert "GRPO" in text


def test_train_steps_must_be_positive() -> None:
    from verl_evidence.cli import app

    result = CliRunner().invoke(app, ["demo", "--train", "--train-steps", "0"], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "train-steps" in re.sub(r"\x1b\[[0-9;]*m", "", result.output)


def test_the_recipe_comes_from_this_checkout() -> None:
    assert demo_training.training_recipe() == REPO / "recipes" / demo_training.TRAIN_RECIPE


def test_without_a_checkout_train_fails_naming_where_it_looked(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(verl_evidence, "__file__", str(tmp_path / "site-packages" / "verl_evidence" / "__init__.py"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(typer.BadParameter, match=r"recipes/eviomni_grpo\.sh --smoke from a source checkout") as error:
        demo_training.training_recipe()
    assert str(tmp_path / "site-packages" / "recipes") in str(error.value)
    assert "make demo DEMO_ARGS=--train" in str(error.value)


def test_the_invocation_is_the_recipes_smoke_run_with_validation_every_step(monkeypatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    command, env = demo_training.training_invocation(REPO / "recipes" / "eviomni_grpo.sh", steps=5)
    assert command[:3] == ["bash", str(REPO / "recipes" / "eviomni_grpo.sh"), "--smoke"]
    assert f"data.val_max_samples={demo_training.TRAIN_VALIDATION_PROMPTS}" in command
    assert f"actor_rollout_ref.rollout.val_kwargs.n={demo_training.TRAIN_VALIDATION_SAMPLES}" in command
    assert env["SMOKE_STEPS"] == "5" and env["TEST_FREQ"] == "1" and env["VAL_BEFORE_TRAIN"] == "true"
    assert env["EPOCHS"] == "5"  # the 8 smoke rows give 4 steps per epoch: enough epochs for every step asked
    assert env["PYTHON"] == sys.executable and env["PYTHONUNBUFFERED"] == "1"
    assert "RAY_ADDRESS" not in env  # a Ray of its own, not the caller's cluster


def fake_recipe(tmp_path: Path, output: str, code: int, metrics: Path | None = None) -> Path:
    """A stand-in for the recipe: prints ``output``, puts ``metrics`` where verl's file logger would, exits ``code``."""
    (tmp_path / "output.txt").write_text(output)
    script = tmp_path / "recipes" / "eviomni_grpo.sh"
    script.parent.mkdir()
    copy = f'cp {metrics} "$VERL_FILE_LOGGER_PATH"\n' if metrics else ""
    script.write_text(f'#!/usr/bin/env bash\necho "args: $*" >&2\ncat {tmp_path / "output.txt"}\n{copy}exit {code}\n')
    return script


def test_run_training_streams_the_log_and_links_the_plot_from_the_report(tmp_path: Path, capsys) -> None:
    metrics = write_metrics_file(tmp_path / "verl_metrics.jsonl")
    recipe = fake_recipe(tmp_path, "# trainer:\nTraining Progress: 100%\n", 0, metrics)
    out = tmp_path / "demo"
    out.mkdir()
    (out / "report.md").write_text("# verl-evidence demo\n")
    assert demo_training.run_training(recipe, out, 3, out / "report.md")
    log = (out / "training.log").read_text()
    assert "args: --smoke data.val_max_samples=" in log and "Training Progress" in log
    assert read_metrics(out / demo_training.TRAIN_METRICS) == read_metrics(metrics)  # verl's file logger wrote it there
    report = (out / "report.md").read_text()
    assert report.startswith("# verl-evidence demo\n") and "\n## Training\n" in report
    assert "](training.md)" in report and "![reward components per training step](training.png)" in report
    check_png(out / "training.png")
    training_md = (out / "training.md").read_text()
    assert (
        "SMOKE_STEPS=3 EPOCHS=3 TEST_FREQ=1 VAL_BEFORE_TRAIN=true bash recipes/eviomni_grpo.sh --smoke" in training_md
    )
    assert table_rows(training_md)[1]["2"][1] == "0.250"
    printed = capsys.readouterr().out
    assert "step 2/3, train reward 0.250" in printed and "before training, val reward 0.050" in printed


def test_a_failed_training_run_is_reported_with_its_log(tmp_path: Path, capsys) -> None:
    recipe = fake_recipe(tmp_path, "Traceback (most recent call last):\nTypeError: boom\n", 1)
    out = tmp_path / "demo"
    out.mkdir()
    (out / "report.md").write_text("# verl-evidence demo\n")
    assert not demo_training.run_training(recipe, out, 3, out / "report.md")
    assert "TypeError: boom" in (out / "training.log").read_text()
    assert "The training run failed (exit code 1); see [training.log](training.log)." in (out / "report.md").read_text()
    assert not (out / "training.png").exists()
    printed = capsys.readouterr().out
    assert "TypeError: boom" in printed and "training failed (exit code 1)" in printed


@pytest.mark.slow  # verl.trainer.main_ppo in a subprocess (Hydra composition only, no training)
@pytest.mark.timeout(300)
def test_the_recipe_accepts_the_demo_overrides() -> None:
    """The recipe's real entry point composes the demo's overrides (a misspelt key would only fail minutes in)."""
    import yaml

    command, env = demo_training.training_invocation(REPO / "recipes" / demo_training.TRAIN_RECIPE, steps=4)
    command = [part for part in command if part != "--smoke"]  # --smoke would build the tiny policy first
    command[2:2] = ["--cfg", "job", "--resolve"]
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=REPO, env={**env, "PATH": os.environ["PATH"]}, timeout=280
    )
    assert result.returncode == 0, result.stderr[-3000:]
    config = yaml.safe_load(result.stdout[result.stdout.index("\nactor_rollout_ref:") + 1 :])
    assert config["data"]["val_max_samples"] == demo_training.TRAIN_VALIDATION_PROMPTS
    val_kwargs = config["actor_rollout_ref"]["rollout"]["val_kwargs"]
    assert val_kwargs["n"] == demo_training.TRAIN_VALIDATION_SAMPLES and val_kwargs["do_sample"] is True
    assert val_kwargs["temperature"] == 1.0
    assert config["trainer"]["test_freq"] == 1 and config["trainer"]["val_before_train"] is True
