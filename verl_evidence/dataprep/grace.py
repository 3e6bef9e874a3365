"""GRACE data construction: the balanced training set (§3.1) and the natural test set (§4.3).

Balanced (training): for every labelled sample and every retriever, retrieve
top-k; split the samples 50/50 into sufficient / insufficient with a generator
seeded per retriever; sufficient contexts get every gold passage (replacing the
lowest-ranked non-gold passages, order and k kept); insufficient contexts lose
every gold passage and are refilled with distractors (k kept); the retrievers'
outputs are merged and duplicate (question, context) pairs dropped.

Natural (test, Table 1): the retrieved top-k as it is; a question is answerable
exactly when its gold passages were retrieved, so the split is whatever the
retriever makes it (HotpotQA with Qwen3-Embedding-0.6B at k = 3: 296:204).

The spec says "if no gold passage was retrieved, replace the lowest-ranked
passages with the gold ones". For multi-hop samples (two gold passages) a
context is only sufficient with all of them, so every missing gold passage is
forced in; for one-gold samples this is exactly the spec's rule.

Questions with answers only (Search-R1/FlashRAG files, no gold passage ids) are
labelled by what each retriever returns: a passage whose text holds a gold
answer is gold (DPR's rule), its answer-bearing sentences the gold evidence,
and the retrieved passages without an answer are the distractors.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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
from verl_evidence.rewards.qa_metrics import normalize

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraceInput:
    record: QARecord
    candidates: tuple[str, ...] | None = None  # restrict retrieval and filling to these ids (QASPER)
    # The record's gold evidence lists the supporting sentences of one evidence (HotpotQA's supporting facts, the
    # bundled set's), which the reward joins into one reference; False: alternative references (QASPER's pieces).
    evidence_sentences: bool = True


@dataclass(frozen=True)
class GraceExample:
    record: QARecord
    retriever: str
    passage_ids: tuple[str, ...]
    answerable: bool
    # The gold evidence an answerable context holds: None for the record's own (annotated samples); ignored
    # when unanswerable.
    evidence: tuple[str, ...] | None = None
    # gold_evidence is one evidence's supporting sentences (see GraceInput), not alternatives
    evidence_sentences: bool = False

    @property
    def gold_evidence(self) -> tuple[str, ...]:
        if not self.answerable:
            return ()
        return self.record.gold_evidence if self.evidence is None else self.evidence


@dataclass
class GraceStats:
    answerable: Counter = field(default_factory=Counter)  # kept, per retriever
    unanswerable: Counter = field(default_factory=Counter)
    duplicates: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)  # answer-labelled samples that could not be built
    samples: int = 0

    @property
    def total(self) -> int:
        return sum(self.answerable.values()) + sum(self.unanswerable.values())

    def as_dict(self, retrievers: Sequence[str]) -> dict:
        """Per-retriever and total counts, as written to the summary beside the output."""
        kinds = ("answerable", "unanswerable", "duplicates", "skipped")
        per = {name: {kind: getattr(self, kind)[name] for kind in kinds} for name in retrievers}
        return {
            "samples": self.samples,
            "examples": self.total,
            "retrievers": per,
            "total": {kind: sum(getattr(self, kind).values()) for kind in kinds},
        }


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


# Answer-labelled samples (no gold passage ids: Search-R1/FlashRAG files) are labelled by the passages a
# retriever returns: a passage holding a gold answer is their gold passage (DPR's "has answer" rule).
DEFAULT_SEARCH_DEPTH = 20


def _tokens(text: str) -> list[str]:
    return normalize(text).split()


def _holds(tokens: Sequence[str], answers: Sequence[Sequence[str]]) -> bool:
    return any(
        answer and any(tokens[i : i + len(answer)] == answer for i in range(len(tokens) - len(answer) + 1))
        for answer in answers
    )


def passage_body(contents: str) -> str:
    """A FlashRAG passage's text without its first line (the title), or all of it when it has one line."""
    title, newline, body = contents.partition("\n")
    return body if newline else title


def contains_answer(contents: str, answers: Sequence[str]) -> bool:
    """A gold answer's normalised tokens appear, in order and contiguous, in the passage's text (not its title)."""
    return _holds(_tokens(passage_body(contents)), [_tokens(a) for a in answers])


def answer_sentences(contents: str, answers: Sequence[str]) -> list[str]:
    """The sentences of a passage that hold a gold answer: the gold evidence of an answer-labelled sample.

    The whole text when no single sentence does (an answer cut by the sentence splitter).
    """
    from nltk.tokenize.punkt import PunktSentenceTokenizer  # untrained: needs no downloaded model

    body = passage_body(contents).strip()
    wanted = [_tokens(a) for a in answers]
    found = [s for s in PunktSentenceTokenizer().tokenize(body) if _holds(_tokens(s), wanted)]
    return found or [body]


@dataclass(frozen=True)
class _Labelled:
    """One sample's retrieval with its gold passages: annotated ones, or (answer-labelled) those found."""

    top: list[str]  # the retrieved top-k
    deeper: list[str]  # the whole retrieval, best first (top-k and beyond, for answer-labelled samples)
    gold: tuple[str, ...]
    annotated: bool


def _label(item: GraceInput, ranked: Sequence[str], corpus: Mapping[str, str], k: int, by_answer: bool) -> _Labelled:
    deeper = list(dict.fromkeys(ranked))
    if not by_answer:
        return _Labelled(deeper[:k], deeper, item.record.gold_passage_ids, True)
    gold = tuple(p for p in deeper if contains_answer(corpus[p], item.record.answers))
    return _Labelled(deeper[:k], deeper, gold, False)


def _evidence(
    item: GraceInput, labelled: _Labelled, context: Sequence[str], corpus: Mapping[str, str]
) -> tuple[str, ...] | None:
    if labelled.annotated:
        return None  # the record's own
    gold = set(labelled.gold)
    return tuple(s for p in context if p in gold for s in answer_sentences(corpus[p], item.record.answers))


def _natural(labelled: _Labelled) -> tuple[list[str], bool]:
    """The top-k as retrieved; answerable iff every gold passage is in it (answer-labelled: any)."""
    if labelled.annotated:
        return labelled.top, set(labelled.gold) <= set(labelled.top)
    return labelled.top, bool(set(labelled.gold) & set(labelled.top))


def _balanced(
    item: GraceInput, labelled: _Labelled, sufficient: bool, fillers: Iterable[str], k: int
) -> list[str] | None:
    """A forced sufficient / insufficient context of k passages; None for an answer-labelled sample that
    cannot have one (no answer-bearing passage retrieved, or too few without one)."""
    ranked = labelled.top
    if labelled.annotated:
        if not sufficient:
            return make_insufficient(ranked, labelled.gold, fillers, k)
        # A short retrieval (tiny pool) is padded with non-gold passages before the gold are forced in.
        padded = make_insufficient(ranked, (), fillers, k) if len(ranked) < k else ranked
        return make_sufficient(padded, labelled.gold, k)
    gold = set(labelled.gold)
    others = [p for p in labelled.deeper if p not in gold]  # retrieved passages without an answer, best first
    try:
        if not sufficient:
            return make_insufficient(ranked, labelled.gold, others, k)
        if not labelled.gold:
            return None
        # The best-ranked answer-bearing passage: already in the top-k when any is, else forced in.
        padded = make_insufficient(ranked, (), others, k) if len(ranked) < k else ranked
        return make_sufficient(padded, labelled.gold[:1], k)
    except DataPrepError:
        return None


def construct(
    items: Sequence[GraceInput],
    retrievers: Sequence[Retriever],
    corpus: Mapping[str, str],
    k: int,
    seed: int = 0,
    progress: Callable[[str, int], None] | None = None,
    natural: bool = False,
    by_answer: bool = False,
    search_depth: int = DEFAULT_SEARCH_DEPTH,
) -> tuple[list[GraceExample], GraceStats]:
    """Build the merged, deduplicated GRACE examples and per-retriever statistics.

    ``natural``: the paper's test set (the top-k as retrieved), else its balanced training set.
    Samples need gold passage ids, unless ``by_answer``: then (answers only: Search-R1/FlashRAG files)
    each retriever's passages within ``search_depth`` that hold a gold answer are the gold passages.
    ``corpus`` must hold every passage a retriever returns once it has returned it (a retrieval
    server's retriever adds what it fetches).
    """
    if k <= 0:
        raise DataPrepError("k must be positive")
    names = [r.name for r in retrievers]
    if len(set(names)) != len(names):
        raise DataPrepError(f"retriever names must be unique, got {names}")
    for item in items:
        if by_answer:
            continue
        if not item.record.gold_passage_ids:
            raise DataPrepError(
                f"sample {item.record.id!r} has no gold passages: GRACE needs them (questions with answers only: "
                "--style qa labels the retrieved passages that hold an answer)"
            )
        if len(set(item.record.gold_passage_ids)) > k and not natural:  # natural: simply never answerable
            raise DataPrepError(f"sample {item.record.id!r} has more gold passages than k={k}")
    if by_answer and any(r.name == "oracle" for r in retrievers):
        raise DataPrepError("retriever 'oracle' needs annotated gold passages, which questions with answers only lack")
    depth = max(k, search_depth) if by_answer else k
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
        ranked_lists = retriever.retrieve(queries, depth)
        sufficient = split_sufficient(len(items), seed, retriever.name)
        all_ids = list(corpus)
        for index, (item, ranked) in enumerate(zip(items, ranked_lists, strict=True)):
            if progress:
                progress(retriever.name, 1)
            labelled = _label(item, ranked, corpus, k, by_answer)
            if natural:
                context, answerable = _natural(labelled)
            else:
                answerable = index in sufficient
                fillers = _filler_stream(item, all_ids, seed, retriever.name)
                context = _balanced(item, labelled, answerable, fillers, k)
            if not context:
                stats.skipped[retriever.name] += 1
                continue
            key = (item.record.question, tuple(corpus[p] for p in context))
            if key in seen:
                stats.duplicates[retriever.name] += 1
                continue
            seen.add(key)
            (stats.answerable if answerable else stats.unanswerable)[retriever.name] += 1
            evidence = _evidence(item, labelled, context, corpus) if answerable else None
            sentences = labelled.annotated and item.evidence_sentences  # answer-labelled: alternative sentences
            examples.append(GraceExample(item.record, retriever.name, tuple(context), answerable, evidence, sentences))
    return examples, stats


# ---------------------------------------------------------------- input styles


def _load_json_or_jsonl(path: str | Path) -> list[dict] | dict:
    return read_jsonl(path) if Path(path).suffix == ".jsonl" else read_json(path)


def read_hotpotqa(
    path: str | Path, data_source: str = "hotpotqa", allow_new_source: bool = False, per_question_pool: bool = True
) -> tuple[list[GraceInput], dict[str, str]]:
    """HotpotQA (original JSON list, or HF-style JSONL) -> GRACE inputs and a paragraph corpus.

    Gold passages are the supporting-fact paragraphs, gold evidence their supporting
    sentences in the order of ``supporting_facts``, distractors the question's other paragraphs.
    ``per_question_pool`` (the default, as the authors' released code indexes each question's own
    paragraphs): a question retrieves, and is filled, only among its own paragraphs; False: among
    every paragraph of the file.
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
            # QASPER's evidence pieces are alternatives: the released code takes the best of them
            items.append(GraceInput(record, pool, evidence_sentences=False))
    check_unique_ids([item.record for item in items], str(path))
    return items, corpus, skipped


# ---------------------------------------------------------------- the SFT baseline's data (Appendix B.3)

# B.3: the SFT baseline learns from the constructed examples (§3.1) with targets written by rule: the gold
# evidence and answer on the <evidence> path, a fixed refusal on the <llm> path. The two refusal strings are the
# paper's labels (an evaluation looks for them), not prose of ours.
SFT_REFUSAL_RECALL = "The question is unanswerable"
SFT_REFUSAL_ANSWER = "Unanswerable"


def sft_target(example: GraceExample) -> str:
    """The assistant turn an SFT baseline is trained on for ``example`` (GRACE Appendix B.3).

    Answerable: ``<evidence>`` with the gold evidence (its sentences joined by a space, in order), then
    ``<answer>`` with the first gold answer. Unanswerable: the paper's fixed ``<llm>`` / ``<answer>`` refusal.
    """
    if not example.answerable:
        return f"<llm>{SFT_REFUSAL_RECALL}</llm>\n<answer>{SFT_REFUSAL_ANSWER}</answer>"
    evidence = " ".join(text.strip() for text in example.gold_evidence if text.strip())
    if not evidence:
        raise DataPrepError(f"sample {example.record.id!r}: an answerable context without gold evidence has no target")
    return f"<evidence>{evidence}</evidence>\n<answer>{example.record.answers[0]}</answer>"


def sft_rows(examples: Sequence[GraceExample], corpus: Mapping[str, str], template: str) -> list[dict]:
    """Chat rows for verl's SFT trainer (``messages``: the GRACE prompt as RL sees it, then the B.3 target)."""
    from verl_evidence.dataprep.templates import render_messages

    rows = []
    for example in examples:
        prompt = render_messages(template, example.record.question, [corpus[p] for p in example.passage_ids])
        if any(message["role"] == "assistant" for message in prompt):
            # verl's MultiTurnSFTDataset trains on every assistant turn: demonstrations would be learned as targets
            raise DataPrepError("--sft needs a prompt without assistant turns (a few-shot prompt's demonstrations)")
        rows.append(
            {
                "messages": [*prompt, {"role": "assistant", "content": sft_target(example)}],
                "id": example.record.id,
                "data_source": example.record.data_source,
                "question": example.record.question,
                "answers": list(example.record.answers),
                "answerable": example.answerable,
                "retriever": example.retriever,
                "passage_ids": list(example.passage_ids),
            }
        )
    return rows


def write_sft_parquet(rows: Sequence[dict], path: str | Path) -> Path:
    """The SFT rows as parquet, ``messages`` as verl's ``data.messages_key`` default reads them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        raise DataPrepError(f"{path}: no rows to write")
    strings = pa.list_(pa.string())
    schema = pa.schema(
        [
            ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("id", pa.string()),
            ("data_source", pa.string()),
            ("question", pa.string()),
            ("answers", strings),
            ("answerable", pa.bool_()),
            ("retriever", pa.string()),
            ("passage_ids", strings),
        ]
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows), schema=schema), path)
    return path
