"""Passages in an Arrow IPC file, memory-mapped: the server holds only the pages it touches.

Rows are in corpus order, so FAISS/BM25 row ids index the store directly. The file is a
sequence of record batches, each bounded in rows and in bytes, so that no batch's 32-bit
string offsets overflow however large the corpus (wiki-18 is ~14 GB of text). A lookup
takes from each batch it needs and never concatenates batches: a ``Table.take`` across
chunks would concatenate them, which fails past 2 GiB of text with ``string`` and copies
the whole column per call with ``large_string`` (benchmarks/scale.py measures both).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from retrieval_server.jsonl import iter_passages

logger = logging.getLogger(__name__)

SCHEMA = pa.schema([("id", pa.string()), ("contents", pa.string())])


class CorpusFormatError(ValueError):
    pass


def iter_corpus(path: Path) -> Iterator[tuple[str, str]]:
    """(id, contents) per line of a FlashRAG-style JSONL corpus; a bad line is an error naming file and line."""
    for _, doc_id, contents in iter_passages(path, CorpusFormatError):
        yield doc_id, contents


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# A batch closes at whichever limit comes first. 256 MiB keeps every string column far below the 2 GiB that
# 32-bit offsets address, while batches stay few (wiki-18: ~60) so that a lookup's per-batch work stays small.
ROWS_PER_BATCH = 65_536
BYTES_PER_BATCH = 256 << 20


def write_docstore(
    corpus: Path,
    destination: Path,
    rows_per_batch: int = ROWS_PER_BATCH,
    on_rows: Callable[[int], None] | None = None,
    bytes_per_batch: int = BYTES_PER_BATCH,
) -> int:
    """Stream the corpus into an uncompressed Arrow IPC file (mmap-able); returns the row count.

    A record batch is written when it reaches ``rows_per_batch`` rows or ``bytes_per_batch`` bytes of text.
    ``on_rows(n)`` is called after every batch with the rows written so far (a progress bar; it may raise to stop).
    A passage id that occurs twice is an error naming both rows.
    """
    tmp = destination.with_suffix(".tmp")
    count = 0
    id_hashes = _IdHashes()
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, SCHEMA) as writer:
        ids: list[str] = []
        texts: list[str] = []
        batch_bytes = 0

        def flush() -> None:
            nonlocal count, ids, texts, batch_bytes
            writer.write_batch(pa.record_batch([ids, texts], schema=SCHEMA))
            id_hashes.add(ids)
            count += len(ids)
            ids, texts, batch_bytes = [], [], 0
            if on_rows is not None:
                on_rows(count)

        for doc_id, contents in iter_corpus(corpus):
            ids.append(doc_id)
            texts.append(contents)
            batch_bytes += len(contents) + len(doc_id)  # characters: a lower bound of the UTF-8 bytes
            if len(ids) >= rows_per_batch or batch_bytes >= bytes_per_batch:
                flush()
        if ids:
            flush()
    duplicate = id_hashes.first_duplicate(DocumentStore(tmp))
    if duplicate is not None:
        tmp.unlink(missing_ok=True)
        doc_id, first, second = duplicate
        raise CorpusFormatError(f"{corpus}: duplicate passage id {doc_id!r} (passages {first} and {second})")
    tmp.replace(destination)
    return count


class _IdHashes:
    """64-bit hashes of every id written, to find a duplicate id in ~8 bytes per passage.

    A set of 21M Python strings would hold ~2 GB; sorted hashes hold 168 MB, and the few
    equal hashes are checked against the ids themselves, so a hash collision is never reported.
    """

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []

    def add(self, ids: list[str]) -> None:
        # Python's str hash is salted per process, which is fine: the hashes never leave this process.
        self._parts.append(np.fromiter(map(hash, ids), dtype=np.int64, count=len(ids)))

    def first_duplicate(self, store: DocumentStore) -> tuple[str, int, int] | None:
        """(id, first row, second row) of the earliest repeated id, or None."""
        if not self._parts:
            return None
        hashes = np.concatenate(self._parts)
        order = np.argsort(hashes, kind="stable")
        ordered = hashes[order]
        same_as_next = np.flatnonzero(ordered[1:] == ordered[:-1])
        if not len(same_as_next):
            return None
        found: tuple[str, int, int] | None = None
        for position in same_as_next:
            first, second = int(order[position]), int(order[position + 1])
            first_id, second_id = (d["id"] for d in store.lookup(np.array([first, second])))
            if first_id == second_id and (found is None or second < found[2]):
                found = (first_id, first, second)
        return found


class DocumentStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._source = pa.memory_map(str(self.path), "r")
        reader = pa.ipc.open_file(self._source)
        # Zero-copy views over the mapped file, one per record batch; never concatenated (see the module doc).
        self._batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        self._starts = np.cumsum([0] + [b.num_rows for b in self._batches], dtype=np.int64)
        # Per batch and column: the string offsets as a numpy view and the UTF-8 bytes as a memoryview, both over
        # the mapped file. A hit is then two offset reads and one decode: no Arrow call per hit or per batch, which
        # matters when 512 random hits touch 300+ batches of wiki-18 (pyarrow's take costs ~50 us a call).
        self._columns = [[_string_view(batch.column(i)) for batch in self._batches] for i in (0, 1)]

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def num_batches(self) -> int:
        return len(self._batches)

    def lookup(self, rows: np.ndarray) -> list[dict]:
        """Documents ``{"id", "contents"}`` for a flat array of row ids, in that order."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if not len(rows):
            return []
        if rows.min() < 0 or rows.max() >= len(self):
            raise IndexError(f"row ids must be in [0, {len(self)}) for {self.path}, got {rows.min()}..{rows.max()}")
        batch_of = np.searchsorted(self._starts, rows, side="right") - 1
        local = (rows - self._starts[batch_of]).tolist()
        ids, texts = self._columns
        return [
            {"id": _read(ids[batch], row), "contents": _read(texts[batch], row)}
            for batch, row in zip(batch_of.tolist(), local)
        ]

    def lookup_one(self, row: int) -> dict:
        """Single-row lookup; the naive baseline of the benchmark uses this per hit."""
        return self.lookup(np.array([row]))[0]

    def iter_ids(self) -> Iterator[list[str]]:
        """The passage ids, one list per record batch (all 21M of wiki-18 as one list would take ~1.5 GB)."""
        for batch in self._batches:
            yield batch.column(0).to_pylist()

    def ids(self) -> list[str]:
        """Every passage id as one list: for small stores and tests; large callers use :meth:`iter_ids`."""
        return [doc_id for ids in self.iter_ids() for doc_id in ids]


def _string_view(array: pa.Array) -> tuple[np.ndarray, memoryview] | pa.Array:
    """(offsets, UTF-8 bytes) of a string column, both views over its buffers; the array itself if it has nulls."""
    if array.null_count:  # never written by write_docstore; read through Arrow so a null stays None
        return array
    _, offsets, data = array.buffers()
    dtype = np.int64 if pa.types.is_large_string(array.type) else np.int32
    view = np.frombuffer(offsets, dtype=dtype)[array.offset : array.offset + len(array) + 1]
    return view, memoryview(data) if data is not None else memoryview(b"")


def _read(column: tuple[np.ndarray, memoryview] | pa.Array, row: int) -> str | None:
    if isinstance(column, pa.Array):
        return column[row].as_py()
    offsets, data = column
    return str(data[offsets[row] : offsets[row + 1]], "utf-8")
