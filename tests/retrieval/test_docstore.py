"""The passage store at any size: record batches bounded in rows and bytes, lookups that never concatenate them.

The slow test builds a store of more than 2 GiB of text (wiki-18 holds ~14 GB), the size at
which a ``Table.take`` over ``string`` columns fails with an offset overflow, and fetches
passages of several record batches in one call, directly and through ``/retrieve``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from retrieval_server.docstore import CorpusFormatError, DocumentStore, write_docstore

pytestmark = [pytest.mark.longest_first(5), pytest.mark.one_worker_group]


def write_corpus(path: Path, passages: list[tuple[str, str]]) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for doc_id, contents in passages:
            handle.write(json.dumps({"id": doc_id, "contents": contents}) + "\n")
    return path


@pytest.fixture
def many_batches(tmp_path) -> tuple[DocumentStore, list[tuple[str, str]]]:
    passages = [(f"doc-{i}", f"Title {i}\n" + "word " * (i % 7 + 1)) for i in range(100)]
    store_path = tmp_path / "docstore.arrow"
    write_docstore(
        write_corpus(tmp_path / "corpus.jsonl", passages), store_path, rows_per_batch=16, bytes_per_batch=200
    )
    return DocumentStore(store_path), passages


def test_batches_close_at_the_byte_bound_as_well_as_the_row_bound(many_batches):
    store, passages = many_batches
    assert len(store) == len(passages)
    # ~20 characters a passage: 200 bytes close a batch after ~10 rows, before the 16-row bound.
    assert store.num_batches >= len(passages) // 11


def test_lookup_across_batches_keeps_the_requested_order(many_batches):
    store, passages = many_batches
    rows = np.array([99, 0, 57, 57, 13, 42, 98, 1])
    got = store.lookup(rows)
    assert [(d["id"], d["contents"]) for d in got] == [passages[r] for r in rows]
    assert store.lookup_one(57) == {"id": passages[57][0], "contents": passages[57][1]}
    assert store.lookup(np.array([], dtype=np.int64)) == []


def test_ids_are_streamed_per_batch(many_batches):
    store, passages = many_batches
    batches = list(store.iter_ids())
    assert len(batches) == store.num_batches
    assert store.ids() == [doc_id for doc_id, _ in passages]


def test_lookup_outside_the_store_names_the_file(many_batches):
    store, _ = many_batches
    with pytest.raises(IndexError, match=r"\[0, 100\) for .*docstore\.arrow"):
        store.lookup(np.array([3, 100]))


def test_duplicate_id_names_both_passages_and_leaves_no_store(tmp_path):
    passages = [("a", "x"), ("b", "y"), ("c", "z"), ("b", "w"), ("a", "v")]
    corpus = write_corpus(tmp_path / "corpus.jsonl", passages)
    with pytest.raises(CorpusFormatError, match=r"duplicate passage id 'b' \(passages 1 and 3\)"):
        write_docstore(corpus, tmp_path / "docstore.arrow", rows_per_batch=2)
    assert not (tmp_path / "docstore.arrow").exists()
    assert not (tmp_path / "docstore.tmp").exists()


def test_equal_id_hashes_are_not_taken_for_duplicates(tmp_path, monkeypatch):
    """Hashes only propose candidates: two different ids with one hash are checked against the ids themselves."""
    import retrieval_server.docstore as docstore

    monkeypatch.setattr(docstore, "hash", lambda _value: 7, raising=False)
    corpus = write_corpus(tmp_path / "corpus.jsonl", [("a", "x"), ("b", "y"), ("c", "z")])
    assert write_docstore(corpus, tmp_path / "docstore.arrow") == 3


def test_stores_written_elsewhere_read_the_same(tmp_path):
    """A store another tool wrote: large_string columns, a sliced batch, a null: each read as Arrow reads it."""
    import pyarrow as pa

    schema = pa.schema([("id", pa.string()), ("contents", pa.large_string())])
    path = tmp_path / "docstore.arrow"
    first = pa.record_batch([["a", "b", "c", "d"], ["één", "", "x" * 70_000, "last"]], schema=schema)
    second = pa.record_batch([["e", "f"], ["ok", None]], schema=schema)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(first.slice(1, 3))
        writer.write_batch(second)
    store = DocumentStore(path)
    got = store.lookup(np.array([4, 0, 2, 1, 3]))
    assert [(d["id"], d["contents"]) for d in got] == [
        ("f", None),
        ("b", ""),
        ("d", "last"),
        ("c", "x" * 70_000),
        ("e", "ok"),
    ]


# --- more than 2 GiB of text --------------------------------------------------------------------------------------

# Nine rows of 260 MiB (2.4 GB in all) between short passages: each long row fills a record batch of its own, so the
# short passages lie in different batches. Few long rows keep it cheap: tokenising a passage costs its full length.
LONG_ROW_CHARS = 260 << 20  # above the store's 256 MiB batch bound: each long row closes a batch
LONG_ROWS = (2, 8, 14, 20, 26, 32, 38, 44, 47)
TOPICS = [
    "Mount Everest is the highest mountain above sea level, in the Himalayas.",
    "Plants turn light, water and carbon dioxide into sugar and oxygen by photosynthesis.",
    "Jazz is a music genre that began in New Orleans in the early twentieth century.",
    "The Great Barrier Reef off Australia is the largest coral reef system in the world.",
    "Penicillin, discovered by Alexander Fleming in 1928, was the first widely used antibiotic.",
]
ROWS = 49


def short_passage(row: int) -> str:
    return f"Passage {row}\n{TOPICS[row % len(TOPICS)]} (note {row})"


def long_passage_head(row: int) -> str:
    return f"Filler {row}\n"


def _long_row_line(row: int, filler: str) -> str:
    return json.dumps({"id": str(row), "contents": long_passage_head(row) + filler}) + "\n"


def test_long_rows_are_written_as_json_dumps_would_write_them():
    filler = ("zq " * 40)[:100]
    assert _long_row_line(2, "").removesuffix('"}\n') + filler + '"}\n' == _long_row_line(2, filler)


@pytest.fixture(scope="module")
def large_index(tmp_path_factory) -> dict:
    """A > 2 GiB corpus, a Flat index of its vectors, adopted as a user adopts wiki-18."""
    import faiss

    from retrieval_server.adopt import adopt_index, sample_rows
    from retrieval_server.config import EncoderConfig, packaged_minilm_path
    from retrieval_server.encoders import SentenceEncoder

    root = tmp_path_factory.mktemp("large-store")
    if shutil.disk_usage(root).free < 8 << 30:
        pytest.skip(f"needs ~5 GiB free under {root} for a > 2 GiB store")
    filler = ("zq " * (LONG_ROW_CHARS // 3 + 1))[:LONG_ROW_CHARS]
    corpus = root / "wiki-like.jsonl"
    heads = []
    with open(corpus, "wb") as handle:
        for row in range(ROWS):
            if row not in LONG_ROWS:
                heads.append(short_passage(row))
                handle.write((json.dumps({"id": str(row), "contents": short_passage(row)}) + "\n").encode())
                continue
            # json.dumps's line without building and escaping a 260 MB string per row (~20 s here): the filler's
            # letters and spaces need no escaping, so it goes between the head's JSON and the closing quote as is.
            heads.append((long_passage_head(row) + filler[:4096])[:4096])
            handle.write(_long_row_line(row, "").removesuffix('"}\n').encode())
            handle.write(filler.encode("ascii"))
            handle.write(b'"}\n')

    config = EncoderConfig(model=packaged_minilm_path(), pooling="mean", max_length=256)
    encoder = SentenceEncoder(config, device="cpu")
    # The encoder reads a passage's first 256 tokens: a long row's vector is its first 4 KB's vector.
    vectors = encoder.encode_passages(heads).astype(np.float32)
    flat = faiss.IndexFlatIP(vectors.shape[1])
    flat.add(vectors)
    faiss.write_index(flat, str(root / "flat.index"))
    # adopt re-encodes its sampled passages in full: a seed whose sample holds no 260 MiB row keeps that cheap.
    seed = next(s for s in range(1000) if not set(sample_rows(ROWS, 4, s).tolist()) & set(LONG_ROWS))
    output = root / "adopted"
    adopt_index(
        root / "flat.index", corpus, output, config, sample=4, seed=seed, show_progress=False,
        make_encoder=lambda _: encoder,
    )  # fmt: skip
    corpus.unlink()  # the store holds the text from here on
    yield {"dir": output, "filler": filler}
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_store_over_2_gib_fetches_rows_of_several_batches_in_one_call(large_index):
    store = DocumentStore(large_index["dir"] / "docstore.arrow")
    assert store.path.stat().st_size > 2 << 30
    assert store.num_batches >= len(LONG_ROWS)
    rows = np.array([48, 0, 20, 27, 3, 45, 1])
    got = store.lookup(rows)
    assert [d["id"] for d in got] == [str(r) for r in rows]
    for row, document in zip(rows, got):
        if row in LONG_ROWS:
            assert document["contents"] == long_passage_head(row) + large_index["filler"]
        else:
            assert document["contents"] == short_passage(row)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_served_store_over_2_gib_answers_retrieve_from_several_batches(large_index, retrieval_server):
    from retrieval_server.client import RetrievalClient
    from retrieval_server.config import ServerConfig
    from retrieval_server.launch import start_server

    handle = start_server(
        ServerConfig(
            index_dir=large_index["dir"],
            app_name="retrieval-large",
            route_prefix="/large",
            mmap_index=True,  # the encoder's ONNX export is linked in from the user cache: the replica loads no torch
        )
    )
    try:
        with RetrievalClient(handle.url) as client:
            results = client.retrieve(TOPICS, topk=5)
    finally:
        handle.shutdown()
    store = DocumentStore(large_index["dir"] / "docstore.arrow")
    for topic, hits in enumerate(results):
        rows = [int(hit["document"]["id"]) for hit in hits]
        # A topic's passages are every fifth row, one per record batch: five hits come from five batches.
        assert all(row % len(TOPICS) == topic and row not in LONG_ROWS for row in rows), rows
        assert len({int(np.searchsorted(store._starts, row, side="right")) for row in rows}) == 5, rows
        assert [hit["document"]["contents"] for hit in hits] == [short_passage(row) for row in rows]
