"""What `serve` checks in its own process before it starts Ray: the files are the ones recorded, hold what the
manifest says, and take the search parameters asked for; each refusal is one line naming the file, exit 2.

Fast tier: `_start_once` (the part that starts Ray) is replaced by a tripwire, so a check that failed to refuse
fails the test instead of starting a cluster.
"""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_index import PASSAGES, CountingEncoder, write_corpus
from typer.testing import CliRunner

from retrieval_server.config import BuildConfig, packaged_minilm_encoder
from retrieval_server.index import (
    DiskFullError,
    IndexMismatchError,
    build_index,
    file_checksum,
    read_faiss_header,
    verify_and_record,
    verify_index,
)

# Seven other passages: an index of them has the same row count as the test index, and other content.
OTHER_PASSAGES = [(f"b{i}", f"Topic {i}\nA different passage number {i} about something else.") for i in range(7)]


class UnusableEncoder:
    """For builds that must find nothing to encode."""

    @property
    def dim(self) -> int:
        raise AssertionError("the build needed an encoder")

    def encode_passages(self, passages, batch_size=64):
        raise AssertionError("the build encoded passages")


@pytest.fixture(scope="module")
def minilm() -> CountingEncoder:
    return CountingEncoder()


def _build(root: Path, passages, encoder, **overrides) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    config = BuildConfig(
        corpus=write_corpus(root / "corpus.jsonl", passages),
        output_dir=root / "index",
        encoder=packaged_minilm_encoder(),
        shard_size=3,
        **{"bm25": False, **overrides},
    )
    build_index(config, encoder=encoder, show_progress=False)
    return root / "index"


@pytest.fixture(scope="module")
def built(tmp_path_factory, minilm) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("startup")
    return {
        "index": _build(root / "a", PASSAGES, minilm),
        "other": _build(root / "b", OTHER_PASSAGES, minilm),
        "ivf": _build(root / "c", PASSAGES, minilm, index_factory="IVF2,Flat"),
    }


@pytest.fixture()
def index_dir(built, tmp_path) -> Path:
    copy = tmp_path / "index"
    shutil.copytree(built["index"], copy)
    return copy


@pytest.fixture()
def no_ray(monkeypatch):
    """Starting Ray is the failure: every check here must refuse before it."""

    def tripwire(*args, **kwargs):
        raise AssertionError("serve got as far as starting Ray")

    monkeypatch.setattr("retrieval_server.launch._start_once", tripwire)


def serve_error(index_dir: Path, *args: str) -> str:
    """`verl-evidence serve` on ``index_dir``: the one ``error:`` line it ends with (exit code 2)."""
    from verl_evidence.cli import app

    result = CliRunner().invoke(app, ["serve", "--index-dir", str(index_dir), *args])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def _edit_manifest(index_dir: Path, edit) -> None:
    path = index_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


# ---------------------------------------------------------------- files swapped, truncated, lied about
@pytest.mark.parametrize("name", ["docstore.arrow", "dense.faiss"])
def test_a_file_swapped_for_another_of_the_same_row_count_is_refused(built, index_dir, no_ray, name):
    shutil.copy(built["other"] / name, index_dir / name)
    assert read_faiss_header(index_dir / "dense.faiss").ntotal == len(PASSAGES)  # the counts alone agree
    line = serve_error(index_dir)
    assert str(index_dir / name) in line and "replaced" in line, line


def test_a_truncated_docstore_is_refused_in_the_launching_process(index_dir, no_ray):
    path = index_dir / "docstore.arrow"
    path.write_bytes(path.read_bytes()[:-100])
    line = serve_error(index_dir)
    assert str(path) in line and "truncated" in line, line


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda m: m.update(count=6), r"docstore\.arrow holds 7 passages, .*manifest\.json says count 6"),
        (lambda m: m["index"].update(ntotal=6), r"dense\.faiss holds 7 vectors, .*manifest\.json says ntotal 6"),
        (lambda m: m.update(dim=768), r"dense\.faiss holds 384-d vectors, .*says dim 768"),
        (lambda m: m["index"].update(factory="HNSW32,Flat"), r"dense\.faiss is a faiss 'IxFI' index, not the 'HNSW32"),
        (lambda m: m.update(version=99), r"manifest version 99; this verl-evidence reads versions 1, 2"),
        (lambda m: m["index"].pop("ntotal"), r"manifest\.json: index\.ntotal: Field required"),
    ],
    ids=["count", "ntotal", "dim", "factory", "version", "missing-field"],
)
def test_a_manifest_that_disagrees_with_its_files_is_refused(index_dir, no_ray, edit, named):
    _edit_manifest(index_dir, edit)
    with pytest.raises(IndexMismatchError, match=named):
        verify_index(index_dir)
    assert serve_error(index_dir)


def test_a_manifest_that_is_not_json_is_one_line(index_dir, no_ray):
    (index_dir / "manifest.json").write_text('{"version": 2, "count": ')
    line = serve_error(index_dir)
    assert str(index_dir / "manifest.json") in line and "is not a JSON manifest" in line, line


def test_checksums_sample_a_large_file_and_see_a_change_in_a_sampled_block(tmp_path):
    from retrieval_server.index import CHECKSUM_BLOCK_BYTES, CHECKSUM_BLOCKS

    path = tmp_path / "big.bin"
    data = bytearray(np.random.default_rng(0).bytes(40 << 20))  # over the 16 MiB read whole
    path.write_bytes(data)
    recorded = file_checksum(path)
    sampled = (len(data) - CHECKSUM_BLOCK_BYTES) * 128 // (CHECKSUM_BLOCKS - 1)  # where block 128 starts

    def changed_at(offset: int) -> bool:
        copy = bytearray(data)
        copy[offset : offset + 8] = b"swapped!"
        path.write_bytes(copy)
        now = file_checksum(path)
        assert now["size"] == recorded["size"]
        return now["xxh3_128"] != recorded["xxh3_128"]

    assert changed_at(sampled)
    assert not changed_at(sampled - 4096)  # the price of sampling: bytes between the blocks are not read


# ---------------------------------------------------------------- an index written before checksums (manifest v1)
def test_a_version_1_manifest_is_refused_until_its_files_are_recorded(index_dir, no_ray, minilm):
    def to_version_1(manifest):
        manifest["version"] = 1
        del manifest["files"], manifest["checksum"]

    _edit_manifest(index_dir, to_version_1)
    line = serve_error(index_dir)
    assert "records no checksums" in line and f"verl-evidence index verify --index-dir {index_dir} --record" in line

    from verl_evidence.cli import app

    recorded = CliRunner().invoke(app, ["index", "verify", "--index-dir", str(index_dir), "--record"])
    assert recorded.exit_code == 0, recorded.output
    assert json.loads((index_dir / "manifest.json").read_text())["version"] == 3
    assert verify_index(index_dir)["files"]["dense.faiss"]["size"] == (index_dir / "dense.faiss").stat().st_size

    # --record checks before it records: a truncated docstore is refused, not blessed.
    _edit_manifest(index_dir, to_version_1)
    store = index_dir / "docstore.arrow"
    store.write_bytes(store.read_bytes()[:-100])
    with pytest.raises(IndexMismatchError, match="cannot be read as a passage store"):
        verify_and_record(index_dir)


def test_the_builder_upgrades_its_own_version_1_manifest(index_dir, minilm):
    def to_version_1(manifest):
        manifest["version"] = 1
        del manifest["files"], manifest["checksum"]

    _edit_manifest(index_dir, to_version_1)
    corpus = Path(json.loads((index_dir / "manifest.json").read_text())["corpus"]["path"])
    config = BuildConfig(
        corpus=corpus, output_dir=index_dir, encoder=packaged_minilm_encoder(), shard_size=3, bm25=False
    )
    manifest = build_index(config, encoder=UnusableEncoder(), show_progress=False)
    assert manifest["version"] == 3 and verify_index(index_dir)["count"] == len(PASSAGES)


# ---------------------------------------------------------------- search parameters
def test_search_params_the_index_does_not_take_stop_serve_before_ray(built, index_dir, no_ray):
    line = serve_error(index_dir, "--search-params", "nprobe=32")
    assert line == (
        f"error: --search-params 'nprobe=32': {index_dir / 'dense.faiss'} (Flat) has no search parameter 'nprobe': "
        "it takes no search parameters (it searches exhaustively)"
    )
    assert "it takes nprobe" in serve_error(built["ivf"], "--search-params", "efSearch=64")
    assert "is not NAME=NUMBER" in serve_error(built["ivf"], "--search-params", "nprobe")


def test_an_ivf_index_is_served_at_the_nprobe_its_build_chose(built):
    import faiss

    from retrieval_server.index import check_search_params, read_dense_index

    manifest = verify_index(built["ivf"])
    tuning = manifest["index"]["tuning"]
    assert manifest["index"]["search_params"] == tuning["search_params"] == "nprobe=2"  # 7 passages, 2 lists
    assert [row["search_params"] for row in tuning["recall"]] == ["nprobe=1", "nprobe=2"]
    assert tuning["recall"][-1]["recall@6"] == 1.0  # every list: exact
    # The file carries it: a replica reading the index searches 2 lists without being told.
    assert faiss.extract_index_ivf(read_dense_index(built["ivf"] / "dense.faiss")).nprobe == 2
    check_search_params(built["ivf"], manifest, "nprobe=1")  # accepted


def test_recall_takes_search_params_and_checks_them_first(built, tmp_path):
    from retrieval_server.index import SearchParamsError
    from retrieval_server.recall import recall_at_k

    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "Which volcano is in Tanzania?", "gold_passage_ids": ["a2"]}) + "\n")
    with pytest.raises(SearchParamsError, match="has no search parameter 'nprobe'"):
        recall_at_k(built["index"], qa, ks=[1], search_params="nprobe=4")


# ---------------------------------------------------------------- building: damaged shards, full disk
def test_a_truncated_shard_is_encoded_again_not_resumed_from(tmp_path, minilm, caplog):
    index_dir = _build(tmp_path, PASSAGES, minilm)
    vectors = np.load(index_dir / "shards" / "00001.npy")
    (index_dir / "manifest.json").unlink()  # an interrupted build: no manifest yet
    shard = index_dir / "shards" / "00001.npy"
    shard.write_bytes(shard.read_bytes()[:200])
    encoded_before = minilm.passages_encoded
    with caplog.at_level("WARNING", logger="retrieval_server.index"):
        build_index(
            BuildConfig(
                corpus=tmp_path / "corpus.jsonl",
                output_dir=index_dir,
                encoder=packaged_minilm_encoder(),
                shard_size=3,
                bm25=False,
            ),
            encoder=minilm,
            show_progress=False,
        )
    assert minilm.passages_encoded - encoded_before == 3  # that shard only
    assert f"shard {shard} is unreadable or truncated" in caplog.text
    np.testing.assert_allclose(np.load(shard), vectors, atol=1e-6)


def test_a_full_disk_removes_temporary_files_and_says_how_much_is_needed(tmp_path, minilm, monkeypatch):
    from verl_evidence.cli import app

    corpus = write_corpus(tmp_path / "corpus.jsonl")
    real_save = np.save

    def save_until_full(path, array):
        if "00001" in str(path):
            Path(path).write_bytes(b"\x93NUMPY half a shard")  # what a write cut short leaves
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(path, array)

    monkeypatch.setattr("retrieval_server.index.np.save", save_until_full)
    monkeypatch.setattr("retrieval_server.encoders.SentenceEncoder", lambda *a, **k: minilm)
    output = tmp_path / "index"
    args = ["index", "build", "--corpus", str(corpus), "-o", str(output), "--shard-size", "3", "--no-bm25"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, (result.output, result.exception)
    line = result.output.strip().splitlines()[-1]  # after the progress bar's
    assert "Traceback" not in result.output
    assert line.startswith(f"error: disk full at {output}: need ~") and "GB more" in line, line
    assert sorted(p.name for p in output.rglob("*tmp*")) == []
    assert (output / "shards" / "00000.npy").exists()  # finished shards stay for the re-run

    # The docstore's write fails alike: its docstore.tmp goes too.
    def docstore_until_full(corpus, destination, **kwargs):
        destination.with_suffix(".tmp").write_bytes(b"ARROW1 partial")
        raise OSError(errno.ENOSPC, "[errno 28] No space left on device")

    monkeypatch.setattr("retrieval_server.index.write_docstore", docstore_until_full)
    shutil.rmtree(output)
    with pytest.raises(DiskFullError, match=f"disk full at {output}"):
        build_index(
            BuildConfig(corpus=corpus, output_dir=output, encoder=packaged_minilm_encoder(), bm25=False),
            encoder=minilm,
            show_progress=False,
        )
    assert not (output / "docstore.tmp").exists()
