"""Adopt an index someone else built (Search-R1's ``e5_Flat.index``, FlashRAG's) without re-encoding the corpus.

The user declares the encoder that made the vectors; we believe it only after
re-encoding a random sample of passages and finding their stored vectors.
Then the corpus becomes our memory-mapped document store (once), the index file
is linked (not copied) into the index directory and a manifest is written, so
the normal ``serve`` path (``verify_index`` and the start-up checks) applies.

How stored vectors are read back, by index type:

* Flat, SQ, HNSW, IVF (given a direct map): ``reconstruct``. A lossy code (SQ8,
  PQ) is compared with the *same code* of the re-encoded vector
  (``sa_decode(sa_encode(v))``), so quantisation error is not mistaken for a
  wrong declaration;
* anything that cannot reconstruct: each re-encoded passage must find its own
  row first in a search of the index, a weaker test.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from filelock import FileLock

from retrieval_server.config import EncoderConfig
from retrieval_server.docstore import DocumentStore, file_sha256, write_docstore
from retrieval_server.index import (
    BM25_DIR,
    BM25_TOKENIZER_VOCAB,
    DENSE_INDEX,
    DOCSTORE,
    MANIFEST,
    MANIFEST_VERSION,
    IndexMismatchError,
    _NullProgress,
    _progress,
    _write_json_atomic,
    read_dense_index,
    record_checksums,
)

logger = logging.getLogger(__name__)

# A re-encoded passage matches its stored vector when the two point the same way and have the same length.
# fp16 GPU encoding (how Search-R1 builds) and fp16 storage stay above 0.9999; a missing "passage: " prefix
# on MiniLM measured 0.981-0.994, the wrong pooling ~0.5, another model ~0.
MIN_COSINE = 0.999
MAX_NORM_RATIO_ERROR = 0.01
# Lossy codes: a re-encoded vector near a code boundary may land on the neighbouring code.
MIN_MATCHED_FRACTION_LOSSY = 0.9
DOCSTORE_SOURCE = "docstore.source.json"  # which corpus the docstore was converted from (reused on re-runs)


class AdoptionError(IndexMismatchError):
    """The files or the declared encoder do not describe the index being adopted."""


@dataclass
class Verification:
    """How the declared encoder compared with the stored vectors on the sampled rows."""

    rows: list[int]
    method: str  # "reconstruct" | "requantize" | "self-search"
    cosines: list[float]
    norm_ratios: list[float]
    matched: list[bool]
    lossy: bool = False
    details: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        if not self.matched:
            return False
        if self.lossy:
            return float(np.mean(self.matched)) >= MIN_MATCHED_FRACTION_LOSSY
        return all(self.matched)

    def summary(self) -> str:
        cos = np.asarray(self.cosines)
        return (
            f"{sum(self.matched)}/{len(self.matched)} sampled passages match their stored vectors "
            f"(cosine min {cos.min():.4f}, mean {cos.mean():.4f}; a match needs >= {MIN_COSINE} "
            f"and lengths within {MAX_NORM_RATIO_ERROR:.0%}; compared by {self.method})"
        )

    def record(self) -> dict:
        cos = np.asarray(self.cosines)
        return {
            "sampled_rows": len(self.rows),
            "matched": int(sum(self.matched)),
            "method": self.method,
            "lossy_codes": self.lossy,
            "cosine_min": round(float(cos.min()), 6),
            "cosine_mean": round(float(cos.mean()), 6),
        }


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    return np.sum(a * b, axis=1) / np.maximum(na * nb, 1e-12)


def _norm_ratios(stored: np.ndarray, fresh: np.ndarray) -> np.ndarray:
    return np.linalg.norm(stored, axis=1) / np.maximum(np.linalg.norm(fresh, axis=1), 1e-12)


def _innermost(index):
    """The index that holds the vectors: an HNSW index's storage, else the index itself."""
    import faiss

    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexHNSW):
        return faiss.downcast_index(index.storage)
    return index


def stored_vectors(index, rows: np.ndarray) -> np.ndarray | None:
    """The vectors (as decoded) at ``rows``, or None when this index type cannot give them back."""
    import faiss

    try:
        ivf = faiss.extract_index_ivf(index)
    except RuntimeError:
        ivf = None
    if ivf is not None and ivf.direct_map.type == faiss.DirectMap.NoMap:
        # IVF finds a vector by id only through a direct map (ntotal int64: 168 MB for 21M rows).
        ivf.make_direct_map()
    try:
        return np.stack([index.reconstruct(int(r)) for r in rows]).astype(np.float32)
    except RuntimeError:
        return None


def requantize(index, vectors: np.ndarray) -> tuple[np.ndarray, bool]:
    """``vectors`` as the index would store them (its own code, decoded), and whether that code is lossy."""
    for codec in (index, _innermost(index)):
        try:
            decoded = codec.sa_decode(codec.sa_encode(np.ascontiguousarray(vectors, dtype=np.float32)))
        except RuntimeError:  # this level has no standalone codec (e.g. HNSW itself)
            continue
        lossy = bool(np.any(_cosines(decoded, vectors) < 1 - 1e-6))
        return decoded.astype(np.float32), lossy
    return vectors, False


def compare(index, rows: np.ndarray, fresh: np.ndarray) -> Verification:
    """Compare re-encoded vectors of ``rows`` with what the index stores for those rows."""
    stored = stored_vectors(index, rows)
    if stored is not None:
        expected, lossy = requantize(index, fresh)
        cos = _cosines(stored, expected)
        ratio = _norm_ratios(stored, expected)
        matched = (cos >= MIN_COSINE) & (np.abs(ratio - 1) <= MAX_NORM_RATIO_ERROR)
        method = "requantize" if lossy else "reconstruct"
        return Verification(
            rows.tolist(),
            method,
            cos.tolist(),
            ratio.tolist(),
            matched.tolist(),
            lossy=lossy,
            details={"stored": stored},
        )
    # No way to read vectors back: a passage's own vector must be its best hit (a score tie counts), scoring
    # about its own squared length. Looser than the cosine test (the index may score approximately): weaker.
    scores, hits = index.search(np.ascontiguousarray(fresh, dtype=np.float32), 10)
    own = np.array([scores[i][list(hits[i]).index(r)] if r in hits[i] else -np.inf for i, r in enumerate(rows)])
    expected = np.sum(fresh * fresh, axis=1)
    matched = (own >= scores[:, 0] - 1e-4) & (np.abs(own / np.maximum(expected, 1e-12) - 1) <= 2 * MAX_NORM_RATIO_ERROR)
    cos = np.where(np.isfinite(own), own / np.maximum(expected, 1e-12), 0.0)
    return Verification(rows.tolist(), "self-search", cos.tolist(), cos.tolist(), matched.tolist(), lossy=True)


def sample_rows(count: int, size: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(count, size=min(size, count), replace=False))


EncoderFactory = Callable[[EncoderConfig], object]


def _describe_declaration(config: EncoderConfig) -> str:
    return (
        f"model={config.model}, pooling={config.pooling}, query_prefix={config.query_prefix!r}, "
        f"passage_prefix={config.passage_prefix!r}, max_length={config.max_length}, normalize={config.normalize}"
    )


def _variants(declared: EncoderConfig) -> list[tuple[dict, EncoderConfig]]:
    """Declarations one or two settings away from ``declared``: the usual mistakes, most likely first."""
    prefixes = [declared.passage_prefix, "", "passage: ", declared.query_prefix]
    poolings = [declared.pooling] + [p for p in ("mean", "cls") if p != declared.pooling]
    out: list[tuple[dict, EncoderConfig]] = []
    seen = set()
    for pooling in poolings:
        for prefix in prefixes:
            change = {
                k: v for k, v in {"pooling": pooling, "passage_prefix": prefix}.items() if getattr(declared, k) != v
            }
            key = tuple(sorted(change.items()))
            if change and key not in seen:
                seen.add(key)
                out.append((change, declared.model_copy(update=change)))
    for max_length in (128, 256, 512):
        if max_length != declared.max_length:
            out.append(({"max_length": max_length}, declared.model_copy(update={"max_length": max_length})))
    out.append(
        ({"normalize": not declared.normalize}, declared.model_copy(update={"normalize": not declared.normalize}))
    )
    return out


def _flag(setting: str, value: object) -> str:
    if isinstance(value, bool):
        return f"--{'' if value else 'no-'}{setting}"
    return (
        f"--{setting.replace('_', '-')} {value!r}"
        if isinstance(value, str)
        else f"--{setting.replace('_', '-')} {value}"
    )


def misaligned_rows(index, rows: np.ndarray, fresh: np.ndarray) -> list[tuple[int, int]]:
    """(corpus row, index row) pairs where a passage's vector sits at another row of the index."""
    scores, hits = index.search(np.ascontiguousarray(fresh, dtype=np.float32), 1)
    expected = np.sum(fresh * fresh, axis=1)
    found = np.abs(scores[:, 0] / np.maximum(expected, 1e-12) - 1) <= 1 - MIN_COSINE
    return [(int(r), int(h)) for r, h, ok in zip(rows, hits[:, 0], found) if ok and h != r]


def diagnose(
    index,
    rows: np.ndarray,
    texts: list[str],
    fresh: np.ndarray,
    declared: EncoderConfig,
    make_encoder: EncoderFactory,
    base: Verification,
) -> str:
    """Name what differs between the declaration and the stored vectors: row order, or one of the usual mistakes."""
    shifted = misaligned_rows(index, rows, fresh)
    if shifted:
        pairs = ", ".join(f"passage {r} is vector {h}" for r, h in shifted[:4])
        return (
            f"the declaration fits, but the rows do not line up ({pairs}): the corpus has other lines or another order "
            "than the one the index was built from"
        )
    lines = []
    if "stored" in base.details:
        stored_norms = np.linalg.norm(base.details["stored"], axis=1)
        unit = bool(np.all(np.abs(stored_norms - 1) <= MAX_NORM_RATIO_ERROR))
        if declared.normalize and not unit:
            lines.append(
                f"normalize: the stored vectors are not unit length (norms {stored_norms.min():.3g}-"
                f"{stored_norms.max():.3g}); declared normalize=True"
            )
        elif not declared.normalize and unit and not np.allclose(base.norm_ratios, 1, atol=MAX_NORM_RATIO_ERROR):
            lines.append("normalize: the stored vectors are unit length; declared normalize=False")
    best: tuple[float, dict] | None = None
    loaded: dict[tuple, object] = {}
    for change, variant in _variants(declared):
        # Prefix variants share one loaded model; pooling and max_length need their own.
        key = (variant.pooling, variant.max_length, variant.normalize)
        if key not in loaded:
            loaded[key] = make_encoder(variant.model_copy(update={"passage_prefix": ""}))
        fresh = loaded[key].encode_passages([variant.passage_prefix + t for t in texts])
        trial = compare(index, rows, fresh)
        score = float(np.mean(trial.cosines))
        if trial.passed:
            named = ", ".join(f"{k}={v!r} (declared {getattr(declared, k)!r})" for k, v in change.items())
            lines.append(
                f"the stored vectors match {named}: cosine min {min(trial.cosines):.4f} on {len(rows)} passages; "
                f"re-run with {' '.join(_flag(k, v) for k, v in change.items())}"
            )
            return "\n  ".join(lines)
        if best is None or score > best[0]:
            best = (score, change)
    tried = (
        "pooling (mean, cls), passage prefix ('', 'passage: ', the query prefix), max_length (128, 256, 512)"
        " and normalize"
    )
    if best is not None:
        lines.append(
            f"no variant of {tried} of {declared.model} matches either"
            f" (closest: {best[1]} at mean cosine {best[0]:.4f}): "
            "the vectors were made by another model, or the corpus is not the one the index was built from"
        )
    return "\n  ".join(lines)


def _check_index_file(index, index_file: Path) -> None:
    import faiss

    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise AdoptionError(
            f"{index_file} ranks by metric {index.metric_type} (L2 = 1); the server serves inner-product indexes only"
        )
    if isinstance(faiss.downcast_index(index), (faiss.IndexIDMap, faiss.IndexIDMap2)):
        raise AdoptionError(
            f"{index_file} maps vectors to custom ids (IndexIDMap); the server needs FAISS id i = corpus line i"
        )


def index_factory_of(index) -> str:
    """The factory string that would build this index type (e.g. ``Flat``, ``IVF4096,PQ96x8``), else its class."""
    from faiss.contrib.factory_tools import reverse_index_factory

    try:
        return reverse_index_factory(index)
    except (NotImplementedError, AssertionError):
        # faiss 1.x's reverse_index_factory names the common types only: NotImplementedError for the rest (NSG,
        # shards, lattice...), an AssertionError for a whitened PCA (eigen_power != 0). The name is informational
        # (manifest, messages), so the class name is an honest fallback.
        import faiss

        return type(faiss.downcast_index(index)).__name__


def _link(source: Path, destination: Path, how: str) -> str:
    """Put ``source`` at ``destination`` by symlink, hardlink or copy; returns how it was done."""
    tmp = destination.with_name(destination.name + ".tmp")
    tmp.unlink(missing_ok=True)
    if how == "copy":
        shutil.copyfile(source, tmp)
    elif how == "hardlink":
        os.link(source, tmp)
    else:
        tmp.symlink_to(source.resolve())
    tmp.replace(destination)
    return how


def _convert_corpus(
    corpus: Path, output_dir: Path, corpus_sha256: str, expected_rows: int, index_file: Path, show_progress: bool
) -> int:
    """Corpus JSONL -> docstore.arrow, unless the docstore already holds this corpus; returns its row count."""
    docstore_path = output_dir / DOCSTORE
    source_path = output_dir / DOCSTORE_SOURCE
    source = {"sha256": corpus_sha256, "size": corpus.stat().st_size}
    if docstore_path.exists() and source_path.exists():
        recorded = json.loads(source_path.read_text())
        if {k: recorded.get(k) for k in source} == source:
            logger.info("%s already holds %s: not converting again", docstore_path, corpus)
            return int(recorded["count"])
    # About to replace the docstore: a manifest must never describe other files.
    (output_dir / MANIFEST).unlink(missing_ok=True)
    source_path.unlink(missing_ok=True)

    def stop_if_too_long(rows: int) -> None:
        progress.update(task, completed=rows)
        if rows > expected_rows:
            raise AdoptionError(
                f"corpus {corpus} has more than {expected_rows} passages (read {rows} so far) but index {index_file} "
                f"holds {expected_rows} vectors: they were not built together"
            )

    try:
        with _progress() if show_progress else _NullProgress() as progress:
            task = progress.add_task("corpus -> docstore", total=expected_rows)
            count = write_docstore(corpus, docstore_path, on_rows=stop_if_too_long)
    finally:
        docstore_path.with_suffix(".tmp").unlink(missing_ok=True)  # left by an interrupted conversion
    _write_json_atomic(source_path, {**source, "count": count, "path": str(corpus.resolve())})
    return count


def adopt_index(
    index_file: Path,
    corpus: Path,
    output_dir: Path,
    encoder: EncoderConfig,
    sample: int = 32,
    link: str = "symlink",
    bm25: bool = False,
    device: str | None = None,
    seed: int = 0,
    show_progress: bool = True,
    make_encoder: EncoderFactory | None = None,
) -> dict:
    """Verify the declaration, convert the corpus, link the index and write the manifest; returns the manifest.

    Raises :class:`AdoptionError` naming the files (row counts, dimensions) or the
    mismatched setting (and by how much). ``make_encoder`` builds an encoder from
    an :class:`EncoderConfig` (default: :class:`SentenceEncoder` on ``device``).
    """
    index_file, corpus, output_dir = Path(index_file), Path(corpus), Path(output_dir)
    for path, what in ((index_file, "index file"), (corpus, "corpus")):
        if not path.is_file():
            raise AdoptionError(f"{what} {path} does not exist")
    if link not in ("symlink", "hardlink", "copy"):
        raise ValueError(f"link must be symlink, hardlink or copy, not {link!r}")
    if make_encoder is None:
        from retrieval_server.encoders import SentenceEncoder

        def make_encoder(config: EncoderConfig):
            return SentenceEncoder(config, device=device)

    output_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(output_dir / ".build.lock"):  # the same lock as the builder: never two writers in one directory
        return _adopt_locked(
            index_file, corpus, output_dir, encoder, sample, link, bm25, seed, show_progress, make_encoder
        )


def _adopt_locked(
    index_file, corpus, output_dir, declared, sample, link, bm25, seed, show_progress, make_encoder
) -> dict:
    from retrieval_server.encoders import describe

    started = time.time()
    # Mapped, so that checking 32 rows of a 61 GB Flat index reads 32 rows, not 61 GB.
    index = read_dense_index(index_file, mmap=True)
    _check_index_file(index, index_file)
    ntotal, dim = int(index.ntotal), int(index.d)

    logger.info("checksumming %s", corpus)
    corpus_sha256 = file_sha256(corpus)
    count = _convert_corpus(corpus, output_dir, corpus_sha256, ntotal, index_file, show_progress)
    if count != ntotal:
        raise AdoptionError(
            f"corpus {corpus} holds {count} passages but index {index_file} holds {ntotal} vectors: "
            "they were not built together (row i of the index must be passage i of the corpus)"
        )

    encoder = make_encoder(declared)
    if encoder.dim != dim:
        raise AdoptionError(
            f"declared model {declared.model} makes {encoder.dim}-d vectors"
            f" but index {index_file} holds {dim}-d vectors: "
            "the index was built with another model"
        )
    store = DocumentStore(output_dir / DOCSTORE)
    rows = sample_rows(count, sample, seed)
    texts = [d["contents"] for d in store.lookup(rows)]
    fresh = encoder.encode_passages(texts)
    verification = compare(index, rows, fresh)
    if not verification.passed:
        failed = [i for i, ok in enumerate(verification.matched) if not ok][:8]  # diagnose on passages that failed
        why = diagnose(
            index, rows[failed], [texts[i] for i in failed], fresh[failed], declared, make_encoder, verification
        )
        raise AdoptionError(
            f"refusing to adopt {index_file}: passages of {corpus} re-encoded with the declared encoder "
            f"({_describe_declaration(declared)}) do not match their stored vectors.\n"
            f"  {verification.summary()}.\n  {why}"
        )
    logger.info("declaration verified: %s", verification.summary())

    (output_dir / MANIFEST).unlink(missing_ok=True)
    how = _link(index_file, output_dir / DENSE_INDEX, link)
    if bm25:
        from retrieval_server.config import BuildConfig
        from retrieval_server.index import build_bm25

        build_bm25(BuildConfig(corpus=corpus, output_dir=output_dir, encoder=declared))
    stat = index_file.stat()
    manifest = {
        "version": MANIFEST_VERSION,
        "corpus": {"path": str(corpus.resolve()), "sha256": corpus_sha256, "size": corpus.stat().st_size},
        "count": count,
        "encoder": describe(declared, dim),
        "dim": dim,
        "index": {
            "factory": index_factory_of(index),
            "metric": "inner_product",
            "file": DENSE_INDEX,
            "ntotal": ntotal,
            **({"search_params": setting} if (setting := _file_search_setting(index)) else {}),
        },
        "docstore": DOCSTORE,
        "bm25": {"dir": BM25_DIR, "tokenizer": "bm25s.Tokenizer(stopwords=en)", "tokenizer_vocab": BM25_TOKENIZER_VOCAB}
        if bm25
        else None,
        "shards": None,  # adopted: the vectors live only in the index file
        "adopted": {
            "index_file": str(index_file.resolve()),
            "index_size": stat.st_size,
            "index_mtime": stat.st_mtime,
            "link": how,
            "verification": verification.record(),
        },
        "build_seconds": round(time.time() - started, 2),
    }
    manifest = record_checksums(output_dir, manifest)
    _write_json_atomic(output_dir / MANIFEST, manifest)
    return manifest


def _file_search_setting(index) -> str:
    """The speed/recall setting an adopted IVF or HNSW file carries (faiss writes it into the file), "" for none."""
    import faiss

    from retrieval_server.search_params import speed_knob

    knob = speed_knob(index)
    if knob is None:
        return ""
    name = knob[0]
    value = faiss.extract_index_ivf(index).nprobe if name == "nprobe" else faiss.downcast_index(index).hnsw.efSearch
    if name == "nprobe" and value == 1:
        logger.warning(
            "the adopted IVF index searches 1 list per query (faiss's default): measure its recall with "
            "`verl-evidence index recall --search-params nprobe=N` and serve with --search-params"
        )
    return f"{name}={value}"
