"""Readers that turn multi-hop QA datasets into one common record.

Every reader yields :class:`QARecord`: the question, its gold answers, the pool
of supporting facts F (gold evidence mixed with distractors) and the indices of
the golden evidence F^ inside that pool. Facts are strings ``"Title: text"``.

Layouts read:

- HotpotQA / 2WikiMultihopQA: ``context`` = ``[[title, [sentence, ...]], ...]``,
  ``supporting_facts`` = ``[[title, sentence_index], ...]``. One fact per sentence.
- MuSiQue: ``paragraphs`` = ``[{"title", "paragraph_text", "is_supporting"}, ...]``,
  answer plus ``answer_aliases``. One fact per paragraph.
- The bundled set (``docs/data-contracts.md``): ``gold_evidence`` sentences are
  F^; F adds the distractor passages from the corpus.

A row that cannot form a record (no question, no answer, no golden evidence, a
supporting fact pointing outside its context) is skipped with a logged reason;
the reader counts the skips in :attr:`ReadReport.skipped`.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_evidence.dataprep.records import read_corpus, read_jsonl

logger = logging.getLogger(__name__)

FORMATS = ("hotpotqa", "2wiki", "musique", "bundled")


@dataclass(frozen=True)
class QARecord:
    """One training problem (q, a, F, F^)."""

    id: str
    question: str
    answers: tuple[str, ...]
    facts: tuple[str, ...]
    golden: tuple[int, ...]  # indices into ``facts``
    source: str

    @property
    def answer(self) -> str:
        return self.answers[0]

    @property
    def golden_facts(self) -> list[str]:
        return [self.facts[i] for i in self.golden]


@dataclass
class ReadReport:
    read: int = 0
    skipped: Counter = field(default_factory=Counter)


class RecordError(ValueError):
    """A dataset row that cannot become a record; the message says why."""


def _fact(title: str, text: str) -> str:
    title, text = str(title).strip(), str(text).strip()
    return f"{title}: {text}" if title else text


def _answers(*values: Any) -> tuple[str, ...]:
    out: list[str] = []
    for value in values:
        if value is None:
            continue
        items = [value] if isinstance(value, str) else list(value)
        for item in items:
            text = str(item).strip()
            if text and text not in out:
                out.append(text)
    return tuple(out)


def _finish(
    row_id: str, question: Any, answers: tuple[str, ...], facts: list[str], golden: list[int], source: str
) -> QARecord:
    question = str(question or "").strip()
    if not question:
        raise RecordError("no question")
    if not answers:
        raise RecordError("no answer")
    if not golden:
        raise RecordError("no golden evidence")
    return QARecord(row_id, question, answers, tuple(facts), tuple(sorted(set(golden))), source)


def from_hotpot_layout(row: dict, source: str = "hotpotqa") -> QARecord:
    """HotpotQA and 2WikiMultihopQA: sentence-level facts, supporting facts by (title, index)."""
    row_id = str(row.get("_id", row.get("id", "")))
    facts: list[str] = []
    position: dict[tuple[str, int], int] = {}
    for entry in row.get("context") or []:
        if isinstance(entry, dict):  # the HF "datasets" layout
            title, sentences = entry.get("title"), entry.get("sentences")
        else:
            title, sentences = entry[0], entry[1]
        for sent_idx, sentence in enumerate(sentences or []):
            if not str(sentence).strip():
                continue
            position[(str(title), sent_idx)] = len(facts)
            facts.append(_fact(title, sentence))
    supporting = row.get("supporting_facts") or []
    if isinstance(supporting, dict):  # HF layout: {"title": [...], "sent_id": [...]}
        supporting = list(zip(supporting.get("title", []), supporting.get("sent_id", [])))
    golden: list[int] = []
    for title, sent_idx in supporting:
        key = (str(title), int(sent_idx))
        if key not in position:
            raise RecordError(f"supporting fact {key} not in context")
        golden.append(position[key])
    return _finish(row_id, row.get("question"), _answers(row.get("answer")), facts, golden, source)


def from_musique(row: dict, source: str = "musique") -> QARecord:
    """MuSiQue: paragraph-level facts with ``is_supporting`` flags."""
    facts: list[str] = []
    golden: list[int] = []
    for paragraph in row.get("paragraphs") or []:
        text = str(paragraph.get("paragraph_text", "")).strip()
        if not text:
            continue
        if paragraph.get("is_supporting"):
            golden.append(len(facts))
        facts.append(_fact(paragraph.get("title", ""), text))
    if row.get("answerable") is False:
        raise RecordError("unanswerable question")
    answers = _answers(row.get("answer"), row.get("answer_aliases"))
    return _finish(str(row.get("id", "")), row.get("question"), answers, facts, golden, source)


def _split_passage(contents: str) -> tuple[str, str]:
    title, _, text = str(contents).partition("\n")
    return title.strip(), text.strip()


def from_bundled(row: dict, corpus: dict[str, str], source: str = "bundled") -> QARecord:
    """The bundled set: gold evidence sentences (titled by their passage) plus distractor passages."""
    gold_ids = list(row.get("gold_passage_ids") or [])
    gold_titles = []
    for pid in gold_ids:
        if pid not in corpus:
            raise RecordError(f"gold passage {pid!r} not in corpus")
        gold_titles.append(_split_passage(corpus[pid]))
    facts: list[str] = []
    golden: list[int] = []
    for sentence in row.get("gold_evidence") or []:
        title = next((t for t, text in gold_titles if str(sentence).strip() in text), "")
        golden.append(len(facts))
        facts.append(_fact(title, sentence))
    for pid in row.get("distractor_ids") or []:
        if pid not in corpus:
            raise RecordError(f"distractor passage {pid!r} not in corpus")
        facts.append(_fact(*_split_passage(corpus[pid])))
    return _finish(
        str(row.get("id", "")), row.get("question"), _answers(row.get("golden_answers")), facts, golden, source
    )


def _read_rows(path: Path) -> Iterator[dict]:
    """JSON Lines, or one JSON array (the official HotpotQA/2Wiki files)."""
    with path.open("rb") as handle:  # bytes: a non-UTF-8 file is the reader's to name
        head = handle.read(1)
        while head and head.isspace():
            head = handle.read(1)
        handle.seek(0)
        if head == b"[":
            yield from json.load(handle)
            return
    yield from read_jsonl(path)


def load_corpus_file(path: Path) -> dict[str, str]:
    return read_corpus(path)


def iter_records(
    rows: Iterable[dict],
    fmt: str,
    corpus: dict[str, str] | None = None,
    report: ReadReport | None = None,
) -> Iterator[QARecord]:
    """Records from raw rows of the given format; bad rows are skipped and counted."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "bundled" and corpus is None:
        raise ValueError("the bundled format needs its corpus")
    report = report if report is not None else ReadReport()
    for row in rows:
        try:
            if fmt in ("hotpotqa", "2wiki"):
                record = from_hotpot_layout(row, source=fmt)
            elif fmt == "musique":
                record = from_musique(row)
            else:
                record = from_bundled(row, corpus or {})
        except (RecordError, KeyError, TypeError, IndexError, ValueError, AttributeError) as err:
            reason = str(err) if isinstance(err, RecordError) else "malformed row"
            row_id = row.get("_id", row.get("id", "?")) if isinstance(row, dict) else "?"
            logger.info("skipping row %s: %s (%s)", row_id, reason, err)
            report.skipped[reason] += 1
            continue
        report.read += 1
        yield record


def load_records(
    path: str | Path | None,
    fmt: str,
    corpus_path: str | Path | None = None,
    limit: int | None = None,
    report: ReadReport | None = None,
) -> list[QARecord]:
    """Read a dataset file (``path=None`` with ``fmt="bundled"`` reads the packaged set)."""
    corpus: dict[str, str] | None = None
    if fmt == "bundled":
        if path is None:
            from verl_evidence import bundled

            rows: Iterable[dict] = bundled.load_qa()
            corpus = read_corpus(bundled.corpus_path())
        else:
            if corpus_path is None:
                corpus_path = Path(path).with_name("corpus.jsonl")
            if not Path(corpus_path).exists():
                raise FileNotFoundError(f"corpus file {corpus_path} (needed by {path}) does not exist")
            corpus = load_corpus_file(Path(corpus_path))
            rows = _read_rows(Path(path))
    else:
        if path is None:
            raise ValueError(f"format {fmt!r} needs an input file")
        if not Path(path).exists():
            raise FileNotFoundError(f"input file {path} does not exist")
        rows = _read_rows(Path(path))
    out: list[QARecord] = []
    for record in iter_records(rows, fmt, corpus=corpus, report=report):
        out.append(record)
        if limit is not None and len(out) >= limit:
            break
    return out
