"""``data grace``: the paper's test set (natural retrieval, k = 3) and rows from files with answers only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

from verl_evidence.dataprep.grace import contains_answer
from verl_evidence.dataprep.mix import summary_path
from verl_evidence.dataprep.rows import read_parquet

from .conftest import PASSAGES, QUESTIONS, flat, invoke

write_search_r1_parquet = load_benchmark("search_r1_files").write_search_r1_parquet  # benchmarks/ owns the layout


def search_r1_file(path: Path) -> Path:
    """The tiny set's questions and answers in Search-R1's parquet layout: no gold passages."""
    examples = [
        {"id": f"train_{n}", "question": q["question"], "golden_answers": q["golden_answers"]}
        for n, q in enumerate(QUESTIONS)
    ]
    return write_search_r1_parquet(path, {"nq": examples}, "train")


def test_a_test_split_is_built_as_the_paper_builds_its_test_set(tiny_set, tmp_path: Path) -> None:
    """Default for --split test: the dense top-3 as retrieved, answerable iff every gold passage is in it."""
    from verl_evidence.dataprep.retrievers import DenseRetriever, Query, _default_dense_model

    qa, corpus = tiny_set
    out = tmp_path / "grace_test.parquet"
    result = invoke("grace", qa, "--corpus", corpus, "--split", "test", "-o", out)
    assert result.exit_code == 0, result.output
    assert "GRACE natural construction, k=3: 6 samples, 6 kept" in flat(result.output)

    dense = DenseRetriever(PASSAGES, _default_dense_model())
    retrieved = dense.retrieve([Query(q["id"], q["question"]) for q in QUESTIONS], 3)
    rows = read_parquet(out)
    assert [r["extra_info"]["passage_ids"] for r in rows] == retrieved  # nothing forced in or out
    by_id = {q["id"]: q for q in QUESTIONS}
    for row in rows:
        question, truth = by_id[row["extra_info"]["id"]], row["reward_model"]["ground_truth"]
        answerable = set(question["gold_passage_ids"]) <= set(row["extra_info"]["passage_ids"])
        assert truth["answerable"] == answerable == row["extra_info"]["answerable"]
        assert truth["evidence"] == (question["gold_evidence"] if answerable else [])
        assert row["extra_info"]["retriever"] == "dense" and row["extra_info"]["validate"] is True
    summary = json.loads(summary_path(out).read_text())
    assert (summary["construction"], summary["k"], summary["retrievers"]) == ("natural", 3, ["dense"])

    # At k = 1 the two-hop questions cannot be answerable: the split is the retriever's, not a forced 50/50.
    result = invoke("grace", qa, "--corpus", corpus, "--split", "test", "--k", 1, "-o", out)
    assert result.exit_code == 0, result.output
    rows = read_parquet(out)
    answerable = sum(r["extra_info"]["answerable"] for r in rows)
    assert 0 < answerable <= 4 and not any(
        r["extra_info"]["answerable"] for r in rows if r["extra_info"]["id"] in ("q2", "q4")
    )
    assert json.loads(summary_path(out).read_text())["counts"]["total"] == {
        "answerable": answerable,
        "unanswerable": len(rows) - answerable,
        "duplicates": 0,
        "skipped": 0,
    }
    assert f"│ dense │ {answerable} │ {len(rows) - answerable} │ 0 │" in flat(result.output)


def test_grace_rows_from_a_search_r1_parquet(tiny_set, tmp_path: Path) -> None:
    """Questions with answers only: gold = retrieved passages holding an answer; their sentences the evidence."""
    _, corpus = tiny_set
    source = search_r1_file(tmp_path / "train.parquet")
    out = tmp_path / "grace.parquet"
    args = ["grace", source, "--corpus", corpus, "--retriever", "bm25", "--retriever", "random", "--k", 3]
    result = invoke(*args, "--seed", 3, "-o", out)
    assert result.exit_code == 0, result.output
    assert "GRACE balanced construction, k=3" in flat(result.output)
    rows = read_parquet(out)
    assert rows and {r["extra_info"]["retriever"] for r in rows} <= {"bm25", "random"}
    assert {r["extra_info"]["id"] for r in rows} <= {f"nq/train_{n}" for n in range(len(QUESTIONS))}
    for row in rows:
        answers = row["reward_model"]["ground_truth"]["target"]
        holding = [p for p in row["extra_info"]["passage_ids"] if contains_answer(PASSAGES[p], answers)]
        truth = row["reward_model"]["ground_truth"]
        assert len(row["extra_info"]["passage_ids"]) == 3
        assert truth["answerable"] == bool(holding)
        if truth["answerable"]:  # evidence: the answer's sentences, from the context's own passages
            assert truth["evidence"] and all(contains_answer(f"T\n{s}", answers) for s in truth["evidence"])
            assert all(any(s in PASSAGES[p] for p in holding) for s in truth["evidence"])
        else:
            assert truth["evidence"] == []
    summary = json.loads(summary_path(out).read_text())
    assert (summary["style"], summary["construction"]) == ("qa", "balanced")  # a .parquet: --style qa
    assert summary["rows"] == len(rows)


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "pass --retriever NAME=URL (a retrieval server"),
        (["--retriever", "bm25"], "retriever 'bm25' runs in this process over a corpus: pass --corpus FILE"),
        (["--corpus", "{corpus}", "--retriever", "oracle"], "'oracle' needs annotated gold passages"),
        (["--style", "bundled", "--corpus", "{corpus}"], "train.parquet: a parquet file, not JSON lines"),
    ],
)
def test_grace_errors_are_one_line(tiny_set, tmp_path: Path, extra: list[str], message: str) -> None:
    _, corpus = tiny_set
    source = search_r1_file(tmp_path / "train.parquet")
    out = tmp_path / "out.parquet"
    result = invoke("grace", source, *[a.format(corpus=corpus) for a in extra], "-o", out)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 or message not in result.output.splitlines()[0]
    assert message in flat(result.output)
    assert not out.exists() and not summary_path(out).exists()
