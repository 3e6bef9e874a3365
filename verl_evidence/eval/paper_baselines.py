"""EviOmni's Zero, CoT and Full baselines (Table 2's rows; prompts of Tables 12-13): ``eval --baseline``.

No policy takes part: the QA generator (``--reader``, the model the papers' readers use) answers each EviOmni row

- ``zero``: from the question alone (``eviomni_closed_book``, Table 12);
- ``full``: from the question and all of the row's retrieved passages (``eviomni_reader``);
- ``cot``:  from the question and the passages, reasoning step by step first (``eviomni_cot``, Table 13).

The passages are the rows' own (``extra_info.passages``: what ``data eviomni`` and the eval harness put in the
policy's prompt), so a baseline reads exactly what the policy read. Each answer becomes an
:class:`~verl_evidence.eval.records.EvalRecord` of the ``eviomni`` family, scored and tabled like a policy's.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Sequence
from typing import Any

from verl_evidence.eval.records import EvalRecord
from verl_evidence.prompts import load_prompt, placeholders, render_prompt

__all__ = ["BASELINES", "baseline_records", "parse_baseline_answer"]

BASELINES = {"zero": "eviomni_closed_book", "full": "eviomni_reader", "cot": "eviomni_cot"}
LABELS = {"zero": "Zero", "full": "Full", "cot": "CoT"}
# greedy, as the reader; CoT writes its reasoning before the answer, so it gets room for it
SAMPLING = {"zero": {"temperature": 0.0, "max_tokens": 64}, "full": {"temperature": 0.0, "max_tokens": 64}}
SAMPLING["cot"] = {"temperature": 0.0, "max_tokens": 512}

_ANSWER_MARK = re.compile(r"(?:final answer|the answer|answer)\s*(?:is|:)\s*", re.IGNORECASE)


def parse_baseline_answer(text: str, kind: str) -> str:
    """The short answer of a reply: an ``<answer>`` block; for CoT, what follows the last "answer is/:" (else the
    last line, where a step-by-step reply ends); for Zero/Full, the first line (the reader's rule)."""
    from verl_evidence.eval.paper_scoring import parse_reader_answer
    from verl_evidence.text.tags import extract_last, strip_thinking

    final = strip_thinking(text or "")
    if kind != "cot" or extract_last(final, "answer") is not None:
        return parse_reader_answer(final)
    marks = list(_ANSWER_MARK.finditer(final))
    if marks:
        tail = final[marks[-1].end() :].strip().splitlines()
        return tail[0].strip().rstrip(".").strip() if tail else ""
    lines = [line.strip() for line in final.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _passages(row: dict[str, Any]) -> list[str]:
    passages = (row.get("extra_info") or {}).get("passages") or []
    return [p["contents"] if isinstance(p, dict) else str(p) for p in passages]


def baseline_prompt(kind: str, prompt: str | None = None) -> str:
    """The baseline's template (``prompt``: another file in its place); one that cannot be filled fails here."""
    if kind not in BASELINES:
        raise ValueError(f"--baseline must be one of {', '.join(BASELINES)}, got {kind!r}")
    template = load_prompt(prompt or BASELINES[kind]).strip()
    fields = placeholders(template)
    if "question" not in fields or fields - {"question", "document"}:
        raise ValueError(f"--baseline {kind}: the prompt needs {{question}} (and may take {{document}}), has {fields}")
    if kind != "zero" and "document" not in fields:
        raise ValueError(f"--baseline {kind} reads the retrieved passages: its prompt needs {{document}}")
    return template


async def baseline_records(
    rows: Sequence[dict[str, Any]],
    kind: str,
    model: Any,
    identity: str,
    prompt: str | None = None,
    concurrency: int = 4,
) -> list[EvalRecord]:
    """One record per EviOmni row: ``model`` (``chat(messages, sampling) -> str``) answering with the baseline's
    prompt. A row without passages (for CoT/Full) or a failed request is a record with ``error``, never a raise."""
    from verl_evidence.dataprep.templates import format_passages
    from verl_evidence.eval.runner import EvalExample, base_record, rollout_kind

    template = baseline_prompt(kind, prompt)
    digest = hashlib.sha256(template.encode()).hexdigest()[:8]
    policy = f"baseline:{kind}|{identity}|prompt:{digest}"
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(index: int, row: dict[str, Any]) -> EvalRecord:
        example = EvalExample(f"eviomni:{(row.get('extra_info') or {}).get('id', index)}", row)
        record = base_record(policy, example)
        passages = _passages(row)
        if "document" in placeholders(template) and not passages:
            record.error = "no passages in the row (write EviOmni rows with `data eviomni`)"
            return record
        text = render_prompt(template, question=record.question, document=format_passages(passages))
        async with gate:
            try:
                reply = await model.chat([{"role": "user", "content": text}], SAMPLING[kind])
            except Exception as err:  # one failed request costs its example, named in the report
                record.error = f"{type(err).__name__}: {err}"
                return record
        record.response = reply
        record.prediction = parse_baseline_answer(reply, kind)
        return record

    eviomni = [row for row in rows if rollout_kind(row) == "eviomni"]
    if not eviomni:
        raise ValueError(f"--baseline {kind} answers EviOmni rows; none among these rows (check --data / --rollouts)")
    return list(await asyncio.gather(*(one(i, row) for i, row in enumerate(eviomni))))


def baseline_rows(
    data: Sequence[Any] | None,
    retrieval_url: str | None,
    qa_path: Any = None,
    corpus_path: Any = None,
    limit: int | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """The EviOmni rows a baseline answers, and a note saying where their passages come from: ``--data`` rows as
    they are; else the QA set's questions with their top 5 passages from ``--retrieval-url`` (the eval harness's
    dense server), or, without one, from BM25 over the QA set's corpus (no server to start)."""
    from verl_evidence.dataprep import rows as rows_mod
    from verl_evidence.dataprep.retrievers import Query, ServerRetriever, build_retriever
    from verl_evidence.dataprep.templates import load_template
    from verl_evidence.eval.datasets import SPLIT, bundled_qa_records, load_rows

    if data:
        rows = [row for path in data for row in load_rows(path)]
        return (rows[:limit] if limit else rows), "Passages: the rows' own (--data)."
    records, corpus = bundled_qa_records(qa_path, corpus_path)
    records = records[:limit] if limit else records
    questions = [r.question for r in records]
    if retrieval_url:
        passages = ServerRetriever(retrieval_url, name="dense").passages(questions, k=5)
        note = f"Passages: each question's top 5 from the retrieval server {retrieval_url}."
    else:
        ranked = build_retriever("bm25", corpus).retrieve([Query(r.id, r.question) for r in records], 5)
        passages = [[{"id": i, "contents": corpus[i]} for i in ids] for ids in ranked]
        note = "Passages: each question's top 5 by BM25 over the corpus (give --retrieval-url for the dense server's)."
    rows = rows_mod.eviomni_rows(records, passages, load_template("eviomni"), SPLIT, lambda text: len(text.split()))
    return rows, note


def run_baseline(
    kind: str,
    reader: str | None,
    reader_model: str | None,
    reader_prompt: Any,
    rows: Sequence[dict[str, Any]],
    concurrency: int,
) -> tuple[list[EvalRecord], str]:
    """``eval --baseline``'s records and the row label (e.g. ``Full (hf:/models/reader)``)."""
    from verl_evidence.eval.paper_scoring import PaperScoringError, chat_model, reader_model_dir

    if not reader:
        raise PaperScoringError(f"--baseline {kind} is answered by the QA generator: give --reader (HF dir or URL)")
    baseline_prompt(kind, str(reader_prompt) if reader_prompt else None)  # a bad prompt ends before any load
    target = reader if reader.startswith(("http://", "https://")) else str(reader_model_dir(reader))
    model, identity = chat_model(target, reader_model, "--reader")
    records = asyncio.run(
        baseline_records(rows, kind, model, identity, str(reader_prompt) if reader_prompt else None, concurrency)
    )
    return records, f"{LABELS[kind]} ({identity.split('|')[0]})"
