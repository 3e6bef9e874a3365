"""The one JSON Lines reader: QA sets, corpora, rows and trajectories, for every package of the project.

It lives in ``retrieval_server`` because that package never imports ``verl_evidence`` (the server runs with
its own dependencies), while ``verl_evidence`` already imports ``retrieval_server`` (``batching``, ``client``):
here both can use it without a cycle. Standard library only.

Each caller passes its own error class (``DataPrepError``, ``CorpusFormatError`` ...), so the one-line error
handling of its command line catches what this reader refuses: a missing file, a parquet file given as JSON,
a line that is not UTF-8 or not a JSON object (by file and line number), an empty file, and, for a corpus,
a passage without a text ``id`` and ``contents``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PARQUET_MAGIC = b"PAR1"
# What a corpus line must hold, as the errors name it.
PASSAGE_SHAPE = '{"id", "contents"}'


class JsonlError(ValueError):
    """A JSON Lines file this reader refuses; the message names the file and line."""


def iter_jsonl(
    path: str | Path, error: type[ValueError] = JsonlError, shape: str | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` per non-blank line, streamed (a corpus may be larger than memory).

    ``shape`` (e.g. ``PASSAGE_SHAPE``) names what a line must hold in the errors of a line that is not one.
    """
    path = Path(path)
    if not path.exists():
        raise error(f"{path}: no such file")
    expected = f"expected {shape} JSON" if shape else "expected a JSON object per line"
    rows = 0
    with path.open("rb") as handle:  # a directory raises IsADirectoryError here, which names the path
        if handle.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC:
            raise error(f"{path}: a parquet file, not JSON lines: name it .parquet")
        handle.seek(0)
        for line_number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise error(
                    f"{path}:{line_number}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1})"
                ) from err
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                reason = f"not valid JSON ({err.msg})"
                raise error(f"{path}:{line_number}: {f'{expected} ({reason})' if shape else reason}") from err
            if not isinstance(row, dict):
                raise error(f"{path}:{line_number}: {expected}")
            rows += 1
            yield line_number, row
    if not rows:
        raise error(f"{path}: no rows")


def read_jsonl(path: str | Path, error: type[ValueError] = JsonlError) -> list[dict[str, Any]]:
    """All objects of a JSON Lines file, in file order (see :func:`iter_jsonl` for what is refused)."""
    return [row for _, row in iter_jsonl(path, error)]


def iter_passages(path: str | Path, error: type[ValueError] = JsonlError) -> Iterator[tuple[int, str, str]]:
    """``(line number, id, contents)`` per passage of a FlashRAG corpus (``{"id", "contents": "Title\\ntext"}``).

    An id may be a number (read as its text); a missing or null id or contents, or contents that are not
    text, is refused by line. Duplicate ids are the caller's to refuse (a dict, or the docstore's hashes).
    """
    for line_number, row in iter_jsonl(path, error, shape=PASSAGE_SHAPE):
        where = f"{path}:{line_number}"
        missing = [column for column in ("id", "contents") if row.get(column) is None]
        if missing:
            raise error(f"{where}: expected {PASSAGE_SHAPE} JSON ({' and '.join(missing)} missing or null)")
        passage_id, contents = row["id"], row["contents"]
        if isinstance(passage_id, bool) or not isinstance(passage_id, (str, int)):
            raise error(f"{where}: 'id' must be a string, got {type(passage_id).__name__}")
        if not isinstance(contents, str):
            raise error(f"{where}: 'contents' must be a string")
        yield line_number, str(passage_id), contents
