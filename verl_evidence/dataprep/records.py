"""Input readers for QA sets, with the validation every method relies on.

Accepted inputs:
- FlashRAG JSONL: ``{"id", "question", "golden_answers", "metadata"?}`` per line,
  plus the bundled set's gold annotations (``gold_passage_ids``, ``gold_evidence``,
  ``distractor_ids``) when present.
- Search-R1 parquet: ``id``, ``question``, ``golden_answers`` (or
  ``reward_model.ground_truth.target``) and ``data_source``, read in record batches
  (``ParquetInput``). Search-R1's merge scripts keep FlashRAG's ids, which restart per
  dataset (``train_0`` in NQ and in HotpotQA), so a parquet ``id`` is recorded as
  ``<data_source>/<id>``; a duplicate within one data source is refused. Files already
  in verl's row layout (``prompt``, ``reward_model``, ``data_source``) also hand their
  verl columns on (``SourceRow.given``) to pass through ``rows.search_row``.
- Corpora in FlashRAG JSONL: ``{"id", "contents": "Title\\ntext"}``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retrieval_server import jsonl

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
    odd = next((item for item in value if not isinstance(item, _SCALARS)), None)
    if odd is not None:
        raise DataPrepError(f"{where}: column {column!r} must hold strings, got {_shown(odd)}")
    return tuple(str(item) for item in value)


# Values a text column may hold (a number is read as its text: some datasets' answers are years).
_SCALARS = (str, int, float)


def _shown(value: Any) -> str:
    """A value named in an error: its type and a short repr."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _require(row: dict, columns: Iterable[str], where: str) -> None:
    missing = [column for column in columns if column not in row]
    if missing:
        raise DataPrepError(f"{where}: missing column(s) {', '.join(missing)} (have: {', '.join(sorted(row))})")
    empty = [column for column in columns if row[column] is None]
    if empty:
        noun = "column" if len(empty) == 1 else "columns"
        raise DataPrepError(f"{where}: {noun} {', '.join(empty)} {'is' if len(empty) == 1 else 'are'} null")


def _text(row: dict, column: str, where: str) -> str:
    """A column that must be text (a question, an id): a string, or a number read as its text."""
    value = row[column]
    if isinstance(value, bool) or not isinstance(value, _SCALARS):
        raise DataPrepError(f"{where}: column {column!r} must be a string, got {_shown(value)}")
    return str(value)


def record_from_row(row: dict, where: str, data_source: str) -> QARecord:
    """Validate one input row and turn it into a ``QARecord``.

    A row with a ``reward_model`` column takes its answers from there (the target a reward will score
    against), else from ``golden_answers``.
    """
    truth = row["reward_model"].get("ground_truth") if isinstance(row.get("reward_model"), dict) else None
    if truth is not None:
        row = {**row, "golden_answers": truth}
    _require(row, ("id", "question", "golden_answers"), where)
    question = _text(row, "question", where).strip()
    if not question:
        raise DataPrepError(f"{where}: empty question")
    record_id = _text(row, "id", where)
    answers = tuple(answer.strip() for answer in _as_str_list(row["golden_answers"], where, "golden_answers"))
    answers = tuple(answer for answer in answers if answer)
    if not answers:
        raise DataPrepError(f"{where}: empty golden_answers for id {record_id!r}")
    metadata = row.get("metadata") or {}
    return QARecord(
        id=record_id,
        question=question,
        answers=answers,
        data_source=data_source,
        gold_passage_ids=_as_str_list(row.get("gold_passage_ids"), where, "gold_passage_ids"),
        gold_evidence=_as_str_list(row.get("gold_evidence"), where, "gold_evidence"),
        distractor_ids=_as_str_list(row.get("distractor_ids"), where, "distractor_ids"),
        metadata=dict(metadata) if isinstance(metadata, dict) else {"metadata": metadata},
    )


class UniqueIds:
    """Refuses a question id seen before in the same data source, naming both rows (1-based) and, when
    they come from different inputs, both files."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.rows: dict[tuple[str, str], tuple[str, int]] = {}

    def add(self, record: QARecord, row_number: int, source: str | None = None) -> None:
        key = (record.data_source, record.id)
        place = (source or self.source, row_number)
        first = self.rows.setdefault(key, place)
        if first == place:
            return
        if first[0] == place[0]:
            rows = f"rows {first[1]} and {row_number}"
        else:
            rows = f"{first[0]}:{first[1]} and {place[0]}:{row_number}"
        raise DataPrepError(f"{place[0]}: duplicate id {record.id!r} in data source {record.data_source!r} ({rows})")


def check_unique_ids(records: Sequence[QARecord], source: str) -> None:
    ids = UniqueIds(source)
    for number, record in enumerate(records, start=1):
        ids.add(record, number)


def read_jsonl(path: str | Path) -> list[dict]:
    """JSON Lines: one object per line; a line that is not UTF-8 or not JSON is refused by its number.

    The project's one JSON Lines reader (``retrieval_server.jsonl``), raising ``DataPrepError``.
    """
    return jsonl.read_jsonl(path, DataPrepError)


def read_json(path: str | Path) -> Any:
    """A whole JSON document (HotpotQA's and QASPER's own files), refused in one line when unreadable."""
    path = Path(path)
    if not path.is_file():
        raise DataPrepError(f"{path}: no such file")
    raw = path.read_bytes()
    if raw.startswith(jsonl.PARQUET_MAGIC):
        raise DataPrepError(f"{path}: a parquet file, not JSON: name it .parquet")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise DataPrepError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[err.start]:02x})") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataPrepError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from err


def read_flashrag_jsonl(path: str | Path, data_source: str, allow_new_source: bool = False) -> list[QARecord]:
    """Read a FlashRAG QA file; every row gets ``data_source``."""
    check_data_source(data_source, allow_new_source)
    records = [
        record_from_row(row, f"{path}:{number}", data_source) for number, row in enumerate(read_jsonl(path), start=1)
    ]
    check_unique_ids(records, str(path))
    return records


# Columns read from a parquet input; any other (FlashRAG's ``metadata``, which for HotpotQA holds every
# question's distractor paragraphs) is never loaded.
PARQUET_COLUMNS = ("id", "question", "golden_answers", "data_source", "prompt", "ability", "reward_model", "extra_info")
# A parquet with these columns is already in verl's row layout: its rows pass through (rows.search_row).
VERL_ROW_COLUMNS = frozenset({"data_source", "prompt", "reward_model"})
# The verl columns a row in that layout hands on; ``agent_name`` is not among them because the method sets it.
GIVEN_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")
PARQUET_BATCH_ROWS = 4096


@dataclass(frozen=True)
class SourceRow:
    """A validated question and, for a file already in verl's row layout, that row's verl columns as read."""

    record: QARecord
    given: dict[str, Any] | None = None


def question_id(row: dict, data_source: str, where: str) -> str:
    """The id a parquet row is recorded under.

    ``id`` column (FlashRAG's, restarting per dataset): ``<data_source>/<id>`` (kept when it already has
    that prefix); else ``extra_info.id`` (a file this project wrote) as it is; else
    ``<data_source>/<extra_info.index>``.
    """
    if row.get("id") is not None:
        raw, prefix = _text(row, "id", where), f"{data_source}/"
        return raw if raw.startswith(prefix) else prefix + raw
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    if extra.get("id") is not None:
        return str(extra["id"])
    if extra.get("index") is not None:
        return f"{data_source}/{extra['index']}"
    raise DataPrepError(f"{where}: no question id: add an id column (or extra_info.id / extra_info.index)")


def _check_verl_row(row: dict, where: str) -> None:
    prompt = row.get("prompt")
    messages_ok = isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt)
    if not messages_ok or not all(isinstance(m.get("content"), str) and isinstance(m.get("role"), str) for m in prompt):
        raise DataPrepError(f"{where}: prompt must be a non-empty list of {{role, content}} messages")
    for column in ("reward_model", "extra_info"):
        if row.get(column) is not None and not isinstance(row[column], dict):
            raise DataPrepError(f"{where}: column {column!r} must be a struct, got {type(row[column]).__name__}")
    index = (row.get("extra_info") or {}).get("index")
    if index is not None and (isinstance(index, bool) or not isinstance(index, int)):
        raise DataPrepError(f"{where}: extra_info.index must be an integer, got {index!r}")


class ParquetInput:
    """A Search-R1 (or verl-layout) parquet, validated and read in record batches of ``batch_rows``
    (default ``PARQUET_BATCH_ROWS``).

    Only ``PARQUET_COLUMNS`` are read, batch by batch, so memory stays bounded by a batch whatever the
    file's size. ``data_source`` overrides the file's column when given.
    """

    def __init__(
        self,
        path: str | Path,
        data_source: str | None = None,
        allow_new_source: bool = False,
        batch_rows: int | None = None,
    ) -> None:
        import pyarrow as pa  # here, not at the top: the readers of JSON files (evipath's CLI too) stay light
        import pyarrow.parquet as pq

        self.path = Path(path)
        if not self.path.is_file():
            raise DataPrepError(f"{self.path}: no such file")
        try:
            self.file = pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as err:
            raise DataPrepError(f"{self.path}: not a readable parquet file ({err})") from err
        names = self.file.schema_arrow.names
        if data_source is None and "data_source" not in names:
            raise DataPrepError(f"{self.path}: missing column data_source (or pass --data-source)")
        if data_source is not None:
            check_data_source(data_source, allow_new_source)
        self.data_source = data_source
        self.allow_new_source = allow_new_source
        self.batch_rows = batch_rows or PARQUET_BATCH_ROWS
        self.columns = [column for column in PARQUET_COLUMNS if column in names]
        self.schema = pa.schema([self.file.schema_arrow.field(column) for column in self.columns])
        self.unread_columns = [column for column in names if column not in PARQUET_COLUMNS]
        self.in_verl_layout = set(names) >= VERL_ROW_COLUMNS
        self.num_rows = self.file.metadata.num_rows

    def _source_of(self, row: dict, where: str, checked: set[str]) -> str:
        name = self.data_source or row.get("data_source")
        if name is None:
            raise DataPrepError(f"{where}: empty data_source (or pass --data-source)")
        if name not in checked:
            try:
                checked.add(check_data_source(name, self.allow_new_source))
            except DataPrepError as err:
                raise DataPrepError(f"{where}: {err}") from err
        return name

    def data_sources(self) -> list[str | None]:
        """Each row's data source (``data_source`` given, else the column), read without the other columns."""
        if self.data_source is not None:
            return [self.data_source] * self.num_rows
        return [
            name for batch in self.file.iter_batches(columns=["data_source"]) for name in batch.column(0).to_pylist()
        ]

    def batches(self) -> Iterator[list[SourceRow]]:
        """Validated rows, one list per record batch; raises on the first bad or duplicate row."""
        ids = UniqueIds(str(self.path))
        checked: set[str] = set()
        number = 0
        for batch in self.file.iter_batches(batch_size=self.batch_rows, columns=self.columns):
            out = []
            for row in batch.to_pylist():
                number += 1
                where = f"{self.path}:row {number}"
                source = self._source_of(row, where, checked)
                row["id"] = question_id(row, source, where)
                extra = row.get("extra_info")
                if row.get("question") is None and isinstance(extra, dict) and extra.get("question") is not None:
                    row["question"] = extra["question"]  # a file this project wrote keeps it there only
                record = record_from_row(row, where, source)
                ids.add(record, number)
                given = None
                if self.in_verl_layout:
                    _check_verl_row(row, where)
                    given = {column: row[column] for column in GIVEN_COLUMNS if column in row}
                out.append(SourceRow(record, given))
            yield out
        if number == 0:
            raise DataPrepError(f"{self.path}: no rows")


def read_search_r1_parquet(
    path: str | Path, data_source: str | None = None, allow_new_source: bool = False
) -> list[QARecord]:
    """All records of a Search-R1 parquet (ids ``<data_source>/<id>``); ``data_source`` overrides the column."""
    source = ParquetInput(path, data_source, allow_new_source)
    return [item.record for batch in source.batches() for item in batch]


def load_records(source: str, data_source: str | None, allow_new_source: bool) -> list[QARecord]:
    """``bundled``, a FlashRAG ``.jsonl`` or a Search-R1 ``.parquet``."""
    if source == "bundled":
        qa_path, _ = bundled_paths()
        return read_flashrag_jsonl(qa_path, data_source or "bundled", allow_new_source)
    path = Path(source)
    if path.suffix == ".parquet":
        return read_search_r1_parquet(path, data_source, allow_new_source)
    if path.suffix == ".jsonl":
        if data_source is None:
            raise DataPrepError(
                f"{path}: FlashRAG files carry no data source; pass --data-source NAME (or give it as NAME={path})"
            )
        return read_flashrag_jsonl(path, data_source, allow_new_source)
    raise DataPrepError(f"{path}: expected 'bundled', a .jsonl (FlashRAG) or a .parquet (Search-R1) file")


def read_corpus(path: str | Path) -> dict[str, str]:
    """Read a FlashRAG corpus into ``{id: "Title\\ntext"}``, refusing duplicate ids."""
    corpus: dict[str, str] = {}
    for number, passage_id, contents in jsonl.iter_passages(path, DataPrepError):
        if passage_id in corpus:
            raise DataPrepError(f"{path}:{number}: duplicate passage id {passage_id!r}")
        corpus[passage_id] = contents
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
