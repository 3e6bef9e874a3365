"""What the evaluation rolls out: verl rows from files, or built from the bundled QA set.

Rows are exactly the verl parquet rows ``verl-evidence data ...`` writes (and
the trainer reads), so a policy is evaluated on the prompts it was trained
with. For the bundled set the rows are built here with the same data-prep
functions:

- ``search``  — EviNote/Search-R1 rows (question only; the loop searches);
- ``eviomni`` — the top passages of the live retrieval server in the prompt;
- ``grace``   — GRACE's constructed contexts (oracle, BM25 and the live dense
  server as retrievers, split 50/50 into sufficient/insufficient).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from verl_evidence.eval.runner import EvalExample, rollout_kind

logger = logging.getLogger(__name__)

__all__ = ["ROLLOUTS", "bundled_qa_records", "bundled_rows", "examples_from_rows", "load_rows"]

ROLLOUTS = ("search", "eviomni", "grace")
SPLIT = "test"


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """verl rows from a parquet file (``verl-evidence data`` output) or a JSONL file of rows.

    A file that is not rows is a :class:`DataPrepError` (a ``ValueError``): the CLI reports it in one line.
    """
    from verl_evidence.dataprep.records import DataPrepError, read_jsonl

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"evaluation data {path} does not exist")
    if path.suffix == ".parquet":
        from verl_evidence.dataprep.rows import read_parquet

        rows = read_parquet(path)
    else:
        rows = read_jsonl(path)
    for i, row in enumerate(rows):
        missing = [k for k in ("prompt", "reward_model", "data_source") if k not in row]
        if missing:
            raise DataPrepError(
                f"{path}: row {i} lacks the verl column(s) {missing}; write rows with `verl-evidence data`"
            )
    return rows


def examples_from_rows(rows: Iterable[dict[str, Any]]) -> list[EvalExample]:
    """One example per row, ids ``<rollout>/<extra_info.id>[@<retriever>]`` (numbered when one still repeats)."""
    examples = []
    seen: Counter[str] = Counter()
    for index, row in enumerate(rows):
        extra = row.get("extra_info") or {}
        base = f"{rollout_kind(row)}/{extra.get('id', index)}"
        if extra.get("retriever"):  # GRACE: one context per retriever for the same question
            base += f"@{extra['retriever']}"
        seen[base] += 1
        example_id = base if seen[base] == 1 else f"{base}#{seen[base]}"
        examples.append(EvalExample(example_id=example_id, row=row))
    return examples


@functools.lru_cache(maxsize=8)
def bundled_qa_records(qa_path: str | Path | None = None, corpus_path: str | Path | None = None):
    """A QA set (default: the bundled one) as data-prep ``QARecord`` s, checked against its corpus."""
    from verl_evidence.dataprep.records import (
        bundled_paths,
        check_references,
        read_corpus,
        read_flashrag_jsonl,
        read_jsonl,
    )

    source = "bundled" if qa_path is None else Path(qa_path).stem
    if qa_path is None or corpus_path is None:
        default_qa, default_corpus = bundled_paths()
        qa_path = qa_path or default_qa
        corpus_path = corpus_path or default_corpus
    records = read_flashrag_jsonl(qa_path, data_source=source, allow_new_source=True)
    # One data source per hop count, so the metrics compare one- and two-hop questions.
    hops = {str(row["id"]): row["hops"] for row in read_jsonl(qa_path) if isinstance(row.get("hops"), int)}
    records = [dataclasses.replace(r, data_source=f"{source}_{hops[r.id]}hop") if r.id in hops else r for r in records]
    corpus = read_corpus(corpus_path)
    check_references(records, corpus, str(qa_path))
    return records, corpus


def bundled_rows(
    rollouts: Sequence[str],
    retrieval_url: str,
    tokenizer: Any,
    limit: int | None = None,
    question_ids: Sequence[str] | None = None,
    seed: int = 0,
    qa_path: str | Path | None = None,
    corpus_path: str | Path | None = None,
) -> list[dict[str, Any]]:
    """verl rows for each requested rollout over the bundled questions (``question_ids`` narrows them).

    ``qa_path`` / ``corpus_path`` replace the bundled QA set / corpus (FlashRAG
    JSONL with ``gold_passage_ids``/``gold_evidence``/``distractor_ids`` for GRACE);
    the retrieval server must serve that corpus.
    """
    from verl_evidence.dataprep import grace as grace_mod
    from verl_evidence.dataprep import rows as rows_mod
    from verl_evidence.dataprep.retrievers import ServerRetriever, build_retriever
    from verl_evidence.dataprep.templates import load_template

    unknown = sorted(set(rollouts) - set(ROLLOUTS))
    if unknown:
        raise ValueError(f"unknown rollout(s) {unknown}; use {', '.join(ROLLOUTS)}")
    records, corpus = bundled_qa_records(qa_path, corpus_path)
    if question_ids is not None:
        wanted = set(question_ids)
        records = [r for r in records if r.id in wanted]
    if limit:
        records = records[:limit]
    rows: list[dict[str, Any]] = []
    if "search" in rollouts:
        rows += rows_mod.search_rows(records, "evinote", load_template("evinote"), SPLIT)
    if "eviomni" in rollouts:
        passages = ServerRetriever(retrieval_url, name="dense").passages([r.question for r in records], k=5)
        rows += rows_mod.eviomni_rows(
            records,
            passages,
            load_template("eviomni"),
            SPLIT,
            lambda text: len(tokenizer.encode(text, add_special_tokens=False)),
        )
    if "grace" in rollouts:
        retrievers = [
            build_retriever("oracle", corpus, seed=seed),
            build_retriever("bm25", corpus, seed=seed),
            ServerRetriever(retrieval_url, name="dense"),
        ]
        items = [grace_mod.GraceInput(record=r) for r in records]
        examples, stats = grace_mod.construct(items, retrievers, corpus, k=3, seed=seed)
        logger.info(
            "GRACE contexts: %d answerable, %d unanswerable",
            sum(stats.answerable.values()),
            sum(stats.unanswerable.values()),
        )
        rows += rows_mod.grace_rows(examples, corpus, load_template("grace"), SPLIT)
    return rows
