"""Recall@k and hit@k of `index recall` against values worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrieval_server.recall import recall_at_k

pytestmark = pytest.mark.slow  # the real MiniLM over the bundled index

CORPUS = Path(__file__).resolve().parents[2] / "verl_evidence" / "bundled" / "corpus.jsonl"


def test_recall_and_hit_match_a_hand_computed_qa_set(bundled_index_dir, tmp_path):
    passages = {}
    with open(CORPUS, encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            passages[row["id"]] = row["contents"]
    # A passage's own text retrieves that passage first, so each question's ranking starts with it.
    qa = [
        {"question": passages["p0001"], "gold_passage_ids": ["p0001"]},  # 1 of 1 gold found
        {"question": passages["p0002"], "gold_passage_ids": ["p0002", "not-in-corpus"]},  # 1 of 2
        {"question": passages["p0003"], "gold_passage_ids": ["not-in-corpus"]},  # 0 of 1
        {"question": passages["p0004"], "gold_passage_ids": []},  # no gold: not counted
    ]
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in qa))

    scores = recall_at_k(bundled_index_dir, path, ks=[1, 3])

    assert scores["questions"] == 3
    assert scores["recall"] == pytest.approx({1: (1 + 1 / 2 + 0) / 3, 3: (1 + 1 / 2 + 0) / 3})
    assert scores["hit"] == pytest.approx({1: 2 / 3, 3: 2 / 3})
