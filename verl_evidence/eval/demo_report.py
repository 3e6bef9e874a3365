"""The demo's report: which reference cases a reward should pay for, where each reward separates good from
bad behaviour, and the tables of the terminal and of ``report.md``."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from verl_evidence.eval import metrics
from verl_evidence.eval.records import EvalRecord
from verl_evidence.eval.report import format_value, markdown_table

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


def separation_rich_table(rows: list[dict]) -> Table:
    """The terminal's short form of :func:`separation_markdown`."""
    table = Table(title="where each reward separates good from bad behaviour")
    for col in ("manager", "rollout", "good mean", "bad mean", "gap", "all good > all bad"):
        table.add_column(col)
    for s in rows:
        table.add_row(
            s["manager"],
            s["rollout"],
            format_value(s["good_mean"]),
            format_value(s["bad_mean"]),
            format_value(s["gap"]),
            "[green]yes[/]" if s["separates"] else "[red]no[/]",
        )
    return table
