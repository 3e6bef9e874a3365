"""Sentence encoders described by an :class:`EncoderConfig` (E5, BGE, any sentence-transformers model).

The pooling is built explicitly from the config (rather than trusting whatever a
checkpoint ships with) so that the manifest's description *is* the computation.

Two backends compute the same vectors: :class:`SentenceEncoder` (torch, the GPU
path and the reference) and :class:`OnnxEncoder` (ONNX Runtime for CPU replicas:
the torch model exported once, with its pooling and normalisation inside the
graph, refused unless it matches torch to :data:`ONNX_TOLERANCE`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from retrieval_server.config import EncoderConfig, cache_dir

logger = logging.getLogger(__name__)


def resolve_device(device: str | None) -> str:
    import torch

    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def model_fingerprint(model: str) -> str:
    """Identity of a local checkpoint (config + weight files' names and sizes); the name itself for hub ids."""
    path = Path(model)
    if not path.is_dir():
        return f"name:{model}"
    digest = hashlib.sha256()
    for file in sorted(path.rglob("*")):
        if file.is_file() and (file.suffix in {".json", ".safetensors", ".bin", ".txt"}):
            rel = file.relative_to(path).as_posix()
            if rel.startswith(".") or rel == "README.md":
                continue
            digest.update(rel.encode())
            if file.suffix == ".json" or file.name == "vocab.txt":
                digest.update(file.read_bytes())
            else:
                digest.update(str(file.stat().st_size).encode())
    return f"sha256:{digest.hexdigest()[:32]}"


def _dimension(module) -> int:
    # sentence-transformers 6 renamed the getters; keep working with 3.x-5.x too.
    for getter in ("get_embedding_dimension", "get_sentence_embedding_dimension", "get_word_embedding_dimension"):
        if hasattr(module, getter):
            return int(getattr(module, getter)())
    raise TypeError(f"cannot tell the embedding dimension of {type(module).__name__}")


class SentenceEncoder:
    """Queries and passages to L2-normalised (if configured) float32 vectors."""

    backend = "torch"

    def __init__(self, config: EncoderConfig, device: str | None = None) -> None:
        from sentence_transformers import SentenceTransformer, models

        self.config = config
        self.device = resolve_device(device)
        if config.pooling == "auto":
            self.model = SentenceTransformer(config.model, device=self.device)
            self.model.max_seq_length = config.max_length
            if config.normalize and not any(isinstance(m, models.Normalize) for m in self.model):
                self.model.append(models.Normalize())
        else:
            transformer = models.Transformer(config.model, max_seq_length=config.max_length)
            modules = [transformer, models.Pooling(_dimension(transformer), pooling_mode=config.pooling)]
            if config.normalize:
                modules.append(models.Normalize())
            self.model = SentenceTransformer(modules=modules, device=self.device)
        if self.device.startswith("cuda"):
            self.model.half()  # fp16 on GPU: half the memory, same ranking to ~1e-3
        self.model.eval()
        self.dim = _dimension(self.model)

    def _encode(self, texts: list[str], prefix: str, batch_size: int) -> np.ndarray:
        vectors = self.model.encode(
            [prefix + t for t in texts],
            batch_size=batch_size,
            convert_to_numpy=True,
            show_progress_bar=False,
            normalize_embeddings=False,  # the Normalize module (if configured) already ran
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_queries(self, queries: list[str], batch_size: int = 128) -> np.ndarray:
        return self._encode(queries, self.config.query_prefix, batch_size)

    def encode_passages(self, passages: list[str], batch_size: int = 64) -> np.ndarray:
        return self._encode(passages, self.config.passage_prefix, batch_size)


# ---------------------------------------------------------------- ONNX Runtime backend (CPU replicas)
ONNX_TOLERANCE = 1e-4  # largest |torch - onnx| allowed in any coordinate of any probe vector
ONNX_EXPORT_FORMAT = 1  # part of the cache key: bump it when the export changes, and old caches are not reused
ONNX_OPSET = 17
ONNX_OUTPUT = "sentence_vector"  # not "embedding": BERT's graph already has a node of that name
# A thread given fewer queries than this costs more in hand-off than it saves; smaller batches stay on one thread.
MIN_QUERIES_PER_THREAD = 8
# What one ONNX Runtime run costs beyond its padded tokens, in tokens' worth of time. MiniLM fp32 on one core here:
# ~3.3 ms per run + ~0.3 ms per padded token (batch 1 vs a full batch of 8 equal lengths), i.e. ~11 tokens. Bigger
# models spend relatively less per run, so for them this over-counts the overhead and cuts a batch less: never
# more runs than pay off. See plan_runs.
RUN_OVERHEAD_TOKENS = 12

# What an export is checked on: a padded batch of mixed lengths and each text alone (padding and sequence length
# are what a trace can freeze), a text past max_length (truncation), non-ASCII text and the empty string.
PROBE_TEXTS = (
    "who wrote on the origin of species",
    "what is the boiling point of water at sea level in degrees fahrenheit?",
    "Paris",
    "Ünïcödé naïve café, 東京 and Zürich: are they tokenised alike?",
    "",
    "evidence " * 400,
    "The Treaty of Westphalia (1648) ended the Thirty Years' War; which powers signed it, and what did it decide?",
)


class OnnxExportError(RuntimeError):
    pass


def _weights_stamp(model: str) -> list[list]:
    """Name, size and modification time of a local checkpoint's weight files.

    The model fingerprint reads weight sizes only, and weights retrained in place keep their sizes: an
    export keyed on the fingerprint alone would silently serve the old model. A copied checkpoint gets new
    times, which costs one more export, never a wrong one.
    """
    path = Path(model)
    if not path.is_dir():
        return []
    files = sorted(f for f in path.rglob("*") if f.is_file() and f.suffix in {".safetensors", ".bin", ".pt", ".onnx"})
    return [[f.relative_to(path).as_posix(), f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def onnx_cache_key(config: EncoderConfig) -> str:
    """Everything the exported graph depends on. Prefixes are applied to the text, so they are not part of it."""
    identity = {
        "format": ONNX_EXPORT_FORMAT,
        "fingerprint": model_fingerprint(config.model),
        "weights": _weights_stamp(config.model),
        "pooling": config.pooling,
        "normalize": config.normalize,
        "max_length": config.max_length,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _writable(directory: Path) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(directory, os.W_OK)


def onnx_export_dir(config: EncoderConfig, index_dir: Path | None, quantized: bool = False) -> Path:
    """``<index_dir>/encoders/onnx-<key>`` (beside the index), else the same under the user cache.

    An existing export is used wherever it is; a new one goes beside the index when that directory is
    writable (replicas on other nodes reading the same index find it there), else into the user cache.
    """
    name = f"onnx-{onnx_cache_key(config)}"
    roots = ([Path(index_dir) / "encoders"] if index_dir is not None else []) + [cache_dir() / "encoders"]
    needed = "model.int8.onnx" if quantized else "export.json"
    for root in roots:
        if (root / name / needed).exists():
            return root / name
    for root in roots:
        if _writable(root):
            return root / name
    tried = ", ".join(map(str, roots))
    raise OnnxExportError(f"no writable directory for the ONNX export of {config.model}: tried {tried}")


@contextlib.contextmanager
def _exclusive(lock_path: Path):
    """One exporter at a time per export directory (replicas of one server start together)."""
    import fcntl

    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_onnx_export(config: EncoderConfig, index_dir: Path | None, quantized: bool = False) -> Path:
    """The directory of this encoder's ONNX export (``model.onnx``, tokenizer, ``export.json``), made if missing."""
    target = onnx_export_dir(config, index_dir, quantized)
    if (target / ("model.int8.onnx" if quantized else "export.json")).exists():
        return target
    with _exclusive(target.parent / f".{target.name}.lock"):
        if not (target / "export.json").exists():  # another replica may have made it while we waited
            export_onnx(config, target)
        if quantized and not (target / "model.int8.onnx").exists():
            quantize_onnx(target)
    return target


def export_onnx(config: EncoderConfig, target: Path) -> dict:
    """Export the torch encoder (transformer, pooling, normalisation: one graph) and check it against torch.

    TorchScript exporter (``dynamo=False``) with dynamic batch and sequence axes, traced on a padded batch:
    it needs no extra package, and its graph ran faster in ONNX Runtime here than the dynamo exporter's
    (both matched torch to ~2e-7). Written to a temporary directory and renamed into place only after
    every probe text matches torch within ONNX_TOLERANCE, so a bad export is never cached.
    """
    import torch

    started = time.perf_counter()
    reference = SentenceEncoder(config, device="cpu")  # fp32: the vectors the index was built with
    model = reference.model
    tokenize = model.preprocess if hasattr(model, "preprocess") else model.tokenize  # sentence-transformers 6 / 3-5
    example = tokenize([config.query_prefix + t for t in PROBE_TEXTS[:4]])  # mixed lengths: the mask is traced too
    names = [name for name, value in example.items() if isinstance(value, torch.Tensor)]

    class SentenceGraph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return self.model(dict(zip(names, inputs)))["sentence_embedding"]

    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer and deprecation chatter: the numeric check below is what counts
            try:
                torch.onnx.export(
                    SentenceGraph().eval(), tuple(example[n] for n in names), str(work / "model.onnx"), dynamo=False,
                    input_names=names, output_names=[ONNX_OUTPUT], opset_version=ONNX_OPSET,
                    dynamic_axes={**{n: {0: "batch", 1: "sequence"} for n in names}, ONNX_OUTPUT: {0: "batch"}},
                )  # fmt: skip
            except Exception as err:
                raise OnnxExportError(
                    f"cannot export {config.model} to ONNX ({type(err).__name__}: {err}); serve it with encoder_backend='torch'"
                ) from err
        model.tokenizer.save_pretrained(str(work / "tokenizer"))
        meta = {
            "format": ONNX_EXPORT_FORMAT,
            "model": config.model,
            "fingerprint": model_fingerprint(config.model),
            "pooling": config.pooling,
            "normalize": config.normalize,
            "max_length": config.max_length,
            "max_seq_length": int(model.max_seq_length),  # what sentence-transformers truncates at (capped by the model)
            "dim": reference.dim,
            "inputs": names,
            "opset": ONNX_OPSET,
            "versions": _versions(),
        }
        (work / "export.json").write_text(json.dumps(meta, indent=2))
        diff = max_abs_difference(reference, OnnxEncoder(work, config), PROBE_TEXTS)
        if not diff <= ONNX_TOLERANCE:
            raise OnnxExportError(
                f"ONNX export of {config.model} differs from torch by up to {diff:.2e} (> {ONNX_TOLERANCE:g}) on the "
                "probe texts; not cached. Serve it with encoder_backend='torch'"
            )
        meta.update(max_abs_diff_vs_torch=diff, export_seconds=round(time.perf_counter() - started, 2))
        (work / "export.json").write_text(json.dumps(meta, indent=2))
        os.replace(work, target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    logger.info("exported %s to ONNX at %s in %.1f s (max |torch - onnx| %.1e)", config.model, target, meta["export_seconds"], diff)
    return meta


def quantize_onnx(export_dir: Path) -> None:
    """``model.int8.onnx``: ONNX Runtime's dynamic int8 quantisation of the fp32 export (weights int8, activations
    quantised per batch). Approximate by design: its vectors are not held to ONNX_TOLERANCE."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    work = export_dir / ".model.int8.onnx.partial"
    previous = logging.root.manager.disable
    logging.disable(logging.INFO)  # the quantiser logs a line per tensor on the root logger
    try:
        # Per-channel weight scales: on MiniLM, cosine to fp32 >= 0.99 on the bundled questions (per-tensor: 0.94).
        quantize_dynamic(str(export_dir / "model.onnx"), str(work), weight_type=QuantType.QInt8, per_channel=True)
    finally:
        logging.disable(previous)
    os.replace(work, export_dir / "model.int8.onnx")


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("torch", "transformers", "sentence-transformers", "onnxruntime"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = None
    return out


def max_abs_difference(a, b, texts: list[str] | tuple[str, ...]) -> float:
    """Largest coordinate difference between two encoders' query vectors: as one padded batch and text by text."""
    batch = np.abs(a.encode_queries(list(texts)) - b.encode_queries(list(texts))).max()
    alone = max(float(np.abs(a.encode_queries([t]) - b.encode_queries([t])).max()) for t in texts)
    return float(max(batch, alone))


class OnnxEncoder:
    """The same vectors as :class:`SentenceEncoder`, from an ONNX export run by ONNX Runtime on CPU.

    A batch is sorted by token length and cut into runs where padding would cost more than another run
    (:func:`plan_runs`). Every run uses one ONNX Runtime thread; a batch of at least
    ``2 * MIN_QUERIES_PER_THREAD`` texts spreads its runs over ``threads`` at once (ONNX Runtime releases the
    GIL), so big batches use the replica's cores while small ones keep the single-thread speed and latency.
    """

    def __init__(
        self, export_dir: Path, config: EncoderConfig, quantized: bool = False, threads: int = 1, batch_size: int = 128
    ) -> None:
        import onnxruntime as ort
        from transformers import AutoTokenizer

        export_dir = Path(export_dir)
        meta = json.loads((export_dir / "export.json").read_text())
        differs = [f for f in ("pooling", "normalize", "max_length") if meta[f] != getattr(config, f)]
        if differs:
            raise OnnxExportError(
                f"{export_dir / 'export.json'} was exported with another {', '.join(differs)} than this encoder's "
                f"({', '.join(f'{f}={getattr(config, f)!r}' for f in differs)})"
            )
        self.config = config
        self.backend = "onnx-int8" if quantized else "onnx"
        self.dim = int(meta["dim"])
        self.threads = threads
        self.batch_size = batch_size
        self.path = export_dir / ("model.int8.onnx" if quantized else "model.onnx")
        self._inputs = meta["inputs"]
        self._max_length = int(meta["max_seq_length"])
        self._tokenizer = AutoTokenizer.from_pretrained(str(export_dir / "tokenizer"))
        # A fast tokenizer called from two threads at once can fail ("Already borrowed").
        self._tokenizer_lock = threading.Lock()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # parallelism comes from concurrent runs of large batches (see class doc)
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="onnx-encode") if threads > 1 else None

    def _token_ids(self, texts: list[str]) -> dict[str, list[list[int]]]:
        # The call sentence-transformers makes, minus the padding: truncate at the model's max_seq_length.
        with self._tokenizer_lock:
            encoded = self._tokenizer(texts, padding=False, truncation="longest_first", max_length=self._max_length)
        return {name: encoded[name] for name in self._inputs}

    def _pad(self, ids: dict[str, list[list[int]]], rows: np.ndarray | range) -> dict[str, np.ndarray]:
        # Pad to the longest row as the tokenizer would (its pad id and side): the feed of one run.
        width = max(len(ids["input_ids"][i]) for i in rows)
        fill = {"input_ids": self._tokenizer.pad_token_id or 0, "token_type_ids": self._tokenizer.pad_token_type_id}
        feed = {}
        for name in self._inputs:
            array = np.full((len(rows), width), fill.get(name, 0), dtype=np.int64)
            for out, i in enumerate(rows):
                row = ids[name][i]
                if self._tokenizer.padding_side == "left":
                    array[out, width - len(row) :] = row
                else:
                    array[out, : len(row)] = row
            feed[name] = array
        return feed

    def _tokenize(self, texts: list[str]) -> dict[str, np.ndarray]:
        """One padded feed for ``texts`` (what sentence-transformers would feed torch)."""
        return self._pad(self._token_ids(texts), range(len(texts)))

    def _run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        return self._session.run([ONNX_OUTPUT], feed)[0]

    def _encode(self, texts: list[str], prefix: str) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        ids = self._token_ids([prefix + t for t in texts])
        lengths = np.array([len(row) for row in ids["input_ids"]])
        order = np.argsort(lengths, kind="stable")  # similar lengths share a run: less padding
        runs = [order[start:stop] for start, stop in plan_runs(lengths[order], self.batch_size)]
        spread = self._pool is not None and len(texts) >= 2 * MIN_QUERIES_PER_THREAD
        while spread and len(runs) < min(self.threads, len(texts) // MIN_QUERIES_PER_THREAD):
            largest = max(range(len(runs)), key=lambda r: len(runs[r]))  # a big even batch: give each thread a part
            runs[largest : largest + 1] = np.array_split(runs[largest], 2)
        if spread and len(runs) > 1:
            outputs = list(self._pool.map(lambda rows: self._run(self._pad(ids, rows)), runs))
        else:
            outputs = [self._run(self._pad(ids, rows)) for rows in runs]
        vectors = np.empty((len(texts), self.dim), dtype=np.float32)
        vectors[np.concatenate(runs)] = np.concatenate(outputs)
        return vectors

    def encode_queries(self, queries: list[str], batch_size: int | None = None) -> np.ndarray:
        return self._encode(queries, self.config.query_prefix)

    def encode_passages(self, passages: list[str], batch_size: int | None = None) -> np.ndarray:
        return self._encode(passages, self.config.passage_prefix)


def plan_runs(sorted_lengths: np.ndarray, max_rows: int, overhead: float = RUN_OVERHEAD_TOKENS) -> list[tuple[int, int]]:
    """Cut texts sorted by token length into runs ``[start, stop)`` of at most ``max_rows``, for the least work.

    A run of ``r`` texts is padded to its longest, so it costs ``overhead + r * longest`` tokens' worth of time.
    One padded batch of mixed-length questions wastes ~30 % on padding (bundled questions, 10-28 tokens, batches
    of 16); cutting it where lengths jump costs a run's overhead instead. Exact (dynamic programming over the cut
    points), ``O(n * max_rows)`` with the inner minimum in numpy.
    """
    n = len(sorted_lengths)
    best = np.zeros(n + 1)  # best[j]: least cost of the first j texts
    cut = np.zeros(n + 1, dtype=np.int64)  # where the last run of that best plan starts
    for stop in range(1, n + 1):
        starts = np.arange(max(0, stop - max_rows), stop)
        costs = best[starts] + overhead + (stop - starts) * float(sorted_lengths[stop - 1])
        pick = int(np.argmin(costs))
        best[stop], cut[stop] = costs[pick], starts[pick]
    plan, stop = [], n
    while stop > 0:
        plan.append((int(cut[stop]), stop))
        stop = int(cut[stop])
    return plan[::-1]


def _require_onnxruntime() -> None:
    # Checked before anything is exported: without it the export could not even be verified.
    try:
        import onnxruntime  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "the onnx encoder backends need onnxruntime: pip install onnxruntime onnx (both in verl-evidence[serve])"
        ) from err


def load_query_encoder(
    config: EncoderConfig, backend: str = "torch", device: str | None = None, index_dir: Path | None = None, threads: int = 1
) -> SentenceEncoder | OnnxEncoder:
    """The query encoder of a server replica. ``backend``: torch | onnx | onnx-int8 | auto (onnx on CPU, torch on GPU)."""
    on_cpu = resolve_device(device) == "cpu"
    if backend == "auto":
        if not on_cpu:
            return SentenceEncoder(config, device=device)
        try:
            _require_onnxruntime()
            return OnnxEncoder(ensure_onnx_export(config, index_dir), config, threads=threads)
        except (ImportError, OnnxExportError) as err:  # onnxruntime not installed, or a model it cannot export
            logger.warning("ONNX encoder unavailable (%s); using torch", err)
            return SentenceEncoder(config, device=device)
    if backend == "torch":
        return SentenceEncoder(config, device=device)
    if backend not in ("onnx", "onnx-int8"):
        raise ValueError(f"unknown encoder backend {backend!r}: torch, onnx, onnx-int8 or auto")
    if not on_cpu:
        raise ValueError(
            f"encoder backend {backend!r} runs on CPU, but device is {resolve_device(device)!r}; torch is the GPU path"
        )
    _require_onnxruntime()
    quantized = backend == "onnx-int8"
    return OnnxEncoder(ensure_onnx_export(config, index_dir, quantized), config, quantized=quantized, threads=threads)


def describe(config: EncoderConfig, dim: int) -> dict:
    """The encoder section of a manifest."""
    return {**json.loads(config.model_dump_json()), "dim": dim, "fingerprint": model_fingerprint(config.model)}
