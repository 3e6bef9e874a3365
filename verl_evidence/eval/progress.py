"""Rich progress bars and tables shared by ``verl-evidence eval`` and ``verl-evidence demo``."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from verl_evidence.eval import metrics
from verl_evidence.eval.cache import ResultsCache
from verl_evidence.eval.records import EvalRecord
from verl_evidence.eval.report import format_value
from verl_evidence.eval.runner import EvalExample, EvalRunner

__all__ = ["metrics_rich_table", "paper_rich_table", "run_with_progress"]


def run_with_progress(
    runner: EvalRunner,
    examples: Sequence[EvalExample],
    cache: ResultsCache | None,
    console: Console,
) -> list[EvalRecord]:
    """Run ``examples`` with one progress bar per rollout family."""
    totals = Counter(e.rollout for e in examples)
    with Progress(
        TextColumn("{task.description:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as progress:
        tasks = {rollout: progress.add_task(rollout, total=n) for rollout, n in sorted(totals.items())}

        def on_done(record: EvalRecord) -> None:
            progress.advance(tasks[record.rollout])

        # asyncio.run cancels what is still pending (e.g. the in-process judge's batcher) before closing its loop
        return asyncio.run(runner.run(examples, cache=cache, on_done=on_done))


def metrics_rich_table(records: Sequence[EvalRecord], title: str = "metrics") -> Table:
    """Metrics (rows) per rollout family over all data sources (columns); the report splits by source."""
    from verl_evidence.eval.report import METRIC_LABELS

    groups = {
        rollout: metrics.summarize(group) for rollout, group in metrics.group_by(records, lambda r: r.rollout).items()
    }
    table = Table(title=title)
    table.add_column("metric")
    for rollout in groups:
        table.add_column(rollout, justify="right")
    for name in metrics.METRIC_NAMES:
        values = [groups[g].get(name) for g in groups]
        if any(v is not None for v in values):
            table.add_row(METRIC_LABELS[name], *[format_value(v) for v in values])
    return table


def paper_rich_table(records: Sequence[EvalRecord], labels: dict[str, str], title: str = "results") -> Table:
    """The results table (paper layout, :mod:`verl_evidence.eval.paper_table`) for the terminal."""
    from verl_evidence.eval import paper_table

    table = paper_table.build_paper_table(records, lambda p: labels.get(p, p), policy_order=list(labels))
    shown = Table(title=title)
    shown.add_column("")
    for name in table.column_names():
        shown.add_column(name, justify="right")
    for row in table.rows:
        shown.add_row(row, *[format_value(table.value(row, s, m)) for s, m in table.columns])
    return shown


def quiet_library_logs() -> None:
    """Silence per-example noise of the libraries so the progress bars and tables stay readable.

    verl warns once per agent-loop instance that the tokenizer has no
    model-specific Continuous Token builder (a benign fallback for the offline
    test tokenizer), and transformers draws a bar each time it loads weights.
    """
    import logging

    logging.getLogger("verl.utils.tokenizer.continuous_token_wiring").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
