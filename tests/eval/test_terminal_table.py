"""eval's results tables in an 80-column terminal and in a non-TTY log (Slurm): wrapped, nothing cut."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from verl_evidence.eval import paper_table
from verl_evidence.eval.progress import print_paper_table

from .test_paper_table import eviomni_read, grace, two_checkpoints


def printed(table, width: int | None = None, **env) -> str:
    buffer = io.StringIO()  # not a TTY, as a Slurm log
    console = Console(file=buffer, width=width) if width else Console(file=buffer)
    assert not console.is_terminal
    print_paper_table(console, table, "checkpoint", title="results")
    return buffer.getvalue()


def assert_everything_shown(table, text: str, width: int) -> None:
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, [line for line in lines if len(line) > width]
    assert "…" not in text and "\x1b[" not in text  # no ellipsis, no colour codes in a log
    # every cell once: the numbers printed are exactly the table's defined cells, in reading order per part
    shown = re.findall(r"(?<![\w.])\d+\.\d+x?(?![\w.])", text)
    cells = [table.cell(r, s, m) for r in table.rows for s, m in table.columns]
    assert sorted(shown) == sorted(c for c in cells if c != "-")
    words = set(re.findall(r"\S+", text))
    line_starts = "".join(line.split()[0] for line in lines if line.strip())
    for row in table.rows:  # labels may wrap (at spaces, or a long word folded over lines), never lose a part
        assert set(row.split()) <= words if " " in row else row in line_starts, row
    for legend in table.legend():
        assert " ".join(legend.split()) in " ".join(text.split())


@pytest.mark.parametrize("width", [80, 200])
def test_checkpoint_table_is_wrapped_not_cut(width) -> None:
    labels = {"p1": "checkpoints/evinote-grpo-qwen2.5-7b/global_step_100", "p2": "[red]global_step_200"}  # not markup
    table = paper_table.build_paper_table(two_checkpoints(), labels.get, ["p1", "p2"])
    text = printed(table, width)
    assert_everything_shown(table, text, width)
    parts = re.findall(r"results \((\d)/(\d)\)", text)
    assert (len(parts) > 1) == (width == 80)  # 16 number columns fit in 200, not in 80: stacked parts


def test_paper_layouts_fit_in_80_columns_with_their_legend() -> None:
    records = [eviomni_read("p1", "nq", i, reader_right=True) for i in range(2)]
    records += [grace("p1", 0, answerable=True, refused=False), grace("p1", 1, answerable=False, refused=True)]
    for paper in ("eviomni", "grace"):
        table = paper_table.build_paper_layout_table(records, paper)
        assert_everything_shown(table, printed(table, 80), 80)


def test_the_width_of_a_log_comes_from_columns(monkeypatch) -> None:
    """Rich reads COLUMNS (Slurm jobs often export it); without a TTY and without it, 80."""
    table = paper_table.build_paper_table(two_checkpoints())
    monkeypatch.setenv("COLUMNS", "80")
    assert_everything_shown(table, printed(table), 80)
    monkeypatch.delenv("COLUMNS")
    assert_everything_shown(table, printed(table), 80)
