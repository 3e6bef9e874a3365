"""Convert a Flat index (built or adopted) to a smaller or faster FAISS index without re-encoding.

The exact vectors are read back from the Flat index in chunks (memory-mapped, so
a 61 GB source is never resident at once), a random sample trains the target
(IVF centroids, PQ codebooks, SQ ranges), and the target is filled chunk by
chunk. The recall of the new index is measured against the Flat one on
sampled passages before anything is written.

The new directory gets its own manifest and index file; the docstore (and BM25
directory) is shared with the source: a hard link when both are on one file
system (the source is rewritten by replacing files, so an old link keeps the old
content), a symbolic link otherwise.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path

import numpy as np

from retrieval_server.index import (
    DENSE_INDEX,
    MANIFEST,
    IndexMismatchError,
    _NullProgress,
    _progress,
    _write_json_atomic,
    faiss_warnings_summarised,
    read_dense_index,
    record_checksums,
    verify_index,
)
from retrieval_server.search_params import DEFAULT_TARGET_RECALL, choose_search_params

logger = logging.getLogger(__name__)

PRESETS = {
    "fp16": "SQfp16",  # half the bytes, exact to fp16 rounding
    "sq8": "SQ8",  # a quarter, one byte per dimension
    "hnsw": "HNSW32,Flat",  # fast CPU search, fp32 vectors plus the graph
    "ivf-pq": None,  # sized from the index: see ivf_pq_factory
}


def ivf_pq_factory(count: int, dim: int) -> str:
    """``IVF<nlist>,PQ<m>``: nlist the power of two nearest 4*sqrt(n), lowered to the largest power of two at most
    n/39 (FAISS's training minimum of 39 vectors per list); m = dim/8 sub-quantisers of 8 bits (768-d: 96 bytes)."""
    nlist = 2 ** round(math.log2(max(4 * math.sqrt(count), 1)))
    nlist = min(nlist, 2 ** max(count // 39, 1).bit_length() // 2)
    m = next(m for m in range(max(dim // 8, 1), 0, -1) if dim % m == 0)
    return f"IVF{nlist},PQ{m}"


def resolve_factory(target: str, count: int, dim: int) -> str:
    """A preset name (fp16, sq8, hnsw, ivf-pq) or any FAISS factory string."""
    key = target.strip().lower()
    if key in PRESETS:
        return PRESETS[key] or ivf_pq_factory(count, dim)
    return target


def _share(source: Path, destination: Path) -> str:
    """Hard link ``source`` at ``destination`` (same file system), else a symbolic link."""
    destination.unlink(missing_ok=True)
    if source.is_file():
        try:
            os.link(source.resolve(), destination)
            return "hardlink"
        except OSError:
            pass
    destination.symlink_to(source.resolve())
    return "symlink"


def _read_chunks(index, start: int, stop: int, chunk: int):
    for begin in range(start, stop, chunk):
        end = min(begin + chunk, stop)
        yield begin, index.reconstruct_n(begin, end - begin)


def measure_recall(
    source, target, rows: np.ndarray, k: int, params: list[str] | None, target_recall: float = DEFAULT_TARGET_RECALL
) -> dict:
    """recall@k of ``target`` against exact search of ``source``, with stored passages as the queries, at the
    settings ``params`` (None: the :func:`~retrieval_server.search_params.speed_knob` sweep), and the setting chosen to
    serve at (``target`` is left set to it): see :func:`~retrieval_server.search_params.choose_search_params`.

    A query's own passage is dropped from both rankings: otherwise every index
    would score an easy hit at rank 1.
    """
    queries = np.ascontiguousarray(source.reconstruct_batch(rows), dtype=np.float32)
    _, exact = source.search(queries, k + 1)
    return choose_search_params(target, queries, exact, k, exclude=rows, target=target_recall, settings=params)


def convert_flat(
    source,
    factory: str,
    train_sample: int = 262_144,
    chunk_size: int = 65_536,
    recall_queries: int = 256,
    k: int = 10,
    search_params: list[str] | None = None,
    seed: int = 0,
    show_progress: bool = False,
    target_recall: float = DEFAULT_TARGET_RECALL,
):
    """A FAISS Flat index -> a new ``factory`` index, plus its recall against the source.

    Returns ``(index, tuning, sampled query rows)``, ``tuning`` as :func:`measure_recall` returns it (the index
    is left set to its chosen setting). The source is only read (``reconstruct_batch`` for the training sample,
    ``reconstruct_n`` per chunk).
    """
    import faiss

    count, dim = int(source.ntotal), int(source.d)
    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    rng = np.random.default_rng(seed)
    with _progress() if show_progress else _NullProgress() as progress:
        if not index.is_trained:
            take = np.sort(rng.choice(count, size=min(train_sample, count), replace=False))
            logger.info("training %s on %d of %d vectors", factory, len(take), count)
            try:
                with faiss_warnings_summarised(f"training {factory}"):
                    index.train(np.ascontiguousarray(source.reconstruct_batch(take), dtype=np.float32))
            except RuntimeError as err:
                raise ValueError(
                    f"cannot train FAISS index {factory!r} on {len(take)} vectors (IVF wants >= 39 per list, an 8-bit "
                    f"PQ/SQ codebook >= 256; raise --train-sample or choose fewer lists or bits, e.g. PQ<m>x4): {err}"
                ) from err
        task = progress.add_task(f"Flat -> {factory}", total=count)
        for begin, vectors in _read_chunks(source, 0, count, chunk_size):
            index.add(np.ascontiguousarray(vectors, dtype=np.float32))
            progress.update(task, completed=begin + len(vectors))

    rows = np.sort(rng.choice(count, size=min(recall_queries, count), replace=False))
    tuning = measure_recall(source, index, rows, min(k, count - 1), search_params, target_recall)
    return index, tuning, rows


def convert_index(
    source_dir: Path,
    output_dir: Path,
    target: str,
    train_sample: int = 262_144,
    chunk_size: int = 65_536,
    recall_queries: int = 256,
    k: int = 10,
    search_params: list[str] | None = None,
    seed: int = 0,
    show_progress: bool = True,
    target_recall: float = DEFAULT_TARGET_RECALL,
) -> dict:
    """Write ``output_dir`` (manifest + converted index, docstore shared); returns its manifest.

    ``target``: fp16, sq8, hnsw, ivf-pq or a FAISS factory string. ``search_params``:
    the settings to measure recall at (default: nprobe / efSearch doubled until ``target_recall``).
    The index file is written set to the chosen setting, which the manifest records.
    """
    import faiss

    started = time.time()
    source_dir, output_dir = Path(source_dir), Path(output_dir)
    if output_dir.resolve() == source_dir.resolve():
        raise ValueError(f"convert writes a new index directory; {output_dir} is the source")
    manifest = verify_index(source_dir)
    source_file = source_dir / manifest["index"]["file"]
    source = read_dense_index(source_file, mmap=True)
    if not isinstance(faiss.downcast_index(source), faiss.IndexFlat):
        raise IndexMismatchError(
            f"convert reads exact vectors from a Flat index; {source_file} is {manifest['index']['factory']!r}: "
            "convert from the Flat index it was made from"
        )
    factory = resolve_factory(target, int(source.ntotal), int(source.d))
    index, tuning, rows = convert_flat(
        source, factory, train_sample, chunk_size, recall_queries, k, search_params, seed, show_progress, target_recall
    )
    count = int(source.ntotal)

    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / MANIFEST).unlink(missing_ok=True)
    tmp = output_dir / (DENSE_INDEX + ".tmp")
    faiss.write_index(index, str(tmp))
    tmp.replace(output_dir / DENSE_INDEX)
    shared = {"docstore": _share(source_dir / manifest["docstore"], output_dir / manifest["docstore"])}
    if manifest.get("bm25"):
        shared["bm25"] = _share(source_dir / manifest["bm25"]["dir"], output_dir / manifest["bm25"]["dir"])
    converted = {
        **manifest,
        "index": {
            "factory": factory,
            "metric": "inner_product",
            "file": DENSE_INDEX,
            "ntotal": int(index.ntotal),
            "search_params": tuning["search_params"],
        },
        "shards": None,
        "converted": {
            "from": str(source_dir.resolve()),
            "source_factory": manifest["index"]["factory"],
            "train_sample": min(train_sample, count),
            "shared": shared,
            "recall_queries": len(rows),
            "recall": tuning["recall"],
            "target_recall": tuning["target_recall"],
            "index_bytes": (output_dir / DENSE_INDEX).stat().st_size,
            "source_index_bytes": source_file.stat().st_size,
        },
        "build_seconds": round(time.time() - started, 2),
    }
    converted = record_checksums(output_dir, converted)
    _write_json_atomic(output_dir / MANIFEST, converted)
    logger.info("converted index written to %s", output_dir)
    return converted
