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
