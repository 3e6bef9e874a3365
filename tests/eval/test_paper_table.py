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


# ---------------------------------------------------------------------------
# eval --paper: the paper's own table, its reported rows beside ours
# ---------------------------------------------------------------------------


def test_the_papers_reported_numbers_are_transcribed_as_printed() -> None:
    from verl_evidence.eval.paper_results import paper_layout

    eviomni = paper_layout("eviomni")
    rows = {r.label: r for r in eviomni.reference}
    assert len(rows) == 18 and list(rows)[8] == "[Table 2] EviOmni (1.5B)"
    assert rows["[Table 2] EviOmni (1.5B)"].values["nq"] == {"em": 41.14, "f1": 70.77, "compression_ratio": 38.1}
    assert rows["[Table 2] Zero (7B)"].values["hotpotqa"]["compression_ratio"] is None  # printed "-"
    assert rows["[Table 2] EviOmni (7B)"].group == "7B size model"
    lear = {r.label: r for r in paper_layout("lear").reference}
    assert lear["[Table 4] LEAR (7B)"].values == rows["[Table 2] EviOmni (7B)"].values  # the same table in both

    evinote = {r.label: r for r in paper_layout("evinote").reference}
    assert len(evinote) == 13
    assert evinote["[Table 1] EviNote-RAG (Ours)"].values["2wikimultihopqa"] == {"f1": 0.536, "em": 0.494}
    assert evinote["[Table 1] Search-R1"].values["nq"] == {"f1": 0.550, "em": 0.508}

    grace = paper_layout("grace")
    assert len(grace.reference) == 20
    # The paper's own arithmetic holds on the transcription: Acc = LJ verdicts weighted by the
    # answerable:unanswerable counts (1200:251, 296:204); B.Acc = the mean of the two LJ columns.
    off = set()
    for row in grace.reference:
        for source, (answerable, unanswerable) in {"qasper": (1200, 251), "hotpotqa": (296, 204)}.items():
            v = row.values[source]
            accuracy = (answerable * v["judge_answerable"] + unanswerable * v["judge_unanswerable"]) / (
                answerable + unanswerable
            )
            balanced = (v["judge_answerable"] + v["judge_unanswerable"]) / 2
            if abs(accuracy - v["judge_accuracy"]) > 0.011 or abs(balanced - v["judge_balanced_accuracy"]) > 0.011:
                off.add((row.label, source))
    # 37 of 40 add up; these three do not in the paper itself (checked against its PDF text, not a typo here)
    assert off == {
        ("[Table 1] DeepSeek-chat", "qasper"),
        ("[Table 1] TrustAlign-7B†", "qasper"),
        ("[Table 1] ARENA-7B†", "hotpotqa"),
    }


def eviomni_read(policy: str, source: str, i: int, reader_right: bool | None) -> EvalRecord:
    record = eviomni(policy, source, i, passage_tokens=100, evidence_tokens=4)
    record.prediction = "lyon"  # the policy's own answer o_f is wrong
    if reader_right is not None:
        record.reader_prediction = "paris" if reader_right else "lyon"
        record.reader = "hf:/reader|prompt:x"
    return record


def test_eviomni_layout_scores_the_reader_in_percent_beside_the_reported_rows(tmp_path) -> None:
    records = [eviomni_read("p1", "nq", i, reader_right=i < 3) for i in range(4)]
    records += [eviomni_read("p1", "bundled_1hop", 0, reader_right=True)]
    records += [eviomni_read("p2", "nq", 0, reader_right=None)]  # no reader: o_f, marked
    records += [search("p1", "nq", 0, correct=True)]  # another family: not in EviOmni's table
    table = paper_table.build_paper_layout_table(records, "eviomni", {"p1": "step 100", "p2": "step 200"}.get)
    assert table.sources == ["nq", "triviaqa", "hotpotqa", "bundled_1hop"]  # the paper's, then ours
    assert table.rows[:18] == [r for r in table.rows if r.startswith("[Table 2] ")]
    assert table.rows[18:] == ["step 100", "step 200 (o_f)"]
    assert table.value("step 100", "nq", "em") == 75.0  # the reader's EM, in the paper's percent
    assert table.value("step 100", "nq", "compression_ratio") == 25.0  # a ratio: not scaled
    assert table.value("step 200 (o_f)", "nq", "em") == 0.0
    assert table.value("step 100", "triviaqa", "em") is None
    assert table.cell("[Table 2] EviOmni (1.5B)", "nq", "compression_ratio") == "38.1x"
    assert table.cell("[Table 2] Full (1.5B)", "nq", "compression_ratio") == "1.00x"

    md, csv_path = paper_table.write_paper_table(table, tmp_path, stem="paper_eviomni")
    text = md.read_text()
    assert text.startswith("**EviOmni") and "| *1.5B size model* |" in text and "| *This evaluation* |" in text
    assert "| [Table 2] EviOmni (1.5B) | 41.14 | 70.77 | 38.1x |" in text
    with csv_path.open() as fh:
        rows = {r["checkpoint"]: r for r in csv.DictReader(fh)}
    assert rows["[Table 2] EviOmni (1.5B)"]["NQ/EM"] == "41.14" and rows["[Table 2] EviOmni (1.5B)"]["NQ/n"] == ""
    assert rows["[Table 2] EviOmni (1.5B)"]["group"] == "1.5B size model"
    assert rows["step 100"]["NQ/n"] == "4" and rows["step 100"]["bundled_1hop/EM"] == "100"


def test_grace_layout_uses_the_judge_and_bertscore_and_marks_rows_without_a_judge() -> None:
    judged = [grace("p1", 0, answerable=True, refused=False), grace("p1", 1, answerable=False, refused=True)]
    judged[0].bertscore_f1, judged[0].judge_correct, judged[1].judge_correct = 0.9, True, False
    unjudged = [grace("p2", 0, answerable=True, refused=False), grace("p2", 1, answerable=False, refused=False)]
    table = paper_table.build_paper_layout_table(judged + unjudged, "grace")
    assert table.sources == ["qasper", "hotpotqa"]
    assert table.rows[-2:] == ["p1", "p2 (EM)"]
    assert table.value("p1", "hotpotqa", "bertscore_f1") == pytest.approx(90.0)
    assert table.value("p1", "hotpotqa", "judge_answerable") == 100.0
    assert table.value("p1", "hotpotqa", "judge_accuracy") == 50.0  # the verdicts, as the paper's Acc.
    assert table.value("p1", "hotpotqa", "refusal_accuracy") == 100.0
    assert table.value("p2 (EM)", "hotpotqa", "judge_accuracy") == 50.0  # the exact-match stand-in
    assert table.value("p2 (EM)", "hotpotqa", "judge_answerable") is None
    assert table.value("p2 (EM)", "hotpotqa", "bertscore_f1") is None  # never token F1 under BERTScore's name
    assert table.measure_label("bertscore_f1") == "Ans F1"


def test_evinote_layout_keeps_the_papers_column_order_and_a_paper_needs_its_family() -> None:
    table = paper_table.build_paper_layout_table([search("p", "nq", 0, correct=True)], "evinote")
    assert table.sources[:2] == ["triviaqa", "2wikimultihopqa"] and table.measures == ["f1", "em"]
    assert table.cell("p", "nq", "em") == "1.000"  # fractions, as EviNote prints them
    with pytest.raises(ValueError, match="no finished 'grace' examples"):
        paper_table.build_paper_layout_table([search("p", "nq", 0, correct=True)], "grace")
    with pytest.raises(ValueError, match="unknown paper"):
        paper_table.build_paper_layout_table([search("p", "nq", 0, correct=True)], "evipath")
