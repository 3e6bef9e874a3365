"""Input readers for QA sets, with the validation every method relies on.

Accepted inputs:
- FlashRAG JSONL: ``{"id", "question", "golden_answers", "metadata"?}`` per line,
  plus the bundled set's gold annotations (``gold_passage_ids``, ``gold_evidence``,
  ``distractor_ids``) when present.
- Search-R1 parquet: ``id``, ``question``, ``golden_answers`` (or
  ``reward_model.ground_truth.target``) and ``data_source``.
- Corpora in FlashRAG JSONL: ``{"id", "contents": "Title\\ntext"}``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

logger = logging.getLogger(__name__)

# Data sources the evaluation and reward code know by name. A typo here would silently
# split metrics into a new bucket, so unknown names are refused unless explicitly allowed.
KNOWN_DATA_SOURCES = frozenset(
    {
        "nq",
        "triviaqa",
        "popqa",
        "hotpotqa",
        "2wikimultihopqa",
        "musique",
        "bamboogle",
        "webquestions",
        "squad",
        "asqa",
        "fever",
        "qasper",
        "bundled",
    }
)
_DATA_SOURCE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


class DataPrepError(ValueError):
    """Bad input for data preparation; the message names the file, row and fix."""


@dataclass(frozen=True)
class QARecord:
    """One question with its gold annotations (empty tuples when the input has none)."""

    id: str
    question: str
    answers: tuple[str, ...]
    data_source: str
    gold_passage_ids: tuple[str, ...] = ()
    gold_evidence: tuple[str, ...] = ()
    distractor_ids: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def check_data_source(name: str, allow_new: bool = False) -> str:
    """Return ``name`` if it is a known data source (or a well-formed new one when allowed)."""
    if not isinstance(name, str) or not _DATA_SOURCE_PATTERN.match(name):
        raise DataPrepError(f"invalid data source {name!r}: use letters, digits, '_', '.', '-'")
    if name not in KNOWN_DATA_SOURCES and not allow_new:
        raise DataPrepError(
            f"unknown data source {name!r}; known: {', '.join(sorted(KNOWN_DATA_SOURCES))}. "
            "Pass --new-data-source to accept a new name."
        )
    return name


def _as_str_list(value: Any, where: str, column: str) -> tuple[str, ...]:
    """Coerce a string / list / numpy array / ``{"target": ...}`` into a tuple of strings."""
    if isinstance(value, dict) and "target" in value:
        value = value["target"]
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise DataPrepError(
            f"{where}: column {column!r} must be a string or a list of strings, got {type(value).__name__}"
        )
    return tuple(str(item) for item in value)


def _require(row: dict, columns: Iterable[str], where: str) -> None:
    missing = [column for column in columns if column not in row or row[column] is None]
    if missing:
        raise DataPrepError(f"{where}: missing column(s) {', '.join(missing)} (have: {', '.join(sorted(row))})")


def record_from_row(row: dict, where: str, data_source: str) -> QARecord:
    """Validate one input row and turn it into a ``QARecord``."""
    if "golden_answers" not in row and isinstance(row.get("reward_model"), dict):
        # Search-R1 parquet keeps the answers only in the reward column.
        row = {**row, "golden_answers": row["reward_model"].get("ground_truth")}
    _require(row, ("id", "question", "golden_answers"), where)
    question = str(row["question"]).strip()
    if not question:
        raise DataPrepError(f"{where}: empty question")
    answers = tuple(answer.strip() for answer in _as_str_list(row["golden_answers"], where, "golden_answers"))
    answers = tuple(answer for answer in answers if answer)
    if not answers:
        raise DataPrepError(f"{where}: empty golden_answers for id {row['id']!r}")
    metadata = row.get("metadata") or {}
    return QARecord(
        id=str(row["id"]),
        question=question,
        answers=answers,
        data_source=data_source,
        gold_passage_ids=_as_str_list(row.get("gold_passage_ids"), where, "gold_passage_ids"),
        gold_evidence=_as_str_list(row.get("gold_evidence"), where, "gold_evidence"),
        distractor_ids=_as_str_list(row.get("distractor_ids"), where, "distractor_ids"),
        metadata=dict(metadata) if isinstance(metadata, dict) else {"metadata": metadata},
    )


def check_unique_ids(records: Sequence[QARecord], source: str) -> None:
    seen: dict[str, int] = {}
    for position, record in enumerate(records):
        if record.id in seen:
            raise DataPrepError(f"{source}: duplicate id {record.id!r} (rows {seen[record.id] + 1} and {position + 1})")
        seen[record.id] = position


def read_jsonl(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise DataPrepError(f"{path}: no such file")
    rows = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataPrepError(f"{path}:{line_number}: not valid JSON ({err.msg})") from err
            if not isinstance(row, dict):
                raise DataPrepError(f"{path}:{line_number}: expected a JSON object per line")
            rows.append(row)
    if not rows:
        raise DataPrepError(f"{path}: no rows")
    return rows


def read_flashrag_jsonl(path: str | Path, data_source: str, allow_new_source: bool = False) -> list[QARecord]:
    """Read a FlashRAG QA file; every row gets ``data_source``."""
    check_data_source(data_source, allow_new_source)
    records = [
        record_from_row(row, f"{path}:{number}", data_source) for number, row in enumerate(read_jsonl(path), start=1)
    ]
    check_unique_ids(records, str(path))
    return records


def read_search_r1_parquet(
    path: str | Path, data_source: str | None = None, allow_new_source: bool = False
) -> list[QARecord]:
    """Read a Search-R1 parquet; ``data_source`` overrides the file's column when given."""
    path = Path(path)
    if not path.is_file():
        raise DataPrepError(f"{path}: no such file")
    table = pq.read_table(path)
    if data_source is None and "data_source" not in table.column_names:
        raise DataPrepError(f"{path}: missing column data_source (or pass --data-source)")
    records = []
    for number, row in enumerate(table.to_pylist(), start=1):
        if "id" not in row and isinstance(row.get("extra_info"), dict) and "index" in row["extra_info"]:
            row["id"] = f"{row.get('data_source', 'row')}-{row['extra_info']['index']}"
        source = check_data_source(data_source or row["data_source"], allow_new_source)
        records.append(record_from_row(row, f"{path}:row {number}", source))
    if not records:
        raise DataPrepError(f"{path}: no rows")
    check_unique_ids(records, str(path))
    return records


def read_corpus(path: str | Path) -> dict[str, str]:
    """Read a FlashRAG corpus into ``{id: "Title\\ntext"}``, refusing duplicate ids."""
    corpus: dict[str, str] = {}
    for number, row in enumerate(read_jsonl(path), start=1):
        _require(row, ("id", "contents"), f"{path}:{number}")
        passage_id = str(row["id"])
        if passage_id in corpus:
            raise DataPrepError(f"{path}:{number}: duplicate passage id {passage_id!r}")
        corpus[passage_id] = str(row["contents"])
    return corpus


def check_references(records: Sequence[QARecord], corpus: dict[str, str], source: str) -> None:
    """Every gold / distractor id a record names must exist in the corpus."""
    for record in records:
        for passage_id in (*record.gold_passage_ids, *record.distractor_ids):
            if passage_id not in corpus:
                raise DataPrepError(f"{source}: id {record.id!r} names passage {passage_id!r}, absent from the corpus")


def bundled_paths() -> tuple[Path, Path]:
    """(qa.jsonl, corpus.jsonl) of the bundled set, failing clearly when it is not installed."""
    from verl_evidence import bundled

    try:
        return Path(bundled.qa_path()), Path(bundled.corpus_path())
    except AttributeError as err:
        raise DataPrepError("the bundled QA set is not installed (verl_evidence.bundled has no qa_path)") from err
