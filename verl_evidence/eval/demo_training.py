"""``verl-evidence demo --train``: the EviOmni recipe's real CPU smoke run in a subprocess, streamed to the
terminal step by step, then ``training.png`` / ``training.md`` and a section of the demo's report."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import typer
from rich.console import Console
from rich.panel import Panel

console = Console()

# --train: the EviOmni recipe's CPU smoke run, longer. Measured on 2 cores: ~1.5 min of Ray start-up, model
# load and the first validation, then ~12-35 s per step with its validation (verl logs reward components
# only for validation), so 8 steps take ~3-6 min.
TRAIN_RECIPE = "eviomni_grpo.sh"
TRAIN_STEPS = 8
TRAIN_VALIDATION_PROMPTS = (
    4  # rows of the smoke validation set (its warmed-up questions), validated before training and after each step
)
TRAIN_VALIDATION_SAMPLES = 2  # samples per row, at the training temperature
TRAIN_LOG = "training.log"
TRAIN_METRICS = "training_metrics.jsonl"  # verl's file logger: every step's metrics, as verl computed them


def training_recipe() -> Path:
    """``recipes/eviomni_grpo.sh`` of the source checkout this package runs from, or of the current directory.

    The recipes are shell scripts next to the package, not part of it: an install without
    the checkout has none, and rebuilding their trainer command here would drift from them.
    """
    import verl_evidence

    candidates = [Path(verl_evidence.__file__).resolve().parents[1] / "recipes", Path.cwd() / "recipes"]
    for directory in candidates:
        if (directory / TRAIN_RECIPE).is_file():
            return directory / TRAIN_RECIPE
    raise typer.BadParameter(
        f"--train runs recipes/{TRAIN_RECIPE} --smoke from a source checkout of verl-evidence; none found in "
        + " or ".join(str(d) for d in candidates)
        + ". Run it from the checkout (make demo DEMO_ARGS=--train).",
        param_hint="--train",
    )


def training_invocation(recipe: Path, steps: int, metrics_path: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """The recipe's smoke run for ``steps`` steps, validating before training and after every step;
    verl's file logger writes the metrics to ``metrics_path`` (the smoke runs' default path when None)."""
    settings = {
        "SMOKE_STEPS": str(steps),
        # the smoke data is the 8 warmed-up questions (4 steps of 2 per epoch): epochs enough for every step asked
        "EPOCHS": str(steps),
        "TEST_FREQ": "1",
        "VAL_BEFORE_TRAIN": "true",
        "EXPERIMENT": "verl-evidence-demo",
    }
    command = [
        "bash",
        str(recipe),
        "--smoke",
        f"data.val_max_samples={TRAIN_VALIDATION_PROMPTS}",
        f"actor_rollout_ref.rollout.val_kwargs.n={TRAIN_VALIDATION_SAMPLES}",
        # sampled like the training rollouts (verl validates greedily by default)
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    ]
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}  # a Ray of its own
    env.update(settings, PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    if metrics_path is not None:
        env["VERL_FILE_LOGGER_PATH"] = str(metrics_path)
    return command, env


def _printable(command: Sequence[str], env: dict[str, str], recipe: Path) -> str:
    import shlex

    shown = [f"recipes/{recipe.name}" if part == str(recipe) else part for part in command]
    settings = [f"{k}={env[k]}" for k in ("SMOKE_STEPS", "EPOCHS", "TEST_FREQ", "VAL_BEFORE_TRAIN")]
    return " ".join(settings + [shlex.quote(part) for part in shown])


def _stream(
    command: list[str], env: dict[str, str], log_path: Path, steps: int, metrics_path: Path
) -> tuple[int, str, float | None]:
    """Run the recipe, copy its output to ``log_path``, print one line per phase and per step verl's file
    logger writes to ``metrics_path``.

    Returns the exit code, the whole output and when verl's trainer started (seconds after launch).
    """
    from verl_evidence.eval.training_report import format_step
    from verl_evidence.local.smoke.logs import MetricsTail

    metrics = MetricsTail(metrics_path)
    started = time.monotonic()
    trainer_started = None
    lines: list[str] = []
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        bufsize=1,
        start_new_session=True,  # its own process group: Ctrl-C stops the recipe, Ray and the trainer
    )
    try:
        with open(log_path, "w", encoding="utf-8") as log:
            assert process.stdout is not None
            for line in process.stdout:
                log.write(line)
                log.flush()
                lines.append(line)
                elapsed = time.monotonic() - started
                if line.startswith("# smoke run on CPU"):
                    console.print(
                        f"  [{elapsed:4.0f}s] preparing the tiny policy and the EviOmni data (the first run "
                        "on a machine warms it up: about a minute, then cached)"
                    )
                elif line.startswith("# trainer:"):
                    trainer_started = elapsed
                    console.print(f"  [{elapsed:4.0f}s] starting verl's trainer (Ray start-up, workers, model load)")
                for step, values in sorted(metrics.new_steps().items()):
                    console.print(f"  [{elapsed:4.0f}s] {format_step(step, values, steps)}")
        code = process.wait()
        for step, values in sorted(metrics.new_steps().items()):
            console.print(f"  [{time.monotonic() - started:4.0f}s] {format_step(step, values, steps)}")
    except BaseException:
        _stop(process)
        raise
    return code, "".join(lines), trainer_started


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGINT, 30), (signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_training(recipe: Path, out: Path, steps: int, report_path: Path) -> bool:
    """``--train``: the recipe's real CPU run, then ``training.png`` / ``training.md`` and a report section."""
    from verl_evidence.eval.training_report import TRAINING_MD, TRAINING_PNG, write_training_report
    from verl_evidence.local.smoke.logs import read_metrics

    metrics_path = out / TRAIN_METRICS
    metrics_path.unlink(missing_ok=True)  # a previous run's steps are not this run's
    command, env = training_invocation(recipe, steps, metrics_path)
    printable = _printable(command, env, recipe)
    log_path = out / TRAIN_LOG
    console.print(
        Panel.fit(
            f"training: {steps} GRPO steps of the EviOmni recipe on CPU with verl's trainer (docs/debug-on-cpu.md)\n"
            f"{printable}\nlog: {log_path}",
            title="demo --train",
        )
    )
    started = time.monotonic()
    code, output, trainer_started = _stream(command, env, log_path, steps, metrics_path)
    elapsed = time.monotonic() - started
    metrics = read_metrics(metrics_path) if metrics_path.exists() else {}
    trained_steps = sorted(step for step, values in metrics.items() if step >= 1 and "critic/score/mean" in values)
    if code != 0 or not trained_steps:
        tail = "".join(output.splitlines(keepends=True)[-40:])
        console.print(tail, markup=False, highlight=False)
        reason = f"exit code {code}" if code != 0 else "no training step in its output"
        console.print(f"[red]training failed ({reason}) after {elapsed:.0f}s; full log: {log_path}[/]")
        _append_training_section(report_path, f"The training run failed ({reason}); see [{TRAIN_LOG}]({TRAIN_LOG}).")
        return False

    preparation = f"{trainer_started:.0f}s preparing the policy and data, " if trainer_started is not None else ""
    intro = [
        f"A real run of the EviOmni recipe's CPU smoke mode, {len(trained_steps)} GRPO steps:",
        "",
        "```bash",
        printable,
        "```",
        "",
        "verl's own trainer (`python -m verl.trainer.main_ppo`) in the CPU training mode (docs/debug-on-cpu.md): "
        "a 2-layer tiny policy warmed up on the methods' output formats, the bundled EviOmni rows it was warmed up "
        "on, 2 prompts x 8 samples per step, the `eviomni` reward manager; "
        f"validation on {TRAIN_VALIDATION_PROMPTS} rows x "
        f"{TRAIN_VALIDATION_SAMPLES} samples before training and after every step. The trainer's command and "
        f"output: [{TRAIN_LOG}]({TRAIN_LOG}); its per-step metrics (verl's file logger): "
        f"[{TRAIN_METRICS}]({TRAIN_METRICS}).",
        "",
        f"Wall time on this machine: {elapsed:.0f}s ({preparation}the rest Ray start-up, steps and validations).",
        "",
        "It shows the whole GRPO loop running on the EviOmni reward (rollouts, reward components, advantages, "
        "updates, weights synced to the rollout), not that the method improves a real policy: a few steps of a "
        "tiny model move the rewards by noise-level amounts.",
    ]
    result = write_training_report(metrics, out, title=f"Training: {len(trained_steps)} GRPO steps on CPU", intro=intro)
    _append_training_section(
        report_path,
        f"{len(trained_steps)} real GRPO steps of the EviOmni recipe on CPU (`--train`): per-step table and "
        f"settings in [{TRAINING_MD}]({TRAINING_MD}), trainer log in [{TRAIN_LOG}]({TRAIN_LOG}).\n\n"
        f"![reward components per training step]({TRAINING_PNG})",
    )
    console.print(f"training done in {elapsed:.0f}s ({len(trained_steps)} steps)")
    console.print(f"plot:   {result.png}")
    console.print(f"report: {result.markdown}")
    return True


def _append_training_section(report_path: Path, body: str) -> None:
    with open(report_path, "a", encoding="utf-8") as handle:
        handle.write(f"\n## Training\n\n{body}\n")
