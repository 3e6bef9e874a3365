"""Input readers: every bad input gets a clear error naming the file and the problem."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl_evidence.dataprep.records import (
    DataPrepError,
    check_data_source,
    check_references,
    read_corpus,
    read_flashrag_jsonl,
    read_search_r1_parquet,
)
from verl_evidence.dataprep.templates import load_template, render

from .conftest import QUESTIONS, write_jsonl


def test_flashrag_reader_keeps_gold_annotations(tiny_set) -> None:
    qa, corpus_path = tiny_set
    records = read_flashrag_jsonl(qa, "bundled")
    assert [r.id for r in records] == [q["id"] for q in QUESTIONS]
    assert records[1].answers == ("Seine", "the Seine")
    assert records[1].gold_passage_ids == ("p03", "p04")
    assert records[0].gold_evidence == ("The Nile flows north into the Mediterranean Sea.",)
    check_references(records, read_corpus(corpus_path), str(qa))


@pytest.mark.parametrize(
    "row, message",
    [
        ({"id": "a", "golden_answers": ["x"]}, "missing column(s) question"),
        ({"id": "a", "question": "q?"}, "missing column(s) golden_answers"),
        ({"id": "a", "question": "q?", "golden_answers": []}, "empty golden_answers for id 'a'"),
        ({"id": "a", "question": "q?", "golden_answers": ["  "]}, "empty golden_answers"),
        ({"id": "a", "question": "   ", "golden_answers": ["x"]}, "empty question"),
        ({"id": "a", "question": "q?", "golden_answers": 3}, "must be a string or a list"),
        ({"id": "a", "question": {"text": "Who?"}, "golden_answers": ["x"]}, "'question' must be a string, got dict"),
        ({"id": "a", "question": ["Who?"], "golden_answers": ["x"]}, "'question' must be a string, got list"),
        ({"id": None, "question": "q?", "golden_answers": ["x"]}, "column id is null"),
        ({"id": {"n": 1}, "question": "q?", "golden_answers": ["x"]}, "'id' must be a string, got dict"),
        ({"id": "a", "question": "q?", "golden_answers": [{"text": "x"}]}, "'golden_answers' must hold strings"),
    ],
)
def test_bad_rows(tmp_path: Path, row: dict, message: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [row])
    with pytest.raises(DataPrepError, match=re.escape(message)) as err:
        read_flashrag_jsonl(path, "nq")
    assert str(path) in str(err.value)


def test_duplicate_ids(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "question": "q1?", "golden_answers": ["x"]},
        {"id": "a", "question": "q2?", "golden_answers": ["y"]},
    ]
    with pytest.raises(DataPrepError, match=r"duplicate id 'a' in data source 'nq' \(rows 1 and 2\)"):
        read_flashrag_jsonl(write_jsonl(tmp_path / "dup.jsonl", rows), "nq")


def test_unknown_data_source_needs_opt_in() -> None:
    with pytest.raises(DataPrepError, match="unknown data source 'hotpot_qa'.*--new-data-source"):
        check_data_source("hotpot_qa")
    assert check_data_source("my_set", allow_new=True) == "my_set"
    with pytest.raises(DataPrepError, match="invalid data source"):
        check_data_source("my set", allow_new=True)


def test_invalid_json_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"id": "a", "question": "q?", "golden_answers": ["x"]}\n{"id": \n')
    with pytest.raises(DataPrepError, match=r"broken.jsonl:2: not valid JSON"):
        read_flashrag_jsonl(path, "nq")


def test_bytes_that_are_not_utf8_name_their_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"id": "a", "question": "q?", "golden_answers": ["x"]}\n{"id": "b", "question": "caf\xe9?"}\n')
    with pytest.raises(DataPrepError, match=r"latin1.jsonl:2: not UTF-8 text \(byte 0xe9 at column 29\)"):
        read_flashrag_jsonl(path, "nq")


def test_a_parquet_named_jsonl_is_named_as_one(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    pq.write_table(pa.table({"id": ["a"], "question": ["q?"]}), path)
    with pytest.raises(DataPrepError, match=r"train.jsonl: a parquet file, not JSON lines"):
        read_flashrag_jsonl(path, "nq")


def test_corpus_duplicates_and_dangling_references(tmp_path: Path) -> None:
    rows = [{"id": "p1", "contents": "T\nx"}, {"id": "p1", "contents": "T\ny"}]
    with pytest.raises(DataPrepError, match="duplicate passage id 'p1'"):
        read_corpus(write_jsonl(tmp_path / "c.jsonl", rows))
    records = read_flashrag_jsonl(write_jsonl(tmp_path / "q.jsonl", [QUESTIONS[0]]), "bundled")
    with pytest.raises(DataPrepError, match="names passage 'p01', absent from the corpus"):
        check_references(records, {"p02": "x"}, "q.jsonl")


def search_r1_table(answers: list, sources: list[str]) -> pa.Table:
    """The layout of Search-R1's released parquet files (answers only inside reward_model)."""
    return pa.Table.from_pylist(
        [
            {
                "id": f"train_{i}",
                "question": f"question {i}?",
                "data_source": source,
                "prompt": [{"role": "user", "content": "old prompt"}],
                "ability": "fact-reasoning",
                "reward_model": {"style": "rule", "ground_truth": {"target": answer}},
                "extra_info": {"split": "train", "index": i},
            }
            for i, (answer, source) in enumerate(zip(answers, sources, strict=True))
        ]
    )


def test_search_r1_parquet(tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    pq.write_table(search_r1_table([["Paris", "paris city"], ["42"]], ["nq", "hotpotqa"]), path)
    records = read_search_r1_parquet(path)
    assert [(r.id, r.data_source, r.answers) for r in records] == [
        ("nq/train_0", "nq", ("Paris", "paris city")),
        ("hotpotqa/train_1", "hotpotqa", ("42",)),
    ]
    assert read_search_r1_parquet(path, data_source="triviaqa")[0].data_source == "triviaqa"
    pq.write_table(search_r1_table([["x"]], ["searchR1_nq"]), path)
    with pytest.raises(DataPrepError, match="unknown data source 'searchR1_nq'"):
        read_search_r1_parquet(path)


def test_numpy_answers_are_coerced() -> None:
    from verl_evidence.dataprep.records import record_from_row

    record = record_from_row(
        {"id": 7, "question": "q?", "golden_answers": {"target": np.array(["a", "b"], dtype=object)}}, "here", "nq"
    )
    assert record.answers == ("a", "b") and record.id == "7"


def test_templates_from_packaged_prompts_and_files(tmp_path: Path) -> None:
    packaged = load_template("evinote")  # method name -> its packaged prompt (evinote_sen)
    assert "<summary>" in packaged and "{question}" in packaged
    custom = tmp_path / "mine.txt"
    custom.write_text("Q: {question}\nC:\n{context}")
    text = render(load_template(str(custom)), "Why {braces}?", ["Title A\nBody a.", "Body b without title"])
    assert text == "Q: Why {braces}?\nC:\nDoc 1 (Title: Title A) Body a.\nDoc 2 (Title: ) Body b without title"
    bad = tmp_path / "bad.txt"
    bad.write_text("Answer {question} with {rationale}")
    with pytest.raises(DataPrepError, match="cannot fill.*rationale"):
        load_template(str(bad))
    with pytest.raises(DataPrepError, match="neither a file nor a packaged prompt"):
        load_template("no_such_prompt")
    with pytest.raises(DataPrepError, match="needs passages"):
        render(load_template("grace"), "q?")


def test_flashrag_metadata_survives(tmp_path: Path) -> None:
    row = {"id": "a", "question": "q?", "golden_answers": ["x"], "metadata": {"type": "comparison"}}
    (record,) = read_flashrag_jsonl(write_jsonl(tmp_path / "m.jsonl", [row]), "hotpotqa")
    assert record.metadata == {"type": "comparison"}
    assert json.loads(json.dumps(record.metadata)) == {"type": "comparison"}
