"""Index builder (corpus -> docstore -> encoded shards -> FAISS index + BM25) and the manifest that guards it.

Layout of an index directory::

    manifest.json        what was built, from what, with which encoder
    docstore.arrow       passages, row i = FAISS id i
    shards/00000.npy     passage embeddings, ``shard_size`` rows each (resumption unit)
    shards/build.json    corpus checksum + encoder of the shards, so stale shards are never reused
    dense.faiss          the FAISS index (inner product)
    bm25/                bm25s index + its vocabulary
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np

from retrieval_server.config import BuildConfig, EncoderConfig
from retrieval_server.docstore import file_sha256, iter_corpus, write_docstore

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
DOCSTORE = "docstore.arrow"
DENSE_INDEX = "dense.faiss"
BM25_DIR = "bm25"
SHARDS_DIR = "shards"
BM25_TOKENIZER_VOCAB = "vocab.tokenizer.json"
MANIFEST_VERSION = 1


class IndexMismatchError(RuntimeError):
    """The index on disk does not belong to the corpus/model it is asked to serve."""


def read_manifest(index_dir: Path) -> dict:
    path = Path(index_dir) / MANIFEST
    if not path.exists():
        raise IndexMismatchError(f"no index manifest at {path}: build the index first (verl-evidence index build)")
    return json.loads(path.read_text())


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
    config: BuildConfig, encoder=None, show_progress: bool = True, lock_timeout_s: float | None = None
) -> dict:
    """Build (or finish building) an index; returns the manifest. Idempotent when nothing changed.

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
        return _build_index_locked(config, encoder, show_progress)
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


def _build_index_locked(config: BuildConfig, encoder, show_progress: bool) -> dict:
    import faiss

    from retrieval_server.encoders import describe, model_fingerprint

    started = time.time()
    corpus_sha256 = file_sha256(config.corpus)
    manifest_path = config.output_dir / MANIFEST
    if manifest_path.exists():
        existing = json.loads(manifest_path.read_text())
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
        ):
            logger.info("index in %s is up to date", config.output_dir)
            return _record_locations(manifest_path, existing, config)
        manifest_path.unlink()  # about to rebuild: never leave a manifest describing other files

    docstore_path = config.output_dir / DOCSTORE
    count = write_docstore(config.corpus, docstore_path)
    if count == 0:
        raise ValueError(f"{config.corpus}: corpus is empty")
    shard_paths, dim = encode_shards(config, corpus_sha256, count, encoder=encoder, show_progress=show_progress)
    index = build_faiss_index(shard_paths, dim, config.index_factory, config.train_sample)
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
        },
        "docstore": DOCSTORE,
        "bm25": {"dir": BM25_DIR, "tokenizer": "bm25s.Tokenizer(stopwords=en)", "tokenizer_vocab": BM25_TOKENIZER_VOCAB}
        if config.bm25
        else None,
        "shards": {"dir": SHARDS_DIR, "shard_size": config.shard_size, "count": len(shard_paths)},
        "build_seconds": round(time.time() - started, 2),
    }
    _write_json_atomic(manifest_path, manifest)
    return manifest


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


def verify_index(index_dir: Path, corpus: Path | None = None, encoder: EncoderConfig | None = None) -> dict:
    """Check that manifest, corpus, model and index files agree; raise :class:`IndexMismatchError` naming the files.

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
    if problems:
        raise IndexMismatchError("refusing to serve this index:\n  - " + "\n  - ".join(problems))
    return manifest
