"""ONNX Runtime query encoder: the same vectors and top-k as torch, one cached export, clear refusals.

Real parts throughout: the packaged MiniLM exported with torch.onnx, run by onnxruntime, searched in
the bundled FAISS index. No timing assertions (speed is shown in benchmarks/retrieval.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from retrieval_server import encoders
from retrieval_server.config import ServerConfig, packaged_minilm_encoder
from retrieval_server.encoders import (
    ONNX_TOLERANCE,
    PROBE_TEXTS,
    OnnxEncoder,
    OnnxExportError,
    SentenceEncoder,
    TokenizerJson,
    ensure_onnx_export,
    load_export_tokenizer,
    load_query_encoder,
    max_abs_difference,
    onnx_cache_key,
    onnx_export,
)
from retrieval_server.recall import load_qa
from retrieval_server.search import Retriever
from verl_evidence.bundled import qa_path as bundled_qa_path

pytestmark = pytest.mark.slow  # loads the real MiniLM and exports it


@pytest.fixture(scope="module")
def questions() -> list[str]:
    return [q["question"] for q in load_qa(bundled_qa_path())]


@pytest.fixture(scope="module")
def torch_encoder() -> SentenceEncoder:
    return SentenceEncoder(packaged_minilm_encoder(), device="cpu")


@pytest.fixture(scope="module")
def export_cache(tmp_path_factory) -> Path:
    """A user cache of this module's own, so that its export is really made (not linked from the machine's cache)."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, export_cache) -> Path:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VERL_EVIDENCE_CACHE", str(export_cache))
        return ensure_onnx_export(packaged_minilm_encoder(), tmp_path_factory.mktemp("index"))


@pytest.fixture(scope="module")
def onnx_encoder(export_dir) -> OnnxEncoder:
    return OnnxEncoder(export_dir, packaged_minilm_encoder())


def test_onnx_vectors_match_torch_on_bundled_questions_and_probes(torch_encoder, onnx_encoder, questions):
    # As padded batches (one of all questions) and one by one; probes: truncation, non-ASCII, empty text.
    for texts in (questions, list(PROBE_TEXTS)):
        assert max_abs_difference(torch_encoder, onnx_encoder, texts) <= ONNX_TOLERANCE


def test_onnx_tokenises_like_sentence_transformers(torch_encoder, onnx_encoder, questions):
    texts = [*questions[:20], *PROBE_TEXTS]
    expected = torch_encoder.model.preprocess(texts)
    got = onnx_encoder._tokenize(texts)
    for name in got:
        np.testing.assert_array_equal(got[name], expected[name].numpy(), err_msg=name)
    assert got["input_ids"].shape[1] == 256  # the 400-word probe is cut at max_length, as torch does


def test_onnx_server_gives_the_same_topk_as_torch_on_the_bundled_index(bundled_index_dir, questions):
    by_backend = {}
    for backend in ("torch", "onnx"):
        retriever = Retriever(ServerConfig(index_dir=bundled_index_dir, encoder_backend=backend))
        assert retriever.encoder.backend == backend
        rows, scores = retriever.search(questions, retriever.encode(questions), 10)
        by_backend[backend] = (rows, scores)
    np.testing.assert_array_equal(by_backend["onnx"][0], by_backend["torch"][0])
    np.testing.assert_allclose(by_backend["onnx"][1], by_backend["torch"][1], atol=1e-5)


def test_split_batches_give_the_same_vectors_in_the_same_order(export_dir, onnx_encoder, questions):
    threaded = OnnxEncoder(export_dir, packaged_minilm_encoder(), threads=2, batch_size=16)
    texts = questions[:50]  # 50 queries, 2 threads, runs of <= 16: split and reordered by length internally
    np.testing.assert_allclose(threaded.encode_queries(texts), onnx_encoder.encode_queries(texts), atol=ONNX_TOLERANCE)
    assert threaded.encode_queries([]).shape == (0, threaded.dim)


def test_export_is_made_once_and_reused(tmp_path, export_dir, monkeypatch):
    index_dir = export_dir.parent.parent
    meta = json.loads((export_dir / "export.json").read_text())
    assert meta["fingerprint"] == encoders.model_fingerprint(packaged_minilm_encoder().model)
    assert meta["max_abs_diff_vs_torch"] <= ONNX_TOLERANCE

    def no_second_export(*args, **kwargs):
        raise AssertionError("exported again although a cached export exists")

    monkeypatch.setattr(onnx_export, "make_export", no_second_export)
    encoder = load_query_encoder(packaged_minilm_encoder(), "onnx", "cpu", index_dir)
    assert encoder.path == export_dir / "model.onnx"
    # Prefixes are applied to the text, so an encoder differing only in them shares the export...
    prefixed = packaged_minilm_encoder().model_copy(update={"query_prefix": "query: "})
    assert onnx_cache_key(prefixed) == onnx_cache_key(packaged_minilm_encoder())
    assert load_query_encoder(prefixed, "onnx", "cpu", index_dir).path == export_dir / "model.onnx"
    # ...while pooling is part of the graph: another key, so another export.
    cls = packaged_minilm_encoder().model_copy(update={"pooling": "cls"})
    assert onnx_cache_key(cls) != onnx_cache_key(packaged_minilm_encoder())
    with pytest.raises(AssertionError, match="exported again"):
        load_query_encoder(cls, "onnx", "cpu", index_dir)


def test_prefix_is_applied_to_the_text(export_dir, torch_encoder):
    prefixed = packaged_minilm_encoder().model_copy(update={"query_prefix": "query: "})
    onnx = OnnxEncoder(export_dir, prefixed)
    expected = torch_encoder.encode_queries(["query: who discovered penicillin"])
    np.testing.assert_allclose(onnx.encode_queries(["who discovered penicillin"]), expected, atol=ONNX_TOLERANCE)


def test_export_for_other_settings_is_refused(export_dir):
    with pytest.raises(OnnxExportError, match="pooling='cls'"):
        OnnxEncoder(export_dir, packaged_minilm_encoder().model_copy(update={"pooling": "cls"}))


def test_export_off_torch_is_refused_and_not_cached(tmp_path, monkeypatch):
    import torch  # noqa: F401  (held by this process: the export runs here, where the patched tolerance applies)

    monkeypatch.setenv("VERL_EVIDENCE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(onnx_export, "ONNX_TOLERANCE", 0.0)  # any float difference at all now counts as a mismatch
    with pytest.raises(OnnxExportError, match="differs from torch by up to .*not cached"):
        ensure_onnx_export(packaged_minilm_encoder(), tmp_path)
    assert [p.name for p in (tmp_path / "encoders").iterdir() if not p.name.endswith(".lock")] == []
    assert not list((tmp_path / "cache").glob("encoders/onnx-*/export.json"))  # nor published to the user cache


def test_a_new_export_is_published_to_the_user_cache_and_linked_into_the_next_index(
    tmp_path, export_dir, export_cache, monkeypatch
):
    """One export per machine: every later index with the same encoder gets the same files, without torch."""
    cached = export_cache / "encoders" / export_dir.name
    assert (cached / "export.json").read_bytes() == (export_dir / "export.json").read_bytes()
    assert (cached / "model.onnx").stat().st_ino == (export_dir / "model.onnx").stat().st_ino  # linked, not copied

    def no_second_export(*args, **kwargs):
        raise AssertionError("exported again although the user cache holds the export")

    monkeypatch.setattr(onnx_export, "make_export", no_second_export)
    monkeypatch.setenv("VERL_EVIDENCE_CACHE", str(export_cache))
    other_index = tmp_path / "other-index"
    linked = ensure_onnx_export(packaged_minilm_encoder(), other_index)
    assert linked == other_index / "encoders" / export_dir.name  # beside the index: other nodes read it there
    assert (linked / "model.onnx").stat().st_ino == (cached / "model.onnx").stat().st_ino
    assert sorted(p.relative_to(linked) for p in linked.rglob("*")) == sorted(
        p.relative_to(cached) for p in cached.rglob("*")
    )
    encoder = load_query_encoder(packaged_minilm_encoder(), "onnx", "cpu", other_index)
    assert encoder.path == linked / "model.onnx"
    np.testing.assert_array_equal(
        encoder.encode_queries(["who wrote on the origin of species"]),
        OnnxEncoder(export_dir, packaged_minilm_encoder()).encode_queries(["who wrote on the origin of species"]),
    )
    assert [p.name for p in other_index.joinpath("encoders").iterdir() if p.is_dir()] == [linked.name]  # no work dirs


def test_export_goes_to_the_user_cache_when_the_index_directory_is_not_writable(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_EVIDENCE_CACHE", str(tmp_path / "cache"))
    blocked = tmp_path / "index"
    blocked.write_text("a file where the index directory's parent should be")  # mkdir below it fails, even as root
    target = encoders.onnx_export_dir(packaged_minilm_encoder(), blocked)
    assert target.parent == tmp_path / "cache" / "encoders"


def test_onnx_backend_is_refused_on_a_gpu_device():
    with pytest.raises(ValueError, match="torch is the GPU path"):
        load_query_encoder(packaged_minilm_encoder(), "onnx", "cuda")


def test_int8_is_opt_in_and_reports_its_recall_against_fp32(bundled_index_dir, questions):
    fp32 = Retriever(ServerConfig(index_dir=bundled_index_dir, encoder_backend="onnx"))
    int8 = Retriever(ServerConfig(index_dir=bundled_index_dir, encoder_backend="onnx-int8"))
    assert int8.encoder.path.name == "model.int8.onnx" and fp32.encoder.path.name == "model.onnx"
    k = 10
    exact, _ = fp32.search(questions, fp32.encode(questions), k)
    approx, _ = int8.search(questions, int8.encode(questions), k)
    recall = np.mean([len(set(a) & set(e)) / k for a, e in zip(approx, exact)])
    print(f"int8 recall@{k} against fp32 on {len(questions)} bundled questions: {recall:.3f}")
    assert recall >= 0.9
    assert not np.array_equal(int8.encode(questions), fp32.encode(questions))  # really the quantised graph


def test_default_backend_on_a_cpu_replica_is_onnx(retrieval_server_url):
    health = httpx.get(f"{retrieval_server_url}/health", timeout=30).json()
    assert health["encoder_backend"] == "onnx"
    assert health["torch_threads"] is None  # the replica never imported torch


def test_the_tokenizers_library_alone_gives_the_transformers_tokenizers_ids(export_dir, tmp_path):
    from transformers import AutoTokenizer

    texts = [*PROBE_TEXTS, "query: " + PROBE_TEXTS[1], "[CLS] already [SEP] marked [PAD]"]
    light = load_export_tokenizer(export_dir / "tokenizer")
    assert isinstance(light, TokenizerJson)
    full = AutoTokenizer.from_pretrained(str(export_dir / "tokenizer"))
    for max_length in (256, 8):  # 8: every probe but the empty one is cut
        expected = full(texts, padding=False, truncation="longest_first", max_length=max_length)
        got = light(texts, padding=False, truncation="longest_first", max_length=max_length)
        for name in ("input_ids", "attention_mask", "token_type_ids"):
            assert got[name] == expected[name], (max_length, name)
    assert (light.pad_token_id, light.pad_token_type_id, light.padding_side) == (
        full.pad_token_id,
        full.pad_token_type_id,
        full.padding_side,
    )
    # An export without tokenizer.json (a model with only a slow tokenizer) keeps the transformers tokenizer.
    slow = tmp_path / "slow"
    slow.mkdir()
    vocab = json.loads((export_dir / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
    (slow / "vocab.txt").write_text("".join(token + "\n" for token, _ in sorted(vocab.items(), key=lambda kv: kv[1])))
    (slow / "tokenizer_config.json").write_text((export_dir / "tokenizer" / "tokenizer_config.json").read_text())
    fallback = load_export_tokenizer(slow)
    assert not isinstance(fallback, TokenizerJson)
    assert (
        fallback(texts, truncation="longest_first", max_length=256)["input_ids"]
        == full(texts, truncation="longest_first", max_length=256)["input_ids"]
    )


def test_on_a_cold_cache_serve_exports_before_replicas_and_neither_imports_torch(bundled_index_dir, tmp_path):
    """A fresh machine: no export beside the index, an empty VERL_EVIDENCE_CACHE. In a fresh interpreter, the
    launching process's check (what `serve` and `start_server` run before Ray) makes the export, in a subprocess;
    then a CPU replica's Retriever loads it. Neither imports torch: a replica starts in a fraction of the CPU time
    when it does not load torch, transformers and scikit-learn (and the first start on a new machine used to)."""
    index_dir = tmp_path / "index"
    shutil.copytree(bundled_index_dir, index_dir, ignore=shutil.ignore_patterns("encoders", "shards"))
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from retrieval_server.config import ServerConfig\n"
        "from retrieval_server.search import Retriever, check_server_config\n"
        "heavy = ('torch', 'transformers', 'sentence_transformers', 'sklearn')\n"
        "config = ServerConfig(index_dir=Path(sys.argv[1]))\n"
        "check_server_config(config)\n"
        "print(sorted(p.parent.name for p in Path(sys.argv[1]).glob('encoders/onnx-*/export.json')))\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "retriever = Retriever(config)\n"
        "assert retriever.encoder.backend == 'onnx', retriever.encoder.backend\n"
        "assert retriever.encoder.encode_queries(['capital of France']).shape == (1, 384)\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "VERL_EVIDENCE_CACHE": str(tmp_path / "empty-cache"),
    }
    result = subprocess.run(
        [sys.executable, "-c", script, str(index_dir)], capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    exported, after_check, after_replica = result.stdout.strip().splitlines()[-3:]
    assert exported.startswith("['onnx-") and after_check == after_replica == "[]", result.stdout


def test_without_onnxruntime_auto_serves_with_torch_and_onnx_says_what_to_install(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now fails
    with pytest.raises(ImportError, match="pip install onnxruntime"):
        load_query_encoder(packaged_minilm_encoder(), "onnx", "cpu", tmp_path)
    with caplog.at_level("WARNING", logger="retrieval_server.encoders"):
        encoder = load_query_encoder(packaged_minilm_encoder(), "auto", "cpu", tmp_path)
    assert encoder.backend == "torch" and "using torch" in caplog.text
    assert not (tmp_path / "encoders").exists()  # nothing exported that could not be checked


def test_weights_rewritten_in_place_get_a_new_export(tmp_path):
    # Same file names and sizes (so the same model fingerprint), new contents: the old export must not be reused.
    import shutil

    model = tmp_path / "minilm"
    shutil.copytree(packaged_minilm_encoder().model, model)
    config = packaged_minilm_encoder().model_copy(update={"model": str(model)})
    before = onnx_cache_key(config)
    weights = model / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert encoders.model_fingerprint(str(model)) == encoders.model_fingerprint(packaged_minilm_encoder().model)
    assert onnx_cache_key(config) != before


def test_a_mixed_length_batch_runs_in_length_sorted_parts_with_the_same_vectors(export_dir, torch_encoder, questions):
    encoder = OnnxEncoder(export_dir, packaged_minilm_encoder())
    feeds = []
    run = encoder._run
    encoder._run = lambda feed: feeds.append(feed) or run(feed)
    texts = [
        *questions[:12],
        "what is the boiling point of water at sea level in degrees fahrenheit in a pressure cooker",
    ]
    vectors = encoder.encode_queries(texts)
    assert len(feeds) > 1  # the long question is not allowed to pad every short one
    assert sum(len(feed["input_ids"]) for feed in feeds) == len(texts)
    widths = [feed["input_ids"].shape[1] for feed in feeds]
    assert widths == sorted(widths)
    np.testing.assert_allclose(vectors, torch_encoder.encode_queries(texts), atol=ONNX_TOLERANCE)


def test_an_int8_graph_made_beside_a_linked_export_is_added_to_the_cached_export(
    tmp_path, export_dir, export_cache, monkeypatch
):
    """The cache lends its fp32 export; the int8 graph quantised from it beside the new index goes back to the cache,
    next to the files the cache already had (published whole, never half)."""
    cache = tmp_path / "cache"
    shutil.copytree(export_cache / "encoders", cache / "encoders")  # the module's cache, without its int8 graph
    cached = cache / "encoders" / export_dir.name
    assert not (cached / "model.int8.onnx").exists()
    monkeypatch.setenv("VERL_EVIDENCE_CACHE", str(cache))
    monkeypatch.setattr(onnx_export, "make_export", lambda *a, **k: pytest.fail("exported again"))
    made = ensure_onnx_export(packaged_minilm_encoder(), tmp_path / "index", quantized=True)
    assert made == tmp_path / "index" / "encoders" / export_dir.name
    assert (made / "model.onnx").stat().st_ino == (cached / "model.onnx").stat().st_ino  # fp32 graph linked in
    assert (cached / "model.int8.onnx").stat().st_ino == (made / "model.int8.onnx").stat().st_ino
    assert (cached / "export.json").read_bytes() == (export_dir / "export.json").read_bytes()
