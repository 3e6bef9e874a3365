"""The results table in the papers' layout: one row per policy (checkpoint), one column group per data source.

The EviNote, EviOmni and GRACE papers print their main results as rows of
methods and column groups of datasets (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki,
Musique, Bamboogle), each group EM and F1 plus the method's own measure
(EviOmni: CR; GRACE: Acc. and B. Acc.), and an average group last. This module
builds that table from evaluation records with the metrics of
:mod:`verl_evidence.eval.metrics` and writes it as Markdown and CSV.

- A row is a policy, or a (policy, rollout family) pair when the records hold
  several families (their EM over different prompts must not be mixed).
- Measures per family: search — EM, F1, note rate, EQR (EviNote); eviomni — EM,
  F1, CR; grace — EM and F1 over the answerable examples (as GRACE reports
  them), Acc. (overall accuracy) and B. Acc. (balanced accuracy).
- ``Avg`` is the unweighted mean of a row's per-source values (each data source
  counts once, as in the papers), shown when there are two sources or more.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean

from verl_evidence.eval import metrics
from verl_evidence.eval.records import EvalRecord

__all__ = [
    "AVERAGE",
    "DATASET_LABELS",
    "PaperTable",
    "build_paper_table",
    "source_label",
    "write_paper_table",
]

AVERAGE = "avg"
# The papers' data sources, in the order of the EviNote paper's main table (in-domain NQ first, as Search-R1 does).
DATASET_LABELS: dict[str, str] = {
    "nq": "NQ",
    "triviaqa": "TriviaQA",
    "popqa": "PopQA",
    "hotpotqa": "HotpotQA",
    "2wikimultihopqa": "2Wiki",
    "musique": "Musique",
    "bamboogle": "Bamboogle",
    "qasper": "QASPER",
}
# Which summarize() keys each rollout family reports, and under which column name.
FAMILY_MEASURES: dict[str, tuple[str, ...]] = {
    "search": ("em", "f1", "note_rate", "mean_eqr"),
    "eviomni": ("em", "f1", "compression_ratio"),
    "grace": ("answerable_em", "answerable_f1", "overall_accuracy", "balanced_accuracy"),
}
# GRACE's EM/F1 are over answerable questions; they share the EM/F1 columns.
_COLUMN_OF = {"answerable_em": "em", "answerable_f1": "f1"}
MEASURE_LABELS: dict[str, str] = {
    "em": "EM",
    "f1": "F1",
    "note_rate": "Note",
    "mean_eqr": "EQR",
    "compression_ratio": "CR",
    "overall_accuracy": "Acc",
    "balanced_accuracy": "B.Acc",
}
_MEASURE_ORDER = tuple(MEASURE_LABELS)


def source_label(source: str) -> str:
    return "Avg" if source == AVERAGE else DATASET_LABELS.get(source, source)


def _source_order(sources: set[str]) -> list[str]:
    known = [s for s in DATASET_LABELS if s in sources]
    return known + sorted(sources - set(known))


@dataclass
class PaperTable:
    """``values[row][source][measure]`` (None: undefined), ``counts[row][source]`` = examples behind a cell."""

    rows: list[str]
    sources: list[str]
    measures: list[str]
    values: dict[str, dict[str, dict[str, float | None]]] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def value(self, row: str, source: str, measure: str) -> float | None:
        return self.values.get(row, {}).get(source, {}).get(measure)

    @property
    def columns(self) -> list[tuple[str, str]]:
        return [(s, m) for s in self.sources for m in self.measures]

    def column_names(self) -> list[str]:
        return [f"{source_label(s)} {MEASURE_LABELS[m]}" for s, m in self.columns]


def build_paper_table(
    records: Sequence[EvalRecord],
    policy_label: Callable[[str], str] | None = None,
    policy_order: Sequence[str] | None = None,
) -> PaperTable:
    """The table of ``records`` (failed examples excluded); ``policy_label`` names a policy id's row."""
    label = policy_label or (lambda policy: policy)
    ok = [r for r in records if r.error is None]
    families = [f for f in FAMILY_MEASURES if any(r.rollout == f for r in ok)]
    policies = list(dict.fromkeys([*(policy_order or ()), *(r.policy for r in ok)]))
    several_families = len(families) > 1

    rows: list[str] = []
    values: dict[str, dict[str, dict[str, float | None]]] = {}
    counts: dict[str, dict[str, int]] = {}
    used_measures: set[str] = set()
    all_sources: set[str] = set()
    for policy in policies:
        for family in families:
            group = [r for r in ok if r.policy == policy and r.rollout == family]
            if not group:
                continue
            row = f"{label(policy)} / {family}" if several_families else label(policy)
            rows.append(row)
            values[row], counts[row] = {}, {}
            for source, source_records in metrics.group_by(group, lambda r: r.data_source).items():
                summary = metrics.summarize(source_records)
                values[row][source] = {_COLUMN_OF.get(k, k): summary.get(k) for k in FAMILY_MEASURES[family]}
                counts[row][source] = len(source_records)
                all_sources.add(source)
                used_measures |= {m for m, v in values[row][source].items() if v is not None}
            used_measures |= {"em", "f1"}
    sources = _source_order(all_sources)
    for row in rows:
        present = [values[row][s] for s in sources if s in values[row]]
        if len(sources) > 1:
            values[row][AVERAGE] = {m: _mean_of(v.get(m) for v in present) for m in {m for v in present for m in v}}
            counts[row][AVERAGE] = sum(counts[row].values())
    if len(sources) > 1:
        sources.append(AVERAGE)
    measures = [m for m in _MEASURE_ORDER if m in used_measures]
    return PaperTable(rows=rows, sources=sources, measures=measures, values=values, counts=counts)


def _mean_of(values) -> float | None:
    kept = [v for v in values if v is not None]
    return fmean(kept) if kept else None


def _markdown_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def paper_table_markdown(table: PaperTable, row_header: str = "checkpoint") -> str:
    """Two header rows as in the papers: data sources spanning their measures, then the measures."""
    if not table.rows:
        return "No finished examples."
    width = len(table.measures)
    spans = [row_header] + [c for s in table.sources for c in [source_label(s)] + [""] * (width - 1)]
    sub = [""] + [MEASURE_LABELS[m] for _, m in table.columns]
    lines = ["| " + " | ".join(spans) + " |", "|" + "|".join(["---"] + ["---:"] * len(table.columns)) + "|"]
    lines.append("| " + " | ".join(sub) + " |")
    for row in table.rows:
        cells = [_markdown_cell(table.value(row, s, m)) for s, m in table.columns]
        lines.append("| " + " | ".join([row.replace("|", "\\|"), *cells]) + " |")
    sizes = "; ".join(
        f"{source_label(s)} {', '.join(str(table.counts[r].get(s, 0)) for r in table.rows)}"
        for s in table.sources
        if s != AVERAGE
    )
    note = (
        f"Examples per data source (rows in order): {sizes}. "
        "Avg: unweighted mean over the data sources. - : undefined for that row."
    )
    return "\n".join(lines) + "\n\n" + note


def write_paper_table(table: PaperTable, out_dir: str | Path, row_header: str = "checkpoint") -> tuple[Path, Path]:
    """``table.md`` and ``table.csv`` (one row per table row; columns ``<source>/<measure>`` and ``<source>/n``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    markdown = out / "table.md"
    markdown.write_text(paper_table_markdown(table, row_header) + "\n", encoding="utf-8")
    csv_path = out / "table.csv"
    with csv_path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        header = [row_header]
        for source in table.sources:
            header += [f"{source_label(source)}/{MEASURE_LABELS[m]}" for m in table.measures]
            header.append(f"{source_label(source)}/n")
        writer.writerow(header)
        for row in table.rows:
            cells: list[object] = [row]
            for source in table.sources:
                for measure in table.measures:
                    value = table.value(row, source, measure)
                    cells.append("" if value is None else f"{value:.6g}")
                cells.append(table.counts[row].get(source, 0))
            writer.writerow(cells)
    return markdown, csv_path
