"""Adopting an index built the way Search-R1 builds one, serving it, and refusing wrong declarations.

The index is made here as Search-R1's ``index_builder.py`` makes ``e5_Flat.index``:
raw transformers, ``passage: `` prefix, mean over the attention mask, L2
normalisation, ``faiss.IndexFlatIP``, a ``{"id", "contents": "\\"Title\\"\\ntext"}``
JSONL corpus. The packaged MiniLM stands in for e5-base-v2 (no hub access). None
of our own encoder code is involved in building it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from retrieval_server.adopt import AdoptionError, adopt_index, index_factory_of
from retrieval_server.config import EncoderConfig, packaged_minilm_path
from verl_evidence.bundled import corpus_path as bundled_corpus_path
from verl_evidence.bundled import qa_path as bundled_qa_path

pytestmark = [pytest.mark.longest_first(6), pytest.mark.one_worker_group]
PASSAGES = 64  # MiniLM encodes ~34 passages/s on 2 cores
SAMPLE = 16


def _search_r1_encode(texts: list[str], prefix: str) -> np.ndarray:
    """Search-R1's encoding: tokenise with the prefix, masked mean of the last hidden state, L2-normalise."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(packaged_minilm_path())
    model = AutoModel.from_pretrained(packaged_minilm_path()).eval()
    out = []
    with torch.no_grad():
        for start in range(0, len(texts), 16):
            batch = tokenizer(
                [prefix + t for t in texts[start : start + 16]],
                padding=True,
                truncation=True,
                max_length=256,
                return_tensors="pt",
            )
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"][..., None].bool()
            pooled = hidden.masked_fill(~mask, 0.0).sum(dim=1) / mask.sum(dim=1)
            out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
    return np.concatenate(out).astype(np.float32)


def write_search_r1_corpus(path: Path, passages: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": str(i), "contents": text}) + "\n" for i, text in enumerate(passages)))
    return path


def write_flat_ip(path: Path, vectors: np.ndarray) -> Path:
    import faiss

    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(path))
    return path


def search_r1_declaration(**changes) -> EncoderConfig:
    """What a user of Search-R1's e5 index declares (with MiniLM in e5's place)."""
    declared = EncoderConfig(
        model=packaged_minilm_path(), pooling="mean", query_prefix="query: ", passage_prefix="passage: ", max_length=256
    )
    return declared.model_copy(update=changes)


@pytest.fixture(scope="module")
def search_r1_index(tmp_path_factory) -> dict:
    """``e5_Flat.index`` + ``wiki-18.jsonl`` lookalikes of the first bundled passages, and their vectors."""
    root = tmp_path_factory.mktemp("search-r1")
    passages = []
    with open(bundled_corpus_path(), encoding="utf-8") as handle:
        for line in list(handle)[:PASSAGES]:
            title, text = json.loads(line)["contents"].split("\n", 1)
            passages.append(f'"{title}"\n{text}')  # wiki-18 quotes the title
    vectors = _search_r1_encode(passages, "passage: ")
    return {
        "root": root,
        "corpus": write_search_r1_corpus(root / "wiki-18.jsonl", passages),
        "index": write_flat_ip(root / "e5_Flat.index", vectors),
        "vectors": vectors,
    }


@pytest.fixture(scope="module")
def make_encoder():
    """SentenceEncoders by declaration, loaded once per module (each load costs seconds on 2 cores)."""
    from retrieval_server.encoders import SentenceEncoder

    cache: dict[str, SentenceEncoder] = {}

    def make(config: EncoderConfig):
        key = config.model_dump_json()
        if key not in cache:
            cache[key] = SentenceEncoder(config, device="cpu")
        return cache[key]

    return make


@pytest.fixture(scope="module")
def adopted(search_r1_index, make_encoder) -> Path:
    output = search_r1_index["root"] / "adopted"
    adopt_index(
        search_r1_index["index"],
        search_r1_index["corpus"],
        output,
        search_r1_declaration(),
        sample=SAMPLE,
        show_progress=False,
        make_encoder=make_encoder,
    )
    return output


@pytest.mark.slow
def test_adopt_verifies_and_writes_a_manifest(adopted, search_r1_index):
    from retrieval_server.docstore import DocumentStore

    manifest = json.loads((adopted / "manifest.json").read_text())
    assert manifest["count"] == PASSAGES and manifest["dim"] == 384
    assert manifest["index"] == {
        "factory": "Flat",
        "metric": "inner_product",
        "file": "dense.faiss",
        "ntotal": PASSAGES,
    }
    # The served files' checksums; the linked index's are its target's.
    assert manifest["version"] == 3 and set(manifest["files"]) == {"docstore.arrow", "dense.faiss"}
    assert manifest["files"]["dense.faiss"]["size"] == search_r1_index["index"].stat().st_size
    assert manifest["encoder"]["passage_prefix"] == "passage: " and manifest["encoder"]["query_prefix"] == "query: "
    assert manifest["encoder"]["pooling"] == "mean" and manifest["encoder"]["fingerprint"].startswith("sha256:")
    verification = manifest["adopted"]["verification"]
    assert verification["matched"] == verification["sampled_rows"] == SAMPLE and verification["method"] == "reconstruct"
    assert verification["cosine_min"] > 0.9999  # our encoder reproduces Search-R1's vectors
    # The index is linked, not copied; the docstore holds the corpus in order.
    assert (adopted / "dense.faiss").is_symlink() and (adopted / "dense.faiss").resolve() == search_r1_index[
        "index"
    ].resolve()
    store = DocumentStore(adopted / "docstore.arrow")
    assert store.ids() == [str(i) for i in range(PASSAGES)]
    assert store.lookup_one(5)["contents"].startswith('"')


@pytest.mark.slow
def test_adopted_index_serves_the_brute_force_top_k(adopted, search_r1_index, retrieval_server):
    """Through Ray Serve (a second app on the session's Serve): same ids and scores as numpy over the stored vectors."""
    from retrieval_server.client import RetrievalClient
    from retrieval_server.config import ServerConfig
    from retrieval_server.launch import start_server
    from retrieval_server.recall import load_qa

    questions = [q["question"] for q in load_qa(bundled_qa_path())[:12]]
    expected_scores = _search_r1_encode(questions, "query: ") @ search_r1_index["vectors"].T
    handle = start_server(
        ServerConfig(index_dir=adopted, app_name="retrieval-adopted", route_prefix="/adopted", max_batch_size=8)
    )
    try:
        assert not handle.owns_serve
        with RetrievalClient(handle.url) as client:
            results = client.retrieve(questions, topk=5)
            assert client.health()["index_size"] == PASSAGES
    finally:
        handle.shutdown()
    for scores, hits in zip(expected_scores, results):
        got = [int(hit["document"]["id"]) for hit in hits]
        want = np.argsort(-scores, kind="stable")[:5]
        np.testing.assert_allclose([hit["score"] for hit in hits], scores[want], atol=1e-4)
        # Equal ids, except where two passages score the same to 1e-5 (their order is then arbitrary).
        for rank, (g, w) in enumerate(zip(got, want)):
            assert g == w or abs(scores[g] - scores[w]) < 1e-5, f"rank {rank}: server {g}, brute force {w}"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"passage_prefix": ""}, "passage_prefix='passage: ' (declared '')"),
        ({"pooling": "cls"}, "pooling='mean' (declared 'cls')"),
        ({"normalize": False}, "normalize=True (declared False)"),
    ],
    ids=["prefix", "pooling", "normalize"],
)
def test_wrong_declaration_is_refused_naming_the_setting(search_r1_index, make_encoder, tmp_path, changes, named):
    with pytest.raises(AdoptionError) as info:
        adopt_index(
            search_r1_index["index"], search_r1_index["corpus"], tmp_path / "idx", search_r1_declaration(**changes),
            sample=SAMPLE, show_progress=False, make_encoder=make_encoder,
        )  # fmt: skip
    message = str(info.value)
    assert str(search_r1_index["index"]) in message and "do not match their stored vectors" in message
    assert named in message, message
    assert "cosine min" in message and "re-run with --" in message
    assert not (tmp_path / "idx" / "manifest.json").exists()


@pytest.fixture(scope="module")
def random_bert(tmp_path_factory):
    """Random-weight BERTs with MiniLM's vocabulary: a 'wrong model' of the right (384) and a wrong (256) width."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(packaged_minilm_path())
    paths = {}
    for hidden in (384, 256):
        directory = tmp_path_factory.mktemp(f"bert{hidden}")
        torch.manual_seed(0)
        config = BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=hidden,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=256,
        )
        BertModel(config).save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        paths[hidden] = str(directory)
    return paths


@pytest.mark.slow
def test_wrong_model_is_refused(search_r1_index, make_encoder, random_bert, tmp_path):
    with pytest.raises(AdoptionError) as info:
        adopt_index(
            search_r1_index["index"],
            search_r1_index["corpus"],
            tmp_path / "idx",
            search_r1_declaration(model=random_bert[384]),
            sample=SAMPLE,
            show_progress=False,
            make_encoder=make_encoder,
        )
    message = str(info.value)
    assert "do not match their stored vectors" in message and "another model" in message, message
    assert "0/16 sampled passages match" in message

    with pytest.raises(AdoptionError, match=r"makes 256-d vectors but index .*e5_Flat.index holds 384-d"):
        adopt_index(
            search_r1_index["index"],
            search_r1_index["corpus"],
            tmp_path / "idx",
            search_r1_declaration(model=random_bert[256]),
            sample=SAMPLE,
            show_progress=False,
            make_encoder=make_encoder,
        )


@pytest.mark.slow
def test_corpus_shifted_by_one_line_is_refused(search_r1_index, make_encoder, tmp_path):
    """Same row count, rows off by one (a header line, a dropped passage): named as misaligned rows."""
    lines = search_r1_index["corpus"].read_text().splitlines(keepends=True)
    shifted = tmp_path / "shifted.jsonl"
    shifted.write_text(lines[-1] + "".join(lines[:-1]))
    with pytest.raises(AdoptionError) as info:
        adopt_index(
            search_r1_index["index"],
            shifted,
            tmp_path / "idx",
            search_r1_declaration(),
            sample=SAMPLE,
            show_progress=False,
            make_encoder=make_encoder,
        )
    assert "0/16 sampled passages match" in str(info.value)
    pairs = [(int(a), int(b)) for a, b in re.findall(r"passage (\d+) is vector (\d+)", str(info.value))]
    assert "rows do not line up" in str(info.value) and pairs, str(info.value)
    assert all(vector == (passage - 1) % PASSAGES for passage, vector in pairs)


# Row counts and index files are checked before any model is loaded: fast tier.


@pytest.fixture()
def random_flat(tmp_path) -> dict:
    vectors = np.random.default_rng(0).standard_normal((10, 8)).astype(np.float32)
    corpus = write_search_r1_corpus(tmp_path / "corpus.jsonl", [f'"T{i}"\npassage {i}' for i in range(10)])
    return {"index": write_flat_ip(tmp_path / "flat.index", vectors), "corpus": corpus, "root": tmp_path}


def _refuse_model(config):
    raise AssertionError("no model should be loaded before the row counts are checked")


@pytest.mark.parametrize("rows", [9, 11])
def test_row_count_mismatch_names_both_files(random_flat, rows):
    corpus = write_search_r1_corpus(random_flat["root"] / f"c{rows}.jsonl", [f"p{i}" for i in range(rows)])
    with pytest.raises(AdoptionError) as info:
        adopt_index(
            random_flat["index"],
            corpus,
            random_flat["root"] / "out",
            search_r1_declaration(),
            show_progress=False,
            make_encoder=_refuse_model,
        )
    message = str(info.value)
    assert str(corpus) in message and str(random_flat["index"]) in message and "10 vectors" in message
    assert not (random_flat["root"] / "out" / "manifest.json").exists()
    assert not (random_flat["root"] / "out" / "docstore.tmp").exists()


def test_l2_index_and_missing_files_are_refused(random_flat):
    import faiss

    l2 = random_flat["root"] / "l2.index"
    index = faiss.IndexFlatL2(8)
    index.add(np.zeros((10, 8), dtype=np.float32))
    faiss.write_index(index, str(l2))
    with pytest.raises(AdoptionError, match="inner-product"):
        adopt_index(
            l2,
            random_flat["corpus"],
            random_flat["root"] / "out",
            search_r1_declaration(),
            show_progress=False,
            make_encoder=_refuse_model,
        )
    with pytest.raises(AdoptionError, match="does not exist"):
        adopt_index(
            random_flat["root"] / "nope.index",
            random_flat["corpus"],
            random_flat["root"] / "out",
            search_r1_declaration(),
            make_encoder=_refuse_model,
        )


def test_cli_adopt_reports_row_mismatch_without_traceback(random_flat):
    from typer.testing import CliRunner

    from retrieval_server.cli import app

    corpus = write_search_r1_corpus(random_flat["root"] / "c9.jsonl", [f"p{i}" for i in range(9)])
    result = CliRunner().invoke(
        app,
        [
            "adopt",
            "--index",
            str(random_flat["index"]),
            "--corpus",
            str(corpus),
            "-o",
            str(random_flat["root"] / "out"),
            "--model",
            packaged_minilm_path(),
        ],
    )
    assert result.exit_code == 2
    assert "holds 9 passages but index" in result.output and "Traceback" not in result.output


# Convert: the adopted Flat index to smaller/faster types, without the model.


@pytest.fixture(scope="module")
def converted(adopted, search_r1_index) -> dict:
    from retrieval_server.convert import convert_index

    root = search_r1_index["root"]
    return {
        target: convert_index(
            adopted,
            root / f"conv-{target.replace(',', '_')}",
            target,
            recall_queries=PASSAGES,
            k=10,
            show_progress=False,
        )
        for target in ("fp16", "sq8", "hnsw", "IVF4,PQ16x4")
    }


@pytest.mark.slow
def test_convert_reports_recall_against_flat(converted, adopted):
    from retrieval_server.index import verify_index

    fp16, sq8, hnsw, ivfpq = (converted[t] for t in ("fp16", "sq8", "hnsw", "IVF4,PQ16x4"))
    assert (fp16["index"]["factory"], sq8["index"]["factory"], hnsw["index"]["factory"]) == (
        "SQfp16",
        "SQ8",
        "HNSW32,Flat",
    )
    assert fp16["converted"]["recall"][0]["recall@10"] >= 0.99  # fp16 rounding changes no neighbour sets here
    assert sq8["converted"]["recall"][0]["recall@10"] >= 0.9
    # The sweep doubles efSearch / nprobe until recall@10 reaches 0.95, and the index is served at that setting.
    hnsw_sweep = hnsw["converted"]["recall"]
    assert hnsw_sweep[-1]["recall@10"] >= 0.95 > max([0, *(r["recall@10"] for r in hnsw_sweep[:-1])])
    assert hnsw["index"]["search_params"] == hnsw_sweep[-1]["search_params"]
    sweep = ivfpq["converted"]["recall"]
    assert [r["search_params"] for r in sweep] == ["nprobe=1", "nprobe=2", "nprobe=4"][: len(sweep)]
    assert sweep[-1]["recall@10"] >= sweep[0]["recall@10"] and 0 < sweep[-1]["recall@10"] < 1  # 4-bit PQ is lossy
    assert ivfpq["index"]["search_params"] in [r["search_params"] for r in sweep]
    assert (fp16["index"]["search_params"], [r["search_params"] for r in fp16["converted"]["recall"]]) == ("", [""])
    flat_bytes = fp16["converted"]["source_index_bytes"]
    assert fp16["converted"]["index_bytes"] < 0.55 * flat_bytes and sq8["converted"]["index_bytes"] < 0.3 * flat_bytes
    corpus = json.loads((adopted / "manifest.json").read_text())["corpus"]
    assert all(m["count"] == PASSAGES and m["corpus"] == corpus and m["shards"] is None for m in converted.values())
    out = adopted.parent / "conv-hnsw"
    verify_index(out)  # the serve path's check accepts the new directory
    assert hnsw["converted"]["shared"]["docstore"] == "hardlink"
    assert (out / "docstore.arrow").stat().st_ino == (adopted / "docstore.arrow").stat().st_ino


@pytest.mark.slow
def test_converted_index_serves_memory_mapped(converted, adopted, search_r1_index, retrieval_server):
    """The fp16 conversion through Ray Serve, its index memory-mapped: the Flat index's top-k."""
    from retrieval_server.client import RetrievalClient
    from retrieval_server.config import ServerConfig
    from retrieval_server.launch import start_server
    from retrieval_server.recall import load_qa

    questions = [q["question"] for q in load_qa(bundled_qa_path())[:8]]
    expected_scores = _search_r1_encode(questions, "query: ") @ search_r1_index["vectors"].T
    out = search_r1_index["root"] / "conv-fp16"
    handle = start_server(
        ServerConfig(index_dir=out, app_name="retrieval-fp16", route_prefix="/fp16", mmap_index=True, max_batch_size=8)
    )
    try:
        with RetrievalClient(handle.url) as client:
            results = client.retrieve(questions, topk=3)
            assert client.health()["index_type"] == "SQfp16"
    finally:
        handle.shutdown()
    for scores, hits in zip(expected_scores, results):
        want = np.argsort(-scores, kind="stable")[:3]
        got = [int(hit["document"]["id"]) for hit in hits]
        for g, w in zip(got, want):
            assert g == w or abs(scores[g] - scores[w]) < 1e-3  # fp16 storage: scores to ~1e-3
        np.testing.assert_allclose([hit["score"] for hit in hits], scores[want], atol=2e-3)


def test_convert_refuses_a_non_flat_source(tmp_path):
    import faiss

    from retrieval_server.convert import convert_index
    from retrieval_server.index import IndexMismatchError

    # A hand-made index directory around an HNSW index (verify_index only needs the files and manifest).
    vectors = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    index = faiss.index_factory(8, "HNSW8", faiss.METRIC_INNER_PRODUCT)
    index.add(vectors)
    source = tmp_path / "src"
    source.mkdir()
    faiss.write_index(index, str(source / "dense.faiss"))
    corpus = write_search_r1_corpus(tmp_path / "c.jsonl", [f"p{i}" for i in range(50)])
    from retrieval_server.docstore import file_sha256, write_docstore
    from retrieval_server.encoders import describe
    from retrieval_server.index import record_checksums

    write_docstore(corpus, source / "docstore.arrow")
    manifest = {
        "version": 2,
        "corpus": {"path": str(corpus), "sha256": file_sha256(corpus), "size": corpus.stat().st_size},
        "count": 50,
        "encoder": describe(search_r1_declaration(), 8),
        "dim": 8,
        "docstore": "docstore.arrow",
        "bm25": None,
        "index": {"factory": "HNSW8", "metric": "inner_product", "file": "dense.faiss", "ntotal": 50},
    }
    (source / "manifest.json").write_text(json.dumps(record_checksums(source, manifest)))
    with pytest.raises(IndexMismatchError, match="convert reads exact vectors from a Flat index"):
        convert_index(source, tmp_path / "out", "sq8", show_progress=False)


def _clustered(n: int, d: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((32, d)).astype(np.float32)
    vectors = centres[rng.integers(0, 32, n)] + 0.3 * rng.standard_normal((n, d)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_convert_serves_ivf_at_the_smallest_nprobe_reaching_the_target_and_summarises_faiss(capfd, caplog):
    import faiss

    from retrieval_server.convert import convert_flat

    source = faiss.IndexFlatIP(16)
    source.add(_clustered(1000, 16))
    with caplog.at_level("WARNING"):
        index, tuning, _ = convert_flat(source, "IVF8,PQ4x4", train_sample=500, recall_queries=64, k=10)
    rows = tuning["recall"]
    reached = [r["search_params"] for r in rows if r["recall@10"] >= 0.95]
    if reached:  # the sweep stops at the first setting reaching the target, and serves it
        assert tuning["search_params"] == reached[0] == rows[-1]["search_params"]
    else:  # PQ4's codes cap the recall: the smallest setting within 0.005 of the best
        best = max(r["recall@10"] for r in rows)
        assert tuning["search_params"] == next(r["search_params"] for r in rows if r["recall@10"] >= best - 0.005)
    assert [r["search_params"] for r in rows] == [f"nprobe={2**i}" for i in range(len(rows))]
    assert faiss.extract_index_ivf(index).nprobe == int(tuning["search_params"].split("=")[1])  # the file's default
    # 4-bit PQ codebooks trained on 500 vectors: k-means warns once per sub-quantiser. One line, counted, not four.
    assert "clustering 500 points to 16 centroids" not in capfd.readouterr().err
    (summary,) = [r.getMessage() for r in caplog.records if "clustering" in r.getMessage()]
    assert "(4 times)" in summary and "raise --train-sample" in summary


def test_a_search_setting_list_is_measured_as_given_and_the_first_reaching_the_target_served():
    import faiss

    from retrieval_server.search_params import choose_search_params

    vectors = _clustered(2000, 16, seed=1)
    index = faiss.index_factory(16, "IVF16,Flat", faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    exact = faiss.IndexFlatIP(16)
    exact.add(vectors)
    _, truth = exact.search(vectors[:50], 11)
    tuning = choose_search_params(index, vectors[:50], truth, 10, exclude=np.arange(50), settings=["nprobe=16"])
    assert tuning["search_params"] == "nprobe=16" and tuning["recall"][0]["recall@10"] == 1.0  # every list: exact
    assert index.nprobe == 16


def test_ivf_pq_preset_sizes_from_the_index():
    from retrieval_server.convert import ivf_pq_factory, resolve_factory

    assert ivf_pq_factory(21_000_000, 768) == "IVF16384,PQ96"  # 4*sqrt(21M) = 18330 -> 2^14
    assert ivf_pq_factory(200_000, 384) == "IVF2048,PQ48"
    assert ivf_pq_factory(1_000, 100) == "IVF16,PQ10"  # a power of two of at most n/39 lists; m divides the dim
    assert resolve_factory("fp16", 10, 8) == "SQfp16" and resolve_factory("IVF8,Flat", 10, 8) == "IVF8,Flat"


def test_mmap_reading_shares_pages_instead_of_copying(tmp_path):
    """A memory-mapped Flat index answers like a read one while its vectors stay file-backed (page cache).

    Measured in a fresh interpreter: inside a long test session, freed memory the
    allocator still holds can absorb a 30 MB load without RssAnon growing.
    """
    vectors = np.random.default_rng(1).standard_normal((60_000, 128)).astype(np.float32)  # 30.7 MB
    path = write_flat_ip(tmp_path / "flat.index", vectors)
    del vectors
    probe = f"""
import json, numpy as np
from retrieval_server.index import read_dense_index

def anon_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("RssAnon:"))

import faiss
queries = np.random.default_rng(2).standard_normal((5, 128)).astype(np.float32)
warm = faiss.IndexFlatIP(128)  # first-search set-up (thread pools, buffers) is not what is measured
warm.add(queries)
warm.search(queries, 5)
before = anon_mb()
mapped = read_dense_index({str(path)!r}, mmap=True)
mapped_ids = mapped.search(queries, 5)[1]
mapped_growth = anon_mb() - before
before = anon_mb()
loaded = read_dense_index({str(path)!r})
loaded_ids = loaded.search(queries, 5)[1]
loaded_growth = anon_mb() - before
print(json.dumps({{"same": bool((mapped_ids == loaded_ids).all()), "mapped": mapped_growth, "loaded": loaded_growth}}))
"""
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert measured["same"]
    assert measured["loaded"] > 25 and measured["mapped"] < 5, measured


# The comparison rule on synthetic vectors (no model): exact codes, lossy codes, no reconstruction at all.


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def unit_vectors() -> np.ndarray:
    return _unit(np.random.default_rng(0).standard_normal((2000, 32)))


def _nudged(vectors: np.ndarray, cosine: float) -> np.ndarray:
    """Vectors turned away from ``vectors`` to about the given cosine (a wrong prefix measured ~0.99)."""
    noise = np.random.default_rng(1).standard_normal(vectors.shape)
    noise -= np.sum(noise * vectors, axis=1, keepdims=True) * vectors  # orthogonal part only
    return _unit(cosine * vectors + np.sqrt(1 - cosine**2) * _unit(noise))


@pytest.mark.parametrize(
    ("factory", "method"),
    [
        ("Flat", "reconstruct"),
        ("SQfp16", "reconstruct"),
        ("SQ8", "requantize"),
        ("IVF8,PQ8x4", "requantize"),
        ("HNSW16,Flat", "reconstruct"),
    ],
)
def test_compare_accepts_own_vectors_and_refuses_a_near_miss(unit_vectors, factory, method):
    import faiss

    from retrieval_server.adopt import compare

    index = faiss.index_factory(32, factory, faiss.METRIC_INNER_PRODUCT)
    index.train(unit_vectors)
    index.add(unit_vectors)
    rows = np.arange(0, 2000, 50)
    right = compare(index, rows, unit_vectors[rows])
    assert right.passed and right.method == method, (min(right.cosines), right.method)
    near_miss = compare(index, rows, _nudged(unit_vectors[rows], 0.99))
    assert not near_miss.passed
    if not right.lossy:
        assert not any(near_miss.matched)
    # Lossy codes are coarser than a 0.99 nudge: some rows keep their code (12/40 measured for 8-bit PQ8),
    # which is why they need 90% of the sample rather than all of it, and why this check is weaker.
    unnormalised = compare(index, rows, 2.5 * unit_vectors[rows])  # same direction, other length
    assert not unnormalised.passed


def test_compare_falls_back_to_self_search_without_reconstruction(unit_vectors):
    import faiss

    from retrieval_server.adopt import compare

    index = faiss.IndexIDMap(faiss.IndexFlatIP(32))  # cannot reconstruct; ids = rows here
    index.add_with_ids(unit_vectors, np.arange(len(unit_vectors)))
    rows = np.arange(0, 2000, 50)
    right = compare(index, rows, unit_vectors[rows])
    assert right.method == "self-search" and right.passed
    assert not compare(index, rows, _nudged(unit_vectors[rows], 0.9)).passed


@pytest.mark.slow
def test_adopting_lossy_conversions_compares_codes(converted, search_r1_index, make_encoder, tmp_path):
    """SQ8 and IVF-PQ files (as FlashRAG users may have them): verified through the index's own codes."""
    for name in ("conv-sq8", "conv-IVF4_PQ16x4"):
        manifest = adopt_index(
            search_r1_index["root"] / name / "dense.faiss",
            search_r1_index["corpus"],
            tmp_path / name,
            search_r1_declaration(),
            sample=SAMPLE,
            show_progress=False,
            make_encoder=make_encoder,
        )
        verification = manifest["adopted"]["verification"]
        assert verification["method"] == "requantize" and verification["lossy_codes"] is True
        assert verification["matched"] >= 0.9 * SAMPLE
    with pytest.raises(AdoptionError, match="passage_prefix='passage: '"):
        adopt_index(
            search_r1_index["root"] / "conv-sq8" / "dense.faiss", search_r1_index["corpus"], tmp_path / "wrong",
            search_r1_declaration(passage_prefix=""), sample=SAMPLE, show_progress=False, make_encoder=make_encoder,
        )  # fmt: skip


def test_index_factory_of_names_what_faiss_cannot_reverse_by_class():
    import faiss

    assert index_factory_of(faiss.IndexFlatIP(8)) == "Flat"
    assert index_factory_of(faiss.IndexNSGFlat(8, 4)) == "IndexNSGFlat"  # faiss: NotImplementedError
    whitened = faiss.IndexPreTransform(faiss.PCAMatrix(8, 4, -0.5), faiss.IndexFlatIP(4))
    assert index_factory_of(whitened) == "IndexPreTransform"  # faiss: AssertionError on eigen_power
