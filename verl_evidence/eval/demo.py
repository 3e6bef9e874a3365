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

This module is the command; the report's tables are in :mod:`.demo_report`, the ``--train`` subprocess
in :mod:`.demo_training`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.panel import Panel

from retrieval_server.user_errors import check_model_source
from verl_evidence.eval import options
from verl_evidence.eval.demo_report import (
    examples_markdown,
    rewards_rich_tables,
    separation,
    separation_markdown,
    separation_rich_table,
)
from verl_evidence.eval.demo_training import TRAIN_STEPS, run_training, training_recipe

logger = logging.getLogger(__name__)
console = Console()

QUICK_PER_CASE = 1


def register(app: typer.Typer) -> None:
    app.command(name="demo")(demo_command)


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
    from verl_evidence.eval.cli import RESULTS_FILE, check_servers
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
    check_model_source(nli_model, "--nli-model")
    check_model_source(str(tokenizer) if tokenizer is not None else None, "--tokenizer")
    check_servers(retrieval_url, endpoint)
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
        console.print(separation_rich_table(sep))
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
