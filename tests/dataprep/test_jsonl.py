"""The one JSON Lines reader (retrieval_server.jsonl): every package reads QA sets and corpora through it,
so every package refuses the same bad input with the same message."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrieval_server import docstore, recall
from retrieval_server.docstore import CorpusFormatError
from retrieval_server.jsonl import JsonlError, iter_passages, read_jsonl
from verl_evidence import bundled
from verl_evidence.dataprep.records import DataPrepError, read_corpus
from verl_evidence.eval.datasets import load_rows
from verl_evidence.evipath.records import load_corpus_file, load_records


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "no rows"),
        (b"\n  \n", "no rows"),
        (b'{"id": "a"}\n[1, 2]\n', ":2: expected a JSON object per line"),
        (b'{"id": "a"}\n{broken\n', ":2: not valid JSON"),
        (b'{"id": "\xe9"}\n', r":1: not UTF-8 text \(byte 0xe9 at column 9\)"),
        (b"PAR1....", "a parquet file, not JSON lines"),
    ],
)
def test_every_reader_refuses_bad_lines_by_file_and_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = write(tmp_path / "qa.jsonl", content)
    with pytest.raises(JsonlError, match=message):
        read_jsonl(path)
    with pytest.raises(DataPrepError, match=message):
        load_rows(path)  # the evaluation's row files
    with pytest.raises(DataPrepError, match=message):
        load_records(path, "musique")  # EviPath's datasets
    with pytest.raises(JsonlError, match=message):
        recall.load_qa(path)  # the server's recall@k


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(JsonlError, match=r"missing.jsonl: no such file"):
        read_jsonl(tmp_path / "missing.jsonl")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": null, "contents": "T\\nx"}', r':2: expected \{"id", "contents"\} JSON \(id missing or null\)'),
        ('{"contents": "T\\nx"}', r"id missing or null"),
        ('{"id": "b"}', r"contents missing or null"),
        ('{"id": true, "contents": "T\\nx"}', r":2: 'id' must be a string, got bool"),
        ('{"id": "b", "contents": 3}', r":2: 'contents' must be a string"),
        ("{not json", r':2: expected \{"id", "contents"\} JSON \(not valid JSON'),
    ],
)
def test_corpus_readers_refuse_the_same_passages(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path / "corpus.jsonl", '{"id": "a", "contents": "A\\ntext"}\n' + line + "\n")
    for error, read in (
        (DataPrepError, read_corpus),
        (DataPrepError, load_corpus_file),
        (CorpusFormatError, lambda p: list(docstore.iter_corpus(p))),
    ):
        with pytest.raises(error, match=message):
            read(path)


def test_evipath_refuses_duplicate_passage_ids_as_data_prep_does(tmp_path: Path) -> None:
    passage = '{"id": "p1", "contents": "A\\none"}\n'
    corpus = write(tmp_path / "corpus.jsonl", passage + passage)
    write(tmp_path / "qa.jsonl", '{"id": "q", "question": "Q?", "golden_answers": ["x"], "gold_evidence": ["one"]}\n')
    with pytest.raises(DataPrepError, match=r"corpus.jsonl:2: duplicate passage id 'p1'"):
        load_records(tmp_path / "qa.jsonl", "bundled", corpus_path=corpus)
    with pytest.raises(DataPrepError, match=r"corpus.jsonl:2: duplicate passage id 'p1'"):
        read_corpus(corpus)


def test_a_numeric_passage_id_is_read_as_its_text(tmp_path: Path) -> None:
    path = write(tmp_path / "corpus.jsonl", '{"id": 7, "contents": "A\\ntext"}\n')
    assert list(iter_passages(path)) == [(1, "7", "A\ntext")]
    assert list(docstore.iter_corpus(path)) == [("7", "A\ntext")]


def test_the_bundled_set_reads_through_the_shared_reader() -> None:
    assert bundled.load_qa() == read_jsonl(bundled.qa_path())
    assert {row["id"]: row["contents"] for row in bundled.load_corpus()} == read_corpus(bundled.corpus_path())
