"""Index builder (corpus -> docstore -> encoded shards -> FAISS index + BM25) and the manifest that guards it.

Layout of an index directory::

    manifest.json        what was built, from what, with which encoder; the served files' sizes and checksums
    docstore.arrow       passages, row i = FAISS id i
    shards/00000.npy     passage embeddings, ``shard_size`` rows each (resumption unit)
    shards/build.json    corpus checksum + encoder of the shards, so stale shards are never reused
    dense.faiss          the FAISS index (inner product)
    bm25/                bm25s index + its vocabulary
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import struct
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from retrieval_server.config import BuildConfig, EncoderConfig
from retrieval_server.docstore import CorpusFormatError, file_sha256, iter_corpus, write_docstore
from retrieval_server.errors import IndexMismatchError, SearchParamsError
from retrieval_server.factory_check import check_factory
from retrieval_server.search_params import choose_search_params, speed_knob

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
DOCSTORE = "docstore.arrow"
DENSE_INDEX = "dense.faiss"
BM25_DIR = "bm25"
SHARDS_DIR = "shards"
BM25_TOKENIZER_VOCAB = "vocab.tokenizer.json"
# 3: also the encoder's files, hashed whole ("encoder_files": the model directory and the ONNX exports beside the index)
# and each served file's hash of every byte ("full_xxh3_128", for `index verify --full`); 2: the served files' sizes
# and sampled checksums ("files", "checksum"). Older ones are refused by serve until `index verify --record` (or a
# rebuild) records what they lack.
MANIFEST_VERSION = 3
READABLE_MANIFEST_VERSIONS = (1, 2, 3)
ENCODERS_DIR = "encoders"  # ONNX exports beside the index (retrieval_server.encoders.onnx_export)


class DiskFullError(OSError):
    """A write of the builder found the disk full; its temporary files are removed."""

    def __init__(self, path: Path, need_bytes: int) -> None:
        free = shutil.disk_usage(path if path.is_dir() else path.parent).free
        self.message = (
            f"disk full at {path}: need ~{need_bytes / 2**30:.1f} GB more for the rest of the build "
            f"({free / 2**30:.1f} GB free); temporary files removed, finished shards kept: free space and re-run"
        )
        super().__init__(errno.ENOSPC, self.message)  # no filename: the user-error line is this message

    def __str__(self) -> str:
        return self.message


def _is_disk_full(err: BaseException) -> bool:
    # pyarrow's and faiss's write errors carry the C library's message, not always an errno
    return getattr(err, "errno", None) == errno.ENOSPC or "No space left on device" in str(err)


class _CorpusFields(BaseModel):
    path: str
    sha256: str
    size: int


class _EncoderFields(BaseModel):
    model: str
    fingerprint: str


class _IndexFields(BaseModel):
    factory: str
    file: str
    ntotal: int
    search_params: str = ""


class _ManifestFields(BaseModel):
    """What start-up reads from a manifest, with its types; other fields are informational."""

    version: int
    corpus: _CorpusFields
    count: int
    encoder: _EncoderFields
    dim: int
    index: _IndexFields
    docstore: str
    bm25: dict | None = None
    files: dict[str, dict] | None = None


def read_manifest(index_dir: Path) -> dict:
    """The manifest as a dict, refused (naming the file) when it is not JSON, misses a field start-up reads, or has
    a version this code does not know."""
    path = Path(index_dir) / MANIFEST
    if not path.exists():
        raise IndexMismatchError(f"no index manifest at {path}: build the index first (verl-evidence index build)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise IndexMismatchError(f"{path} is not a JSON manifest ({err}): rebuild or re-adopt the index") from None
    version = manifest.get("version") if isinstance(manifest, dict) else None
    if version not in READABLE_MANIFEST_VERSIONS:
        raise IndexMismatchError(
            f"{path} has manifest version {version!r}; this verl-evidence reads versions "
            f"{', '.join(map(str, READABLE_MANIFEST_VERSIONS))} (upgrade verl-evidence, or rebuild the index)"
        )
    from pydantic import ValidationError

    try:
        _ManifestFields.model_validate(manifest)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise IndexMismatchError(f"{path}: {where}: {first['msg']} (rebuild or re-adopt the index)") from None
    return manifest


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)


def _shard_paths(shard_dir: Path, count: int, shard_size: int) -> list[Path]:
    return [shard_dir / f"{i:05d}.npy" for i in range((count + shard_size - 1) // shard_size)]


def _progress():
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )


@contextmanager
def faiss_warnings_summarised(what: str) -> Iterator[None]:
    """faiss's C++ warnings during ``what`` (k-means warns once per run: 48 identical lines for a PQ48 codebook),
    logged once per distinct line with its count instead of printed each time."""
    from wurlitzer import pipes

    with pipes(stdout=None) as (_, captured):
        yield
    lines = (line.strip().removeprefix("WARNING").strip() for line in captured.getvalue().splitlines())
    for line, times in Counter(filter(None, lines)).items():
        advice = " (raise --train-sample, or use fewer lists or PQ bits)" if "training points" in line else ""
        logger.warning("faiss, %s (%d time%s): %s%s", what, times, "" if times == 1 else "s", line, advice)


def encode_shards(
    config: BuildConfig, corpus_sha256: str, count: int, encoder=None, show_progress: bool = True
) -> tuple[list[Path], int]:
    """Encode the corpus into ``.npy`` shards, skipping shards already finished by an earlier run."""
    from retrieval_server.encoders import SentenceEncoder, describe

    shard_dir = config.output_dir / SHARDS_DIR
    shard_dir.mkdir(parents=True, exist_ok=True)
    build_info_path = shard_dir / "build.json"
    encoder = encoder or SentenceEncoder(config.encoder, device=config.device)
    # Content only (no model location): shards encoded by a moved or copied model stay valid.
    build_info = {
        "corpus_sha256": corpus_sha256,
        "encoder": vector_identity(describe(config.encoder, encoder.dim)),
        "shard_size": config.shard_size,
    }
    if build_info_path.exists() and json.loads(build_info_path.read_text()) != build_info:
        logger.warning("shards in %s were encoded from another corpus/encoder: re-encoding", shard_dir)
        shutil.rmtree(shard_dir)
        shard_dir.mkdir(parents=True)
    _write_json_atomic(build_info_path, build_info)

    paths = _shard_paths(shard_dir, count, config.shard_size)
    for i, path in enumerate(paths):
        rows = min(config.shard_size, count - i * config.shard_size)
        problem = _shard_problem(path, rows, encoder.dim)
        if problem is not None:
            logger.warning("shard %s %s: encoding it again", path, problem)
            path.unlink()
    todo = [i for i, p in enumerate(paths) if not p.exists()]
    if len(todo) < len(paths):
        logger.info("resuming: %d of %d shards already encoded", len(paths) - len(todo), len(paths))
    if todo:
        todo_set = set(todo)
        with _progress() if show_progress else _NullProgress() as progress:
            task = progress.add_task(
                "encoding passages", total=count, completed=(len(paths) - len(todo)) * config.shard_size
            )
            batch: list[str] = []
            shard = 0
            for row, (_, contents) in enumerate(iter_corpus(config.corpus)):
                if row // config.shard_size in todo_set:
                    batch.append(contents)
                if (row + 1) % config.shard_size == 0 or row + 1 == count:
                    if shard in todo_set:
                        vectors = encoder.encode_passages(batch, batch_size=config.encode_batch_size)
                        tmp = paths[shard].with_suffix(".tmp.npy")
                        np.save(tmp, vectors.astype(np.float32))
                        tmp.replace(paths[shard])  # a shard exists only once it is complete
                        progress.update(task, advance=len(batch))
                    batch = []
                    shard += 1
    return paths, encoder.dim


def _shard_problem(path: Path, rows: int, dim: int) -> str | None:
    """Why a finished shard cannot be resumed from (unreadable, truncated, another shape), or None."""
    if not path.exists():
        return None
    try:
        vectors = np.load(path, mmap_mode="r")  # reads the header; a file shorter than it announces fails here
    except (ValueError, OSError, EOFError) as err:
        return f"is unreadable or truncated ({err})"
    if vectors.shape != (rows, dim) or vectors.dtype != np.float32:
        return f"holds {vectors.dtype} {vectors.shape}, not float32 ({rows}, {dim})"
    return None


class _NullProgress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, *args, **kwargs):
        return 0

    def update(self, *args, **kwargs):
        pass


def build_faiss_index(shard_paths: list[Path], dim: int, factory: str, train_sample: int, seed: int = 0):
    import faiss

    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        shards = [np.load(p, mmap_mode="r") for p in shard_paths]
        total = sum(len(s) for s in shards)
        rng = np.random.default_rng(seed)
        take = np.sort(rng.choice(total, size=min(train_sample, total), replace=False))
        sample = np.concatenate(shards)[take] if total <= train_sample * 4 else _gather_rows(shards, take)
        try:
            with faiss_warnings_summarised(f"training {factory}"):
                index.train(np.ascontiguousarray(sample, dtype=np.float32))
        except RuntimeError as err:
            raise ValueError(f"cannot train FAISS index {factory!r} on {len(sample)} vectors: {err}") from err
    for path in shard_paths:
        index.add(np.ascontiguousarray(np.load(path, mmap_mode="r"), dtype=np.float32))
    return index


def _gather_rows(shards: list[np.ndarray], rows: np.ndarray) -> np.ndarray:
    offsets = np.cumsum([0] + [len(s) for s in shards])
    out = []
    for i, shard in enumerate(shards):
        local = rows[(rows >= offsets[i]) & (rows < offsets[i + 1])] - offsets[i]
        if len(local):
            out.append(np.asarray(shard[local]))
    return np.concatenate(out)


def build_bm25(config: BuildConfig) -> None:
    import bm25s
    from bm25s.tokenization import Tokenizer

    tokenizer = Tokenizer(stopwords="en")
    # Streamed from the corpus: wiki-18's 14 GB of text never sit in memory as strings, only their token ids.
    stream = tokenizer.tokenize((contents for _, contents in iter_corpus(config.corpus)), return_as="stream")
    tokens = tokenizer.to_tokenized_tuple(list(stream))
    retriever = bm25s.BM25()
    retriever.index(tokens, show_progress=False)
    tmp = config.output_dir / (BM25_DIR + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    retriever.save(str(tmp), show_progress=False)
    tokenizer.save_vocab(str(tmp), vocab_name=BM25_TOKENIZER_VOCAB)  # queries must be split with this vocabulary
    final = config.output_dir / BM25_DIR
    shutil.rmtree(final, ignore_errors=True)
    tmp.replace(final)


def build_index(
    config: BuildConfig,
    encoder=None,
    show_progress: bool = True,
    lock_timeout_s: float | None = None,
    target_recall: float = 0.95,
) -> dict:
    """Build (or finish building) an index; returns the manifest. Idempotent when nothing changed.

    An IVF or HNSW index is written set to the smallest ``nprobe``/``efSearch`` whose recall@10 against exact
    search reaches ``target_recall`` (:func:`tune_on_shards`), recorded in the manifest with the sweep.

    An exclusive lock on the directory makes concurrent builders (two test runs,
    a demo and a server) wait for each other instead of interleaving files;
    ``lock_timeout_s`` bounds that wait (None: wait as long as the other build takes).
    """
    from filelock import FileLock

    config.output_dir.mkdir(parents=True, exist_ok=True)
    lock_path = config.output_dir / ".build.lock"
    lock = FileLock(lock_path)
    _wait_for_lock(lock, lock_path, lock_timeout_s)
    try:
        return _build_index_locked(config, encoder, show_progress, target_recall)
    finally:
        lock.release()


def _wait_for_lock(lock, lock_path: Path, timeout_s: float | None) -> None:
    from filelock import Timeout

    try:
        lock.acquire(timeout=0)
        return
    except Timeout:
        logger.info("waiting for another process building the index in %s", lock_path.parent)
    try:
        lock.acquire(timeout=-1 if timeout_s is None else timeout_s, poll_interval=0.5)
    except Timeout:
        raise TimeoutError(
            f"another process has been building the index in {lock_path.parent} for over {timeout_s:.0f} s "
            f"(it holds {lock_path}); wait for it or stop it"
        ) from None


def _build_index_locked(config: BuildConfig, encoder, show_progress: bool, target_recall: float) -> dict:
    from retrieval_server.encoders import model_fingerprint

    started = time.time()
    corpus_sha256 = file_sha256(config.corpus)
    manifest_path = config.output_dir / MANIFEST
    if manifest_path.exists():
        try:
            existing = read_manifest(config.output_dir)
        except IndexMismatchError as err:
            logger.warning("%s; rebuilding", err)
            existing = {}
        # Judged by content, not by where corpus and model were when it was built (a moved or deleted
        # checkout or venv, a second clone): the same bytes give the same index.
        if (
            existing.get("corpus", {}).get("sha256") == corpus_sha256
            and existing.get("index", {}).get("factory") == config.index_factory
            and recorded_encoder(existing).describes_same_vectors(config.encoder) == []
            and existing["encoder"].get("fingerprint") == model_fingerprint(config.encoder.model)
            and (existing.get("bm25") is not None) >= config.bm25
            and (not config.bm25 or (config.output_dir / BM25_DIR / BM25_TOKENIZER_VOCAB).exists())
            and all((config.output_dir / name).exists() for name in (DOCSTORE, DENSE_INDEX))
            and _files_still_written(config.output_dir, existing, manifest_path)
        ):
            logger.info("index in %s is up to date", config.output_dir)
            if existing["version"] < MANIFEST_VERSION:  # our own files, checked above: record their checksums
                logger.info("recording the checksums of %s's files in its manifest", config.output_dir)
                existing = record_checksums(config.output_dir, existing)
                _write_json_atomic(manifest_path, existing)
            return _record_locations(manifest_path, existing, config)
        manifest_path.unlink()  # about to rebuild: never leave a manifest describing other files

    progress = {"count": None, "dim": None}
    try:
        return _build_files(config, encoder, show_progress, target_recall, corpus_sha256, started, progress)
    except BaseException as err:
        _remove_temporary_files(config.output_dir)
        if isinstance(err, (OSError, RuntimeError)) and _is_disk_full(err):
            raise DiskFullError(config.output_dir, _space_needed(config, progress)) from err
        raise


def _files_still_written(index_dir: Path, manifest: dict, manifest_path: Path) -> bool:
    """The files hold what the manifest says (and, once recorded, are the files it recorded): else rebuild them."""
    problems = _open_problems(index_dir, manifest, manifest_path)
    if not problems and manifest["version"] >= 2:
        problems = _served_file_problems(index_dir, manifest, manifest_path)
    if not problems and manifest["version"] >= 3:  # weights changed in place (same sizes): the vectors are stale
        problems = _model_problems(manifest, manifest["encoder"]["model"], manifest_path)
    for problem in problems:
        logger.warning("%s: rebuilding", problem)
    return not problems


def _build_files(config, encoder, show_progress, target_recall, corpus_sha256, started, progress) -> dict:
    import faiss

    from retrieval_server.encoders import SentenceEncoder, describe

    docstore_path = config.output_dir / DOCSTORE
    count = write_docstore(config.corpus, docstore_path)
    if count == 0:
        raise CorpusFormatError(f"{config.corpus}: corpus is empty")
    encoder = encoder or SentenceEncoder(config.encoder, device=config.device)
    progress.update(count=count, dim=encoder.dim)
    check_factory(config.index_factory, encoder.dim, count, config.train_sample)  # before the encoding's hours
    shard_paths, dim = encode_shards(config, corpus_sha256, count, encoder=encoder, show_progress=show_progress)
    index = build_faiss_index(shard_paths, dim, config.index_factory, config.train_sample)
    # IVF's nprobe and HNSW's efSearch are written into the file: it is served at the setting chosen here.
    tuning = tune_on_shards(index, shard_paths, target_recall) if _has_speed_knob(index) else None
    faiss.write_index(index, str(config.output_dir / (DENSE_INDEX + ".tmp")))
    (config.output_dir / (DENSE_INDEX + ".tmp")).replace(config.output_dir / DENSE_INDEX)
    if config.bm25:
        build_bm25(config)

    manifest = {
        "version": MANIFEST_VERSION,
        "corpus": {"path": str(config.corpus.resolve()), "sha256": corpus_sha256, "size": config.corpus.stat().st_size},
        "count": count,
        "encoder": describe(config.encoder, dim),
        "dim": dim,
        "index": {
            "factory": config.index_factory,
            "metric": "inner_product",
            "file": DENSE_INDEX,
            "ntotal": int(index.ntotal),
            **({"search_params": tuning["search_params"], "tuning": tuning} if tuning else {}),
        },
        "docstore": DOCSTORE,
        "bm25": {"dir": BM25_DIR, "tokenizer": "bm25s.Tokenizer(stopwords=en)", "tokenizer_vocab": BM25_TOKENIZER_VOCAB}
        if config.bm25
        else None,
        "shards": {"dir": SHARDS_DIR, "shard_size": config.shard_size, "count": len(shard_paths)},
        "build_seconds": round(time.time() - started, 2),
    }
    manifest = record_checksums(config.output_dir, manifest)
    _write_json_atomic(config.output_dir / MANIFEST, manifest)
    return manifest


def _has_speed_knob(index) -> bool:
    return speed_knob(index) is not None


def tune_on_shards(index, shard_paths: list[Path], target_recall: float, k: int = 10, queries: int = 256) -> dict:
    """Choose ``index``'s search setting by recall@k against exact search of the shards (sampled passages as queries,
    each one's own passage dropped); see :func:`retrieval_server.search_params.choose_search_params`."""
    import faiss

    shards = [np.load(p, mmap_mode="r") for p in shard_paths]
    total = sum(len(s) for s in shards)
    k = max(1, min(k, total - 1))
    rows = np.sort(np.random.default_rng(0).choice(total, size=min(queries, total), replace=False))
    sample = np.ascontiguousarray(_gather_rows(shards, rows), dtype=np.float32)
    exact = faiss.ResultHeap(len(rows), k + 1, keep_max=True)  # merged shard by shard: no second copy of the vectors
    offset = 0
    for shard in shards:
        scores, found = faiss.knn(
            sample, np.ascontiguousarray(shard, dtype=np.float32), min(k + 1, len(shard)), faiss.METRIC_INNER_PRODUCT
        )
        exact.add_result(scores, np.where(found >= 0, found + offset, -1))
        offset += len(shard)
    exact.finalize()
    tuning = choose_search_params(index, sample, exact.I, k, exclude=rows, target=target_recall)
    chosen = next(row for row in tuning["recall"] if row["search_params"] == tuning["search_params"])
    logger.info(
        "the index is written set to %s: recall@%d %.3f against exact search",
        tuning["search_params"], k, chosen[f"recall@{k}"],
    )  # fmt: skip
    return {**tuning, "queries": len(rows)}


def _remove_temporary_files(index_dir: Path) -> None:
    """What an interrupted build leaves half-written; finished shards stay (they are the resumption unit)."""
    for path in [*index_dir.glob(f"{SHARDS_DIR}/*.tmp.npy"), *index_dir.glob("*.tmp")]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _space_needed(config: BuildConfig, progress: dict) -> int:
    """Rough bytes the rest of a build writes: docstore (about the corpus), shards and a Flat-sized index, BM25."""
    corpus = config.corpus.stat().st_size
    docstore = 0 if (config.output_dir / DOCSTORE).exists() else corpus
    if progress["count"] and progress["dim"]:
        vector_bytes = progress["count"] * progress["dim"] * 4
        finished = sum(p.stat().st_size for p in (config.output_dir / SHARDS_DIR).glob("[0-9]*.npy"))
        vectors = max(vector_bytes - finished, 0) + vector_bytes
    else:
        vectors = 2 * corpus  # unknown before the encoder loads: about the corpus's size, twice
    return docstore + vectors + (corpus // 2 if config.bm25 else 0)


def read_dense_index(path: Path, mmap: bool = False):
    """Read a FAISS index file; ``mmap=True`` maps its vectors/codes from the file instead of copying them.

    Mapped pages live in the page cache, so every replica on a node that maps the
    same file shares one copy, and pages never searched are never read. faiss's
    ``IO_FLAG_MMAP_IFC`` does this for Flat, SQ, HNSW and IVF indexes (``IO_FLAG_MMAP``
    alone only concerns on-disk IVF lists); read-only, as a mapped index cannot grow.
    """
    import faiss

    flags = (faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY) if mmap else 0
    return faiss.read_index(str(path), flags)


def load_shard_embeddings(index_dir: Path) -> np.ndarray:
    """All passage embeddings of an index, in row order (tests and recall measurements)."""
    manifest = read_manifest(index_dir)
    shard_dir = Path(index_dir) / manifest["shards"]["dir"]
    paths = _shard_paths(shard_dir, manifest["count"], manifest["shards"]["shard_size"])
    return np.concatenate([np.load(p) for p in paths])


def recorded_encoder(manifest: dict) -> EncoderConfig:
    """The encoder settings a manifest records (its model as recorded: a location that may be gone)."""
    return EncoderConfig(**{k: manifest["encoder"][k] for k in EncoderConfig.model_fields})


def vector_identity(encoder_description: dict) -> dict:
    """An encoder description without the model's location: what decides the vectors."""
    return {k: v for k, v in encoder_description.items() if k != "model"}


def _record_locations(manifest_path: Path, manifest: dict, config: BuildConfig) -> dict:
    """Point an up-to-date manifest at the corpus and model it was just checked against, if they moved."""
    corpus, model = str(config.corpus.resolve()), config.encoder.model
    if manifest["corpus"]["path"] == corpus and manifest["encoder"]["model"] == model:
        return manifest
    logger.info(
        "index in %s was built from %s with %s; same content found at %s and %s",
        manifest_path.parent, manifest["corpus"]["path"], manifest["encoder"]["model"], corpus, model,
    )  # fmt: skip
    manifest = {
        **manifest,
        "corpus": {**manifest["corpus"], "path": corpus},
        "encoder": {**manifest["encoder"], "model": model},
    }
    _write_json_atomic(manifest_path, manifest)
    return manifest


def known_model_copies() -> list[str]:
    """Models this installation can offer in place of a recorded one that is gone (matched by fingerprint)."""
    try:
        from retrieval_server.config import packaged_minilm_path

        return [packaged_minilm_path()]
    except ImportError:
        return []


CORPUS_STAT_CACHE = "corpus-checksum.json"


def corpus_sha256(corpus: Path, index_dir: Path) -> str:
    """The corpus file's sha256, re-read only when the file is not the one last hashed for this index.

    Hashing wiki-18's 14 GB JSONL takes about a minute, at every server start. As git
    does for its index, the checksum is kept beside the index with the file's
    identity (resolved path, device, inode, size, mtime in ns) and reused while all
    of them match; an edit in place changes mtime and size. A read-only index
    directory just means hashing every time.
    """
    corpus = Path(corpus)
    stat = corpus.stat()
    identity = {
        "path": str(corpus.resolve()), "device": stat.st_dev, "inode": stat.st_ino,
        "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
    }  # fmt: skip
    cache = Path(index_dir) / CORPUS_STAT_CACHE
    try:
        cached = json.loads(cache.read_text())
        if cached.get("identity") == identity and isinstance(cached.get("sha256"), str):
            return cached["sha256"]
    except (OSError, ValueError):
        pass
    digest = file_sha256(corpus)
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps({"identity": identity, "sha256": digest}))
        os.replace(tmp, cache)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        logger.debug("corpus checksum not cached in %s: %s", cache, err)
    return digest


# ---------------------------------------------------------------- the served files: checksums and cheap opens
# xxh3-128 of the file's size and of 256 blocks of 64 KiB spread evenly over it (first and last included); a file of
# at most 16 MiB is hashed whole. Why sampled: every start checks the files, and hashing a 60 GB Flat index whole
# means reading 60 GB (minutes from disk); 16 MiB take milliseconds. A replaced, truncated or extended file is caught
# (another file differs in every block, and the size is hashed); a few bytes changed between samples are not (bit
# rot is the file system's job).
CHECKSUM_METHOD = "xxh3_128 of the size and 256 evenly spaced 64 KiB blocks (whole file up to 16 MiB)"
CHECKSUM_BLOCK_BYTES = 1 << 16
CHECKSUM_BLOCKS = 256


def file_checksum(path: Path) -> dict:
    """``{"size", "xxh3_128"}`` of a file by :data:`CHECKSUM_METHOD`."""
    import xxhash

    digest = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        digest.update(size.to_bytes(8, "little"))
        if size <= CHECKSUM_BLOCK_BYTES * CHECKSUM_BLOCKS:
            while block := handle.read(1 << 20):
                digest.update(block)
        else:
            last = size - CHECKSUM_BLOCK_BYTES
            for i in range(CHECKSUM_BLOCKS):
                digest.update(os.pread(handle.fileno(), CHECKSUM_BLOCK_BYTES, last * i // (CHECKSUM_BLOCKS - 1)))
    return {"size": size, "xxh3_128": digest.hexdigest()}


def served_files(index_dir: Path, manifest: dict) -> list[str]:
    """The files a server reads, relative to the index directory: docstore, dense index, BM25's files."""
    names = [manifest["docstore"], manifest["index"]["file"]]
    if manifest.get("bm25"):
        bm25_dir = Path(index_dir) / manifest["bm25"]["dir"]
        names += sorted(p.relative_to(index_dir).as_posix() for p in bm25_dir.rglob("*") if p.is_file())
    return names


def record_checksums(index_dir: Path, manifest: dict, model: str | None = None, strict: bool = False) -> dict:
    """``manifest`` at the current version with the checksums of the files it serves and of its encoder's files (the
    caller writes it). ``model``: the model directory to record (default: the manifest's, or a known copy of it).

    An ONNX export beside the index is recorded only if it still holds the files it recorded when it was made; one
    that does not is left out with a warning (``strict``: refused), so nothing altered is ever recorded.
    """
    from retrieval_server.encoders.fingerprint import full_checksum

    files = {}
    for name in served_files(index_dir, manifest):
        path = Path(index_dir) / name
        files[name] = {**file_checksum(path), "full_xxh3_128": full_checksum(path)["xxh3_128"]}
    encoder_files = _encoder_record(Path(index_dir), manifest, model, strict)
    return {
        **manifest, "version": MANIFEST_VERSION, "checksum": CHECKSUM_METHOD, "files": files,
        "encoder_files": encoder_files,
    }  # fmt: skip


def exports_beside(index_dir: Path) -> list[Path]:
    """The ONNX exports beside an index that this verl-evidence can load: those of its export format (the format is
    part of the directory's key, so an older one is never loaded, and has no record of its files to check)."""
    from retrieval_server.encoders.onnx_export import ONNX_EXPORT_FORMAT

    found = []
    for export_dir in sorted((Path(index_dir) / ENCODERS_DIR).glob("onnx-*")):
        try:
            meta = json.loads((export_dir / "export.json").read_text())
        except (OSError, ValueError):
            continue  # being made (it appears whole, by one rename), or not an export
        if isinstance(meta, dict) and meta.get("format") == ONNX_EXPORT_FORMAT:
            found.append(export_dir)
    return found


def _loadable_model(manifest: dict) -> str:
    """The model directory a server would load for ``manifest``: the recorded one, or a known copy of it if gone."""
    from retrieval_server.encoders import model_fingerprint

    recorded = manifest["encoder"]
    if Path(recorded["model"]).exists() or recorded["fingerprint"].startswith("name:"):
        return recorded["model"]
    copy = next((m for m in known_model_copies() if model_fingerprint(m) == recorded["fingerprint"]), None)
    return copy or recorded["model"]


def _encoder_record(index_dir: Path, manifest: dict, model: str | None, strict: bool) -> dict:
    from retrieval_server.encoders.fingerprint import (
        ENCODER_CHECKSUM,
        checksum_files,
        export_files,
        export_problems,
        model_files,
    )

    model = model or _loadable_model(manifest)
    names = model_files(model)
    exports = {}
    for export_dir in exports_beside(index_dir):
        problems = export_problems(export_dir)
        if problems and strict:
            raise IndexMismatchError(f"refusing to record the ONNX export {export_dir}: {'; '.join(problems)}")
        if problems:
            logger.warning("ONNX export not recorded in %s: %s", index_dir / MANIFEST, "; ".join(problems))
            continue
        exports[export_dir.name] = checksum_files(export_dir, export_files(export_dir))
    return {
        "checksum": ENCODER_CHECKSUM,
        "model": None if names is None else checksum_files(Path(model), names),  # None: a hub name, no files
        "exports": exports,
    }


def record_export(index_dir: Path, export_dir: Path, made_now: bool = False) -> bool:
    """Add an ONNX export beside the index to its manifest (checked against the export's own record first); False
    when the manifest cannot be written (a read-only index: every start then checks the export's own record).

    An export already recorded keeps its record, unless ``made_now``: made, linked in or given its int8 graph by
    this start (the recorded one was removed, as a refusal advises, or lacked the int8 graph), so its record is new.
    """
    from filelock import FileLock

    from retrieval_server.encoders.fingerprint import checksum_files, export_files, export_problems

    index_dir, export_dir = Path(index_dir), Path(export_dir)
    try:
        with FileLock(index_dir / ".manifest.lock", timeout=30):
            manifest = read_manifest(index_dir)
            record = manifest.get("encoder_files")
            if manifest["version"] < 3 or not isinstance(record, dict):
                return False  # refused at start-up anyway, with the command that records everything
            if export_dir.name in (record.get("exports") or {}) and not made_now:
                return True
            problems = export_problems(export_dir)
            if problems:
                raise IndexMismatchError(f"refusing the ONNX export {export_dir}: " + "; ".join(problems))
            exports = {
                **(record.get("exports") or {}),
                export_dir.name: checksum_files(export_dir, export_files(export_dir)),
            }
            _write_json_atomic(index_dir / MANIFEST, {**manifest, "encoder_files": {**record, "exports": exports}})
    except OSError as err:  # read-only or full: the export's own record still guards it
        logger.info("ONNX export %s not recorded in %s: %s", export_dir, index_dir / MANIFEST, err)
        return False
    logger.info("recorded the ONNX export %s in %s", export_dir.name, index_dir / MANIFEST)
    return True


def _checksum_problems(index_dir: Path, manifest: dict, manifest_path: Path, full: bool = False) -> list[str]:
    if manifest["version"] < 2:
        return [f"{manifest_path} records no checksums of the files it serves (manifest version {manifest['version']})"]
    problems = _served_file_problems(index_dir, manifest, manifest_path, full=full and manifest["version"] >= 3)
    if not problems and manifest["version"] < 3:
        problems = [
            f"{manifest_path} records no checksums of its encoder's files (manifest version {manifest['version']})"
        ]
    return problems


def _model_problems(manifest: dict, model: str, manifest_path: Path) -> list[str]:
    """How the model directory to load differs from the one the manifest recorded (every byte of its files)."""
    from retrieval_server.encoders.fingerprint import ENCODER_CHECKSUM, file_problems, model_files

    record = manifest.get("encoder_files")
    if not isinstance(record, dict) or record.get("checksum") != ENCODER_CHECKSUM:
        return [f"{manifest_path} records no checksums of its encoder's files in this verl-evidence's way"]
    names = model_files(model)
    if record.get("model") is None or names is None:  # a hub name: nothing on disk to compare
        return []
    return file_problems(Path(model), record["model"], names, manifest_path)


def _export_problems(index_dir: Path, manifest: dict, manifest_path: Path) -> list[str]:
    """Each ONNX export beside the index against the manifest's record of it, or (not yet recorded) its own."""
    from retrieval_server.encoders.fingerprint import export_problems

    recorded = (manifest.get("encoder_files") or {}).get("exports") or {}
    problems = []
    for export_dir in exports_beside(index_dir):
        found = export_problems(export_dir, recorded.get(export_dir.name), manifest_path)
        if found:
            problems.append(f"{'; '.join(found)} (remove {export_dir}: it is exported again at the next start)")
    return problems


def unhashed_bytes(index_dir: Path, manifest: dict) -> tuple[int, int]:
    """(bytes a sampled check never reads, bytes served): each file over 16 MiB is read in 256 blocks of 64 KiB."""
    never = total = 0
    for name in served_files(index_dir, manifest):
        size = (Path(index_dir) / name).stat().st_size
        total += size
        if size > CHECKSUM_BLOCK_BYTES * CHECKSUM_BLOCKS:
            never += size - CHECKSUM_BLOCK_BYTES * CHECKSUM_BLOCKS
    return never, total


def _size(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


def sampling_summary(index_dir: Path, manifest: dict, full: bool, seconds: float) -> str:
    """What `index verify` hashed of the served files: every byte (``full``, with its time), or what a sampled check
    never reads."""
    never, total = unhashed_bytes(index_dir, manifest)
    if full:
        return f"every byte of the {_size(total)} served hashed in {seconds:.1f} s (--full)"
    if never == 0:
        return f"every byte of the {_size(total)} served hashed (no file over 16 MiB)"
    return (
        f"sampled checksums: {never / total:.2%} of the {_size(total)} served ({_size(never)}) never hashed, so a "
        "change there goes unseen; --full hashes every byte"
    )


def encoder_files_summary(index_dir: Path, manifest: dict) -> str:
    """What `index verify` checked of the encoder: its model files and ONNX exports, each hashed whole."""
    record = manifest.get("encoder_files") or {}
    model = record.get("model")
    exports = [p.name for p in exports_beside(index_dir)]
    recorded = set(record.get("exports") or {})
    model_part = (
        f"encoder model {manifest['encoder']['model']}: {len(model)} files hashed whole"
        if model is not None
        else f"encoder model {manifest['encoder']['model']}: a hub name, no files to hash"
    )
    export_part = ", ".join(f"{name} ({'recorded' if name in recorded else 'its own record'})" for name in exports)
    return f"{model_part}; ONNX exports beside the index: {export_part or 'none'}"


def _served_file_problems(index_dir: Path, manifest: dict, manifest_path: Path, full: bool = False) -> list[str]:
    from retrieval_server.encoders.fingerprint import full_checksum

    if manifest.get("checksum") != CHECKSUM_METHOD or not isinstance(manifest.get("files"), dict):
        return [f"{manifest_path} records no checksums of its files in this verl-evidence's way ({CHECKSUM_METHOD})"]
    recorded = manifest["files"]
    problems = []
    for name in served_files(index_dir, manifest):
        path = Path(index_dir) / name
        if name not in recorded:
            problems.append(f"{path} is served but {manifest_path} records no checksum of it")
            continue
        if not path.exists():
            continue  # reported as missing
        if full:
            if "full_xxh3_128" not in recorded[name]:
                problems.append(f"{manifest_path} records no hash of every byte of {path} (written before --full)")
                continue
            now, recorded_hash = full_checksum(path), recorded[name]["full_xxh3_128"]
        else:
            now = file_checksum(path)
            recorded_hash = recorded[name].get("xxh3_128")
        if now["size"] != recorded[name].get("size"):
            problems.append(
                f"{path} is {now['size']} bytes, {manifest_path} recorded {recorded[name].get('size')}: "
                "truncated, extended or replaced since the index was written"
            )
        elif now["xxh3_128"] != recorded_hash:
            problems.append(
                f"{path} is not the file {manifest_path} recorded (same size, other content): "
                "replaced or rewritten since the index was written"
            )
    return problems


# The header every faiss index file starts with: type code (fourcc), dimension, vector count, two fields faiss writes
# as 1 << 20, is_trained, metric. faiss has no header-only reader, and a full read (even memory-mapped) loads an HNSW
# graph whole: ~5 GB for wiki-18, only to learn the count.
_FAISS_HEADER = struct.Struct("<4siqqq?i")
_FAISS_HEADER_MARK = 1 << 20


@dataclass(frozen=True)
class FaissHeader:
    fourcc: str
    dim: int
    ntotal: int
    metric: int


def read_faiss_header(path: Path) -> FaissHeader:
    """The header of a faiss index file, read without loading the index; refused unless it is one."""
    with open(path, "rb") as handle:
        raw = handle.read(_FAISS_HEADER.size)
    if len(raw) == _FAISS_HEADER.size:
        fourcc, dim, ntotal, mark_a, mark_b, _, metric = _FAISS_HEADER.unpack(raw)
        if mark_a == mark_b == _FAISS_HEADER_MARK and dim > 0 and ntotal >= 0:
            return FaissHeader(fourcc.decode("latin-1"), dim, ntotal, metric)
    raise IndexMismatchError(f"{path} does not start with a FAISS index header: not a FAISS index file, or truncated")


def factory_fourcc(factory: str, dim: int) -> str | None:
    """The type code a ``factory`` index is written under (an empty one, serialised: no training, a few KB), or
    None when faiss cannot make that factory string (an adopted type named by class)."""
    import faiss

    try:
        empty = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError:
        return None
    return bytes(faiss.serialize_index(empty)[:4]).decode("latin-1")


def _open_problems(index_dir: Path, manifest: dict, manifest_path: Path) -> list[str]:
    """Open the docstore and read the dense index's header (both cheap: a mapped Arrow footer, 37 bytes) and compare
    what they hold with the manifest."""
    import faiss
    import pyarrow as pa

    from retrieval_server.docstore import DocumentStore

    problems = []
    docstore_path = Path(index_dir) / manifest["docstore"]
    if docstore_path.exists():
        try:
            rows = len(DocumentStore(docstore_path))
        except (pa.ArrowInvalid, OSError, ValueError) as err:
            problems.append(f"{docstore_path} cannot be read as a passage store (truncated or not one?): {err}")
        else:
            if rows != manifest["count"]:
                problems.append(
                    f"{docstore_path} holds {rows} passages, {manifest_path} says count {manifest['count']}"
                )
    dense_path = Path(index_dir) / manifest["index"]["file"]
    if dense_path.exists():
        try:
            header = read_faiss_header(dense_path)
        except IndexMismatchError as err:
            return [*problems, str(err)]
        said = manifest["index"]
        if header.ntotal != said["ntotal"] or header.ntotal != manifest["count"]:
            problems.append(
                f"{dense_path} holds {header.ntotal} vectors, {manifest_path} says ntotal {said['ntotal']} "
                f"and count {manifest['count']}"
            )
        if header.dim != manifest["dim"]:
            problems.append(f"{dense_path} holds {header.dim}-d vectors, {manifest_path} says dim {manifest['dim']}")
        if header.metric != faiss.METRIC_INNER_PRODUCT:
            problems.append(f"{dense_path} ranks by metric {header.metric}, not inner product (0)")
        expected = factory_fourcc(said["factory"], header.dim)
        if expected is not None and expected != header.fourcc:
            problems.append(
                f"{dense_path} is a faiss {header.fourcc!r} index, not the {said['factory']!r} "
                f"({expected!r}) {manifest_path} says"
            )
    bm25 = manifest.get("bm25")
    if bm25:
        params = Path(index_dir) / bm25["dir"] / "params.index.json"
        try:
            docs = json.loads(params.read_text())["num_docs"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            problems.append(f"{params} (BM25) cannot be read: {err}")
        else:
            if docs != manifest["count"]:
                problems.append(f"{params} indexes {docs} passages, {manifest_path} says count {manifest['count']}")
    return problems


def check_search_params(index_dir: Path, manifest: dict, search_params: str) -> None:
    """Raise :class:`SearchParamsError` (one line: the setting, the index file and its type, what it takes) unless
    faiss can apply ``search_params`` to this index. Tried on an empty index of the same factory (the file's type code
    is checked against it at start-up), so a huge index is not read for it."""
    import faiss

    if not search_params.strip():
        return
    dense_path = Path(index_dir) / manifest["index"]["file"]
    factory = manifest["index"]["factory"]
    try:
        index = faiss.index_factory(manifest["dim"], factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError:  # a type faiss's factory cannot name: the file itself, mapped
        index = read_dense_index(dense_path, mmap=True)
    space = faiss.ParameterSpace()
    space.initialize(index)
    takes = sorted({space.parameter_ranges.at(i).name for i in range(space.parameter_ranges.size())} - {"ht"})
    offer = f"it takes {', '.join(takes)}" if takes else "it takes no search parameters (it searches exhaustively)"
    for setting in filter(None, (part.strip() for part in search_params.split(","))):
        name, equals, value = setting.partition("=")
        try:
            float(value)
        except ValueError:
            equals = ""
        if not equals or not name.strip():
            raise SearchParamsError(f"--search-params {search_params!r}: {setting!r} is not NAME=NUMBER")
        try:
            space.set_index_parameters(index, setting)
        except RuntimeError:
            raise SearchParamsError(
                f"--search-params {search_params!r}: {dense_path} ({factory}) has no search parameter "
                f"{name.strip()!r}: {offer}"
            ) from None


def verify_index(
    index_dir: Path,
    corpus: Path | None = None,
    encoder: EncoderConfig | None = None,
    checksums: bool = True,
    full: bool = False,
) -> dict:
    """Check that manifest, corpus, model and index files agree; raise :class:`IndexMismatchError` naming the files.

    The served files must have the sizes and checksums the manifest recorded (``checksums``; a manifest
    without them, version 1, is refused with the command that records them), and hold what it says: the
    docstore ``count`` passages, the dense index ``ntotal`` vectors of ``dim`` under the recorded factory's
    type, BM25 ``count`` documents. Opening them is cheap (an Arrow footer, a faiss header), so every
    start does it, in the launching process before any replica. ``full``: every byte of the served files is
    hashed, not only the sampled blocks (``index verify --full``).

    The encoder's files are hashed whole (a loader reads them whole anyway): the model directory to load and every
    ONNX export beside the index must be the files the manifest recorded (an export not recorded yet: the files the
    export recorded when it matched torch). A manifest without those records (version 2) is refused with the
    command that records them.

    Content decides, not location. A recorded corpus that no longer exists is no
    reason to refuse (the index holds its own copy of the passages, and its
    checksum still says which corpus that was); a corpus that is there, or is
    given, must have the recorded checksum. Without ``encoder``, a recorded model
    that no longer exists is replaced by a known copy with the same fingerprint
    (the packaged MiniLM). Returns the manifest with the locations that passed.
    """
    from retrieval_server.encoders import model_fingerprint

    index_dir = Path(index_dir)
    manifest_path = index_dir / MANIFEST
    manifest = read_manifest(index_dir)
    problems: list[str] = []

    recorded_corpus = Path(manifest["corpus"]["path"])
    if corpus is None and not recorded_corpus.exists():
        logger.info(
            "corpus %s recorded in %s is gone; serving the index's own copy of its passages",
            recorded_corpus,
            manifest_path,
        )
    else:
        corpus = Path(corpus) if corpus is not None else recorded_corpus
        if not corpus.exists():
            problems.append(
                f"corpus {corpus} does not exist (the index {manifest_path} was built from {recorded_corpus})"
            )
        elif (
            corpus.stat().st_size != manifest["corpus"]["size"]
            or corpus_sha256(corpus, index_dir) != manifest["corpus"]["sha256"]
        ):
            problems.append(
                f"corpus {corpus} has changed or is a different file: its sha256 differs from the "
                f"{manifest['corpus']['sha256'][:12]}... recorded in {manifest_path} for {recorded_corpus}"
            )
        else:
            manifest["corpus"]["path"] = str(corpus.resolve())

    recorded = manifest["encoder"]
    if encoder is not None:
        differing = recorded_encoder(manifest).describes_same_vectors(encoder)
        if differing:
            problems.append(f"encoder settings {differing} differ from those recorded in {manifest_path}")
        if model_fingerprint(encoder.model) != recorded["fingerprint"]:
            problems.append(
                f"encoder model {encoder.model} is not the model {recorded['model']} recorded in {manifest_path} "
                f"(fingerprint {model_fingerprint(encoder.model)} != {recorded['fingerprint']})"
            )
        recorded["model"] = encoder.model
    elif model_fingerprint(recorded["model"]) != recorded["fingerprint"]:
        if recorded["fingerprint"].startswith("name:") or Path(recorded["model"]).exists():
            problems.append(f"encoder model {recorded['model']} recorded in {manifest_path} has changed on disk")
        else:
            copy = next((m for m in known_model_copies() if model_fingerprint(m) == recorded["fingerprint"]), None)
            if copy is None:
                problems.append(
                    f"encoder model {recorded['model']} recorded in {manifest_path} does not exist; "
                    f"pass --model with a copy of it (fingerprint {recorded['fingerprint']})"
                )
            else:
                logger.info(
                    "encoder model %s recorded in %s is gone; using the same model at %s",
                    recorded["model"],
                    manifest_path,
                    copy,
                )
                recorded["model"] = copy

    docstore_path = index_dir / manifest["docstore"]
    dense_path = index_dir / manifest["index"]["file"]
    for required in (docstore_path, dense_path):
        if not required.exists():
            problems.append(f"{required} listed in {manifest_path} is missing")
    problems += _open_problems(index_dir, manifest, manifest_path)
    if checksums and not problems:
        checksum_problems = _checksum_problems(index_dir, manifest, manifest_path, full)
        if not checksum_problems:
            checksum_problems = _model_problems(manifest, recorded["model"], manifest_path)
        if checksum_problems:
            problems += checksum_problems[:-1] + [
                f"{checksum_problems[-1]}; if these are the files to serve, record them with "
                f"`verl-evidence index verify --index-dir {index_dir} --record`, else rebuild or re-adopt the index"
            ]
        else:
            problems += _export_problems(index_dir, manifest, manifest_path)
    if problems:  # one line, however many: a log or a terminal shows it whole
        raise IndexMismatchError("refusing to serve this index: " + "; ".join(problems))
    return manifest


def verify_and_record(index_dir: Path, corpus: Path | None = None, encoder: EncoderConfig | None = None) -> dict:
    """``index verify --record``: every check of :func:`verify_index` but the checksums, a full (mapped) read of the
    dense index, then the files' and the encoder's checksums written into the manifest (upgrading an older manifest;
    an ONNX export beside the index that no longer holds the files it recorded is refused). Returns it."""
    manifest = verify_index(index_dir, corpus=corpus, encoder=encoder, checksums=False)
    dense_path = Path(index_dir) / manifest["index"]["file"]
    try:
        read_dense_index(dense_path, mmap=True)  # once: a file truncated past its header fails here
    except RuntimeError as err:
        raise IndexMismatchError(f"{dense_path} cannot be read by faiss (truncated?): {err}".splitlines()[0]) from None
    stored = read_manifest(index_dir)  # the file's own locations, not the ones this check substituted
    updated = record_checksums(index_dir, stored, model=manifest["encoder"]["model"], strict=True)
    _write_json_atomic(Path(index_dir) / MANIFEST, updated)
    return updated
