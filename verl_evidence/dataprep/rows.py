"""verl parquet rows for each method, and the pyarrow writer/reader.

Row layout (what ``verl.utils.dataset.rl_dataset.RLHFDataset`` reads):
``data_source``, ``prompt`` (chat list), ``ability``, ``agent_name``,
``reward_model = {style: "rule", ground_truth: {target, evidence[, answerable]}}``,
``extra_info = {index, split, id, question, method, agent_name, ...}`` with
``tools_kwargs``/``need_tools_kwargs`` for the searching methods,
``passages`` ([{id, contents}])/``eviomni_len_p`` for EviOmni/LEAR and
``retriever``/``passage_ids``/``answerable``/``validate`` for GRACE.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from verl_evidence.dataprep.grace import GraceExample
from verl_evidence.dataprep.records import DataPrepError, QARecord
from verl_evidence.dataprep.templates import format_passages, render


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


def _base_row(record: QARecord, method: str, index: int, split: str, content: str) -> dict:
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
        "prompt": [{"role": "user", "content": content}],
        "ability": spec.ability,
        "agent_name": spec.agent_name,
        "reward_model": {"style": "rule", "ground_truth": _ground_truth(record)},
        "extra_info": extra,
    }


def search_rows(records: Sequence[QARecord], method: str, template: str, split: str) -> list[dict]:
    """Rows for the searching methods (Search-R1 baseline, EviNote): the prompt holds only the question."""
    if not method_spec(method).searches:
        raise DataPrepError(f"method {method!r} does not search; use its own row builder")
    return [_base_row(r, method, i, split, render(template, r.question)) for i, r in enumerate(records)]


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
        row = _base_row(record, method, index, split, render(template, record.question, contents))
        row["extra_info"].update(
            passages=[{"id": str(doc["id"]), "contents": str(doc["contents"])} for doc in docs],
            eviomni_len_p=count_tokens(format_passages(contents)),
        )
        rows.append(row)
    return rows


def grace_rows(examples: Sequence[GraceExample], corpus: dict[str, str], template: str, split: str) -> list[dict]:
    """GRACE rows: the constructed context in the prompt; gold evidence only when it is in the context."""
    rows = []
    for index, example in enumerate(examples):
        contents = [corpus[p] for p in example.passage_ids]
        row = _base_row(example.record, "grace", index, split, render(template, example.record.question, contents))
        evidence = example.record.gold_evidence if example.answerable else ()
        row["reward_model"]["ground_truth"] = _ground_truth(example.record, example.answerable, evidence)
        row["extra_info"].update(
            retriever=example.retriever,
            passage_ids=list(example.passage_ids),
            answerable=example.answerable,
            validate=split.lower() in VALIDATION_SPLITS,
        )
        rows.append(row)
    return rows


_STRINGS = pa.list_(pa.string())


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
