"""verl parquet rows for each method, and the pyarrow writer/reader.

Row layout (what ``verl.utils.dataset.rl_dataset.RLHFDataset`` reads):
``data_source``, ``prompt`` (chat list), ``ability``, ``agent_name``,
``reward_model = {style: "rule", ground_truth: {target, evidence[, answerable]}}``,
``extra_info = {index, split, id, question, method, agent_name, ...}`` with
``tools_kwargs``/``need_tools_kwargs`` for the searching methods,
``passages`` ([{id, contents}])/``eviomni_len_p`` for EviOmni/LEAR and
``retriever``/``passage_ids``/``answerable``/``validate`` for GRACE.

Rows of a file already in verl's layout (Search-R1's parquet) pass through
``search_row``: their ``prompt``, ``ability``, ``reward_model`` and
``extra_info`` are kept and only the fields this project's loop and rewards
read are added (see ``search_row``). ``RowWriter`` writes rows batch by batch
with one explicit schema, so a 170k-row file never sits in memory at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pyarrow as pa
import pyarrow.parquet as pq

from verl_evidence.dataprep.grace import GraceExample
from verl_evidence.dataprep.records import DataPrepError, QARecord, SourceRow
from verl_evidence.dataprep.templates import format_passages, render_messages


@dataclass(frozen=True)
class MethodSpec:
    agent_name: str
    ability: str
    searches: bool


# Agent loop names are the ones the plugin registers (verl_evidence.agent_loops);
# GRACE puts its context in the prompt, so verl's built-in single-turn loop serves it.
METHODS: dict[str, MethodSpec] = {
    "search_r1": MethodSpec("evidence_search", "fact-reasoning", searches=True),
    "evinote": MethodSpec("evidence_search", "fact-reasoning", searches=True),
    "eviomni": MethodSpec("eviomni", "evidence-extraction", searches=False),
    "lear": MethodSpec("eviomni", "evidence-extraction", searches=False),
    "grace": MethodSpec("single_turn_agent", "grounded-qa", searches=False),
}
SEARCH_TOOL_NAME = "search"
# Rows of these splits carry extra_info.validate=true: GRACE's scoring function then uses its
# validation weights (alpha = beta = 1) even when called through verl's DAPO manager.
VALIDATION_SPLITS = frozenset({"val", "validation", "dev", "test"})


def method_spec(method: str) -> MethodSpec:
    if method not in METHODS:
        raise DataPrepError(f"unknown method {method!r}: use one of {', '.join(METHODS)}")
    return METHODS[method]


def _ground_truth(record: QARecord, answerable: bool | None = None, evidence: Sequence[str] | None = None) -> dict:
    truth: dict[str, Any] = {
        "target": list(record.answers),
        "evidence": list(record.gold_evidence if evidence is None else evidence),
    }
    if answerable is not None:
        truth["answerable"] = answerable
    return truth


def _base_row(record: QARecord, method: str, index: int, split: str, prompt: list[dict[str, str]]) -> dict:
    spec = method_spec(method)
    extra: dict[str, Any] = {
        "index": index,
        "split": split,
        "id": record.id,
        "question": record.question,
        "method": method,
        "agent_name": spec.agent_name,
    }
    if spec.searches:
        extra["tools_kwargs"] = {SEARCH_TOOL_NAME: {"create_kwargs": {"question": record.question}}}
        extra["need_tools_kwargs"] = True
    return {
        "data_source": record.data_source,
        "prompt": prompt,
        "ability": spec.ability,
        "agent_name": spec.agent_name,
        "reward_model": {"style": "rule", "ground_truth": _ground_truth(record)},
        "extra_info": extra,
    }


def search_rows(records: Sequence[QARecord], method: str, template: str, split: str) -> list[dict]:
    """Rows for the searching methods (Search-R1 baseline, EviNote): the prompt holds only the question."""
    if not method_spec(method).searches:
        raise DataPrepError(f"method {method!r} does not search; use its own row builder")
    return [_base_row(r, method, i, split, render_messages(template, r.question)) for i, r in enumerate(records)]


def keeps_given_prompt(item: SourceRow, method: str, template_given: bool) -> bool:
    """A row's own prompt is kept unless ``--template`` was given or it was written for another method.

    A row without ``extra_info.method`` (Search-R1's files) counts as ``search_r1``: its prompt asks for
    the ``<search>``/``<information>``/``<answer>`` protocol the search loop speaks, but has no notes.
    """
    if item.given is None or template_given:
        return False
    extra = item.given.get("extra_info") or {}
    return (extra.get("method") or "search_r1") == method


def _str_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def search_row(
    item: SourceRow, method: str, template: str, index: int, split: str | None, template_given: bool = False
) -> dict:
    """One Search-R1 / EviNote row; ``index`` is the row's position in the output.

    Without ``item.given`` (FlashRAG JSONL, a parquet not in verl's layout) the row is built from the
    record. A row already in verl's layout passes through: ``data_source`` (unless overridden),
    ``prompt`` (see ``keeps_given_prompt``; else rendered from ``template``), ``ability``,
    ``reward_model`` (every key; ``ground_truth.target`` as a list of str) and every ``extra_info`` key,
    including ``index`` and ``split`` (``split`` replaced only when given), are kept; added are
    ``agent_name``, ``ground_truth.evidence`` (``[]`` when absent, so every ``data qa`` file has one
    schema) and ``extra_info`` ``id``, ``question``, ``method``, ``agent_name``, ``need_tools_kwargs`` and
    ``tools_kwargs.search.create_kwargs.question`` (merged into any ``tools_kwargs`` the row has).
    """
    spec = method_spec(method)
    if not spec.searches:
        raise DataPrepError(f"method {method!r} does not search; use its own row builder")
    record, given = item.record, item.given
    if given is None:
        return _base_row(record, method, index, split or "train", render_messages(template, record.question))
    keep = keeps_given_prompt(item, method, template_given)
    row = _base_row(record, method, index, split or "train", [] if keep else render_messages(template, record.question))
    if keep:
        row["prompt"] = [dict(message) for message in given["prompt"]]
    row["ability"] = given.get("ability") or spec.ability

    reward = dict(given.get("reward_model") or {})
    truth = dict(reward.get("ground_truth") or {})
    truth["target"] = _str_list(truth.get("target"))
    truth["evidence"] = _str_list(truth.get("evidence"))
    row["reward_model"] = {**reward, "style": reward.get("style") or "rule", "ground_truth": truth}

    theirs = dict(given.get("extra_info") or {})
    ours = row["extra_info"]
    ours["index"] = theirs.get("index", index)
    ours["split"] = split or theirs.get("split") or "train"
    tools = dict(theirs.get("tools_kwargs") or {})
    tool = dict(tools.get(SEARCH_TOOL_NAME) or {})
    tool["create_kwargs"] = {**(tool.get("create_kwargs") or {}), "question": record.question}
    ours["tools_kwargs"] = {**tools, SEARCH_TOOL_NAME: tool}
    row["extra_info"] = {**theirs, **ours}
    return row


def eviomni_rows(
    records: Sequence[QARecord],
    passages: Sequence[Sequence[dict]],
    template: str,
    split: str,
    count_tokens: Callable[[str], int],
    method: str = "eviomni",
) -> list[dict]:
    """EviOmni/LEAR rows: top passages in the prompt and in ``extra_info``, with L_P."""
    if len(passages) != len(records):
        raise DataPrepError(f"got passages for {len(passages)} questions, expected {len(records)}")
    rows = []
    for index, (record, docs) in enumerate(zip(records, passages, strict=True)):
        if not docs:
            raise DataPrepError(f"question {record.id!r}: no passages retrieved")
        contents = [str(doc["contents"]) for doc in docs]
        row = _base_row(record, method, index, split, render_messages(template, record.question, contents))
        row["extra_info"].update(
            passages=[{"id": str(doc["id"]), "contents": str(doc["contents"])} for doc in docs],
            eviomni_len_p=count_tokens(format_passages(contents)),
        )
        rows.append(row)
    return rows


def grace_rows(examples: Sequence[GraceExample], corpus: Mapping[str, str], template: str, split: str) -> list[dict]:
    """GRACE rows: the constructed context in the prompt; gold evidence only when it is in the context."""
    rows = []
    for index, example in enumerate(examples):
        contents = [corpus[p] for p in example.passage_ids]
        row = _base_row(
            example.record, "grace", index, split, render_messages(template, example.record.question, contents)
        )
        row["reward_model"]["ground_truth"] = _ground_truth(example.record, example.answerable, example.gold_evidence)
        row["extra_info"].update(
            retriever=example.retriever,
            passage_ids=list(example.passage_ids),
            answerable=example.answerable,
            validate=split.lower() in VALIDATION_SPLITS,
            evidence_sentences=example.evidence_sentences,  # the reward joins them into one reference
        )
        rows.append(row)
    return rows


_STRINGS = pa.list_(pa.string())
_MESSAGES = pa.list_(pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())]))
_CREATE_KWARGS = pa.struct([pa.field("create_kwargs", pa.struct([pa.field("question", pa.string())]))])
# The columns ``search_row`` writes, with the types every ``data qa`` file has.
SEARCH_ROW_SCHEMA = pa.schema(
    [
        pa.field("data_source", pa.string()),
        pa.field("prompt", _MESSAGES),
        pa.field("ability", pa.string()),
        pa.field("agent_name", pa.string()),
        pa.field(
            "reward_model",
            pa.struct(
                [
                    pa.field("style", pa.string()),
                    pa.field("ground_truth", pa.struct([pa.field("target", _STRINGS), pa.field("evidence", _STRINGS)])),
                ]
            ),
        ),
        pa.field(
            "extra_info",
            pa.struct(
                [
                    pa.field("index", pa.int64()),
                    pa.field("split", pa.string()),
                    pa.field("id", pa.string()),
                    pa.field("question", pa.string()),
                    pa.field("method", pa.string()),
                    pa.field("agent_name", pa.string()),
                    pa.field("tools_kwargs", pa.struct([pa.field(SEARCH_TOOL_NAME, _CREATE_KWARGS)])),
                    pa.field("need_tools_kwargs", pa.bool_()),
                ]
            ),
        ),
    ]
)


def _laid_over(ours: pa.DataType, theirs: pa.DataType | None) -> pa.DataType:
    """``theirs`` with ``ours`` laid over it: struct fields of both (theirs in their order, then our new
    ones), our type wherever both have a field, recursively through structs and lists."""
    if theirs is None:
        return ours
    if pa.types.is_struct(ours) and pa.types.is_struct(theirs):
        our_fields = {f.name: f.type for f in ours}
        fields = [
            pa.field(f.name, _laid_over(our_fields[f.name], f.type) if f.name in our_fields else f.type) for f in theirs
        ]
        their_names = {f.name for f in theirs}
        return pa.struct(fields + [pa.field(n, t) for n, t in our_fields.items() if n not in their_names])
    if pa.types.is_list(ours) and (pa.types.is_list(theirs) or pa.types.is_large_list(theirs)):
        return pa.list_(_laid_over(ours.value_type, theirs.value_type))
    return ours


def search_row_schema(*given: pa.Schema) -> pa.Schema:
    """``SEARCH_ROW_SCHEMA``, widened by the fields of each input in verl's layout (kept by ``search_row``).

    Where two inputs type a field differently, the first one's type is written (a row that does not fit
    it is refused by ``RowWriter``).
    """
    schema = SEARCH_ROW_SCHEMA
    for theirs in given:
        schema = pa.schema(
            [
                pa.field(f.name, _laid_over(f.type, theirs.field(f.name).type if f.name in theirs.names else None))
                for f in schema
            ]
        )
    return schema


class RowWriter:
    """Writes rows batch by batch with one ``schema`` to a temporary file renamed to ``path`` on success.

    Used as a context manager: an exception (bad input found halfway) or zero rows leaves no file at
    ``path``, as the one-shot ``write_parquet`` does.
    """

    def __init__(self, path: str | Path, schema: pa.Schema) -> None:
        self.path = Path(path)
        self.schema = schema
        self.rows = 0
        self._partial = self.path.with_name(f".{self.path.name}.partial")
        self._writer: pq.ParquetWriter | None = None

    def __enter__(self) -> Self:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = pq.ParquetWriter(self._partial, self.schema)
        return self

    def write(self, rows: Sequence[dict]) -> None:
        if not rows:
            return
        assert self._writer is not None, "RowWriter is used as a context manager"
        try:
            table = pa.Table.from_pylist(list(rows), schema=self.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            first = self.rows + 1
            raise DataPrepError(
                f"{self.path}: output rows {first}-{first + len(rows) - 1} do not fit one schema: {err}"
            ) from err
        self._writer.write_table(table)
        self.rows += len(rows)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        assert self._writer is not None
        self._writer.close()
        if kind is None and self.rows == 0:
            self._partial.unlink(missing_ok=True)
            raise DataPrepError(f"{self.path}: no rows to write")
        if kind is None:
            os.replace(self._partial, self.path)
        else:
            self._partial.unlink(missing_ok=True)


def _ground_truth_type(rows: Sequence[dict]) -> pa.DataType:
    # Explicit list<string> types: an all-empty evidence column would otherwise be inferred as list<null>.
    fields = [pa.field("target", _STRINGS), pa.field("evidence", _STRINGS)]
    if any("answerable" in row["reward_model"]["ground_truth"] for row in rows):
        fields.append(pa.field("answerable", pa.bool_()))
    return pa.struct(fields)


def write_parquet(rows: Sequence[dict], path: str | Path) -> Path:
    """Write rows with pyarrow; refuses an empty set (verl would fail later, less clearly)."""
    if not rows:
        raise DataPrepError(f"{path}: no rows to write")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(list(rows))
    reward_type = pa.struct([pa.field("style", pa.string()), pa.field("ground_truth", _ground_truth_type(rows))])
    table = table.set_column(
        table.schema.get_field_index("reward_model"),
        "reward_model",
        pa.array([row["reward_model"] for row in rows], type=reward_type),
    )
    pq.write_table(table, path)
    return path


def read_parquet(path: str | Path) -> list[dict]:
    return pq.read_table(path).to_pylist()
