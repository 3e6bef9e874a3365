"""Recall@k of gold passages for a QA set, computed in-process over a built index."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from retrieval_server.config import RetrievalMethod, ServerConfig
from retrieval_server.index import check_search_params, read_manifest
from retrieval_server.jsonl import read_jsonl
from retrieval_server.search import Retriever

logger = logging.getLogger(__name__)


def load_qa(path: Path) -> list[dict]:
    return read_jsonl(path)


def recall_at_k(
    index_dir: Path, qa_path: Path, ks: list[int], method: RetrievalMethod = "dense", search_params: str = ""
) -> dict:
    """``{"questions": n, "recall": {k: mean fraction of gold found}, "hit": {k: fraction with >= 1 gold found},
    "search_params": the faiss setting searched at}``; ``search_params`` "" searches at the index's own setting
    (the one ``index build``/``convert`` chose and wrote into the file)."""
    questions = [q for q in load_qa(qa_path) if q.get("gold_passage_ids")]
    if not questions:
        raise ValueError(f"{qa_path}: no question has gold_passage_ids")
    depth = max(ks)
    config = ServerConfig(
        index_dir=index_dir, method=method, max_topk=max(depth, 100), default_topk=1, search_params=search_params
    )
    if method != "bm25":
        check_search_params(Path(index_dir), read_manifest(index_dir), search_params)
    retriever = Retriever(config)
    texts = [q["question"] for q in questions]
    rows, _ = retriever.search(texts, retriever.encode(texts), depth)
    documents = retriever.lookup(np.where(rows >= 0, rows, 0).reshape(-1))
    recall = dict.fromkeys(ks, 0.0)
    hit = dict.fromkeys(ks, 0.0)
    for i, question in enumerate(questions):
        gold = set(question["gold_passage_ids"])
        ranked = [documents[i * depth + j]["id"] for j in range(depth) if rows[i, j] >= 0]
        for k in ks:
            found = gold & set(ranked[:k])
            recall[k] += len(found) / len(gold)
            hit[k] += 1.0 if found else 0.0
    n = len(questions)
    return {
        "questions": n,
        "recall": {k: v / n for k, v in recall.items()},
        "hit": {k: v / n for k, v in hit.items()},
        "search_params": search_params
        or (retriever.manifest["index"].get("search_params", "") if method != "bm25" else ""),
    }
