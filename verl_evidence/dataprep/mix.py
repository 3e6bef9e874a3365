"""Several QA inputs into one output, sampled per data source, with a summary written beside it.

``data qa nq=nq/train.jsonl hotpotqa=hotpotqa/train.jsonl`` mixes FlashRAG files (``NAME=PATH`` gives
a file its data source) and Search-R1 parquets into one parquet; ``--sample N --seed S`` keeps N rows
per data source, drawn reproducibly (EviNote's test protocol: 500 per dataset, Bamboogle's 125 whole).
What went in and what came out (per-source counts, the sampled ids) is written to
``<output stem>.summary.json`` beside the parquet, so a run can be reproduced and checked later.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from verl_evidence.dataprep.records import DataPrepError, ParquetInput, SourceRow, load_records
from verl_evidence.dataprep.retrievers import stable_seed

_NAMED_INPUT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*)=(.+)$")


@dataclass(frozen=True)
class InputSpec:
    path: str  # 'bundled', a FlashRAG .jsonl or a Search-R1 .parquet
    data_source: str | None  # from NAME=PATH, else --data-source (None: the parquet's own column)

    @property
    def label(self) -> str:
        return self.path


def parse_input(spec: str, data_source: str | None) -> InputSpec:
    """``NAME=PATH`` (a data source for this input) or ``PATH`` (``--data-source``, if any).

    A file whose own name contains ``=`` is taken as a path when it exists.
    """
    match = _NAMED_INPUT.match(spec)
    if match and not Path(spec).exists():
        return InputSpec(match[2], match[1])
    return InputSpec(spec, data_source)


class QAInput:
    """One input of ``data qa``: a parquet read in record batches, or a FlashRAG JSONL / ``bundled`` read whole."""

    def __init__(self, spec: InputSpec, allow_new_source: bool) -> None:
        self.spec = spec
        self.parquet: ParquetInput | None = None
        self.records = None
        if spec.path.endswith(".parquet"):
            self.parquet = ParquetInput(spec.path, spec.data_source, allow_new_source)
        else:
            self.records = load_records(spec.path, spec.data_source, allow_new_source)

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def num_rows(self) -> int:
        return self.parquet.num_rows if self.parquet is not None else len(self.records or ())

    @property
    def verl_schema(self) -> pa.Schema | None:
        """The schema of a parquet already in verl's row layout (its rows pass through), else None."""
        return self.parquet.schema if self.parquet is not None and self.parquet.in_verl_layout else None

    def data_sources(self) -> list[str | None]:
        """Each row's data source, in file order, without validating the rows (``--sample``'s first pass)."""
        if self.parquet is not None:
            return self.parquet.data_sources()
        return [record.data_source for record in self.records or ()]

    def batches(self) -> Iterator[list[SourceRow]]:
        if self.parquet is not None:
            yield from self.parquet.batches()
        else:
            yield [SourceRow(record) for record in self.records or ()]


def choose_rows(data_sources: Sequence[str | None], per_source: int, seed: int) -> set[int]:
    """Positions ``--sample`` keeps: ``per_source`` rows of each data source, drawn without replacement with
    a generator seeded by (``seed``, data source), so a data source's draw does not depend on what else
    the inputs hold; all rows of a data source that has fewer."""
    if per_source <= 0:
        raise DataPrepError(f"--sample must be positive, got {per_source}")
    positions: dict[str | None, list[int]] = {}
    for position, name in enumerate(data_sources):
        positions.setdefault(name, []).append(position)
    chosen: set[int] = set()
    for name, rows in positions.items():
        if len(rows) <= per_source:
            chosen.update(rows)
        else:
            chosen.update(random.Random(stable_seed(seed, "sample", name)).sample(rows, per_source))
    return chosen


def summary_path(output: Path) -> Path:
    """``data/evinote/test.parquet`` -> ``data/evinote/test.summary.json``."""
    return output.with_name(f"{output.stem}.summary.json")


def write_summary(output: Path, summary: dict[str, Any]) -> Path:
    """Write the run's summary beside ``output`` (whole or not at all: a temporary file renamed)."""
    path = summary_path(output)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path
