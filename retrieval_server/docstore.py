"""Passages in an Arrow IPC file, memory-mapped: the server holds only the pages it touches.

Rows are in corpus order, so FAISS/BM25 row ids index the store directly and a
whole batch of hits is fetched with one ``take``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

logger = logging.getLogger(__name__)

SCHEMA = pa.schema([("id", pa.string()), ("contents", pa.string())])


class CorpusFormatError(ValueError):
    pass


def iter_corpus(path: Path) -> Iterator[tuple[str, str]]:
    """(id, contents) per line of a FlashRAG-style JSONL corpus; a bad line is an error naming file and line."""
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                doc_id, contents = record["id"], record["contents"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise CorpusFormatError(f"{path}:{line_number}: expected {{\"id\", \"contents\"}} JSON ({err})") from err
            if not isinstance(contents, str):
                raise CorpusFormatError(f"{path}:{line_number}: 'contents' must be a string")
            yield str(doc_id), contents


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def write_docstore(
    corpus: Path, destination: Path, rows_per_batch: int = 65_536, on_rows: Callable[[int], None] | None = None
) -> int:
    """Stream the corpus into an uncompressed Arrow IPC file (mmap-able); returns the row count.

    ``on_rows(n)`` is called after every batch with the rows written so far (a progress bar; it may raise to stop).
    """
    tmp = destination.with_suffix(".tmp")
    count = 0
    seen: set[str] = set()
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, SCHEMA) as writer:
        ids: list[str] = []
        texts: list[str] = []
        for doc_id, contents in iter_corpus(corpus):
            if doc_id in seen:
                raise CorpusFormatError(f"{corpus}: duplicate passage id {doc_id!r}")
            seen.add(doc_id)
            ids.append(doc_id)
            texts.append(contents)
            if len(ids) >= rows_per_batch:
                writer.write_batch(pa.record_batch([ids, texts], schema=SCHEMA))
                count += len(ids)
                ids, texts = [], []
                if on_rows is not None:
                    on_rows(count)
        if ids:
            writer.write_batch(pa.record_batch([ids, texts], schema=SCHEMA))
            count += len(ids)
            if on_rows is not None:
                on_rows(count)
    tmp.replace(destination)
    return count


class DocumentStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._source = pa.memory_map(str(self.path), "r")
        self.table = pa.ipc.open_file(self._source).read_all()  # zero-copy views over the mapped file

    def __len__(self) -> int:
        return self.table.num_rows

    def lookup(self, rows: np.ndarray) -> list[dict]:
        """Documents ``{"id", "contents"}`` for a flat array of row ids, in that order, in one take."""
        taken = self.table.take(pa.array(np.asarray(rows, dtype=np.int64)))
        return [{"id": i, "contents": c} for i, c in zip(taken.column("id").to_pylist(), taken.column("contents").to_pylist())]

    def lookup_one(self, row: int) -> dict:
        """Single-row lookup; the naive baseline of the benchmark uses this per hit."""
        return {"id": self.table.column("id")[row].as_py(), "contents": self.table.column("contents")[row].as_py()}

    def ids(self) -> list[str]:
        return self.table.column("id").to_pylist()
