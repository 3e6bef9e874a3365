"""The encoder in the manifest: the model directory the server loads and the ONNX export beside the index are hashed
whole, recorded, and checked by `index verify` and by `serve` before it starts Ray; what a sampled checksum of the
served files misses is said, and `index verify --full` hashes every byte.

Fast tier: the bundled index copied into tmp, the machine's MiniLM export copied into a user cache of this module's
own (exported once per machine if missing: ~35 s on a cold cache, shared with the session server), so files can be
altered in place without touching anybody else's. `serve` runs in-process with Ray replaced by a tripwire.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_startup_checks import serve_error
from typer.testing import CliRunner

from retrieval_server.config import ServerConfig, packaged_minilm_encoder
from retrieval_server.encoders import OnnxEncoder, ensure_onnx_export
from retrieval_server.encoders.fingerprint import checksum_files, export_files
from retrieval_server.index import IndexMismatchError, verify_index
from retrieval_server.search import check_server_config

QUESTION = "Who discovered penicillin?"


@pytest.fixture()
def no_ray(monkeypatch):
    """Starting Ray is the failure: every refusal here comes before it."""

    def tripwire(*args, **kwargs):
        raise AssertionError("serve got as far as starting Ray")

    monkeypatch.setattr("retrieval_server.launch._start_once", tripwire)


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory) -> Path:
    """A user cache holding a real copy (not links) of the machine's MiniLM export."""
    machine_export = ensure_onnx_export(packaged_minilm_encoder(), None)
    cache = tmp_path_factory.mktemp("cache")
    shutil.copytree(machine_export, cache / "encoders" / machine_export.name)
    return cache


@pytest.fixture(scope="module")
def served_index(tmp_path_factory, bundled_index_dir, private_cache) -> Path:
    """The bundled index after `serve`'s own check: the export linked in beside it and recorded in its manifest."""
    index = tmp_path_factory.mktemp("served") / "index"
    shutil.copytree(bundled_index_dir, index, ignore=shutil.ignore_patterns("encoders", "shards", ".*"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VERL_EVIDENCE_CACHE", str(private_cache))
        check_server_config(ServerConfig(index_dir=index))
    return index


@pytest.fixture()
def index_copy(served_index, private_cache, tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("VERL_EVIDENCE_CACHE", str(private_cache))
    copy = tmp_path / "index"
    shutil.copytree(served_index, copy)  # copies: altering them leaves the module's files alone
    return copy


def export_of(index_dir: Path) -> Path:
    (export,) = (index_dir / "encoders").glob("onnx-*")
    return export


def shuffle_word_embeddings(model_path: Path) -> None:
    """The issue's attack: the word-embedding rows of the ONNX graph permuted, in place (same size, same inode)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(model_path))
    (table,) = [t for t in model.graph.initializer if t.name.endswith("word_embeddings.weight")]
    rows = numpy_helper.to_array(table)
    table.CopyFrom(numpy_helper.from_array(rows[np.random.default_rng(0).permutation(len(rows))], table.name))
    data = model.SerializeToString()
    assert len(data) == model_path.stat().st_size
    with open(model_path, "r+b") as handle:  # written through: every hard link to it sees the change
        handle.write(data)


def verify_cli(*args: str):
    from verl_evidence.cli import app

    return CliRunner().invoke(app, ["index", "verify", *args])


def test_the_manifest_records_the_model_and_the_export_beside_the_index(served_index):
    record = json.loads((served_index / "manifest.json").read_text())["encoder_files"]
    assert record["checksum"] == "xxh3_128 of every byte"
    assert {"model.safetensors", "config.json", "tokenizer.json", "vocab.txt"} <= set(record["model"])
    export = export_of(served_index)
    assert set(record["exports"]) == {export.name}
    int8 = {"model.int8.onnx", "model.int8.json"}  # present once any test or index asked for the int8 graph
    assert set(record["exports"][export.name]) - int8 == {
        "export.json", "model.onnx", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json",
    }  # fmt: skip
    verify_index(served_index)


def test_shuffled_embedding_rows_in_the_export_are_refused_by_verify_and_before_ray(index_copy, no_ray):
    export = export_of(index_copy)
    before = OnnxEncoder(export, packaged_minilm_encoder()).encode_queries([QUESTION])
    shuffle_word_embeddings(export / "model.onnx")
    after = OnnxEncoder(export, packaged_minilm_encoder()).encode_queries([QUESTION])
    assert float(before[0] @ after[0]) < 0.9  # the attack works: another vector for the same question

    with pytest.raises(IndexMismatchError, match=rf"{export / 'model.onnx'} is not the file .* altered"):
        verify_index(index_copy)
    result = verify_cli("--index-dir", str(index_copy))
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: ") and str(export / "model.onnx") in line and f"remove {export}" in line, line
    line = serve_error(index_copy)
    assert str(export / "model.onnx") in line, line


def test_a_whole_export_swapped_for_a_consistent_one_is_refused_by_the_manifest(index_copy, no_ray):
    """An export that agrees with its own record (here: altered, then re-recorded) is still not the one recorded."""
    export = export_of(index_copy)
    shuffle_word_embeddings(export / "model.onnx")
    meta = json.loads((export / "export.json").read_text())
    meta["files"] = checksum_files(export, export_files(export, own_record=True))
    (export / "export.json").write_text(json.dumps(meta))
    line = serve_error(index_copy)
    assert str(export / "model.onnx") in line and str(index_copy / "manifest.json") in line, line


def test_a_model_weight_file_altered_at_the_same_size_is_refused(index_copy, tmp_path):
    model = tmp_path / "minilm"
    shutil.copytree(packaged_minilm_encoder().model, model)
    weights = model / "model.safetensors"
    with open(weights, "r+b") as handle:  # bytes swapped deep in the weights: names and sizes (the fingerprint) agree
        handle.seek(weights.stat().st_size // 2)
        handle.write(b"\x00" * 64)
    result = verify_cli("--index-dir", str(index_copy), "--model", str(model))
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert f"{weights} is not the file" in line and "altered" in line, line


def test_one_changed_file_linked_into_two_indexes_is_refused_by_both_and_lent_to_none(
    served_index, private_cache, tmp_path, monkeypatch
):
    name = export_of(served_index).name
    cache = tmp_path / "cache"
    shutil.copytree(private_cache / "encoders" / name, cache / "encoders" / name)  # this test's own, altered below
    monkeypatch.setenv("VERL_EVIDENCE_CACHE", str(cache))
    cached = cache / "encoders" / name
    indexes = []
    for index_name in ("a", "b"):
        index = tmp_path / index_name
        shutil.copytree(served_index, index, ignore=shutil.ignore_patterns("encoders"))
        check_server_config(ServerConfig(index_dir=index))  # the export linked in from the cache and recorded
        assert (export_of(index) / "model.onnx").stat().st_ino == (cached / "model.onnx").stat().st_ino
        indexes.append(index)
    shuffle_word_embeddings(cached / "model.onnx")
    for index in indexes:
        with pytest.raises(IndexMismatchError, match=rf"{export_of(index) / 'model.onnx'} is not the file"):
            verify_index(index)
    fresh = tmp_path / "c"
    shutil.copytree(served_index, fresh, ignore=shutil.ignore_patterns("encoders"))
    with pytest.raises(IndexMismatchError, match=rf"refusing the ONNX export {cached}: .*model\.onnx"):
        check_server_config(ServerConfig(index_dir=fresh))
    assert not (fresh / "encoders" / name).exists()


def test_a_version_2_manifest_is_refused_until_its_encoder_is_recorded(index_copy, no_ray):
    path = index_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["version"] = 2
    del manifest["encoder_files"]
    path.write_text(json.dumps(manifest))
    line = serve_error(index_copy)
    assert "records no checksums of its encoder's files (manifest version 2)" in line, line
    assert f"verl-evidence index verify --index-dir {index_copy} --record" in line, line

    recorded = verify_cli("--index-dir", str(index_copy), "--record")
    assert recorded.exit_code == 0, recorded.output
    manifest = json.loads(path.read_text())
    assert manifest["version"] == 3 and set(manifest["encoder_files"]["exports"]) == {export_of(index_copy).name}
    verify_index(index_copy)

    # --record checks the export against its own record before recording it: an altered one is not blessed
    manifest["version"] = 2
    del manifest["encoder_files"]
    path.write_text(json.dumps(manifest))
    shuffle_word_embeddings(export_of(index_copy) / "model.onnx")
    refused = verify_cli("--index-dir", str(index_copy), "--record")
    assert refused.exit_code == 2 and "refusing to record the ONNX export" in refused.output, refused.output
    assert json.loads(path.read_text())["version"] == 2


def _big_flat_index(root: Path, count: int = 30_000) -> Path:
    """A Flat index of random vectors whose dense file (~44 MiB) is sampled, not read whole; manifest as built."""
    import faiss

    from retrieval_server.docstore import file_sha256, write_docstore
    from retrieval_server.encoders import describe
    from retrieval_server.index import record_checksums

    root.mkdir(parents=True)
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f"t{i}\np{i}"}) + "\n" for i in range(count)))
    index_dir = root / "index"
    index_dir.mkdir()
    write_docstore(corpus, index_dir / "docstore.arrow")
    vectors = np.random.default_rng(0).standard_normal((count, 384)).astype(np.float32)
    flat = faiss.IndexFlatIP(384)
    flat.add(vectors)
    faiss.write_index(flat, str(index_dir / "dense.faiss"))
    encoder = packaged_minilm_encoder()
    manifest = {
        "version": 3,
        "corpus": {"path": str(corpus), "sha256": file_sha256(corpus), "size": corpus.stat().st_size},
        "count": count, "encoder": describe(encoder, 384), "dim": 384, "docstore": "docstore.arrow", "bm25": None,
        "index": {"factory": "Flat", "metric": "inner_product", "file": "dense.faiss", "ntotal": count},
    }  # fmt: skip
    (index_dir / "manifest.json").write_text(json.dumps(record_checksums(index_dir, manifest)))
    return index_dir


def test_verify_says_what_sampling_misses_and_full_hashes_every_byte(tmp_path):
    from retrieval_server.index import CHECKSUM_BLOCK_BYTES, CHECKSUM_BLOCKS

    index_dir = _big_flat_index(tmp_path / "big")
    dense = index_dir / "dense.faiss"
    size = dense.stat().st_size
    result = verify_cli("--index-dir", str(index_dir))
    assert result.exit_code == 0, result.output
    never = size - CHECKSUM_BLOCK_BYTES * CHECKSUM_BLOCKS
    total = size + (index_dir / "docstore.arrow").stat().st_size
    assert f"sampled checksums: {never / total:.2%} of the" in result.output, result.output
    assert "--full hashes every byte" in result.output and "files hashed whole" in result.output

    between = (size - CHECKSUM_BLOCK_BYTES) * 100 // (CHECKSUM_BLOCKS - 1) - 4096  # before block 100, after block 99
    with open(dense, "r+b") as handle:
        handle.seek(between)
        original = handle.read(8)
        handle.seek(between)
        handle.write(b"swapped!")
    assert verify_cli("--index-dir", str(index_dir)).exit_code == 0  # what sampling misses
    full = verify_cli("--index-dir", str(index_dir), "--full")
    assert full.exit_code == 2 and f"{dense} is not the file" in full.output, full.output

    with open(dense, "r+b") as handle:  # the bytes put back: --full passes and says how long it took
        handle.seek(between)
        handle.write(original)
    passed = verify_cli("--index-dir", str(index_dir), "--full")
    assert passed.exit_code == 0, passed.output
    assert "every byte of the" in passed.output and "hashed in" in passed.output, passed.output


def test_a_removed_export_made_again_replaces_its_record(index_copy):
    """What a refusal advises (remove the export): the next start's export, made or linked in, is recorded anew."""
    export = export_of(index_copy)
    path = index_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["encoder_files"]["exports"][export.name]["export.json"] = {"size": 1, "xxh3_128": "another export's"}
    path.write_text(json.dumps(manifest))
    shutil.rmtree(export)
    check_server_config(ServerConfig(index_dir=index_copy))
    recorded = json.loads(path.read_text())["encoder_files"]["exports"][export.name]
    assert recorded["export.json"]["size"] == (export / "export.json").stat().st_size
    verify_index(index_copy)
