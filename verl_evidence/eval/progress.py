"""Rich progress bars and tables shared by ``verl-evidence eval`` and ``verl-evidence demo``."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from verl_evidence.eval import metrics
from verl_evidence.eval.records import EvalRecord
from verl_evidence.eval.report import format_value
from verl_evidence.eval.runner import EvalExample, EvalRunner
from verl_evidence.eval.cache import ResultsCache

__all__ = ["metrics_rich_table", "run_with_progress"]


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

        return asyncio.get_event_loop().run_until_complete(runner.run(examples, cache=cache, on_done=on_done))


def metrics_rich_table(records: Sequence[EvalRecord], title: str = "metrics") -> Table:
    """The report's metrics table, for the terminal."""
    table = Table(title=title)
    rows = []
    for rollout, group in metrics.group_by(records, lambda r: r.rollout).items():
        by_source = metrics.metrics_by_source(group)
        if len(by_source) == 2:  # one data source: its row equals the "all" row
            by_source.pop(metrics.ALL_SOURCES)
        rows += [(rollout, source, values) for source, values in by_source.items()]
    columns = [m for m in metrics.METRIC_NAMES if any(v.get(m) is not None for _, _, v in rows)]
    table.add_column("rollout")
    table.add_column("source")
    for c in columns:
        table.add_column(c, justify="right")
    for rollout, source, values in rows:
        table.add_row(rollout, source, *[format_value(values[c]) for c in columns])
    return table
