"""The ONNX Runtime backend (CPU replicas): :class:`OnnxEncoder` runs an export made by
:mod:`retrieval_server.encoders.onnx_export`, in length-sorted runs (:func:`plan_runs`)."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from retrieval_server.config import EncoderConfig

ONNX_OUTPUT = "sentence_vector"  # not "embedding": BERT's graph already has a node of that name
# A thread given fewer queries than this costs more in hand-off than it saves; smaller batches stay on one thread.
MIN_QUERIES_PER_THREAD = 8
# What one ONNX Runtime run costs beyond its padded tokens, in tokens' worth of time. MiniLM fp32 on one core here:
# ~3.3 ms per run + ~0.3 ms per padded token (batch 1 vs a full batch of 8 equal lengths), i.e. ~11 tokens. Bigger
# models spend relatively less per run, so for them this over-counts the overhead and cuts a batch less: never
# more runs than pay off. See plan_runs.
RUN_OVERHEAD_TOKENS = 12


class OnnxExportError(RuntimeError):
    pass


class TokenizerJson:
    """The export's fast tokenizer run by the ``tokenizers`` library alone, called as :class:`OnnxEncoder` calls a
    transformers tokenizer (``padding=False``, longest-first truncation at ``max_length``): the same ids, since a
    transformers fast tokenizer is this library under the same ``tokenizer.json``.

    Why not transformers here: a CPU replica would import it (and with it torch and scikit-learn) only to tokenize,
    ~4 of the ~5 CPU-seconds a replica spends starting (measured on the bundled index).
    """

    def __init__(self, directory: Path) -> None:
        from tokenizers import Tokenizer

        settings = json.loads((directory / "tokenizer_config.json").read_text())
        self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self._tokenizer.no_padding()  # OnnxEncoder pads each run itself
        self._tokenizer.no_truncation()  # the caller's max_length, not the file's
        self._truncation_side = settings.get("truncation_side", "right")
        self.padding_side = settings.get("padding_side", "right")
        self.pad_token_type_id = int(settings.get("pad_token_type_id", 0))
        pad_token = settings.get("pad_token")
        if isinstance(pad_token, dict):  # an AddedToken written out in full
            pad_token = pad_token.get("content")
        self.pad_token_id = self._tokenizer.token_to_id(pad_token) if pad_token else None

    def __call__(
        self, texts: list[str], padding: bool = False, truncation: str = "longest_first", max_length: int = 512
    ) -> dict[str, list[list[int]]]:
        if padding or truncation != "longest_first":
            raise ValueError("TokenizerJson pads nothing and truncates longest-first only")
        if (self._tokenizer.truncation or {}).get("max_length") != max_length:  # set once: OnnxEncoder keeps it
            self._tokenizer.enable_truncation(max_length, strategy="longest_first", direction=self._truncation_side)
        encodings = self._tokenizer.encode_batch(texts)
        return {
            "input_ids": [e.ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
            "token_type_ids": [e.type_ids for e in encodings],
        }


def load_export_tokenizer(directory: Path):
    """The export's tokenizer: :class:`TokenizerJson` where the export saved a fast tokenizer (``tokenizer.json``),
    else the transformers tokenizer (a model with only a slow, e.g. SentencePiece-only, tokenizer)."""
    if (directory / "tokenizer.json").is_file() and (directory / "tokenizer_config.json").is_file():
        return TokenizerJson(directory)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


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
        self._tokenizer = load_export_tokenizer(export_dir / "tokenizer")
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


def plan_runs(
    sorted_lengths: np.ndarray, max_rows: int, overhead: float = RUN_OVERHEAD_TOKENS
) -> list[tuple[int, int]]:
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
