"""``verl-evidence demo``: the main job on the embedded default, CPU only, nothing downloaded.

1. Start the retrieval server on the bundled corpus with the packaged MiniLM.
2. Roll out the search loop (EviNote/Search-R1 protocol), the EviOmni loop and
   a GRACE prompt set over the bundled questions, with the bundled reference
   trajectories replayed as the policy (or ``--model DIR`` / ``--endpoint URL``).
3. Score every rollout with the reward managers (``evinote``, ``composite``,
   ``eviomni``, ``grace``) through verl's reward loop (real ``DataProto``,
   ``RewardLoopWorker``, ``run_single``).
4. Print the rewards per component per case, show where each reward separates
   good from bad behaviour, and write ``outputs/demo/report.md`` with PNG plots.
5. With ``--train``: a short real GRPO training on CPU (``recipes/eviomni_grpo.sh
   --smoke``, verl's own trainer, the tiny warmed-up policy), its reward components
   per step plotted in ``training.png`` / ``training.md`` next to the report.
"""

from __future__ import annotations

import logging
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
from rich.table import Table

from verl_evidence.eval import metrics, options
from verl_evidence.eval.records import EvalRecord
from verl_evidence.eval.report import format_value, markdown_table

logger = logging.getLogger(__name__)
console = Console()

# Reference behaviours of the bundled trajectories: what a reward should pay for, and what not.
GOOD_CASES = frozenset({"well_grounded", "note_taking", "correct_refusal", "grounded", "good"})
BAD_CASES = frozenset(
    {"unsupported", "wrong_refusal", "bad_format", "wrong_answer", "hallucinated", "ungrounded", "no_search", "bad"}
)
# Components shown in the terminal table (the report has all of them).
_TERMINAL_COMPONENTS = {
    "evinote": ("em", "format_ok", "notes_ok", "eqr", "gate"),
    "composite": ("evinote.score", "answer_f1.score"),
    "eviomni": ("ans", "ans_f", "ans_r", "ans_e", "len", "format"),
    "grace": ("format", "path", "content", "evidence_rouge", "answer_rouge"),
}
QUICK_PER_CASE = 1

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


def register(app: typer.Typer) -> None:
    app.command(name="demo")(demo_command)


def case_quality(case: str | None) -> str | None:
    """``good`` / ``bad`` for a reference case name, ``None`` when it is neither (or unlabelled)."""
    if case is None:
        return None
    if case in GOOD_CASES:
        return "good"
    if case in BAD_CASES:
        return "bad"
    return None


def separation(records: Sequence[EvalRecord]) -> list[dict]:
    """Per (manager, rollout): mean score of good and bad cases, the gap, and whether every good case beats every
    bad one."""
    out = []
    groups: dict[tuple[str, str], list[EvalRecord]] = {}
    for r in records:
        for manager in r.rewards:
            groups.setdefault((manager, r.rollout), []).append(r)
    for (manager, rollout), group in sorted(groups.items()):
        good = [r.rewards[manager]["score"] for r in group if case_quality(r.case) == "good"]
        bad = [r.rewards[manager]["score"] for r in group if case_quality(r.case) == "bad"]
        if not good or not bad:
            continue
        by_case = metrics.group_by(group, lambda r: r.case)
        case_means = {c: sum(x.rewards[manager]["score"] for x in rs) / len(rs) for c, rs in by_case.items()}
        out.append(
            {
                "manager": manager,
                "rollout": rollout,
                "good_mean": sum(good) / len(good),
                "bad_mean": sum(bad) / len(bad),
                "gap": sum(good) / len(good) - sum(bad) / len(bad),
                "min_good": min(good),
                "max_bad": max(bad),
                "separates": min(good) > max(bad),
                "case_means": case_means,
            }
        )
    return out


def separation_markdown(rows: list[dict]) -> str:
    header = [
        "manager",
        "rollout",
        "good mean",
        "bad mean",
        "gap",
        "min good",
        "max bad",
        "all good > all bad",
        "mean by case",
    ]
    body = [
        [
            f"`{s['manager']}`",
            s["rollout"],
            s["good_mean"],
            s["bad_mean"],
            s["gap"],
            s["min_good"],
            s["max_bad"],
            "yes" if s["separates"] else "no",
            ", ".join(f"{c}: {format_value(v)}" for c, v in sorted(s["case_means"].items(), key=lambda kv: -kv[1])),
        ]
        for s in rows
    ]
    return markdown_table(header, body)


def examples_markdown(records: Sequence[EvalRecord]) -> str:
    managers = sorted({m for r in records for m in r.rewards})
    header = ["example", "case", "answer", "gold"] + managers
    body = []
    for r in sorted(records, key=lambda r: (r.rollout, r.case or "", r.example_id)):
        answer = (r.prediction or "(none)")[:60]
        body.append(
            [r.example_id, r.case or "-", answer, "; ".join(r.golden_answers)[:40]]
            + [r.rewards[m]["score"] if m in r.rewards else "" for m in managers]
        )
    return markdown_table(header, body)


def rewards_rich_tables(records: Sequence[EvalRecord]) -> list[Table]:
    tables = []
    for manager in sorted({m for r in records for m in r.rewards}):
        scored = [r for r in records if manager in r.rewards]
        present = {c for r in scored for c in r.rewards[manager]}
        components = [c for c in _TERMINAL_COMPONENTS.get(manager, ()) if c in present]
        table = Table(title=f"reward manager [bold]{manager}[/]: mean per case")
        for col in ("rollout", "case", "quality", "n", "score", *components):
            table.add_column(col, justify="left" if col in ("rollout", "case", "quality") else "right")
        groups: dict[tuple[str, str], list[EvalRecord]] = {}
        for r in scored:
            groups.setdefault((r.rollout, r.case or "-"), []).append(r)
        for (rollout, case), group in sorted(groups.items()):
            means = metrics.reward_means(group)[manager]
            quality = case_quality(case) or "-"
            style = {"good": "green", "bad": "red"}.get(quality, "")
            table.add_row(
                rollout,
                case,
                f"[{style}]{quality}[/]" if style else quality,
                str(len(group)),
                format_value(means.get("score")),
                *[format_value(means.get(c)) for c in components],
            )
        tables.append(table)
    return tables


def demo_command(
    model: options.Model = None,
    endpoint: options.Endpoint = None,
    served_model: options.ServedModel = None,
    tokenizer: options.Tokenizer = None,
    trajectories: options.Trajectories = None,
    qa: options.QA = None,
    nli_model: options.NliModel = None,
    max_response_tokens: options.MaxResponseTokens = 4096,
    max_turn_tokens: options.MaxTurnTokens = 512,
    retrieval_url: options.RetrievalUrl = None,
    out: Path = typer.Option(Path("outputs/demo"), help="where report.md, the PNGs and results.jsonl go"),
    quick: bool = typer.Option(
        False, help=f"CI size: {QUICK_PER_CASE} trajectory per (rollout, case), 2 questions for a model"
    ),
    per_case: int = typer.Option(None, help="at most N reference trajectories per (rollout, case)"),
    questions: int = typer.Option(None, help="with --model/--endpoint: number of bundled questions (default 10)"),
    train: bool = typer.Option(
        False,
        "--train",
        help="then run a short real GRPO training on this CPU (EviOmni recipe --smoke, verl's trainer, a tiny "
        f"policy) and plot its reward components per step ({TRAIN_STEPS} steps: ~3-6 min on 2 cores; the first "
        "run on a machine also warms the tiny policy up once, about a minute)",
    ),
    train_steps: int = typer.Option(TRAIN_STEPS, min=1, help="GRPO steps of --train"),
) -> None:
    """Serve the bundled corpus, roll out every method, score with every reward manager, write the report."""
    from verl_evidence.eval import replay
    from verl_evidence.eval.cache import ResultsCache
    from verl_evidence.eval.cli import RESULTS_FILE
    from verl_evidence.eval.datasets import ROLLOUTS, bundled_rows, examples_from_rows
    from verl_evidence.eval.progress import (
        metrics_rich_table,
        quiet_library_logs,
        run_with_progress,
    )
    from verl_evidence.eval.report import write_report
    from verl_evidence.eval.session import RANDOM_JUDGE_NOTE, make_runner, open_session

    started = time.monotonic()
    recipe = training_recipe() if train else None  # before the demo's minutes: a missing recipe fails now
    quiet_library_logs()
    policy, tokenizer = options.policy_and_tokenizer(trajectories, model, endpoint, served_model, tokenizer)
    console.print(
        Panel.fit(
            "verl-evidence demo: retrieval server (bundled corpus, packaged MiniLM) -> search / EviOmni / GRACE "
            f"rollouts -> every reward manager via verl's reward loop -> {out / 'report.md'}\n"
            f"policy: {policy.policy_id}",
            title="demo",
        )
    )
    if nli_model is None:
        console.print(f"[bold yellow]WARNING:[/] {RANDOM_JUDGE_NOTE}")
    out.mkdir(parents=True, exist_ok=True)
    cache_path = out / RESULTS_FILE
    if cache_path.exists():
        cache_path.unlink()  # a demo shows a fresh run; `verl-evidence eval` is the resumable one

    with open_session(
        out / "work",
        tokenizer_dir=tokenizer,
        retrieval_url=retrieval_url,
        nli_model=nli_model,
        response_length=max_response_tokens,
        max_tokens_per_turn=max_turn_tokens,
    ) as session:
        console.print(f"retrieval server ready at {session.retrieval_url} ({time.monotonic() - started:.0f}s)")
        if policy.kind == "replay":
            limit = QUICK_PER_CASE if quick and per_case is None else per_case
            examples = replay.replay_examples(replay.load_trajectories(policy.target), session, limit=limit, qa_path=qa)
        else:
            n = questions or (2 if quick else 10)
            rows = bundled_rows(list(ROLLOUTS), session.retrieval_url, session.tokenizer, limit=n, qa_path=qa)
            examples = examples_from_rows(rows)
        runner = make_runner(session, policy)
        records = run_with_progress(runner, examples, ResultsCache(cache_path), console)
        sep = separation(records)
        extra = []
        if sep:
            extra.append(("Where each reward separates good from bad behaviour", separation_markdown(sep)))
        extra.append(("Every example", examples_markdown(records)))
        report = write_report(
            records, out, title="verl-evidence demo (embedded default)", notes=session.notes, extra_sections=extra
        )
        notes = list(session.notes)

    for table in rewards_rich_tables(records):
        console.print(table)
    console.print(metrics_rich_table(records, title="evaluation metrics"))
    if sep:
        table = Table(title="where each reward separates good from bad behaviour")
        for col in ("manager", "rollout", "good mean", "bad mean", "gap", "all good > all bad"):
            table.add_column(col)
        for s in sep:
            table.add_row(
                s["manager"],
                s["rollout"],
                format_value(s["good_mean"]),
                format_value(s["bad_mean"]),
                format_value(s["gap"]),
                "[green]yes[/]" if s["separates"] else "[red]no[/]",
            )
        console.print(table)
    for note in notes:
        console.print(f"[yellow]note:[/] {note}")
    failed = [r for r in records if r.error]
    if failed:
        console.print(
            f"[red]{len(failed)} example(s) failed:[/] " + "; ".join(f"{r.example_id}: {r.error}" for r in failed[:5])
        )
    console.print(f"report: {report.markdown}")
    for png in report.images:
        console.print(f"plot:   {png}")
    console.print(f"done in {time.monotonic() - started:.0f}s ({len(records)} rollouts)")
    trained = True
    if recipe is not None:
        trained = run_training(recipe, out, train_steps, report.markdown)
    else:
        console.print(
            f"[dim]Add --train (make demo DEMO_ARGS=--train) to also run {TRAIN_STEPS} real GRPO steps of the "
            "EviOmni recipe on this CPU with verl's trainer and plot the reward components per step (~3-6 min).[/]"
        )
    if failed or not trained:
        raise typer.Exit(code=1)


# --------------------------------------------------------------------------- --train


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
