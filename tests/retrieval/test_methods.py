"""BM25, hybrid (reciprocal-rank fusion), cross-encoder rerank and Recall@k on the bundled set (in-process)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from retrieval_server.config import ServerConfig, bundled_qa_path
from retrieval_server.recall import load_qa, recall_at_k
from retrieval_server.search import Retriever, reciprocal_rank_fusion

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


def _tiny_cross_encoder(directory) -> str:
    """A randomly initialised 2-layer BERT cross-encoder with MiniLM's vocabulary, saved locally."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from retrieval_server.config import packaged_minilm_path

    tokenizer = AutoTokenizer.from_pretrained(packaged_minilm_path())
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def test_cross_encoder_rerank_reorders_the_dense_top_n(bundled_index_dir, tmp_path, questions):
    from sentence_transformers import CrossEncoder

    model = _tiny_cross_encoder(tmp_path / "tiny-ce")
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
    bad = CliRunner().invoke(app, ["index", "build", "-o", str(tmp_path), "--train-sample", "0"])
    assert bad.exit_code != 0
