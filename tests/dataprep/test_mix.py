"""``data qa`` with several inputs (EviNote's NQ + HotpotQA training mix) and ``--sample`` (its test protocol)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmark_scripts import load_benchmark

from verl_evidence.dataprep.mix import choose_rows, parse_input, summary_path
from verl_evidence.dataprep.rows import read_parquet

from .conftest import flat, invoke, write_jsonl

search_r1 = load_benchmark("search_r1_files")  # Search-R1's parquet layout (benchmarks/ owns it)
HOTPOTQA_METADATA = search_r1.HOTPOTQA_METADATA
flashrag_examples = search_r1.flashrag_examples
merged_train_file = search_r1.merged_train_file
write_search_r1_parquet = search_r1.write_search_r1_parquet


def test_flashrag_files_mix_with_their_data_sources_named(tmp_path: Path) -> None:
    nq = write_jsonl(tmp_path / "nq_train.jsonl", flashrag_examples("nq", "train", 3))
    hotpotqa = write_jsonl(tmp_path / "hotpotqa_train.jsonl", flashrag_examples("hotpotqa", "train", 2))
    out = tmp_path / "evinote" / "train.parquet"
    result = invoke("qa", f"nq={nq}", f"hotpotqa={hotpotqa}", "--method", "evinote", "-o", out)
    assert result.exit_code == 0, result.output

    rows = read_parquet(out)
    assert [(r["data_source"], r["extra_info"]["id"]) for r in rows] == [
        ("nq", "train_0"),
        ("nq", "train_1"),
        ("nq", "train_2"),
        ("hotpotqa", "train_0"),  # FlashRAG ids restart per dataset: unique within each data source
        ("hotpotqa", "train_1"),
    ]
    assert [r["extra_info"]["index"] for r in rows] == list(range(5))
    assert all("<summary>" in r["prompt"][0]["content"] for r in rows)  # EviNote's prompt
    for line in ("│ nq │ 3 │ 3 │", "│ hotpotqa │ 2 │ 2 │", "│ total │ 5 │ 5 │"):
        assert line in flat(result.output)

    summary = json.loads(summary_path(out).read_text())
    assert summary_path(out) == tmp_path / "evinote" / "train.summary.json"
    assert summary["rows"] == 5 and summary["method"] == "evinote"
    assert summary["data_sources"] == {"nq": {"rows": 3, "available": 3}, "hotpotqa": {"rows": 2, "available": 2}}
    assert [(i["path"], i["data_source"]) for i in summary["inputs"]] == [(str(nq), "nq"), (str(hotpotqa), "hotpotqa")]
    assert "sample" not in summary


def test_a_search_r1_parquet_mixes_with_a_flashrag_file(tmp_path: Path) -> None:
    merged = merged_train_file(tmp_path / "train.parquet", nq=2, hotpotqa=2)
    triviaqa = write_jsonl(tmp_path / "triviaqa.jsonl", flashrag_examples("triviaqa", "train", 2))
    out = tmp_path / "mix.parquet"
    result = invoke("qa", merged, f"triviaqa={triviaqa}", "-o", out)
    assert result.exit_code == 0, result.output
    rows = read_parquet(out)
    ids = [r["extra_info"]["id"] for r in rows]
    assert ids == ["nq/train_0", "nq/train_1", "hotpotqa/train_0", "hotpotqa/train_1", "train_0", "train_1"]
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 0, 1, 4, 5]  # Search-R1's own index kept
    assert rows[0]["prompt"][0]["content"].startswith("[Search-R1 instruction")  # passed through
    assert rows[4]["data_source"] == "triviaqa" and rows[4]["extra_info"]["split"] == "train"


def test_the_same_question_in_two_inputs_is_refused_naming_both(tmp_path: Path) -> None:
    nq = write_jsonl(tmp_path / "nq.jsonl", flashrag_examples("nq", "train", 2))
    again = write_jsonl(tmp_path / "nq_again.jsonl", flashrag_examples("nq", "train", 3)[1:])
    out = tmp_path / "out.parquet"
    result = invoke("qa", nq, again, "--data-source", "nq", "-o", out)
    assert result.exit_code == 2
    assert f"duplicate id 'train_1' in data source 'nq' ({nq}:2 and {again}:1)" in flat(result.output)
    assert not out.exists() and not summary_path(out).exists()


def test_sample_keeps_n_per_data_source_reproducibly(tmp_path: Path) -> None:
    datasets = {
        "nq": flashrag_examples("nq", "test", 20),
        "hotpotqa": flashrag_examples("hotpotqa", "dev", 12, with_metadata=True),
        "bamboogle": flashrag_examples("bamboogle", "test", 3),
    }
    source = write_search_r1_parquet(tmp_path / "test.parquet", datasets, "test", HOTPOTQA_METADATA)

    def sampled(seed: int, name: str, path: Path = source) -> tuple[list[str], dict]:
        out = tmp_path / name
        result = invoke("qa", path, "--method", "evinote", "--sample", 5, "--seed", seed, "-o", out)
        assert result.exit_code == 0, result.output
        assert "kept every row of bamboogle (no more than --sample 5)" in flat(result.output) or path != source
        return [r["extra_info"]["id"] for r in read_parquet(out)], json.loads(summary_path(out).read_text())

    ids, summary = sampled(1, "a.parquet")
    by_source = {name: [i for i in ids if i.startswith(f"{name}/")] for name in datasets}
    assert {name: len(kept) for name, kept in by_source.items()} == {"nq": 5, "hotpotqa": 5, "bamboogle": 3}
    assert summary["sample"] == {"per_data_source": 5, "seed": 1, "ids": by_source}
    assert summary["data_sources"]["nq"] == {"rows": 5, "available": 20}
    order = [f"nq/test_{n}" for n in range(20)] + [f"hotpotqa/dev_{n}" for n in range(12)]
    assert ids[:10] == sorted(ids[:10], key=order.index)  # the file's order is kept
    assert sampled(1, "b.parquet")[0] == ids  # same seed, same rows
    assert sampled(2, "c.parquet")[0] != ids
    # A data source's draw depends only on (seed, data source), not on what else the input holds.
    nq_only = write_search_r1_parquet(tmp_path / "nq.parquet", {"nq": datasets["nq"]}, "test")
    assert sampled(1, "d.parquet", nq_only)[0] == by_source["nq"]


def test_sample_must_be_positive(tmp_path: Path) -> None:
    nq = write_jsonl(tmp_path / "nq.jsonl", flashrag_examples("nq", "train", 2))
    result = invoke("qa", nq, "--data-source", "nq", "--sample", 0, "-o", tmp_path / "out.parquet")
    assert result.exit_code == 2 and "--sample must be positive, got 0" in result.output


def test_choose_rows_and_input_names() -> None:
    sources = ["nq"] * 10 + ["bamboogle"] * 2 + ["nq"] * 5
    chosen = choose_rows(sources, 4, seed=0)
    assert sum(sources[i] == "nq" for i in chosen) == 4 and {10, 11} <= chosen
    assert chosen == choose_rows(sources, 4, seed=0)
    assert parse_input("nq=data/nq.jsonl", None) == parse_input("data/nq.jsonl", "nq")
    assert parse_input("data/train.parquet", None).data_source is None
