"""Evaluation metrics against values worked out by hand."""

from __future__ import annotations

import pytest

from verl_evidence.eval import metrics
from verl_evidence.eval.records import EvalRecord


def rec(example_id: str, prediction: str | None, golds: list[str], source: str = "nq", **kw) -> EvalRecord:
    return EvalRecord(
        policy="p",
        example_id=example_id,
        data_source=source,
        rollout=kw.pop("rollout", "search"),
        question="q?",
        golden_answers=golds,
        prediction=prediction,
        **kw,
    )


def test_em_and_f1_use_squad_normalisation_and_max_over_golds() -> None:
    records = [
        rec("a", "The Eiffel Tower!", ["eiffel tower"]),  # EM 1, F1 1
        rec("b", "paris france", ["Paris", "Lyon"]),  # EM 0; F1 vs "paris": P=1/2 R=1 -> 2/3
        rec("c", None, ["x"]),  # no answer: 0, 0
        rec(
            "d", "blue whale calf", ["a blue whale"]
        ),  # EM 0; tokens {blue, whale, calf} vs {blue, whale}: P=2/3 R=1 -> 0.8
    ]
    assert metrics.exact_match_rate(records) == pytest.approx(1 / 4)
    assert metrics.f1_mean(records) == pytest.approx((1 + 2 / 3 + 0 + 0.8) / 4)


def test_answer_recall_only_counts_records_with_evidence() -> None:
    records = [
        rec("a", "x", ["Marie Curie"], evidence="In 1903, marie curie shared the prize."),
        rec("b", "x", ["1911"], evidence="She won again later."),
        rec("c", "x", ["anything"]),  # no evidence: skipped
    ]
    assert metrics.answer_recall_rate(records) == pytest.approx(0.5)
    assert metrics.answer_recall_rate([records[2]]) is None


def test_compression_ratio_is_mean_of_per_example_passage_over_evidence() -> None:
    records = [
        rec("a", "x", ["x"], rollout="eviomni", passage_tokens=500, evidence_tokens=25),  # 20
        rec("b", "x", ["x"], rollout="eviomni", passage_tokens=300, evidence_tokens=50),  # 6
        rec("c", "x", ["x"], rollout="eviomni", passage_tokens=300, evidence_tokens=0),  # undefined: skipped
        rec("d", "x", ["x"], raw_context_tokens=400, context_tokens=100),  # search loop with extractor: 4
        rec("e", "x", ["x"]),  # nothing retrieved: skipped
    ]
    assert metrics.example_compression_ratio(records[0]) == pytest.approx(20.0)
    assert metrics.example_compression_ratio(records[2]) is None
    assert metrics.compression_ratio(records) == pytest.approx((20 + 6 + 4) / 3)


def test_search_and_note_statistics() -> None:
    records = [
        rec("a", "x", ["x"], num_searches=2, summary_count=1, eqr=0.9),
        rec("b", "x", ["x"], num_searches=0, summary_count=0, eqr=0.0),
        rec("c", "x", ["x"], num_searches=3, summary_count=2, eqr=None),
        rec("d", "x", ["x"], rollout="eviomni"),  # no search-loop fields: skipped everywhere
    ]
    assert metrics.average_searches(records) == pytest.approx(5 / 3)
    assert metrics.note_rate(records) == pytest.approx(2 / 3)
    assert metrics.mean_eqr(records) == pytest.approx(0.45)


def test_grace_metrics_by_hand() -> None:
    records = [
        # answerable: correct, wrong answer, refused although answerable (wrong even with a right answer)
        rec("a1", "Paris", ["Paris"], rollout="grace", answerable=True, refused=False),
        rec("a2", "Lyon", ["Paris"], rollout="grace", answerable=True, refused=False),
        rec("a3", "Paris", ["Paris"], rollout="grace", answerable=True, refused=True),
        # unanswerable: refused (right), answered (wrong)
        rec("u1", "Rome", ["Paris"], rollout="grace", answerable=False, refused=True),
        rec("u2", "Paris", ["Paris"], rollout="grace", answerable=False, refused=False),
        rec("x", "Paris", ["Paris"]),  # unlabelled: no GRACE metric sees it
    ]
    g = metrics.grace_metrics(records)
    assert g["answerable_em"] == pytest.approx(2 / 3)  # a1 and a3 match the gold
    assert g["answerable_f1"] == pytest.approx(2 / 3)
    assert g["answerable_accuracy"] == pytest.approx(1 / 3)  # only a1
    assert g["refusal_accuracy"] == pytest.approx(1 / 2)
    assert g["overall_accuracy"] == pytest.approx(2 / 5)  # a1 + u1 out of five labelled
    assert g["balanced_accuracy"] == pytest.approx((1 / 3 + 1 / 2) / 2)


def test_grace_metrics_with_one_class_only_have_no_balanced_accuracy() -> None:
    g = metrics.grace_metrics([rec("a", "Paris", ["Paris"], answerable=True, refused=False)])
    assert g["overall_accuracy"] == 1.0
    assert g["refusal_accuracy"] is None
    assert g["balanced_accuracy"] is None
    assert metrics.grace_metrics([rec("b", "x", ["y"])])["overall_accuracy"] is None


def test_metrics_by_source_aggregates_each_source_and_all() -> None:
    records = [
        rec("a", "x", ["x"], source="nq"),
        rec("b", "y", ["x"], source="nq"),
        rec("c", "z", ["z"], source="hotpotqa"),
    ]
    table = metrics.metrics_by_source(records)
    assert set(table) == {"nq", "hotpotqa", metrics.ALL_SOURCES}
    assert table["nq"]["em"] == pytest.approx(0.5)
    assert table["hotpotqa"]["em"] == pytest.approx(1.0)
    assert table["all"]["em"] == pytest.approx(2 / 3)
    assert table["all"]["n"] == 3
    assert table["nq"]["compression_ratio"] is None
    assert set(metrics.METRIC_NAMES) <= set(table["all"])


def test_reward_means_per_manager_and_component() -> None:
    records = [
        rec("a", "x", ["x"], rewards={"grace": {"score": 2.5, "format": 0.5}, "evinote": {"score": 1.0}}),
        rec("b", "x", ["x"], rewards={"grace": {"score": 0.5, "format": 0.5}}),
        rec("c", "x", ["x"], rewards={"grace": {"score": None, "format": 0.0}}),
    ]
    means = metrics.reward_means(records)
    assert means["grace"]["score"] == pytest.approx(1.5)
    assert means["grace"]["format"] == pytest.approx(1 / 3)
    assert means["evinote"] == {"score": 1.0}


def test_record_json_round_trip_drops_non_finite_rewards() -> None:
    r = rec("a", "x", ["x"], rewards={"m": {"score": float("nan"), "ok": 1.0}}, case="well_grounded")
    row = r.to_json()
    assert row["rewards"]["m"] == {"score": None, "ok": 1.0}
    back = EvalRecord.from_json(row)
    assert back.case == "well_grounded" and back.example_id == "a"
    with pytest.raises(ValueError, match="example_id"):
        EvalRecord.from_json({"policy": "p"})
