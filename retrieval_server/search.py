"""Searchers over a built index: FAISS (dense), BM25, reciprocal-rank fusion, cross-encoder rerank.

Every searcher takes a *batch* of queries and returns ``(rows, scores)`` arrays of
shape ``(n_queries, k)``; row ``-1`` marks "no hit" (fewer passages than k).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from retrieval_server.config import EncoderConfig, ServerConfig
from retrieval_server.docstore import DocumentStore
from retrieval_server.index import (
    ENCODERS_DIR,
    IndexMismatchError,
    check_search_params,
    read_manifest,
    record_export,
    recorded_encoder,
    verify_index,
)

logger = logging.getLogger(__name__)


class DenseSearcher:
    def __init__(
        self, index_path: Path, search_params: str = "", use_gpu: bool = True, fp16: bool = True, mmap: bool = False
    ) -> None:
        import faiss

        from retrieval_server.index import read_dense_index

        self.index = read_dense_index(index_path, mmap=mmap)
        if search_params:
            faiss.ParameterSpace().set_index_parameters(self.index, search_params)
        self.on_gpu = False
        if use_gpu and faiss.get_num_gpus() > 0:
            # Shard the vectors across every visible GPU (fp16 storage halves the memory); faiss merges the top-k.
            options = faiss.GpuMultipleClonerOptions()
            options.shard = True
            options.useFloat16 = fp16
            self.index = faiss.index_cpu_to_all_gpus(self.index, co=options)
            self.on_gpu = True
            logger.info("FAISS index sharded over %d GPUs", faiss.get_num_gpus())

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def search(self, query_vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores, rows = self.index.search(np.ascontiguousarray(query_vectors, dtype=np.float32), k)
        return rows, scores


class BM25Searcher:
    def __init__(self, bm25_dir: Path) -> None:
        import bm25s
        from bm25s.tokenization import Tokenizer

        from retrieval_server.index import BM25_TOKENIZER_VOCAB

        self.retriever = bm25s.BM25.load(str(bm25_dir), mmap=True, show_progress=False)
        self.tokenizer = Tokenizer(stopwords="en")
        self.tokenizer.load_vocab(str(bm25_dir), vocab_name=BM25_TOKENIZER_VOCAB)
        self.vocab = self.retriever.vocab_dict
        self.ntotal = int(self.retriever.scores["num_docs"])

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        # update_vocab=False: the corpus vocabulary stays fixed, so a long-running server does not grow it.
        tokens = self.tokenizer.tokenize(queries, update_vocab=False, return_as="string", show_progress=False)
        # Words the corpus never uses carry no BM25 signal; dropping them keeps bm25s from failing on them.
        tokens = [[t for t in query if t in self.vocab] for query in tokens]
        kk = min(k, self.ntotal)
        rows, scores = self.retriever.retrieve(tokens, k=kk, show_progress=False, n_threads=0)
        rows, scores = np.asarray(rows, dtype=np.int64), np.asarray(scores, dtype=np.float32)
        if kk < k:
            rows = np.pad(rows, ((0, 0), (0, k - kk)), constant_values=-1)
            scores = np.pad(scores, ((0, 0), (0, k - kk)), constant_values=-np.inf)
        return rows, scores


def reciprocal_rank_fusion(rankings: list[np.ndarray], k: int, rrf_k: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """Fuse several (n_queries, depth) row rankings: score(d) = sum over rankings of 1 / (rrf_k + rank(d))."""
    n_queries = rankings[0].shape[0]
    out_rows = np.full((n_queries, k), -1, dtype=np.int64)
    out_scores = np.full((n_queries, k), -np.inf, dtype=np.float32)
    for q in range(n_queries):
        fused: dict[int, float] = {}
        for ranking in rankings:
            for rank, row in enumerate(ranking[q]):
                if row >= 0:
                    fused[int(row)] = fused.get(int(row), 0.0) + 1.0 / (rrf_k + rank + 1)
        # Ties broken by row id so the order is deterministic.
        best = sorted(fused.items(), key=lambda item: (-item[1], item[0]))[:k]
        for j, (row, score) in enumerate(best):
            out_rows[q, j], out_scores[q, j] = row, score
    return out_rows, out_scores


class CrossEncoderReranker:
    def __init__(self, model: str, device: str | None = None) -> None:
        from sentence_transformers import CrossEncoder

        from retrieval_server.encoders import resolve_device

        self.model = CrossEncoder(model, device=resolve_device(device))

    def rerank(
        self, queries: list[str], rows: np.ndarray, texts: list[list[str]], k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Re-order each query's candidates (rows[q], texts[q]) by cross-encoder score; keep the best k."""
        pairs = [(query, text) for query, candidates in zip(queries, texts) for text in candidates]
        flat = np.asarray(self.model.predict(pairs, show_progress_bar=False, convert_to_numpy=True), dtype=np.float32)
        if flat.ndim > 1:  # multi-label heads: use the first logit as relevance
            flat = flat[:, 0]
        out_rows = np.full((len(queries), k), -1, dtype=np.int64)
        out_scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        offset = 0
        for q, candidates in enumerate(texts):
            scores = flat[offset : offset + len(candidates)]
            offset += len(candidates)
            order = np.argsort(-scores, kind="stable")[:k]
            out_rows[q, : len(order)] = rows[q][order]
            out_scores[q, : len(order)] = scores[order]
        return out_rows, out_scores


def _cut(rows: np.ndarray, scores: np.ndarray | None, depths: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Blank each query's ranking past its own depth (rows -1, scores -inf), as if searched that deep alone."""
    past = np.arange(rows.shape[1])[None, :] >= depths[:, None]
    rows = np.where(past, -1, rows)
    return rows, (None if scores is None else np.where(past, -np.inf, scores).astype(scores.dtype))


def check_server_config(config: ServerConfig, prepare: bool = True) -> tuple[dict, EncoderConfig]:
    """Verify index files, corpus and (requested or recorded) encoder; return the manifest and the encoder to use.

    ``prepare`` (the launching process, before any replica): also try ``search_params`` on the index's type and make
    the ONNX export CPU replicas load (in a subprocess), so that neither fails inside a replica.
    """
    requested = None
    if config.encoder_model is not None:
        requested = recorded_encoder(read_manifest(Path(config.index_dir))).model_copy(
            update={"model": config.encoder_model}
        )
    manifest = verify_index(Path(config.index_dir), corpus=config.corpus, encoder=requested)
    encoder = recorded_encoder(manifest)  # the model location that passed the check
    if prepare and config.method in ("dense", "hybrid"):
        from retrieval_server.encoders import prepare_query_encoder

        check_search_params(Path(config.index_dir), manifest, config.search_params)
        prepared = prepare_query_encoder(
            encoder, config.encoder_backend, config.device, config.num_gpus_per_replica, Path(config.index_dir)
        )
        if prepared is not None and prepared[0].parent == Path(config.index_dir) / ENCODERS_DIR:
            # from now on its replicas check it against the manifest; one made just now replaces an older record
            record_export(Path(config.index_dir), prepared[0], made_now=prepared[1])
    return manifest, encoder


class Retriever:
    """Everything one replica serves from: encoder, searchers, document store. Batch in, documents out."""

    def __init__(self, config: ServerConfig) -> None:
        from retrieval_server.encoders import load_query_encoder

        self.config = config
        index_dir = Path(config.index_dir)
        self.manifest, encoder_config = check_server_config(config, prepare=False)
        self.docstore = DocumentStore(index_dir / self.manifest["docstore"])
        self.encoder = None
        self.dense = None
        self.bm25 = None
        if config.method in ("dense", "hybrid"):
            self.encoder = load_query_encoder(
                encoder_config, config.encoder_backend, config.device, index_dir, config.effective_encode_threads
            )
            self.dense = DenseSearcher(
                index_dir / self.manifest["index"]["file"],
                config.search_params,
                config.use_gpu_index,
                mmap=config.mmap_index,
            )
            if self.encoder.dim != self.dense.dim or self.dense.dim != self.manifest["dim"]:
                raise IndexMismatchError(
                    f"encoder {self.encoder.config.model} produces {self.encoder.dim}-d vectors, index "
                    f"{index_dir / self.manifest['index']['file']} holds {self.dense.dim}-d, manifest "
                    f"{index_dir / 'manifest.json'} says {self.manifest['dim']}"
                )
            if self.dense.ntotal != len(self.docstore):
                raise IndexMismatchError(
                    f"{index_dir / self.manifest['index']['file']} holds {self.dense.ntotal} vectors but "
                    f"{self.docstore.path} holds {len(self.docstore)} passages"
                )
        if config.method in ("bm25", "hybrid"):
            if not self.manifest.get("bm25"):
                raise IndexMismatchError(
                    f"method {config.method!r} needs a BM25 index, but {index_dir / 'manifest.json'} has none "
                    "(build with --bm25)"
                )
            self.bm25 = BM25Searcher(index_dir / self.manifest["bm25"]["dir"])
            if self.bm25.ntotal != len(self.docstore):
                raise IndexMismatchError(
                    f"{index_dir / 'bm25'} indexes {self.bm25.ntotal} passages, {self.docstore.path} holds "
                    f"{len(self.docstore)}"
                )
        self.reranker = CrossEncoderReranker(config.rerank_model, device=config.device) if config.rerank_model else None

    @property
    def size(self) -> int:
        return len(self.docstore)

    def encode(self, queries: list[str]) -> np.ndarray | None:
        return self.encoder.encode_queries(queries) if self.encoder is not None else None

    def search(
        self, queries: list[str], query_vectors: np.ndarray | None, k: int | Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows and scores for a batch of queries, by the configured method (+ optional rerank).

        ``k`` is one cut-off for every query or one per query (a server batch mixes requests). The arrays
        are as wide as the largest k; a query's columns past its own k hold -1 / -inf. Each query gets what
        it would get searched alone: fusion and rerank depths follow its own k, not its batch companions'.
        """
        ks = np.broadcast_to(np.asarray(k, dtype=np.int64), (len(queries),))
        widest = int(ks.max())
        depths = np.maximum(ks, self.config.rerank_top_n) if self.reranker else ks
        if self.config.method == "dense":
            rows, scores = self.dense.search(query_vectors, int(depths.max()))
        elif self.config.method == "bm25":
            rows, scores = self.bm25.search(queries, int(depths.max()))
        else:
            fusion_depths = np.maximum(depths, self.config.fusion_depth)
            dense_rows, _ = self.dense.search(query_vectors, int(fusion_depths.max()))
            bm25_rows, _ = self.bm25.search(queries, int(fusion_depths.max()))
            rankings = [_cut(ranking, None, fusion_depths)[0] for ranking in (dense_rows, bm25_rows)]
            rows, scores = reciprocal_rank_fusion(rankings, int(depths.max()), self.config.rrf_k)
        rows, scores = _cut(rows, scores, depths)
        if self.reranker is not None:
            texts = [[d["contents"] for d in self.docstore.lookup(r[r >= 0])] for r in rows]
            valid = [r[r >= 0] for r in rows]
            rows, scores = self.reranker.rerank(queries, valid, texts, widest)
        return _cut(rows[:, :widest], scores[:, :widest], ks)

    def lookup(self, rows: np.ndarray) -> list[dict]:
        return self.docstore.lookup(rows)


class ResultCache:
    """The recent answers of one replica: (query, topk, method, index) -> that query's (rows, scores), least recently
    used out.

    In GRPO the n samples of a prompt often send the same first query; a repeat is answered from here exactly as
    the search answered it the first time. ``size`` 0 keeps nothing. Not thread-safe: the server uses it on its
    event loop only.
    """

    def __init__(self, size: int, method: str, index: str) -> None:
        from cachetools import LRUCache

        self.size = size
        self._entries: LRUCache = LRUCache(maxsize=max(size, 1))
        self._scope = (method, index)

    def key(self, query: str, topk: int) -> tuple:
        return (query, topk, *self._scope)

    def get(self, key: tuple) -> tuple[list[int], list[float]] | None:
        return self._entries.get(key) if self.size else None

    def put(self, key: tuple, hits: tuple[list[int], list[float]]) -> None:
        if self.size:
            self._entries[key] = hits
