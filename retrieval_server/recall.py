"""Recall@k of gold passages for a QA set, computed in-process over a built index."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from retrieval_server.config import RetrievalMethod, ServerConfig
from retrieval_server.jsonl import read_jsonl


def load_qa(path: Path) -> list[dict]:
    return read_jsonl(path)


def recall_at_k(index_dir: Path, qa_path: Path, ks: list[int], method: RetrievalMethod = "dense") -> dict:
    """``{"questions": n, "recall": {k: mean fraction of gold found}, "hit": {k: fraction with >= 1 gold found}}``."""
    from retrieval_server.search import Retriever

    questions = [q for q in load_qa(qa_path) if q.get("gold_passage_ids")]
    if not questions:
        raise ValueError(f"{qa_path}: no question has gold_passage_ids")
    depth = max(ks)
    retriever = Retriever(ServerConfig(index_dir=index_dir, method=method, max_topk=max(depth, 100), default_topk=1))
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
    return {"questions": n, "recall": {k: v / n for k, v in recall.items()}, "hit": {k: v / n for k, v in hit.items()}}


def neighbour_recall(exact: np.ndarray, approx: np.ndarray, k: int, exclude: np.ndarray | None = None) -> float:
    """Mean fraction of each query's exact top-k rows that an approximate search also ranks in its top-k.

    ``exact``/``approx`` are ``(n_queries, depth)`` row arrays (-1 = no hit). ``exclude[i]`` (e.g. the
    passage a query vector was taken from) is dropped from both rankings before cutting at k.
    """
    total = 0.0
    for i in range(len(exact)):
        drop = {-1} if exclude is None else {-1, int(exclude[i])}
        truth = [int(r) for r in exact[i] if int(r) not in drop][:k]
        found = [int(r) for r in approx[i] if int(r) not in drop][:k]
        total += len(set(truth) & set(found)) / max(len(truth), 1)
    return total / max(len(exact), 1)
