"""Data preparation against the real retrieval server (Ray Serve on 127.0.0.1, bundled corpus, MiniLM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from verl_evidence.cli import app
from verl_evidence.dataprep.records import read_corpus
from verl_evidence.dataprep.rows import read_parquet

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server_url(retrieval_server_url: str) -> str:
    """The session's retrieval server (tests/conftest.py): bundled corpus, packaged MiniLM."""
    return retrieval_server_url


def test_eviomni_and_grace_from_the_retrieval_server(server_url: str, tokenizer_dir: Path, tmp_path: Path) -> None:
    from retrieval_server.client import RetrievalClient
    from verl_evidence import bundled

    runner = CliRunner()
    out = tmp_path / "eviomni.parquet"
    result = runner.invoke(
        app,
        [
            "data",
            "eviomni",
            "bundled",
            "--retrieval-url",
            server_url,
            "--tokenizer",
            str(tokenizer_dir),
            "-o",
            str(out),
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    rows = read_parquet(out)
    questions = [json.loads(line) for line in Path(bundled.qa_path()).read_text().splitlines() if line.strip()]
    assert len(rows) == len(questions)
    direct = RetrievalClient(server_url).retrieve([questions[0]["question"]], topk=5, return_scores=False)[0]
    assert [p["id"] for p in rows[0]["extra_info"]["passages"]] == [hit["document"]["id"] for hit in direct]
    assert all(len(r["extra_info"]["passages"]) == 5 and r["extra_info"]["eviomni_len_p"] > 0 for r in rows)

    grace_out = tmp_path / "grace.parquet"
    result = runner.invoke(
        app,
        [
            "data",
            "grace",
            "bundled",
            "--retriever",
            "oracle",
            "--retriever",
            f"server-dense={server_url}",
            "--k",
            "5",
            "-o",
            str(grace_out),
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "server-dense" in result.output
    grace_rows = read_parquet(grace_out)
    corpus = read_corpus(bundled.corpus_path())
    gold = {q["id"]: set(q["gold_passage_ids"]) for q in questions}
    served = [r for r in grace_rows if r["extra_info"]["retriever"] == "server-dense"]
    assert served
    for row in grace_rows:
        ids = row["extra_info"]["passage_ids"]
        assert len(ids) == 5 and set(ids) <= set(corpus)
        assert (gold[row["extra_info"]["id"]] <= set(ids)) == row["reward_model"]["ground_truth"]["answerable"]


def test_grace_from_a_search_r1_parquet_against_the_served_index(server_url: str, tiny_set, tmp_path: Path) -> None:
    """Search-R1's files (answers only) -> GRACE rows, the served index as the dense retriever; and a server
    holding another corpus than the QA file's refused in one line (it used to be ``KeyError: '0'``)."""
    from benchmark_scripts import load_benchmark

    from retrieval_server.client import RetrievalClient
    from verl_evidence import bundled
    from verl_evidence.dataprep.grace import contains_answer
    from verl_evidence.dataprep.mix import summary_path

    write_search_r1_parquet = load_benchmark("search_r1_files").write_search_r1_parquet

    questions = [json.loads(line) for line in Path(bundled.qa_path()).read_text().splitlines() if line.strip()]
    examples = [{"id": q["id"], "question": q["question"], "golden_answers": q["golden_answers"]} for q in questions]
    source = write_search_r1_parquet(tmp_path / "train.parquet", {"nq": examples}, "train")
    corpus = read_corpus(bundled.corpus_path())
    runner = CliRunner()

    out = tmp_path / "grace_train.parquet"
    result = runner.invoke(app, ["data", "grace", str(source), "--retriever", f"dense={server_url}", "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = read_parquet(out)
    answerable = [r for r in rows if r["extra_info"]["answerable"]]
    assert answerable and len(rows) - len(answerable)
    for row in rows:
        ids, truth = row["extra_info"]["passage_ids"], row["reward_model"]["ground_truth"]
        assert len(ids) == 5 and set(ids) <= set(corpus)  # the served passages, looked up by their ids
        assert any(contains_answer(corpus[p], truth["target"]) for p in ids) == truth["answerable"]
        assert bool(truth["evidence"]) == truth["answerable"]

    test_out = tmp_path / "grace_test.parquet"
    args = ["data", "grace", str(source), "--retriever", f"dense={server_url}", "--split", "test", "--sample", "40"]
    result = runner.invoke(app, [*args, "-o", str(test_out)])
    assert result.exit_code == 0, result.output
    rows = read_parquet(test_out)
    summary = json.loads(summary_path(test_out).read_text())
    assert (summary["construction"], summary["k"], len(summary["sample"]["ids"]["nq"])) == ("natural", 3, 40)
    served = RetrievalClient(server_url).retrieve([r["extra_info"]["question"] for r in rows], topk=3)
    assert [r["extra_info"]["passage_ids"] for r in rows] == [[h["document"]["id"] for h in hits] for hits in served]

    qa, tiny_corpus = tiny_set
    result = runner.invoke(
        app,
        ["data", "grace", str(qa), "--corpus", str(tiny_corpus), "--retriever", f"dense={server_url}", "-o", str(out)],
    )
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert f"absent from {tiny_corpus}: the server serves another corpus" in message
    assert result.output.startswith("error: retriever 'dense'") and "Traceback" not in result.output
