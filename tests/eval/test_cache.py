"""The JSONL results cache: keyed by (policy, example id), resumable, robust to a torn line."""

from __future__ import annotations

import json

from verl_evidence.eval.cache import ResultsCache
from verl_evidence.eval.records import EvalRecord


def rec(policy: str, example_id: str, prediction: str = "x") -> EvalRecord:
    return EvalRecord(
        policy=policy,
        example_id=example_id,
        data_source="bundled",
        rollout="search",
        question="q?",
        golden_answers=["x"],
        prediction=prediction,
        rewards={"grace": {"score": 1.5}},
    )


def test_records_survive_a_reload_and_are_keyed_by_policy_and_id(tmp_path) -> None:
    path = tmp_path / "cache" / "results.jsonl"
    cache = ResultsCache(path)
    cache.add(rec("replay", "q1"))
    cache.add(rec("replay", "q2"))
    cache.add(rec("hf:/m", "q1", prediction="y"))

    again = ResultsCache(path)
    assert len(again) == 3
    assert ("replay", "q1") in again and ("hf:/m", "q2") not in again
    assert again.get("hf:/m", "q1").prediction == "y"
    assert again.get("replay", "q2").rewards == {"grace": {"score": 1.5}}
    assert {r.example_id for r in again.records("replay")} == {"q1", "q2"}


def test_a_later_line_for_the_same_key_wins(tmp_path) -> None:
    path = tmp_path / "results.jsonl"
    cache = ResultsCache(path)
    cache.add(rec("p", "q1", prediction="old"))
    cache.add(rec("p", "q1", prediction="new"))
    assert ResultsCache(path).get("p", "q1").prediction == "new"
    assert len(ResultsCache(path)) == 1


def test_a_torn_last_line_is_skipped_and_the_next_record_still_lands(tmp_path) -> None:
    path = tmp_path / "results.jsonl"
    ResultsCache(path).add(rec("p", "q1"))
    with path.open("a") as fh:  # a crash in the middle of writing q2
        fh.write(json.dumps(rec("p", "q2").to_json())[:40])

    cache = ResultsCache(path)
    assert len(cache) == 1  # q2 is not done, so a resumed run redoes it
    cache.add(rec("p", "q3"))
    reloaded = ResultsCache(path)
    assert {r.example_id for r in reloaded} == {"q1", "q3"}
