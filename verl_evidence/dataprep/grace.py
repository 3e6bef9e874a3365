"""GRACE training-data construction: sufficient and insufficient contexts.

For every labelled sample and every retriever: retrieve top-k; split the
samples 50/50 into sufficient / insufficient with a generator seeded per
retriever; sufficient contexts get every gold passage (replacing the
lowest-ranked non-gold passages, order and k kept); insufficient contexts lose
every gold passage and are refilled with distractors (k kept); the retrievers'
outputs are merged and duplicate (question, context) pairs dropped.

The spec says "if no gold passage was retrieved, replace the lowest-ranked
passages with the gold ones". For multi-hop samples (two gold passages) a
context is only sufficient with all of them, so every missing gold passage is
forced in; for one-gold samples this is exactly the spec's rule.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from verl_evidence.dataprep.records import (
    DataPrepError,
    QARecord,
    check_data_source,
    check_unique_ids,
    read_json,
    read_jsonl,
)
from verl_evidence.dataprep.retrievers import Query, Retriever, stable_seed

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraceInput:
    record: QARecord
    candidates: tuple[str, ...] | None = None  # restrict retrieval and filling to these ids (QASPER)


@dataclass(frozen=True)
class GraceExample:
    record: QARecord
    retriever: str
    passage_ids: tuple[str, ...]
    answerable: bool


@dataclass
class GraceStats:
    answerable: Counter = field(default_factory=Counter)  # kept, per retriever
    unanswerable: Counter = field(default_factory=Counter)
    duplicates: Counter = field(default_factory=Counter)
    samples: int = 0

    @property
    def total(self) -> int:
        return sum(self.answerable.values()) + sum(self.unanswerable.values())


def make_sufficient(ranked: Sequence[str], gold_ids: Sequence[str], k: int) -> list[str]:
    """Every gold passage present, k passages, the surviving retrieved passages in their order.

    Missing gold passages take the lowest ranks, replacing the lowest-ranked non-gold passages.
    """
    if len(set(gold_ids)) > k:
        raise DataPrepError(f"k={k} is smaller than the number of gold passages ({len(set(gold_ids))})")
    if len(ranked) != k:
        raise DataPrepError(f"make_sufficient needs exactly k={k} ranked passages, got {len(ranked)}")
    gold = set(gold_ids)
    missing = [g for g in dict.fromkeys(gold_ids) if g not in ranked]
    if not missing:
        return list(ranked)
    to_drop = len(missing)
    kept = list(ranked)
    for position in range(len(kept) - 1, -1, -1):
        if to_drop == 0:
            break
        if kept[position] not in gold:
            del kept[position]
            to_drop -= 1
    return kept + missing


def make_insufficient(ranked: Sequence[str], gold_ids: Sequence[str], fillers: Iterable[str], k: int) -> list[str]:
    """No gold passage, k passages: retrieved non-gold passages in order, then fillers."""
    gold = set(gold_ids)
    context = [p for p in ranked if p not in gold]
    seen = set(context)
    for filler in fillers:
        if len(context) >= k:
            break
        if filler in gold or filler in seen:
            continue
        context.append(filler)
        seen.add(filler)
    if len(context) < k:
        raise DataPrepError(f"not enough non-gold passages to fill an insufficient context to k={k}")
    return context[:k]


def split_sufficient(count: int, seed: int, retriever: str) -> set[int]:
    """Indices (of ``count`` samples) that get a sufficient context: half, seeded per retriever."""
    order = list(range(count))
    random.Random(stable_seed(seed, "grace-split", retriever)).shuffle(order)
    return set(order[: (count + 1) // 2])


def _filler_stream(item: GraceInput, all_ids: Sequence[str], seed: int, retriever: str) -> Iterator[str]:
    """Distractors for an insufficient context: the sample's own first, then its pool in seeded random order."""
    yield from item.record.distractor_ids
    pool = list(item.candidates) if item.candidates is not None else list(all_ids)
    random.Random(stable_seed(seed, "grace-fill", retriever, item.record.id)).shuffle(pool)
    yield from pool


def construct(
    items: Sequence[GraceInput],
    retrievers: Sequence[Retriever],
    corpus: dict[str, str],
    k: int,
    seed: int = 0,
    progress: Callable[[str, int], None] | None = None,
) -> tuple[list[GraceExample], GraceStats]:
    """Build the merged, deduplicated GRACE examples and per-retriever statistics."""
    if k <= 0:
        raise DataPrepError("k must be positive")
    names = [r.name for r in retrievers]
    if len(set(names)) != len(names):
        raise DataPrepError(f"retriever names must be unique, got {names}")
    for item in items:
        if not item.record.gold_passage_ids:
            raise DataPrepError(f"sample {item.record.id!r} has no gold passages: GRACE needs them")
        if len(set(item.record.gold_passage_ids)) > k:
            raise DataPrepError(f"sample {item.record.id!r} has more gold passages than k={k}")
    all_ids = list(corpus)
    stats = GraceStats(samples=len(items))
    examples: list[GraceExample] = []
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for retriever in retrievers:
        queries = [
            Query(
                id=item.record.id,
                question=item.record.question,
                gold_ids=item.record.gold_passage_ids,
                distractor_ids=item.record.distractor_ids,
                candidates=item.candidates,
            )
            for item in items
        ]
        ranked_lists = retriever.retrieve(queries, k)
        sufficient = split_sufficient(len(items), seed, retriever.name)
        for index, (item, ranked) in enumerate(zip(items, ranked_lists, strict=True)):
            ranked = list(dict.fromkeys(ranked))[:k]
            fillers = _filler_stream(item, all_ids, seed, retriever.name)
            if index in sufficient:
                # A short retrieval (tiny pool) is padded with non-gold passages before the gold are forced in.
                padded = make_insufficient(ranked, (), fillers, k) if len(ranked) < k else ranked
                context = make_sufficient(padded, item.record.gold_passage_ids, k)
            else:
                context = make_insufficient(ranked, item.record.gold_passage_ids, fillers, k)
            if progress:
                progress(retriever.name, 1)
            key = (item.record.question, tuple(corpus[p] for p in context))
            if key in seen:
                stats.duplicates[retriever.name] += 1
                continue
            seen.add(key)
            answerable = index in sufficient
            (stats.answerable if answerable else stats.unanswerable)[retriever.name] += 1
            examples.append(GraceExample(item.record, retriever.name, tuple(context), answerable))
    return examples, stats


# ---------------------------------------------------------------- input styles


def _load_json_or_jsonl(path: str | Path) -> list[dict] | dict:
    return read_jsonl(path) if Path(path).suffix == ".jsonl" else read_json(path)


def read_hotpotqa(
    path: str | Path, data_source: str = "hotpotqa", allow_new_source: bool = False, per_question_pool: bool = False
) -> tuple[list[GraceInput], dict[str, str]]:
    """HotpotQA (original JSON list, or HF-style JSONL) -> GRACE inputs and a paragraph corpus.

    Gold passages are the supporting-fact paragraphs, gold evidence their supporting
    sentences, distractors the question's other paragraphs.
    """
    check_data_source(data_source, allow_new_source)
    rows = _load_json_or_jsonl(path)
    if not isinstance(rows, list):
        raise DataPrepError(f"{path}: expected a list of HotpotQA questions")
    corpus: dict[str, str] = {}
    items: list[GraceInput] = []
    for number, row in enumerate(rows, start=1):
        where = f"{path}:{number}"
        for column in ("question", "answer", "supporting_facts", "context"):
            if column not in row:
                raise DataPrepError(f"{where}: missing column {column}")
        qid = str(row.get("_id", row.get("id", "")))
        if not qid:
            raise DataPrepError(f"{where}: missing column _id/id")
        context = row["context"]
        if isinstance(context, dict):  # HF layout: {"title": [...], "sentences": [[...]]}
            context = list(zip(context["title"], context["sentences"], strict=True))
        facts = row["supporting_facts"]
        if isinstance(facts, dict):
            facts = list(zip(facts["title"], facts["sent_id"], strict=True))
        paragraph_ids: dict[str, str] = {}
        sentences_by_title: dict[str, list[str]] = {}
        for title, sentences in context:
            text = "".join(sentences).strip()
            contents = f"{title}\n{text}"
            passage_id = title
            suffix = 1
            while passage_id in corpus and corpus[passage_id] != contents:
                suffix += 1
                passage_id = f"{title}#{suffix}"
            corpus[passage_id] = contents
            paragraph_ids[title] = passage_id
            sentences_by_title[title] = [s.strip() for s in sentences]
        gold_titles = list(dict.fromkeys(title for title, _ in facts))
        missing = [t for t in gold_titles if t not in paragraph_ids]
        if missing:
            raise DataPrepError(f"{where}: supporting fact title(s) {missing} not in the context")
        evidence = [
            sentences_by_title[title][sent_id]
            for title, sent_id in facts
            if 0 <= sent_id < len(sentences_by_title[title])
        ]
        answer = str(row["answer"]).strip()
        if not answer:
            raise DataPrepError(f"{where}: empty answer for id {qid!r}")
        gold_ids = tuple(paragraph_ids[t] for t in gold_titles)
        distractors = tuple(pid for title, pid in paragraph_ids.items() if title not in gold_titles)
        record = QARecord(
            qid, str(row["question"]).strip(), (answer,), data_source, gold_ids, tuple(evidence), distractors
        )
        candidates = tuple(paragraph_ids.values()) if per_question_pool else None
        items.append(GraceInput(record, candidates))
    check_unique_ids([item.record for item in items], str(path))
    return items, corpus


def _qasper_answer(answer: dict) -> tuple[str, list[str], list[str]] | None:
    """(answer text, evidence paragraphs, highlighted evidence) of an answerable annotation."""
    if answer.get("unanswerable"):
        return None
    text = (answer.get("free_form_answer") or "").strip()
    if not text and answer.get("extractive_spans"):
        text = ", ".join(s.strip() for s in answer["extractive_spans"] if s.strip())
    if not text and answer.get("yes_no") is not None:
        text = "yes" if answer["yes_no"] else "no"
    if not text:
        return None
    return text, list(answer.get("evidence") or []), list(answer.get("highlighted_evidence") or [])


def read_qasper(
    path: str | Path, data_source: str = "qasper", allow_new_source: bool = False
) -> tuple[list[GraceInput], dict[str, str], int]:
    """QASPER (original ``{paper_id: paper}`` JSON, or HF-style rows) -> inputs, corpus, skipped count.

    Each question's pool is its own paper's paragraphs; gold passages are the
    paragraphs cited as evidence, gold evidence the highlighted sentences.
    Unanswerable or evidence-less questions are skipped (and counted).
    """
    check_data_source(data_source, allow_new_source)
    raw = _load_json_or_jsonl(path)
    papers = list(raw.items()) if isinstance(raw, dict) else [(str(row.get("id", "")), row) for row in raw]
    corpus: dict[str, str] = {}
    items: list[GraceInput] = []
    skipped = 0
    for paper_id, paper in papers:
        if not paper_id or "full_text" not in paper or "qas" not in paper:
            raise DataPrepError(f"{path}: paper {paper_id!r} lacks id, full_text or qas")
        full_text = paper["full_text"]
        if isinstance(full_text, dict):  # HF layout
            full_text = [
                {"section_name": s, "paragraphs": p}
                for s, p in zip(full_text["section_name"], full_text["paragraphs"], strict=True)
            ]
        paragraph_id_by_text: dict[str, str] = {}
        for section in full_text:
            for paragraph in section.get("paragraphs") or []:
                paragraph = paragraph.strip()
                if not paragraph or paragraph in paragraph_id_by_text:
                    continue
                passage_id = f"{paper_id}:p{len(paragraph_id_by_text)}"
                paragraph_id_by_text[paragraph] = passage_id
                corpus[passage_id] = f"{paper.get('title', paper_id)}: {section.get('section_name') or ''}\n{paragraph}"
        pool = tuple(paragraph_id_by_text.values())
        qas = paper["qas"]
        if isinstance(qas, dict):  # HF layout
            qas = [
                {"question": q, "question_id": i, "answers": [{"answer": a} for a in ans["answer"]]}
                for q, i, ans in zip(qas["question"], qas["question_id"], qas["answers"], strict=True)
            ]
        for qa in qas:
            parsed = next(
                (p for p in (_qasper_answer(a.get("answer", a)) for a in qa.get("answers", [])) if p and p[1]), None
            )
            gold_ids = tuple(
                dict.fromkeys(
                    paragraph_id_by_text[e.strip()]
                    for e in (parsed[1] if parsed else [])
                    if e.strip() in paragraph_id_by_text
                )
            )
            if parsed is None or not gold_ids:
                skipped += 1
                continue
            text, _, highlighted = parsed
            evidence = tuple(highlighted) if highlighted else tuple(parsed[1])
            distractors = tuple(p for p in pool if p not in gold_ids)
            record = QARecord(
                str(qa["question_id"]),
                str(qa["question"]).strip(),
                (text,),
                data_source,
                gold_ids,
                evidence,
                distractors,
            )
            items.append(GraceInput(record, pool))
    check_unique_ids([item.record for item in items], str(path))
    return items, corpus, skipped
