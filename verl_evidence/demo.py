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
"""

from __future__ import annotations

import logging
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
    """Per (manager, rollout): mean score of good and bad cases, the gap, and whether every good case beats every bad one."""
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
    header = ["manager", "rollout", "good mean", "bad mean", "gap", "min good", "max bad", "all good > all bad", "mean by case"]
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
                rollout, case, f"[{style}]{quality}[/]" if style else quality, str(len(group)),
                format_value(means.get("score")), *[format_value(means.get(c)) for c in components],
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
    quick: bool = typer.Option(False, help=f"CI size: {QUICK_PER_CASE} trajectory per (rollout, case), 2 questions for a model"),
    per_case: int = typer.Option(None, help="at most N reference trajectories per (rollout, case)"),
    questions: int = typer.Option(None, help="with --model/--endpoint: number of bundled questions (default 10)"),
) -> None:
    """Serve the bundled corpus, roll out every method, score with every reward manager, write the report."""
    from verl_evidence.eval import replay
    from verl_evidence.eval.cache import ResultsCache
    from verl_evidence.eval.cli import RESULTS_FILE
    from verl_evidence.eval.datasets import ROLLOUTS, bundled_rows, examples_from_rows
    from verl_evidence.eval.progress import (
        cancel_pending_tasks,
        metrics_rich_table,
        quiet_library_logs,
        run_with_progress,
    )
    from verl_evidence.eval.report import write_report
    from verl_evidence.eval.session import RANDOM_JUDGE_NOTE, make_runner, open_session

    started = time.monotonic()
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
        out / "work", tokenizer_dir=tokenizer, retrieval_url=retrieval_url, nli_model=nli_model,
        response_length=max_response_tokens, max_tokens_per_turn=max_turn_tokens,
    ) as session:
        console.print(f"retrieval server ready at {session.retrieval_url} ({time.monotonic() - started:.0f}s)")
        if policy.kind == "replay":
            limit = QUICK_PER_CASE if quick and per_case is None else per_case
            examples = replay.replay_examples(
                replay.load_trajectories(policy.target), session, limit=limit, qa_path=qa
            )
        else:
            n = questions or (2 if quick else 10)
            rows = bundled_rows(list(ROLLOUTS), session.retrieval_url, session.tokenizer, limit=n, qa_path=qa)
            examples = examples_from_rows(rows)
        runner = make_runner(session, policy)
        records = run_with_progress(runner, examples, ResultsCache(cache_path), console)
        cancel_pending_tasks()
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
                s["manager"], s["rollout"], format_value(s["good_mean"]), format_value(s["bad_mean"]),
                format_value(s["gap"]), "[green]yes[/]" if s["separates"] else "[red]no[/]",
            )
        console.print(table)
    for note in notes:
        console.print(f"[yellow]note:[/] {note}")
    failed = [r for r in records if r.error]
    if failed:
        console.print(f"[red]{len(failed)} example(s) failed:[/] " + "; ".join(f"{r.example_id}: {r.error}" for r in failed[:5]))
    console.print(f"report: {report.markdown}")
    for png in report.images:
        console.print(f"plot:   {png}")
    console.print(f"done in {time.monotonic() - started:.0f}s ({len(records)} rollouts)")
    if failed:
        raise typer.Exit(code=1)
