"""Evaluation inputs: verl parquet rows as `verl-evidence data` writes them, and the bundled QA set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_evidence.eval.datasets import bundled_qa_records, examples_from_rows, load_rows

DATA = Path(__file__).parent / "data"


def test_parquet_rows_from_data_prep_become_examples(tmp_path) -> None:
    from verl_evidence.dataprep import rows as rows_mod
    from verl_evidence.dataprep.templates import load_template

    records, _ = bundled_qa_records(DATA / "qa.jsonl")
    rows = rows_mod.search_rows(records, "evinote", load_template("evinote"), "test")
    path = rows_mod.write_parquet(rows, tmp_path / "test.parquet")
    loaded = load_rows(path)
    examples = examples_from_rows(loaded + loaded[:1])  # a repeated question gets a numbered id
    assert [e.example_id for e in examples] == ["search/t1", "search/t2", "search/t1#2"]
    assert {e.rollout for e in examples} == {"search"}
    assert [r.data_source for r in records] == ["qa_1hop", "qa_2hop"]  # one source per hop count
    assert examples[0].row["reward_model"]["ground_truth"]["target"] == ["Mediterranean Sea", "the Mediterranean"]


def test_bad_row_files_fail_clearly(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_rows(tmp_path / "missing.parquet")
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": "q"}]}) + "\n")
    with pytest.raises(ValueError, match=r"row 0 lacks the verl column\(s\) \['reward_model', 'data_source'\]"):
        load_rows(path)
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"rows.jsonl:1: not valid JSON"):
        load_rows(path)
    path.write_text(
        json.dumps({"prompt": [], "reward_model": {}, "data_source": "x", "extra_info": {"method": "?"}}) + "\n"
    )
    with pytest.raises(ValueError, match="cannot tell its rollout"):
        examples_from_rows(load_rows(path))


def test_the_bundled_set_loads_with_hop_sources() -> None:
    records, corpus = bundled_qa_records()
    assert len(records) >= 100 and len(corpus) >= 300
    assert {r.data_source for r in records} == {"bundled_1hop", "bundled_2hop"}
