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
- ``eval --paper NAME`` (:func:`build_paper_layout_table`): the paper's own main
  table instead, its reported numbers as reference rows
  (:mod:`verl_evidence.eval.paper_results`) above the rows of this evaluation,
  in the paper's columns, measures and unit.
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
    "build_paper_layout_table",
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
    "eviomni": ("em", "f1", "compression_ratio", "reader_em", "reader_f1"),
    "grace": (
        "answerable_em",
        "answerable_f1",
        "overall_accuracy",
        "balanced_accuracy",
        "bertscore_f1",
        "judge_accuracy",
        "judge_balanced_accuracy",
    ),
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
    "reader_em": "rEM",
    "reader_f1": "rF1",
    "bertscore_f1": "BS-F1",
    "judge_accuracy": "LJ Acc",
    "judge_balanced_accuracy": "LJ B.Acc",
}
# What the short column names stand for (printed under the terminal table).
MEASURE_LEGEND: dict[str, str] = {
    "note_rate": "share of answers with a note",
    "mean_eqr": "mean evidence-quality reward",
    "compression_ratio": "compression ratio",
    "overall_accuracy": "overall accuracy",
    "balanced_accuracy": "balanced accuracy",
    "reader_em": "the reader's EM (answer from the evidence)",
    "reader_f1": "the reader's F1",
    "bertscore_f1": "BERTScore F1 (answerable)",
    "judge_accuracy": "LLM-judge accuracy",
    "judge_balanced_accuracy": "LLM-judge balanced accuracy",
}
_MEASURE_ORDER = tuple(MEASURE_LABELS)


def source_label(source: str) -> str:
    return "Avg" if source == AVERAGE else DATASET_LABELS.get(source, source)


def _source_order(sources: set[str]) -> list[str]:
    known = [s for s in DATASET_LABELS if s in sources]
    return known + sorted(sources - set(known))


@dataclass
class PaperTable:
    """``values[row][source][measure]`` (None: undefined), ``counts[row][source]`` = examples behind a cell.

    A paper's layout (``--paper``) adds ``row_groups`` (row -> the paper's section heading),
    ``labels`` (the paper's column names), its number of ``digits``, a ``title`` and ``notes``;
    reference rows have no ``counts``.
    """

    rows: list[str]
    sources: list[str]
    measures: list[str]
    values: dict[str, dict[str, dict[str, float | None]]] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    row_groups: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    digits: int = 3
    title: str = ""
    notes: list[str] = field(default_factory=list)

    def value(self, row: str, source: str, measure: str) -> float | None:
        return self.values.get(row, {}).get(source, {}).get(measure)

    def measure_label(self, measure: str) -> str:
        return self.labels.get(measure, MEASURE_LABELS.get(measure, measure))

    def cell(self, row: str, source: str, measure: str) -> str:
        """A value as printed: ``-`` when undefined; a paper's compression ratios as ``38.1x``."""
        value = self.value(row, source, measure)
        if value is None:
            return "-"
        if measure == "compression_ratio" and self.labels:
            return f"{value:.{2 if value < 10 else 1}f}x"
        return f"{value:.{self.digits}f}"

    @property
    def columns(self) -> list[tuple[str, str]]:
        return [(s, m) for s in self.sources for m in self.measures]

    def column_names(self) -> list[str]:
        return [f"{source_label(s)} {self.measure_label(m)}" for s, m in self.columns]

    def legend(self) -> list[str]:
        """What the table's short names mean: its measures' legend, then its notes."""
        if self.labels:
            return list(self.notes)
        known = [f"{MEASURE_LABELS[m]}: {MEASURE_LEGEND[m]}" for m in self.measures if m in MEASURE_LEGEND]
        return (["; ".join(known) + "."] if known else []) + list(self.notes)


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


def paper_table_markdown(table: PaperTable, row_header: str = "checkpoint") -> str:
    """Two header rows as in the papers: data sources spanning their measures, then the measures.

    A paper's layout also has its section headings as bold rows, a title above and its notes below.
    """
    if not table.rows:
        return "No finished examples."
    width = len(table.measures)
    spans = [row_header] + [c for s in table.sources for c in [source_label(s)] + [""] * (width - 1)]
    sub = [""] + [table.measure_label(m) for _, m in table.columns]
    lines = [f"**{table.title}**", ""] if table.title else []
    lines += ["| " + " | ".join(spans) + " |", "|" + "|".join(["---"] + ["---:"] * len(table.columns)) + "|"]
    lines.append("| " + " | ".join(sub) + " |")
    group = None
    for row in table.rows:
        if table.row_groups.get(row, group) != group:
            group = table.row_groups[row]
            lines.append("| " + " | ".join([f"*{group}*"] + [""] * len(table.columns)) + " |")
        cells = [table.cell(row, s, m) for s, m in table.columns]
        lines.append("| " + " | ".join([row.replace("|", "\\|"), *cells]) + " |")
    counted = [r for r in table.rows if table.counts.get(r)]
    sizes = "; ".join(
        f"{source_label(s)} {', '.join(str(table.counts[r].get(s, 0)) for r in counted)}"
        for s in table.sources
        if s != AVERAGE
    )
    which = "rows in order" if len(counted) == len(table.rows) else "this evaluation's rows in order"
    note = f"Examples per data source ({which}): {sizes}. "
    if AVERAGE in table.sources:
        note += "Avg: unweighted mean over the data sources. "
    note += "- : undefined for that row."
    return "\n".join(lines) + "\n\n" + "\n\n".join([note, *table.legend()])


def write_paper_table(
    table: PaperTable, out_dir: str | Path, row_header: str = "checkpoint", stem: str = "table"
) -> tuple[Path, Path]:
    """``<stem>.md`` and ``<stem>.csv`` (a row per table row; columns ``<source>/<measure>``, ``<source>/n``).

    A paper layout's CSV also has a ``group`` column (the paper's section of the row).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    markdown = out / f"{stem}.md"
    markdown.write_text(paper_table_markdown(table, row_header) + "\n", encoding="utf-8")
    csv_path = out / f"{stem}.csv"
    with csv_path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        grouped = bool(table.row_groups)
        header = [row_header] + (["group"] if grouped else [])
        for source in table.sources:
            header += [f"{source_label(source)}/{table.measure_label(m)}" for m in table.measures]
            header.append(f"{source_label(source)}/n")
        writer.writerow(header)
        for row in table.rows:
            cells: list[object] = [row] + ([table.row_groups.get(row, "")] if grouped else [])
            counts = table.counts.get(row)
            for source in table.sources:
                for measure in table.measures:
                    value = table.value(row, source, measure)
                    cells.append("" if value is None else f"{value:.6g}")
                cells.append(counts.get(source, 0) if counts else "")  # reference rows: the paper's n
            writer.writerow(cells)
    return markdown, csv_path


THIS_EVALUATION = "This evaluation"


def _layout_value(summary: dict[str, float | None], measure: str, judged: bool) -> float | None:
    """A paper measure of one of our rows, from :func:`metrics.summarize` (see the layout's notes)."""
    if measure in ("em", "f1") and summary.get(f"reader_{measure}") is not None:
        return summary[f"reader_{measure}"]  # EviOmni/LEAR score the separate reader's answer
    if not judged and measure in _EM_STAND_IN:
        return summary.get(_EM_STAND_IN[measure])
    return summary.get(measure)


# GRACE's Acc. / B. Acc. come from the LLM judge; a row without verdicts shows the exact-match stand-in.
_EM_STAND_IN = {"judge_accuracy": "overall_accuracy", "judge_balanced_accuracy": "balanced_accuracy"}


def build_paper_layout_table(
    records: Sequence[EvalRecord],
    paper: str,
    policy_label: Callable[[str], str] | None = None,
    policy_order: Sequence[str] | None = None,
    table: str | None = None,
) -> PaperTable:
    """A table of ``paper`` (``eviomni``, ``lear``, ``evinote``, ``grace``; ``table``: its number, default the main
    one, or an ablation table of :data:`~verl_evidence.eval.paper_results.ABLATION_TABLES`): the paper's reported
    rows, then one row per policy of ``records`` (its rollout family only), in the paper's columns and unit.

    Data sources of ``records`` that the paper's table lacks are added as further column groups
    (the reference rows show ``-`` there), so no result is left out. A noise series (EviOmni Fig. 5) has a row per
    policy and number of added passages instead, the data sources without their ``+noise<k>`` suffix.
    """
    from verl_evidence.eval.noise import noise_level
    from verl_evidence.eval.paper_results import paper_layout

    layout = paper_layout(paper, table)
    label = policy_label or (lambda policy: policy)
    ok = [r for r in records if r.error is None and r.rollout == layout.family]
    if not ok:
        raise ValueError(
            f"--paper {paper}: no finished {layout.family!r} examples to compare with {layout.table} "
            f"(rollouts here: {', '.join(sorted({r.rollout for r in records})) or 'none'})"
        )
    source_of = (lambda r: noise_level(r.data_source)[0]) if layout.noise_series else (lambda r: r.data_source)
    if layout.noise_series and not any(noise_level(r.data_source)[1] is not None for r in ok):
        raise ValueError(
            f"--paper {paper} --table {table}: no examples with added passages; "
            "run eval with --noise-passages 0,2,4,6,8"
        )
    ours = {source_of(r) for r in ok}
    sources = list(layout.sources) + _source_order(ours - set(layout.sources))
    if layout.average:
        sources.append(AVERAGE)
    result = PaperTable(
        rows=[],
        sources=sources,
        measures=list(layout.measures),
        labels=dict(layout.measure_labels),
        digits=layout.digits,
        title=f"{layout.paper}, {layout.table}: rows [{layout.table}] as the paper reports them",
        notes=list(layout.notes),
    )
    if not layout.reference:
        result.title = f"{layout.paper}, {layout.table}: this evaluation's series (the paper prints no numbers)"
    for reference in layout.reference:
        result.rows.append(reference.label)
        result.row_groups[reference.label] = reference.group
        result.values[reference.label] = reference.values
    policies = list(dict.fromkeys([*(policy_order or ()), *(r.policy for r in ok)]))
    for policy in policies:
        mine = [r for r in ok if r.policy == policy]
        if not mine:
            continue
        series = metrics.group_by(mine, lambda r: noise_level(r.data_source)[1]) if layout.noise_series else {"": mine}
        for level, group in sorted(series.items(), key=lambda item: (item[0] == "None", len(item[0]), item[0])):
            judged = any(r.judge_correct is not None for r in group)
            row = label(policy)
            if layout.noise_series:
                row += f", +{level} irrelevant passages" if level != "None" else ", no added passages"
            if layout.family == "grace" and not judged:
                row += " (EM)"
            elif layout.family == "eviomni" and not any(r.reader_prediction is not None for r in group):
                row += " (o_f)"
            result.rows.append(row)
            result.row_groups[row] = THIS_EVALUATION
            result.values[row], result.counts[row] = {}, {}
            for source, source_records in metrics.group_by(group, source_of).items():
                summary = metrics.summarize(source_records)
                summary["evidence_rouge"] = _evidence_rouge(source_records)
                result.values[row][source] = {
                    m: _scaled(_layout_value(summary, m, judged), m, layout.scale) for m in layout.measures
                }
                result.counts[row][source] = len(source_records)
            if layout.average:
                present = [result.values[row][s] for s in layout.sources if s in result.values[row]]
                result.values[row][AVERAGE] = {m: _mean_of(v.get(m) for v in present) for m in layout.measures}
                result.counts[row][AVERAGE] = sum(result.counts[row].values())
    return result


def _evidence_rouge(records: Sequence[EvalRecord]) -> float | None:
    """GRACE's ER: the mean ROUGE-L of the quoted evidence over the answerable examples (the grace reward's
    ``evidence_rouge`` component; None when no record carries it)."""
    values = [
        components["evidence_rouge"]
        for r in records
        if r.answerable
        for components in r.rewards.values()
        if components.get("evidence_rouge") is not None
    ]
    return fmean(values) if values else None


def _scaled(value: float | None, measure: str, scale: float) -> float | None:
    if value is None or measure == "compression_ratio":  # a ratio, not a share
        return value
    return value * scale
