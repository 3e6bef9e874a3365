"""``data qa`` on Search-R1's parquet files as its merge scripts write them (layout: ``benchmarks/search_r1_files.py``).

FlashRAG's ids restart per dataset, so the merged NQ + HotpotQA train file and the 7-dataset test file
repeat ``train_0`` / ``test_0``: rows are recorded as ``<data_source>/<id>``, their verl columns pass
through, and a duplicate within one data source is still refused naming both rows.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from benchmark_scripts import load_benchmark

from verl_evidence.dataprep import records as records_mod
from verl_evidence.dataprep.records import DataPrepError, ParquetInput
from verl_evidence.dataprep.rows import read_parquet
from verl_evidence.dataprep.templates import load_template, render

from .test_cli import invoke, verl_dataset

search_r1 = load_benchmark("search_r1_files")  # Search-R1's parquet layout (benchmarks/ owns it)
HOTPOTQA_METADATA = search_r1.HOTPOTQA_METADATA
INSTRUCTION = search_r1.INSTRUCTION
TEST_MERGE_SPLITS = search_r1.TEST_MERGE_SPLITS
flashrag_examples = search_r1.flashrag_examples
merged_test_file = search_r1.merged_test_file
merged_train_file = search_r1.merged_train_file
write_search_r1_parquet = search_r1.write_search_r1_parquet


def test_the_builder_writes_the_scripts_layout(tmp_path: Path) -> None:
    """Guards the fixture itself: FlashRAG columns first, verl columns after, ids repeating across datasets."""
    path = merged_train_file(tmp_path / "train.parquet")
    schema = pq.read_schema(path)
    assert schema.names == [
        "id",
        "question",
        "golden_answers",
        "metadata",
        "data_source",
        "prompt",
        "ability",
        "reward_model",
        "extra_info",
    ]
    rows = pq.read_table(path).to_pylist()
    assert [r["id"] for r in rows] == ["train_0", "train_1", "train_2"] * 2
    assert [r["extra_info"] for r in rows][:4] == [
        {"split": "train", "index": 0},
        {"split": "train", "index": 1},
        {"split": "train", "index": 2},
        {"split": "train", "index": 0},
    ]
    nq, hotpot = rows[0], rows[3]
    assert nq["question"] == "nq question number 0?" and nq["metadata"] is None
    assert hotpot["metadata"]["supporting_facts"]["sent_id"] == [0, 1]
    assert nq["prompt"] == [{"role": "user", "content": f"{INSTRUCTION}Question: nq question number 0?\n"}]
    assert nq["reward_model"] == {"style": "rule", "ground_truth": {"target": ["nq answer 0", "alias 0"]}}


def test_merged_train_file_passes_through(tokenizer_dir, tmp_path: Path) -> None:
    source = merged_train_file(tmp_path / "train.parquet")
    given = pq.read_table(source).to_pylist()
    out = tmp_path / "search_r1.parquet"
    result = invoke("qa", source, "-o", out)
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "kept 6 prompts, rendered 0" in output and "columns not read (not part of the rows): metadata" in output

    rows = read_parquet(out)
    assert [r["extra_info"]["id"] for r in rows] == [f"{s}/train_{n}" for s in ("nq", "hotpotqa") for n in range(3)]
    assert "metadata" not in pq.read_schema(out).names
    for before, after in zip(given, rows, strict=True):
        # Kept as they came.
        assert after["data_source"] == before["data_source"] and after["ability"] == "fact-reasoning"
        assert after["prompt"] == before["prompt"]
        assert after["reward_model"] == {
            "style": "rule",
            "ground_truth": {"target": before["golden_answers"], "evidence": []},
        }
        assert {k: after["extra_info"][k] for k in ("split", "index")} == before["extra_info"]
        # Added for the search loop and the rewards.
        assert after["agent_name"] == after["extra_info"]["agent_name"] == "evidence_search"
        assert after["extra_info"]["question"] == before["question"]
        assert after["extra_info"]["method"] == "search_r1" and after["extra_info"]["need_tools_kwargs"] is True
        assert after["extra_info"]["tools_kwargs"] == {"search": {"create_kwargs": {"question": before["question"]}}}

    dataset = verl_dataset(out, tokenizer_dir)
    assert len(dataset) == 6
    item = dataset[4]
    assert item["raw_prompt"][0]["content"] == given[4]["prompt"][0]["content"]
    assert item["agent_name"] == "evidence_search"
    assert item["tools_kwargs"]["search"]["create_kwargs"]["question"] == "hotpotqa question number 1?"
    assert item["index"] == 1  # Search-R1's per-dataset index, kept
    assert list(item["reward_model"]["ground_truth"]["target"]) == ["hotpotqa answer 1", "alias 1"]


def test_seven_dataset_test_file_for_evinote(tmp_path: Path) -> None:
    source = merged_test_file(tmp_path / "test.parquet")
    out = tmp_path / "evinote_test.parquet"
    result = invoke("qa", source, "--method", "evinote", "-o", out)
    assert result.exit_code == 0, result.output
    assert "kept 0 prompts, rendered 14 with the 'evinote' template" in " ".join(result.output.split())

    rows = read_parquet(out)
    expected_ids = [f"{s}/{split}_{n}" for s, split in TEST_MERGE_SPLITS.items() for n in range(2)]
    assert [r["extra_info"]["id"] for r in rows] == expected_ids
    assert {r["extra_info"]["split"] for r in rows} == {"test"}  # the file's split, not a default "train"
    template = load_template("evinote")
    for row in rows:
        # Search-R1's prompt asks for no notes: EviNote rows get EviNote's prompt around the same question.
        assert row["prompt"] == [{"role": "user", "content": render(template, row["extra_info"]["question"])}]
        assert "<summary>" in row["prompt"][0]["content"]
        assert row["extra_info"]["method"] == "evinote"


def test_duplicate_within_one_data_source_names_both_rows(tmp_path: Path) -> None:
    examples = flashrag_examples("nq", "train", 3)
    examples[2]["id"] = "train_0"
    datasets = {"nq": examples, "hotpotqa": flashrag_examples("hotpotqa", "train", 1, with_metadata=True)}
    source = write_search_r1_parquet(tmp_path / "dup.parquet", datasets, "train", HOTPOTQA_METADATA)
    out = tmp_path / "out.parquet"
    result = invoke("qa", source, "-o", out)
    assert result.exit_code == 2
    assert "duplicate id 'nq/train_0' in data source 'nq' (rows 1 and 3)" in " ".join(result.output.split())
    assert not out.exists()


def test_a_duplicate_found_after_rows_were_written_leaves_no_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(records_mod, "PARQUET_BATCH_ROWS", 2)
    examples = flashrag_examples("hotpotqa", "train", 5, with_metadata=True)
    examples[4]["id"] = "train_1"
    source = write_search_r1_parquet(tmp_path / "dup.parquet", {"hotpotqa": examples}, "train", HOTPOTQA_METADATA)
    out = tmp_path / "out" / "rows.parquet"
    result = invoke("qa", source, "-o", out)
    assert result.exit_code == 2
    assert "(rows 2 and 5)" in " ".join(result.output.split())
    assert list(out.parent.iterdir()) == []  # neither the file nor its partial twin


def test_a_data_source_override_that_merges_datasets_is_refused(tmp_path: Path) -> None:
    source = merged_train_file(tmp_path / "train.parquet")
    result = invoke("qa", source, "--data-source", "nq", "-o", tmp_path / "out.parquet")
    assert result.exit_code == 2
    assert "duplicate id 'nq/train_0' in data source 'nq' (rows 1 and 4)" in " ".join(result.output.split())


def test_our_own_output_passes_through_unchanged(tmp_path: Path) -> None:
    first = tmp_path / "first.parquet"
    assert invoke("qa", merged_test_file(tmp_path / "test.parquet"), "-o", first).exit_code == 0
    again = tmp_path / "again.parquet"
    result = invoke("qa", first, "-o", again)
    assert result.exit_code == 0, result.output
    assert read_parquet(again) == read_parquet(first)
    assert pq.read_schema(again).equals(pq.read_schema(first))


def test_template_and_split_options_replace_what_the_rows_carry(tmp_path: Path) -> None:
    source = merged_train_file(tmp_path / "train.parquet", nq=1, hotpotqa=1)
    template = tmp_path / "mine.txt"
    template.write_text("Q: {question}")
    out = tmp_path / "out.parquet"
    result = invoke("qa", source, "--template", template, "--split", "val", "-o", out)
    assert result.exit_code == 0, result.output
    rows = read_parquet(out)
    assert [r["prompt"][0]["content"] for r in rows] == ["Q: nq question number 0?", "Q: hotpotqa question number 0?"]
    assert [r["extra_info"]["split"] for r in rows] == ["val", "val"]


def test_verl_rows_keep_their_own_extra_fields(tmp_path: Path) -> None:
    """A row written by another verl recipe (verl's own search preprocessing adds tool kwargs of its own)."""
    row = {
        "data_source": "nq",
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who wrote Emma?"}],
        "ability": "fact-reasoning",
        "agent_name": "tool_agent",
        "reward_model": {"style": "rule", "ground_truth": {"target": ["Jane Austen"]}},
        "extra_info": {
            "index": 7,
            "split": "train",
            "question": "Who wrote Emma?",
            "need_tools_kwargs": True,
            "tools_kwargs": {"search": {"create_kwargs": {"ground_truth": {"target": ["Jane Austen"]}}}},
            "interaction_kwargs": {"name": "none"},
        },
    }
    source = tmp_path / "verl.parquet"
    pq.write_table(pa.Table.from_pylist([row]), source)
    out = tmp_path / "out.parquet"
    result = invoke("qa", source, "-o", out)
    assert result.exit_code == 0, result.output
    (written,) = read_parquet(out)
    assert written["prompt"] == row["prompt"] and written["agent_name"] == "evidence_search"
    extra = written["extra_info"]
    assert extra["id"] == "nq/7" and extra["index"] == 7 and extra["interaction_kwargs"] == {"name": "none"}
    assert extra["tools_kwargs"] == {
        "search": {"create_kwargs": {"ground_truth": {"target": ["Jane Austen"]}, "question": "Who wrote Emma?"}}
    }


@pytest.mark.parametrize(
    "change, message",
    [
        ({"prompt": []}, "prompt must be a non-empty list of {role, content} messages"),
        ({"reward_model": {"style": "rule", "ground_truth": {"target": []}}}, "empty golden_answers for id 'nq/a'"),
        ({"question": "  "}, "empty question"),
        ({"data_source": "searchR1_nq"}, "unknown data source 'searchR1_nq'"),
        ({"extra_info": {"split": "train", "index": "0"}}, "extra_info.index must be an integer, got '0'"),
    ],
)
def test_bad_verl_rows_are_refused(tmp_path: Path, change: dict, message: str) -> None:
    row = {
        "id": "a",
        "question": "q?",
        "data_source": "nq",
        "prompt": [{"role": "user", "content": "q?"}],
        "reward_model": {"style": "rule", "ground_truth": {"target": ["x"]}},
        "extra_info": {"split": "train", "index": 0},
    }
    source = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{**row, **change}]), source)
    result = invoke("qa", source, "-o", tmp_path / "out.parquet")
    assert result.exit_code == 2
    assert f"{source}:row 1" in " ".join(result.output.split())
    assert message in " ".join(result.output.split())


def test_parquet_is_read_in_batches_of_the_needed_columns(tmp_path: Path) -> None:
    path = merged_train_file(tmp_path / "train.parquet", nq=3, hotpotqa=4)
    source = ParquetInput(path, batch_rows=3)
    assert source.unread_columns == ["metadata"] and "metadata" not in source.schema.names
    assert source.in_verl_layout and source.num_rows == 7
    batches = list(source.batches())
    assert [len(b) for b in batches] == [3, 3, 1]
    assert [item.record.id for item in batches[1]] == ["hotpotqa/train_0", "hotpotqa/train_1", "hotpotqa/train_2"]
    assert batches[0][0].given is not None and "metadata" not in batches[0][0].given


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    path = write_search_r1_parquet(tmp_path / "empty.parquet", {"nq": []}, "train")
    with pytest.raises(DataPrepError, match="no rows"):
        list(ParquetInput(path).batches())


def test_row_writer_refuses_rows_off_its_schema_and_leaves_no_file(tmp_path: Path) -> None:
    from verl_evidence.dataprep.rows import RowWriter

    schema = pa.schema([pa.field("index", pa.int64())])
    out = tmp_path / "rows.parquet"
    with pytest.raises(DataPrepError, match=r"output rows 3-3 do not fit one schema"), RowWriter(out, schema) as w:
        w.write([{"index": 0}, {"index": 1}])
        w.write([{"index": "two"}])
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(DataPrepError, match="no rows to write"), RowWriter(out, schema):
        pass
    assert list(tmp_path.iterdir()) == []
