"""Index builder: shards, resumption, manifest, FAISS factories, and start-up refusal on mismatches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from retrieval_server.config import BuildConfig, EncoderConfig, ServerConfig, packaged_minilm_encoder
from retrieval_server.encoders import SentenceEncoder
from retrieval_server.index import IndexMismatchError, build_index, load_shard_embeddings, verify_index
from retrieval_server.search import Retriever

PASSAGES = [
    ("a1", "Nile\nThe Nile flows north through Egypt into the Mediterranean Sea."),
    ("a2", "Mount Kilimanjaro\nKilimanjaro is a dormant volcano in Tanzania and the highest peak in Africa."),
    ("a3", "Penicillin\nAlexander Fleming noticed in 1928 that a mould killed bacteria in a culture dish."),
    ("a4", "Canberra\nCanberra was chosen as the capital of Australia as a compromise between Sydney and Melbourne."),
    ("a5", "Saturn\nSaturn is the sixth planet from the Sun and is known for its bright rings."),
    ("a6", "Danube\nThe Danube passes through ten countries before reaching the Black Sea."),
    ("a7", "Marie Curie\nMarie Curie was the first person to win Nobel Prizes in two sciences."),
]


def write_corpus(path: Path, passages=PASSAGES) -> Path:
    path.write_text("".join(json.dumps({"id": i, "contents": c}) + "\n" for i, c in passages))
    return path


class CountingEncoder(SentenceEncoder):
    """The real MiniLM encoder, counting passages it encodes and optionally dying after some shards."""

    def __init__(self, fail_after_calls: int | None = None) -> None:
        super().__init__(packaged_minilm_encoder(), device="cpu")
        self.passages_encoded = 0
        self.calls = 0
        self.fail_after_calls = fail_after_calls

    def encode_passages(self, passages, batch_size=64):
        if self.fail_after_calls is not None and self.calls >= self.fail_after_calls:
            raise KeyboardInterrupt("simulated interruption")
        self.calls += 1
        self.passages_encoded += len(passages)
        return super().encode_passages(passages, batch_size)


@pytest.fixture(scope="module")
def encoder() -> CountingEncoder:
    return CountingEncoder()


@pytest.fixture(scope="module")
def small_index(tmp_path_factory, encoder) -> Path:
    root = tmp_path_factory.mktemp("small")
    config = BuildConfig(
        corpus=write_corpus(root / "corpus.jsonl"),
        output_dir=root / "index",
        encoder=packaged_minilm_encoder(),
        shard_size=3,
    )
    build_index(config, encoder=encoder, show_progress=False)
    return root / "index"


def test_manifest_records_the_build(small_index):
    manifest = json.loads((small_index / "manifest.json").read_text())
    assert manifest["count"] == len(PASSAGES) and manifest["dim"] == 384
    assert manifest["encoder"]["pooling"] == "mean" and manifest["encoder"]["normalize"] is True
    assert manifest["encoder"]["query_prefix"] == "" and manifest["encoder"]["passage_prefix"] == ""
    assert manifest["encoder"]["fingerprint"].startswith("sha256:")
    assert manifest["index"] == {
        "factory": "Flat",
        "metric": "inner_product",
        "file": "dense.faiss",
        "ntotal": len(PASSAGES),
    }
    assert len(manifest["corpus"]["sha256"]) == 64
    assert manifest["shards"]["count"] == 3  # 7 passages in shards of 3


def test_shards_hold_the_encoders_vectors_in_corpus_order(small_index, encoder):
    stored = load_shard_embeddings(small_index)
    direct = SentenceEncoder.encode_passages(encoder, [c for _, c in PASSAGES])
    np.testing.assert_allclose(stored, direct, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(stored, axis=1), 1.0, atol=1e-5)


def test_interrupted_build_resumes_without_reencoding_finished_shards(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    config = BuildConfig(
        corpus=corpus, output_dir=tmp_path / "index", encoder=packaged_minilm_encoder(), shard_size=2, bm25=False
    )
    dying = CountingEncoder(fail_after_calls=2)
    with pytest.raises(KeyboardInterrupt):
        build_index(config, encoder=dying, show_progress=False)
    assert not (tmp_path / "index" / "manifest.json").exists()
    finished = sorted((tmp_path / "index" / "shards").glob("0*.npy"))
    assert [p.name for p in finished] == ["00000.npy", "00001.npy"]
    mtimes = [p.stat().st_mtime_ns for p in finished]

    resumed = CountingEncoder()
    manifest = build_index(config, encoder=resumed, show_progress=False)
    assert resumed.passages_encoded == len(PASSAGES) - 4  # only shards 2 and 3
    assert [p.stat().st_mtime_ns for p in finished] == mtimes
    assert manifest["count"] == len(PASSAGES) and manifest["bm25"] is None

    again = CountingEncoder()
    assert build_index(config, encoder=again, show_progress=False) == manifest  # up to date: nothing to do
    assert again.passages_encoded == 0


def test_changed_corpus_discards_stale_shards(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", PASSAGES[:4])
    config = BuildConfig(
        corpus=corpus, output_dir=tmp_path / "index", encoder=packaged_minilm_encoder(), shard_size=2, bm25=False
    )
    build_index(config, encoder=CountingEncoder(), show_progress=False)
    write_corpus(corpus, PASSAGES[3:7])
    rebuilt = CountingEncoder()
    manifest = build_index(config, encoder=rebuilt, show_progress=False)
    assert rebuilt.passages_encoded == 4 and manifest["count"] == 4
    np.testing.assert_allclose(
        load_shard_embeddings(tmp_path / "index"), rebuilt.encode_passages([c for _, c in PASSAGES[3:7]]), atol=1e-5
    )


@pytest.mark.slow  # builds more indexes with a freshly loaded MiniLM
@pytest.mark.parametrize("factory", ["HNSW8,Flat", "IVF2,Flat", "PQ8x2"])
def test_trained_and_graph_factories_build_and_search(tmp_path, small_index, factory):
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    index_dir = tmp_path / "index"
    # Reuse the encoded shards of the small index: the builder resumes from them.
    shutil.copytree(small_index / "shards", index_dir / "shards")
    config = BuildConfig(
        corpus=corpus,
        output_dir=index_dir,
        encoder=packaged_minilm_encoder(),
        shard_size=3,
        index_factory=factory,
        bm25=False,
    )
    counting = CountingEncoder()
    manifest = build_index(config, encoder=counting, show_progress=False)
    assert counting.passages_encoded == 0
    assert manifest["index"]["factory"] == factory and manifest["index"]["ntotal"] == len(PASSAGES)
    params = "nprobe=2" if factory.startswith("IVF") else ""
    retriever = Retriever(ServerConfig(index_dir=index_dir, search_params=params))
    queries = ["Which volcano is the highest peak in Africa?", "rings of the sixth planet"]
    rows, scores = retriever.search(queries, retriever.encode(queries), 3)
    ids = [[d["id"] for d in retriever.lookup(r)] for r in rows]
    assert ids[0][0] == "a2" and ids[1][0] == "a5"
    assert np.all(np.diff(scores, axis=1) <= 1e-6)


def test_untrainable_factory_fails_with_a_clear_error(tmp_path, small_index):
    shutil.copytree(small_index / "shards", tmp_path / "index" / "shards")
    config = BuildConfig(
        corpus=write_corpus(tmp_path / "c.jsonl"),
        output_dir=tmp_path / "index",
        encoder=packaged_minilm_encoder(),
        shard_size=3,
        index_factory="PQ8",
        bm25=False,
    )
    # refused before the passages are encoded (retrieval_server/factory_check.py), as faiss would refuse to train
    with pytest.raises(ValueError, match=r"index factory 'PQ8' \(--factory\) trains 256 PQ centroids .* on 7 vectors"):
        build_index(config, encoder=CountingEncoder(), show_progress=False)
    assert not (tmp_path / "index" / "manifest.json").exists()


def test_encoder_presets_by_family():
    e5 = EncoderConfig.for_model("intfloat/e5-base-v2")
    assert (e5.pooling, e5.query_prefix, e5.passage_prefix) == ("mean", "query: ", "passage: ")
    assert EncoderConfig.for_model("/models/multilingual-e5-large").query_prefix == "query: "
    bge = EncoderConfig.for_model("BAAI/bge-base-en-v1.5")
    assert bge.pooling == "cls" and bge.query_prefix.startswith("Represent this sentence") and bge.passage_prefix == ""
    other = EncoderConfig.for_model("sentence-transformers/all-MiniLM-L6-v2")
    assert other.pooling == "auto" and other.query_prefix == ""
    assert EncoderConfig.for_model("intfloat/e5-base-v2", pooling="cls").pooling == "cls"


def test_e5_conventions_are_applied(tmp_path):
    """An E5-style config on the MiniLM weights: prefixes reach the model and pooling is explicit mean."""
    from sentence_transformers import SentenceTransformer

    e5_style = EncoderConfig(
        model=packaged_minilm_encoder().model, pooling="mean", query_prefix="query: ", passage_prefix="passage: "
    )
    encoder = SentenceEncoder(e5_style, device="cpu")
    plain = SentenceTransformer(packaged_minilm_encoder().model, device="cpu")
    expected = plain.encode(["query: where is the Nile"], normalize_embeddings=True)
    np.testing.assert_allclose(encoder.encode_queries(["where is the Nile"]), expected, atol=1e-5)
    cls = SentenceEncoder(e5_style.model_copy(update={"pooling": "cls"}), device="cpu")
    assert not np.allclose(cls.encode_queries(["where is the Nile"]), expected, atol=1e-3)


# ---------------------------------------------------------------- refusal on mismatch
def test_changed_corpus_refuses_to_start_naming_files(tmp_path, small_index):
    index_dir = tmp_path / "index"
    shutil.copytree(small_index, index_dir)
    manifest = json.loads((index_dir / "manifest.json").read_text())
    other = write_corpus(tmp_path / "other.jsonl", PASSAGES[:5])
    with pytest.raises(IndexMismatchError) as info:
        verify_index(index_dir, corpus=other)
    assert str(other) in str(info.value) and str(index_dir / "manifest.json") in str(info.value)
    # Same through the server's start-up path, before any Ray work.
    from retrieval_server.launch import start_server

    with pytest.raises(IndexMismatchError, match="other.jsonl"):
        start_server(ServerConfig(index_dir=index_dir, corpus=other))
    # The recorded corpus edited in place is caught too.
    recorded = Path(manifest["corpus"]["path"])
    original = recorded.read_bytes()
    try:
        recorded.write_bytes(original + b'{"id": "zz", "contents": "T\\nx"}\n')
        with pytest.raises(IndexMismatchError, match="has changed"):
            Retriever(ServerConfig(index_dir=index_dir))
    finally:
        recorded.write_bytes(original)


def test_other_model_refuses_to_start_naming_files(tmp_path, small_index):
    from verl_evidence.local.tiny_models import tiny_nli_model

    index_dir = tmp_path / "index"
    shutil.copytree(small_index, index_dir)
    other_model = tiny_nli_model(tmp_path / "other-model")
    with pytest.raises(IndexMismatchError) as info:
        Retriever(ServerConfig(index_dir=index_dir, encoder_model=str(other_model)))
    message = str(info.value)
    assert str(other_model) in message and "manifest.json" in message and "fingerprint" in message


@pytest.mark.slow  # builds more indexes with a freshly loaded MiniLM
def test_index_files_disagreeing_with_each_other_refuse(tmp_path, small_index):
    index_dir = tmp_path / "index"
    shutil.copytree(small_index, index_dir)
    smaller_root = tmp_path / "smaller"
    build_index(
        BuildConfig(
            corpus=write_corpus(tmp_path / "c5.jsonl", PASSAGES[:5]),
            output_dir=smaller_root,
            encoder=packaged_minilm_encoder(),
            bm25=False,
        ),
        encoder=CountingEncoder(),
        show_progress=False,
    )
    shutil.copy(smaller_root / "dense.faiss", index_dir / "dense.faiss")
    with pytest.raises(IndexMismatchError, match=r"dense\.faiss holds 5 vectors, .*manifest\.json says ntotal 7"):
        Retriever(ServerConfig(index_dir=index_dir))
    (index_dir / "manifest.json").unlink()
    with pytest.raises(IndexMismatchError, match="no index manifest at .*manifest.json"):
        Retriever(ServerConfig(index_dir=index_dir))


def test_serve_run_app_builder_parses_args_and_checks_the_index(tmp_path, small_index):
    from pydantic import ValidationError
    from ray.serve import Application

    from retrieval_server.launch import app_builder

    args = {"index_dir": str(small_index), "num_replicas": "2", "max_batch_size": "16", "num_cpus_per_replica": "0.5"}
    application = app_builder(args)
    assert isinstance(application, Application)
    # Ray Serve reads nothing of a bound application publicly: its one field is the deployment it will run.
    deployment = application._bound_deployment
    assert deployment.num_replicas == 2
    assert deployment.ray_actor_options["num_cpus"] == 0.5
    assert deployment.max_ongoing_requests == 32  # two batches of 16 queued per replica
    (replica_config,) = deployment.init_args  # what each replica is built with: the strings parsed, once
    built = ServerConfig.model_validate(replica_config)
    assert (built.max_batch_size, built.num_replicas, built.index_dir) == (16, 2, small_index)

    with pytest.raises(ValidationError, match="num_replicas"):
        app_builder({"index_dir": str(small_index), "num_replicas": "two"})
    with pytest.raises(IndexMismatchError, match="other.jsonl"):
        app_builder(
            {"index_dir": str(small_index), "corpus": str(write_corpus(tmp_path / "other.jsonl", PASSAGES[:2]))}
        )


# ------------------------------------------------------------ an index built elsewhere (moved/deleted checkout or venv)
def write_corpus_in(directory: Path) -> Path:
    directory.mkdir(parents=True)
    return write_corpus(directory / "corpus.jsonl")


def _manifest(index_dir: Path) -> dict:
    return json.loads((index_dir / "manifest.json").read_text())


@pytest.mark.slow  # builds more indexes with a freshly loaded MiniLM
def test_index_outlives_the_corpus_copy_it_was_built_from(tmp_path, small_index):
    """The index carries its passages: a deleted corpus copy is no reason to refuse it, a different corpus still is."""
    index_dir = tmp_path / "index"
    shutil.copytree(small_index, index_dir)
    first = write_corpus_in(tmp_path / "checkout-a")
    build_index(
        BuildConfig(corpus=first, output_dir=index_dir, encoder=packaged_minilm_encoder(), shard_size=3),
        show_progress=False,
    )
    shutil.rmtree(tmp_path / "checkout-a")

    retriever = Retriever(ServerConfig(index_dir=index_dir))
    queries = ["Which volcano is the highest peak in Africa?"]
    rows, _ = retriever.search(queries, retriever.encode(queries), 1)
    assert retriever.lookup(rows[0])[0]["id"] == "a2"

    # Another copy of the same content (a second clone) is accepted as is, without encoding, and recorded.
    second = write_corpus_in(tmp_path / "checkout-b")
    counting = CountingEncoder()
    manifest = build_index(
        BuildConfig(corpus=second, output_dir=index_dir, encoder=packaged_minilm_encoder(), shard_size=3),
        encoder=counting,
        show_progress=False,
    )
    assert counting.passages_encoded == 0
    assert manifest["corpus"]["path"] == str(second.resolve()) == _manifest(index_dir)["corpus"]["path"]

    other = write_corpus(tmp_path / "other.jsonl", PASSAGES[:5])
    with pytest.raises(IndexMismatchError) as info:
        verify_index(index_dir, corpus=other)
    assert str(other) in str(info.value) and str(index_dir / "manifest.json") in str(info.value)


@pytest.mark.slow  # builds more indexes with a freshly loaded MiniLM
def test_index_outlives_the_model_copy_it_was_built_with(tmp_path, small_index):
    """A deleted venv's model is found again by content (the packaged MiniLM); an unknown one is a clear error."""
    index_dir = tmp_path / "index"
    shutil.copytree(small_index, index_dir)
    model_copy = tmp_path / "old-venv" / "minilm"
    shutil.copytree(packaged_minilm_encoder().model, model_copy)
    built = build_index(
        BuildConfig(corpus=write_corpus(tmp_path / "corpus.jsonl"), output_dir=index_dir,
                    encoder=packaged_minilm_encoder().model_copy(update={"model": str(model_copy)}), shard_size=3),
        encoder=CountingEncoder(), show_progress=False,
    )  # fmt: skip
    assert built["encoder"]["model"] == str(model_copy)
    shutil.rmtree(tmp_path / "old-venv")

    retriever = Retriever(ServerConfig(index_dir=index_dir))
    assert retriever.encoder.config.model == packaged_minilm_encoder().model
    assert retriever.manifest["encoder"]["model"] == packaged_minilm_encoder().model  # what /health reports

    counting = CountingEncoder()
    rebuilt = build_index(
        BuildConfig(
            corpus=tmp_path / "corpus.jsonl", output_dir=index_dir, encoder=packaged_minilm_encoder(), shard_size=3
        ),
        encoder=counting,
        show_progress=False,
    )
    assert counting.passages_encoded == 0 and rebuilt["encoder"]["model"] == packaged_minilm_encoder().model

    manifest = _manifest(index_dir)
    manifest["encoder"].update(model="/gone/venv/some-model", fingerprint="sha256:" + "0" * 32)
    (index_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexMismatchError, match=r"/gone/venv/some-model .*does not exist.*--model"):
        Retriever(ServerConfig(index_dir=index_dir))


def test_bundled_cache_built_by_a_deleted_checkout_is_reused(tmp_path, monkeypatch, bundled_index_dir):
    """`verl-evidence serve` after the checkout that built the cache is gone: the cache is valid, not fatal."""
    from retrieval_server.launch import default_index_dir, ensure_index
    from retrieval_server.search import check_server_config
    from verl_evidence.bundled import corpus_path

    monkeypatch.setenv("VERL_EVIDENCE_CACHE", str(tmp_path / "cache"))
    cache = default_index_dir(corpus_path())
    # without the ONNX exports kept beside it (one per encoder setting the suite has used: hundreds of MB)
    shutil.copytree(bundled_index_dir, cache, ignore=shutil.ignore_patterns("encoders"))
    manifest = _manifest(cache)
    manifest["corpus"]["path"] = "/gone/checkout/verl_evidence/bundled/corpus.jsonl"
    (cache / "manifest.json").write_text(json.dumps(manifest))
    dense_mtime = (cache / "dense.faiss").stat().st_mtime_ns

    assert ensure_index(corpus_path(), show_progress=False) == cache
    assert (cache / "dense.faiss").stat().st_mtime_ns == dense_mtime  # reused, not rebuilt
    # (torch: nothing to export for replicas, which is not what this test is about)
    checked, _ = check_server_config(ServerConfig(index_dir=cache, encoder_backend="torch"))
    assert checked["corpus"]["path"] == str(corpus_path())


def test_a_stuck_builder_fails_the_wait_with_a_deadline(tmp_path):
    import fcntl

    index_dir = tmp_path / "index"
    index_dir.mkdir()
    config = BuildConfig(
        corpus=write_corpus(tmp_path / "corpus.jsonl"), output_dir=index_dir, encoder=packaged_minilm_encoder()
    )
    with open(index_dir / ".build.lock", "w") as other_builder:
        fcntl.flock(other_builder, fcntl.LOCK_EX)
        with pytest.raises(TimeoutError, match=f"building the index in {index_dir} for over 1 s .*\\.build\\.lock"):
            build_index(config, encoder=CountingEncoder(), show_progress=False, lock_timeout_s=1.0)
    assert not (index_dir / "manifest.json").exists()


def test_a_builder_waits_for_the_one_holding_the_lock_then_builds(tmp_path, caplog):
    import threading

    from filelock import FileLock

    index_dir = tmp_path / "index"
    index_dir.mkdir()
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    config = BuildConfig(corpus=corpus, output_dir=index_dir, encoder=packaged_minilm_encoder(), bm25=False)
    encoder = CountingEncoder()  # loaded first: on a busy machine loading it took longer than the other build
    other_builder = FileLock(index_dir / ".build.lock", thread_local=False)  # released from the timer thread
    other_builder.acquire()
    releaser = threading.Timer(1.0, other_builder.release)  # the other build ends a second later
    releaser.start()
    with caplog.at_level("INFO", logger="retrieval_server.index"):
        manifest = build_index(config, encoder=encoder, show_progress=False, lock_timeout_s=60.0)
    releaser.join()
    assert f"waiting for another process building the index in {index_dir}" in caplog.text
    assert manifest["count"] == len(PASSAGES) and (index_dir / "manifest.json").exists()


def test_corpus_checksum_is_reused_until_the_file_changes(tmp_path, small_index, monkeypatch):
    """A start does not re-hash an unchanged corpus (minutes for wiki-18); an edit in place is still caught."""
    import os

    import retrieval_server.index as index_module

    index_dir = tmp_path / "index"
    shutil.copytree(small_index, index_dir)
    (index_dir / index_module.CORPUS_STAT_CACHE).unlink(missing_ok=True)
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    hashed: list[Path] = []
    real = index_module.file_sha256
    monkeypatch.setattr(index_module, "file_sha256", lambda path: hashed.append(Path(path)) or real(path))

    verify_index(index_dir, corpus=corpus)
    verify_index(index_dir, corpus=corpus)
    assert hashed == [corpus]  # the second start trusted the recorded checksum of the same file

    # Same size, different content, mtime moved on (as any write does): hashed again, and refused.
    text = corpus.read_text()
    corpus.write_text(text.replace("Egypt", "Sudan"))
    stat = corpus.stat()
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    with pytest.raises(IndexMismatchError, match="has changed"):
        verify_index(index_dir, corpus=corpus)
    assert hashed == [corpus, corpus]

    # An index directory it cannot write to: the checksum is still right, just not kept.
    def refuse(*args, **kwargs):
        raise PermissionError("read-only index directory")

    monkeypatch.setattr(index_module.os, "replace", refuse)
    fresh = write_corpus(tmp_path / "fresh.jsonl", PASSAGES[:3])
    assert index_module.corpus_sha256(fresh, index_dir) == real(fresh)
