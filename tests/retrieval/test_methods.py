"""BM25, hybrid (reciprocal-rank fusion), cross-encoder rerank and Recall@k on the bundled set (in-process)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from retrieval_server.config import ServerConfig
from retrieval_server.recall import load_qa, recall_at_k
from retrieval_server.search import Retriever, reciprocal_rank_fusion
from verl_evidence.bundled import corpus_path as bundled_corpus_path
from verl_evidence.bundled import qa_path as bundled_qa_path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def questions() -> list[dict]:
    return load_qa(bundled_qa_path())


@pytest.fixture(scope="module")
def hybrid(bundled_index_dir) -> Retriever:
    return Retriever(ServerConfig(index_dir=bundled_index_dir, method="hybrid", fusion_depth=30))


def _ids(retriever: Retriever, rows: np.ndarray) -> list[list[str]]:
    return [[d["id"] for d in retriever.lookup(r[r >= 0])] for r in rows]


def test_bm25_finds_gold_passages_of_bundled_questions(hybrid, questions):
    texts = [q["question"] for q in questions]
    rows, scores = hybrid.bm25.search(texts, 5)
    assert np.all(np.diff(scores, axis=1) <= 0)
    hits = [bool(set(q["gold_passage_ids"]) & set(ids)) for q, ids in zip(questions, _ids(hybrid, rows))]
    assert np.mean(hits) >= 0.8, f"BM25 hit@5 {np.mean(hits):.2f}"


def test_bm25_handles_queries_without_known_words(hybrid):
    rows, scores = hybrid.bm25.search(["", "zzqx wvvut", "the of and"], 3)
    assert rows.shape == (3, 3) and np.all(scores == 0)


def test_hybrid_is_reciprocal_rank_fusion_of_dense_and_bm25(hybrid, questions):
    texts = [q["question"] for q in questions[:20]]
    vectors = hybrid.encode(texts)
    fused_rows, fused_scores = hybrid.search(texts, vectors, 5)
    dense_rows, _ = hybrid.dense.search(vectors, 30)
    bm25_rows, _ = hybrid.bm25.search(texts, 30)
    for q in range(len(texts)):
        expected: dict[int, float] = {}
        for ranking in (dense_rows[q], bm25_rows[q]):
            for rank, row in enumerate(ranking):
                expected[int(row)] = expected.get(int(row), 0.0) + 1.0 / (60 + rank + 1)
        best = sorted(expected.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
        assert fused_rows[q].tolist() == [row for row, _ in best]
        np.testing.assert_allclose(fused_scores[q], [score for _, score in best], rtol=1e-6)


def _alone(retriever: Retriever, texts: list[str], vectors, ks: list[int]) -> list[list[int]]:
    return [retriever.search([t], vectors[q : q + 1], k)[0][0].tolist() for q, (t, k) in enumerate(zip(texts, ks))]


def test_hybrid_with_mixed_topk_gives_each_query_its_alone_result(hybrid, questions):
    """A server batch mixes requests' topk; a deep companion must not change a shallow query's fusion."""
    texts = [q["question"] for q in questions[:16]]  # question 12's top 3 changes when fused 100 deep
    ks = [3 if q % 2 == 0 else 100 for q in range(len(texts))]
    vectors = hybrid.encode(texts)
    rows, scores = hybrid.search(texts, vectors, ks)
    assert rows.shape == scores.shape == (len(texts), 100)
    alone = _alone(hybrid, texts, vectors, ks)
    for q, k in enumerate(ks):
        assert rows[q, :k].tolist() == alone[q]
        assert np.all(rows[q, k:] == -1) and np.all(np.isneginf(scores[q, k:]))
    deep = hybrid.search(texts, vectors, 100)[0]
    assert deep[12, :3].tolist() != alone[12], "question 12 no longer shows the difference; pick another"


def test_rrf_rewards_agreement_and_pads_missing():
    rows, scores = reciprocal_rank_fusion([np.array([[1, 2, 3]]), np.array([[3, 9, -1]])], k=5, rrf_k=60)
    assert rows[0, 0] == 3  # in both lists
    assert rows[0].tolist()[:4] == [3, 1, 2, 9] and rows[0, 4] == -1 and np.isneginf(scores[0, 4])


def test_hybrid_recall_not_below_the_weaker_retriever(bundled_index_dir):
    qa = bundled_qa_path()
    dense = recall_at_k(bundled_index_dir, qa, [3], method="dense")["recall"][3]
    bm25 = recall_at_k(bundled_index_dir, qa, [3], method="bm25")["recall"][3]
    fused = recall_at_k(bundled_index_dir, qa, [3], method="hybrid")["recall"][3]
    assert fused >= min(dense, bm25) - 0.02
    assert min(dense, bm25, fused) > 0.5


def test_cross_encoder_rerank_reorders_the_dense_top_n(bundled_index_dir, tiny_cross_encoder, questions):
    from sentence_transformers import CrossEncoder

    model = tiny_cross_encoder
    plain = Retriever(ServerConfig(index_dir=bundled_index_dir))
    reranked = Retriever(ServerConfig(index_dir=bundled_index_dir, rerank_model=model, rerank_top_n=8))
    texts = [q["question"] for q in questions[:4]]
    candidates, _ = plain.search(texts, plain.encode(texts), 8)
    rows, scores = reranked.search(texts, reranked.encode(texts), 3)
    judge = CrossEncoder(model, device="cpu")
    for q, text in enumerate(texts):
        contents = [d["contents"] for d in plain.lookup(candidates[q])]
        ce_scores = judge.predict([(text, c) for c in contents], show_progress_bar=False)
        order = np.argsort(-ce_scores, kind="stable")[:3]
        assert rows[q].tolist() == candidates[q][order].tolist()
        np.testing.assert_allclose(scores[q], ce_scores[order], rtol=1e-4, atol=1e-5)


def test_rerank_with_mixed_topk_reranks_each_query_at_its_own_depth(bundled_index_dir, tiny_cross_encoder, questions):
    reranked = Retriever(ServerConfig(index_dir=bundled_index_dir, rerank_model=tiny_cross_encoder, rerank_top_n=8))
    texts = [q["question"] for q in questions[:6]]
    ks = [2, 30, 5, 2, 30, 8]
    vectors = reranked.encode(texts)
    rows, _ = reranked.search(texts, vectors, ks)
    alone = _alone(reranked, texts, vectors, ks)
    assert [rows[q, :k].tolist() for q, k in enumerate(ks)] == alone
    deep = reranked.search(texts, vectors, 30)[0]
    assert any(deep[q, :k].tolist() != alone[q] for q, k in enumerate(ks) if k < 8), (
        "reranking 30 deep changes no short list"
    )


def test_recall_command_reports_recall_at_3(bundled_index_dir):
    from verl_evidence.cli import app

    result = CliRunner().invoke(app, ["index", "recall", "--index-dir", str(bundled_index_dir), "--k", "3"])
    assert result.exit_code == 0, result.output
    expected = recall_at_k(bundled_index_dir, bundled_qa_path(), [3])
    assert f"{expected['recall'][3]:.3f}" in result.output and "questions" in result.output


def test_build_command_passes_train_sample_and_factory(monkeypatch, tmp_path):
    """`index build --train-sample` reaches BuildConfig (IVF65536 needs ~2.6M training vectors)."""
    import retrieval_server.index as index_module
    from verl_evidence.cli import app

    seen = {}

    def fake_build_index(config, *args, **kwargs):
        seen["config"] = config
        return {"count": 0, "dim": 0, "index": {}, "encoder": {}}

    monkeypatch.setattr(index_module, "build_index", fake_build_index)
    result = CliRunner().invoke(
        app, ["index", "build", "-o", str(tmp_path), "--factory", "IVF65536,PQ96", "--train-sample", "2600000"]
    )
    assert result.exit_code == 0, result.output
    assert seen["config"].train_sample == 2_600_000 and seen["config"].index_factory == "IVF65536,PQ96"
    assert seen["config"].corpus == bundled_corpus_path()  # verl-evidence gives the server its bundled corpus
    bad = CliRunner().invoke(app, ["index", "build", "-o", str(tmp_path), "--train-sample", "0"])
    assert bad.exit_code != 0


@pytest.mark.parametrize(
    ("args", "option"),
    [(["serve"], "--index-dir"), (["build"], "--corpus"), (["recall", "--index-dir", "idx"], "--qa")],
)
def test_the_server_alone_has_no_default_data_and_asks_for_paths(args, option):
    """`retrieval-server` has no corpus of its own (only verl-evidence gives it one): it says what to pass."""
    from retrieval_server.cli import app

    result = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert result.exit_code == 2
    assert f"Invalid value for {option}: this command has no default" in result.output, result.output
