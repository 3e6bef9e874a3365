"""The results table in the papers' layout: rows = checkpoints, column groups = data sources + Avg."""

from __future__ import annotations

import csv
import dataclasses

import pytest

from verl_evidence.eval import paper_table
from verl_evidence.eval.records import EvalRecord


def search(policy: str, source: str, i: int, correct: bool, notes: int = 0, eqr: float | None = None) -> EvalRecord:
    return EvalRecord(
        policy=policy,
        example_id=f"search/{source}{i}",
        data_source=source,
        rollout="search",
        question="q",
        golden_answers=["paris"],
        prediction="paris" if correct else "paris lyon",
        summary_count=notes,
        eqr=eqr,
        num_searches=1,
    )


def eviomni(policy: str, source: str, i: int, passage_tokens: int, evidence_tokens: int) -> EvalRecord:
    return EvalRecord(
        policy=policy,
        example_id=f"eviomni/{source}{i}",
        data_source=source,
        rollout="eviomni",
        question="q",
        golden_answers=["paris"],
        prediction="paris",
        passage_tokens=passage_tokens,
        evidence_tokens=evidence_tokens,
    )


def grace(policy: str, i: int, answerable: bool, refused: bool) -> EvalRecord:
    return EvalRecord(
        policy=policy,
        example_id=f"grace/{i}",
        data_source="hotpotqa",
        rollout="grace",
        question="q",
        golden_answers=["paris"],
        prediction="paris",
        answerable=answerable,
        refused=refused,
    )


def two_checkpoints() -> list[EvalRecord]:
    records = []
    for policy, right in (("p1", 1), ("p2", 2)):  # p2 answers more NQ questions right
        records += [search(policy, "nq", i, correct=i < right, notes=1, eqr=0.5) for i in range(4)]
        records += [search(policy, "hotpotqa", i, correct=i == 0, notes=i % 2) for i in range(2)]
        records += [search(policy, "bamboogle", 0, correct=True)]
    records.append(dataclasses.replace(search("p1", "nq", 9, correct=True), error="rollout failed"))
    return records


def test_rows_are_checkpoints_columns_are_sources_in_paper_order_then_avg() -> None:
    table = paper_table.build_paper_table(two_checkpoints(), {"p1": "step 1", "p2": "step 2"}.get, ["p1", "p2"])
    assert table.rows == ["step 1", "step 2"]
    assert table.sources == ["nq", "hotpotqa", "bamboogle", "avg"]  # the EviNote/Search-R1 order, Avg last
    assert table.measures == ["em", "f1", "note_rate", "mean_eqr"]
    assert table.value("step 1", "nq", "em") == 0.25 and table.value("step 2", "nq", "em") == 0.5
    assert table.value("step 1", "hotpotqa", "em") == 0.5
    assert table.value("step 1", "hotpotqa", "f1") == pytest.approx((1 + 2 / 3) / 2)
    assert table.value("step 1", "nq", "note_rate") == 1.0 and table.value("step 1", "hotpotqa", "note_rate") == 0.5
    assert table.value("step 1", "hotpotqa", "mean_eqr") is None  # no example was judged there
    # Avg: each data source counts once (the failed example is not counted anywhere)
    assert table.value("step 1", "avg", "em") == pytest.approx((0.25 + 0.5 + 1.0) / 3)
    assert table.value("step 1", "avg", "mean_eqr") == 0.5
    assert table.counts["step 1"] == {"nq": 4, "hotpotqa": 2, "bamboogle": 1, "avg": 7}


def test_markdown_and_csv_hold_the_same_numbers(tmp_path) -> None:
    table = paper_table.build_paper_table(two_checkpoints(), {"p1": "step 1", "p2": "step 2"}.get, ["p1", "p2"])
    md_path, csv_path = paper_table.write_paper_table(table, tmp_path)
    lines = md_path.read_text().splitlines()
    assert lines[0] == "| checkpoint | NQ |  |  |  | HotpotQA |  |  |  | Bamboogle |  |  |  | Avg |  |  |  |"
    assert lines[2] == "|  |" + " EM | F1 | Note | EQR |" * 4
    assert lines[3].startswith("| step 1 | 0.250 | ") and lines[4].startswith("| step 2 | 0.500 | ")
    assert "| - |" in lines[3]  # HotpotQA EQR is undefined
    with csv_path.open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["checkpoint"] for r in rows] == ["step 1", "step 2"]
    assert float(rows[1]["NQ/EM"]) == 0.5 and rows[0]["HotpotQA/EQR"] == "" and rows[0]["NQ/n"] == "4"
    assert float(rows[0]["Avg/EM"]) == pytest.approx(table.value("step 1", "avg", "em"), abs=1e-6)


def test_each_family_brings_its_own_measures_and_families_get_their_own_rows() -> None:
    records = [eviomni("p", "nq", 0, 100, 10), eviomni("p", "nq", 1, 90, 30)]
    records += [
        grace("p", 0, answerable=True, refused=False),
        grace("p", 1, answerable=False, refused=True),
        grace("p", 2, answerable=False, refused=False),
    ]
    table = paper_table.build_paper_table(records)
    assert table.rows == ["p / eviomni", "p / grace"]
    assert table.measures == ["em", "f1", "compression_ratio", "overall_accuracy", "balanced_accuracy"]
    assert table.value("p / eviomni", "nq", "compression_ratio") == 6.5  # (100/10 + 90/30) / 2
    assert table.value("p / eviomni", "nq", "balanced_accuracy") is None
    # GRACE: EM over the answerable example only; Acc 2 of 3; B.Acc mean of 1.0 (answerable) and 0.5 (refusals)
    assert table.value("p / grace", "hotpotqa", "em") == 1.0
    assert table.value("p / grace", "hotpotqa", "overall_accuracy") == pytest.approx(2 / 3)
    assert table.value("p / grace", "hotpotqa", "balanced_accuracy") == 0.75
    markdown = paper_table.paper_table_markdown(table)
    assert "CR | Acc | B.Acc |" in markdown and markdown.count("| p / ") == 2


def test_one_data_source_has_no_average_and_unknown_sources_keep_their_names() -> None:
    table = paper_table.build_paper_table([search("p", "bundled_1hop", 0, True)])
    assert table.sources == ["bundled_1hop"]
    assert paper_table.source_label("bundled_1hop") == "bundled_1hop"
    assert paper_table.source_label("2wikimultihopqa") == "2Wiki"
