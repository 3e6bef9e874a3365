"""Append-only JSONL results cache keyed by (policy, example id).

``verl-evidence eval`` writes one line per finished example and flushes it, so
an interrupted run loses at most the example in flight; the next run loads the
file, skips what is done and appends the rest. A torn last line (the process
died mid-write) is ignored with a warning instead of failing the resume.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from verl_evidence.eval.records import EvalRecord

logger = logging.getLogger(__name__)

__all__ = ["ResultsCache"]

CacheKey = tuple[str, str]


class ResultsCache:
    """Finished :class:`EvalRecord` s on disk, one JSON object per line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._records: dict[CacheKey, EvalRecord] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        with self.path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    record = EvalRecord.from_json(json.loads(line))
                except (ValueError, TypeError) as err:
                    logger.warning("%s:%d: skipping unreadable cache line (%s)", self.path, lineno, err)
                    continue
                self._records[(record.policy, record.example_id)] = record  # later lines win

    def __contains__(self, key: CacheKey) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def get(self, policy: str, example_id: str) -> EvalRecord | None:
        return self._records.get((policy, example_id))

    def records(self, policy: str | None = None) -> list[EvalRecord]:
        return [r for (p, _), r in self._records.items() if policy is None or p == policy]

    def __iter__(self) -> Iterator[EvalRecord]:
        return iter(list(self._records.values()))

    def add(self, record: EvalRecord) -> None:
        """Store ``record`` in memory and append it to the file (flushed and fsynced)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record.to_json(), ensure_ascii=False)
        with self.path.open("a", encoding="utf-8") as fh:
            if fh.tell() > 0 and not self._ends_with_newline():
                fh.write("\n")  # a torn line from a crash must not swallow this record
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self._records[(record.policy, record.example_id)] = record

    def _ends_with_newline(self) -> bool:
        with self.path.open("rb") as fh:
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) == b"\n"
