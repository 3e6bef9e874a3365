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
from verl_evidence.eval.paper_table import PaperTable, source_label
from verl_evidence.eval.records import EvalRecord
from verl_evidence.eval.report import format_value
from verl_evidence.eval.runner import EvalExample, EvalRunner

__all__ = ["metrics_rich_table", "paper_rich_tables", "print_paper_table", "run_with_progress"]


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


def _packed(widths: list[int], room: int) -> list[list[int]]:
    """Consecutive indices of ``widths`` in chunks whose sum fits ``room`` (a chunk holds one at least)."""
    chunks: list[list[int]] = [[]]
    used = 0
    for index, width in enumerate(widths):
        if chunks[-1] and used + width > room:
            chunks.append([])
            used = 0
        chunks[-1].append(index)
        used += width
    return chunks


def paper_rich_tables(table: PaperTable, row_header: str, width: int, title: str = "") -> list[Table]:
    """The results table as terminal tables no wider than ``width`` columns, nothing cut.

    A table too wide for the terminal (or for a Slurm log, 80 columns when not a TTY) is
    wrapped: its data-source groups are split over several tables stacked one under the
    other, each repeating the row labels; a group wider than a whole table is split by
    measure. Long row labels wrap inside their column instead of being cut.
    """
    from rich import box
    from rich.text import Text

    cells = {row: [table.cell(row, s, m) for s, m in table.columns] for row in table.rows}
    measure_names = [table.measure_label(m) for _, m in table.columns]
    source_names = [source_label(s) for s, _ in table.columns]

    def column_width(i: int, headed: bool) -> int:  # content, plus padding and the separator
        return (
            max([len(source_names[i]) if headed else 0, len(measure_names[i]), *(len(cells[r][i]) for r in table.rows)])
            + 3
        )

    longest_label = max([len(row_header), *(len(r) for r in table.rows)])
    label_width = min(longest_label, max(12, width // 3))
    room = max(1, width - (label_width + 3) - 1)
    # whole data-source groups where they fit (the source named over its first measure only);
    # a group wider than a whole table is split by measure, each part headed by the source
    per_group = len(table.measures)
    groups = [list(range(g * per_group, (g + 1) * per_group)) for g in range(len(table.sources))]
    group_widths = [sum(column_width(i, i == columns[0]) for i in columns) for columns in groups]
    chunks: list[list[int]] = []
    headed: set[int] = {columns[0] for columns in groups}
    for group_chunk in _packed(group_widths, room):
        if len(group_chunk) == 1 and group_widths[group_chunk[0]] > room:
            columns = groups[group_chunk[0]]
            parts = [[columns[i] for i in part] for part in _packed([column_width(i, True) for i in columns], room)]
            headed |= {part[0] for part in parts}
            chunks += parts
        else:
            chunks.append([i for g in group_chunk for i in groups[g]])
    shown = []
    for number, chunk in enumerate(chunks, start=1):
        part = f" ({number}/{len(chunks)})" if len(chunks) > 1 else ""
        grid = Table(title=f"{title}{part}" if title else None, box=box.SIMPLE_HEAD, pad_edge=False)
        grid.add_column(row_header, overflow="fold", min_width=min(label_width, 12), max_width=label_width)
        for i in chunk:
            top = source_names[i] if i in headed else ""
            grid.add_column(f"{top}\n{measure_names[i]}", justify="right", no_wrap=True)
        group = None
        for row in table.rows:
            if table.row_groups.get(row, group) != group:
                group = table.row_groups[row]
                grid.add_row(Text(group, style="italic"), *[""] * len(chunk))
            grid.add_row(Text(row), *[cells[row][i] for i in chunk])  # a label is text, never markup
        shown.append(grid)
    return shown


def print_paper_table(console: Console, table: PaperTable, row_header: str, title: str = "") -> None:
    """Print :func:`paper_rich_tables` at the console's width, then the table's legend (wrapped, not cut)."""
    for grid in paper_rich_tables(table, row_header, console.width, title=title):
        console.print(grid)
    for line in table.legend():
        console.print(line, overflow="fold", markup=False, highlight=False)


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
