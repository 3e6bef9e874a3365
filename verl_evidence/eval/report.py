"""Markdown report with tables and PNG plots from evaluation records.

The report answers three questions: how good are the answers (the results
table in the papers' layout, :mod:`verl_evidence.eval.paper_table`, and the
metrics per rollout and data source), what did each reward manager pay for which behaviour
(reward components per case), and how much context did each question cost.
Plots are written with matplotlib's Agg backend, so no display is needed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from verl_evidence.eval import metrics, paper_table
from verl_evidence.eval.records import EvalRecord

logger = logging.getLogger(__name__)

__all__ = ["Report", "format_value", "markdown_table", "write_report"]

REPORT_NAME = "report.md"
REWARD_COMPONENTS_PNG = "reward_components.png"
REWARDS_BY_CASE_PNG = "rewards_by_case.png"
ACCURACY_PNG = "accuracy_by_source.png"
CONTEXT_TOKENS_PNG = "context_tokens.png"

METRIC_LABELS = {
    "n": "n",
    "em": "EM",
    "f1": "F1",
    "answer_recall": "AR",
    "compression_ratio": "CR",
    "avg_searches": "searches",
    "note_rate": "note rate",
    "mean_eqr": "EQR",
    "answerable_em": "ans. EM",
    "answerable_f1": "ans. F1",
    "refusal_accuracy": "refusal acc.",
    "overall_accuracy": "overall acc.",
    "balanced_accuracy": "balanced acc.",
    "reader_em": "reader EM",
    "reader_f1": "reader F1",
    "bertscore_f1": "BERTScore F1",
    "judge_answerable": "LJ ans.",
    "judge_unanswerable": "LJ unans.",
    "judge_accuracy": "LJ acc.",
    "judge_balanced_accuracy": "LJ B.acc.",
}


@dataclass
class Report:
    markdown: Path
    images: list[Path] = field(default_factory=list)
    table_markdown: Path | None = None  # the results in the papers' layout (paper_table.py)
    table_csv: Path | None = None


def format_value(value: float | None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, int):  # counts
        return str(value)
    return f"{value:.3f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(x: object) -> str:
        text = format_value(x) if isinstance(x, (int, float)) or x is None else str(x)
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def _group_label(record: EvalRecord, several_policies: bool) -> str:
    return f"{record.policy} / {record.rollout}" if several_policies else record.rollout


def metrics_table(records: Sequence[EvalRecord]) -> str:
    """Rows: (rollout, data source) plus an ``all`` row per rollout; columns: metrics any row has."""
    several = len({r.policy for r in records}) > 1
    rows: list[tuple[str, str, dict[str, float | None]]] = []
    for group, group_records in metrics.group_by(records, lambda r: _group_label(r, several)).items():
        by_source = metrics.metrics_by_source(group_records)
        sources = [s for s in by_source if s != metrics.ALL_SOURCES]
        if len(sources) > 1:
            sources.append(metrics.ALL_SOURCES)
        rows += [(group, s, by_source[s]) for s in sources]
    columns = [m for m in metrics.METRIC_NAMES if any(values.get(m) is not None for _, _, values in rows)]
    header = ["rollout", "data source"] + [METRIC_LABELS[c] for c in columns]
    return markdown_table(header, [[g, s] + [values[c] for c in columns] for g, s, values in rows])


def _component_columns(records: Sequence[EvalRecord], manager: str) -> list[str]:
    names: list[str] = []
    for r in records:
        for name in r.rewards.get(manager, {}):
            if name not in names:
                names.append(name)
    # The total first, then the components in the order the manager reported them.
    return sorted(names, key=lambda n: (n != "score",))


def reward_tables(records: Sequence[EvalRecord]) -> str:
    """One table per reward manager: mean of every component per (rollout, case)."""
    managers = sorted({m for r in records for m in r.rewards})
    parts = []
    for manager in managers:
        scored = [r for r in records if manager in r.rewards]
        columns = _component_columns(scored, manager)
        rows = []
        for (rollout, case), group in _by_rollout_and_case(scored).items():
            means = metrics.reward_means(group).get(manager, {})
            rows.append([rollout, case, len(group)] + [means.get(c) for c in columns])
        parts.append(f"### `{manager}`\n\n" + markdown_table(["rollout", "case", "n"] + columns, rows))
    return "\n\n".join(parts)


def _by_rollout_and_case(records: Sequence[EvalRecord]) -> dict[tuple[str, str], list[EvalRecord]]:
    groups: dict[tuple[str, str], list[EvalRecord]] = {}
    for r in records:
        groups.setdefault((r.rollout, r.case or "-"), []).append(r)
    return dict(sorted(groups.items()))


# ---------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------


# Logged values that are counts, labels or diagnostics rather than rewards: left out of the box plots
# (their scale would flatten the rewards), kept in the tables.
_NOT_REWARDS = frozenset(
    {"len_r", "len_e", "len_p", "num_summaries", "has_summary", "reward_error", "answerable", "chose_evidence"}
)


def _plotted_components(records: Sequence[EvalRecord], manager: str) -> list[str]:
    """Reward-valued components; of a composite's ``part.key`` entries only each part's ``score``."""
    out = []
    for name in _component_columns(records, manager):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in _NOT_REWARDS or ("." in name and leaf != "score"):
            continue
        out.append(name)
    return out


def _pyplot():
    """matplotlib's pyplot on the headless Agg backend (clusters and CI have no display).

    Imported by the first plot, not with this module: the table helpers here are used by
    command modules, and importing matplotlib would add seconds to every ``--help``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_reward_components(records: Sequence[EvalRecord], path: Path) -> Path | None:
    """Box plots of every reward component, one panel per reward manager."""
    plt = _pyplot()
    managers = sorted({m for r in records for m in r.rewards})
    if not managers:
        return None
    fig, axes = plt.subplots(len(managers), 1, figsize=(9, 2.8 * len(managers)), squeeze=False)
    for ax, manager in zip(axes[:, 0], managers):
        columns = _plotted_components(records, manager)
        data = [
            [r.rewards[manager][c] for r in records if r.rewards.get(manager, {}).get(c) is not None] for c in columns
        ]
        kept = [(c, d) for c, d in zip(columns, data) if d]
        ax.boxplot([d for _, d in kept], showmeans=True)
        ax.set_xticks(range(1, len(kept) + 1), [c for c, _ in kept], rotation=20, fontsize=8)
        ax.set_title(f"reward manager: {manager}", fontsize=10)
        ax.set_ylabel("value")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_rewards_by_case(records: Sequence[EvalRecord], path: Path) -> Path | None:
    """Mean total reward per case, one panel per reward manager: where each reward separates behaviours."""
    plt = _pyplot()
    managers = sorted({m for r in records for m in r.rewards})
    if not managers or not any(r.case for r in records):
        return None
    fig, axes = plt.subplots(1, len(managers), figsize=(4.2 * len(managers), 3.6), squeeze=False)
    for ax, manager in zip(axes[0], managers):
        groups = _by_rollout_and_case([r for r in records if manager in r.rewards])
        labels, means = [], []
        for (rollout, case), group in groups.items():
            scores = [r.rewards[manager].get("score") for r in group]
            scores = [s for s in scores if s is not None]
            if scores:
                labels.append(case if len({k[0] for k in groups}) == 1 else f"{rollout}: {case}")
                means.append(sum(scores) / len(scores))
        ax.barh(range(len(means)), means, color="tab:blue")
        for y, value in enumerate(means):
            ax.text(value, y, f" {value:.2f}", va="center", fontsize=7)
        ax.set_yticks(range(len(means)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{manager}: mean score by case", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_accuracy_by_source(records: Sequence[EvalRecord], path: Path) -> Path | None:
    """EM, F1 and (where labelled) GRACE overall accuracy per rollout and data source."""
    plt = _pyplot()
    several = len({r.policy for r in records}) > 1
    labels, em, f1, acc = [], [], [], []
    for group, group_records in metrics.group_by(records, lambda r: _group_label(r, several)).items():
        for source, values in metrics.metrics_by_source(group_records).items():
            if source == metrics.ALL_SOURCES:
                continue
            labels.append(f"{group}\n{source}")
            em.append(values["em"] or 0.0)
            f1.append(values["f1"] or 0.0)
            acc.append(values["overall_accuracy"])
    if not labels:
        return None
    has_acc = any(a is not None for a in acc)
    width = 0.27 if has_acc else 0.4
    xs = range(len(labels))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(labels)), 4))
    ax.bar([x - width / (1 if has_acc else 2) for x in xs], em, width, label="EM")
    ax.bar([x + (0 if has_acc else width / 2) for x in xs], f1, width, label="F1")
    if has_acc:
        ax.bar([x + width for x in xs], [a or 0.0 for a in acc], width, label="overall acc. (GRACE)")
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_title("accuracy by data source")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_context_tokens(records: Sequence[EvalRecord], path: Path) -> Path | None:
    """Context tokens per question (retrieved or extracted evidence the policy saw), by rollout."""
    plt = _pyplot()
    several = len({r.policy for r in records}) > 1
    groups = metrics.group_by([r for r in records if r.context_tokens is not None], lambda r: _group_label(r, several))
    if not groups:
        return None
    fig, ax = plt.subplots(figsize=(11, 3.8))
    for group, group_records in groups.items():
        ordered = sorted(group_records, key=lambda r: r.example_id)
        line = ax.plot(range(len(ordered)), [r.context_tokens for r in ordered], marker="o", ms=3, lw=1, label=group)[0]
        raw = [r.passage_tokens if r.passage_tokens is not None else r.raw_context_tokens for r in ordered]
        if all(x is not None for x in raw) and raw != [r.context_tokens for r in ordered]:
            # what the policy would have read without extraction/truncation: the compression, visibly
            ax.plot(range(len(ordered)), raw, ls="--", lw=1, color=line.get_color(), label=f"{group} (raw retrieved)")
    ax.set_xlabel("question (sorted by id)")
    ax.set_ylabel("tokens")
    ax.set_title("context tokens per question")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------


def write_report(
    records: Sequence[EvalRecord],
    out_dir: str | Path,
    *,
    title: str = "verl-evidence evaluation",
    notes: Sequence[str] = (),
    extra_sections: Sequence[tuple[str, str]] = (),
    policy_labels: Mapping[str, str] | None = None,
    row_header: str = "policy",
) -> Report:
    """Write ``report.md``, its PNGs and the results table (``table.md``, ``table.csv``) into ``out_dir``.

    ``notes`` are shown as a bulleted list under the title (e.g. that the
    EviNote judge is a random model); ``extra_sections`` are ``(heading,
    markdown)`` pairs appended after the standard sections. ``policy_labels``
    name the results table's rows (policy id -> label, in row order; default:
    the policy ids), ``row_header`` heads their column.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = list(records)
    plots = [
        ("Reward components", plot_reward_components(records, out / REWARD_COMPONENTS_PNG)),
        ("Mean reward by case", plot_rewards_by_case(records, out / REWARDS_BY_CASE_PNG)),
        ("Accuracy by data source", plot_accuracy_by_source(records, out / ACCURACY_PNG)),
        ("Context tokens per question", plot_context_tokens(records, out / CONTEXT_TOKENS_PNG)),
    ]
    policies = sorted({r.policy for r in records})
    failed = [r for r in records if r.error]

    lines = [f"# {title}", ""]
    lines += [f"Policies: {', '.join(f'`{p}`' for p in policies) or 'none'}; examples: {len(records)}."]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    labels = dict(policy_labels or {})
    table = paper_table.build_paper_table(records, lambda p: labels.get(p, p), policy_order=list(labels))
    table_md, table_csv = paper_table.write_paper_table(table, out, row_header=row_header)
    lines += ["", "## Results", "", paper_table.paper_table_markdown(table, row_header)]
    lines += ["", f"Also as [{table_md.name}]({table_md.name}) and [{table_csv.name}]({table_csv.name})."]
    lines += ["", "## Metrics by rollout and data source", "", metrics_table(records) if records else "No records."]
    lines += ["", "Column definitions: docs/evaluation.md."]
    if any(r.rewards for r in records):
        lines += ["", "## Rewards per component, by case", "", reward_tables(records)]
    for heading, body in extra_sections:
        lines += ["", f"## {heading}", "", body]
    lines += ["", "## Plots", ""]
    for caption, png in plots:
        if png is not None:
            lines += [f"![{caption}]({png.name})", ""]
    if failed:
        lines += ["## Examples that failed", ""]
        lines += [markdown_table(["example", "error"], [[r.example_id, r.error] for r in failed])]
    path = out / REPORT_NAME
    path.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    logger.info("wrote %s", path)
    images = [png for _, png in plots if png is not None]
    return Report(markdown=path, images=images, table_markdown=table_md, table_csv=table_csv)
