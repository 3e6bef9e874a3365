"""ROUGE-L F1 that returns exactly what ``rouge_score.rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)``
returns (``fmeasure``, max over references), only faster: the Porter stems are cached and the longest common
subsequence is computed bit-parallel on Python ints (tests/rewards/test_reward_rouge_identity.py proves them equal)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from verl_evidence.text.ground_truth import as_gold_list

__all__ = ["rouge_l", "rouge_tokens"]

# rouge_score.tokenize: lower-case, every non [a-z0-9] run becomes a space, split,
# Porter-stem tokens longer than 3 characters, keep tokens matching ^[a-z0-9]+$.
_ROUGE_NON_ALNUM_RE = re.compile(r"[^a-z0-9]+")
_ROUGE_VALID_TOKEN_RE = re.compile(r"^[a-z0-9]+$")


@lru_cache(maxsize=1)
def _porter_stemmer():
    """The same class and mode rouge-score instantiates, made on first use.

    Imported here, not at the top: ``import nltk`` loads scipy.stats and more (~2.4 s), which every
    reward worker and the CLI would otherwise pay even when no ROUGE is ever computed.
    """
    from nltk.stem.porter import PorterStemmer

    return PorterStemmer()


@lru_cache(maxsize=1 << 18)
def _rouge_stem(token: str) -> str | None:
    """Stemmed token, or None if rouge-score would drop it."""
    stemmed = _porter_stemmer().stem(token) if len(token) > 3 else token
    return stemmed if _ROUGE_VALID_TOKEN_RE.match(stemmed) else None


@lru_cache(maxsize=1 << 14)
def rouge_tokens(text: str) -> tuple[str, ...]:
    """Tokens exactly as rouge-score's DefaultTokenizer(use_stemmer=True) produces them."""
    # After the substitution only [a-z0-9 ] remain, so str.split equals rouge-score's
    # re.split(r"\s+") followed by dropping the empty strings.
    raw = _ROUGE_NON_ALNUM_RE.sub(" ", text.lower()).split()
    out = []
    for tok in raw:
        stemmed = _rouge_stem(tok)
        if stemmed is not None:
            out.append(stemmed)
    return tuple(out)


def _lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence, bit-parallel (Hyyrö 2004).

    One bit per position of ``a``; each token of ``b`` costs a few big-int
    operations instead of a row of the quadratic DP table.
    """
    if len(a) < len(b):
        a, b = b, a
    n = len(a)
    if n == 0 or not b:
        return 0
    position_masks: dict[str, int] = {}
    for i, tok in enumerate(a):
        position_masks[tok] = position_masks.get(tok, 0) | (1 << i)
    full = (1 << n) - 1
    v = full
    for tok in b:
        m = position_masks.get(tok)
        if m is None:
            continue
        u = v & m
        v = ((v + u) | (v - u)) & full
    return n - v.bit_count()


def _rouge_l_tokens(reference: tuple[str, ...], prediction: tuple[str, ...]) -> float:
    # Same arithmetic, in the same order, as rouge_score.rouge_scorer._score_lcs and
    # scoring.fmeasure, so the floats are bit-identical.
    if not reference or not prediction:
        return 0.0
    lcs = _lcs_length(reference, prediction)
    precision = lcs / len(prediction)
    recall = lcs / len(reference)
    if precision + recall > 0:
        return 2 * precision * recall / (precision + recall)
    return 0.0


def rouge_l(prediction: str, references: Sequence[str] | str) -> float:
    """ROUGE-L F1 (Porter-stemmed), max over references; 0.0 without references.

    Equal to ``max(RougeScorer(["rougeL"], use_stemmer=True).score(ref, prediction)["rougeL"].fmeasure)``.
    """
    if not isinstance(prediction, str):
        prediction = "" if prediction is None else str(prediction)
    pred_tokens = rouge_tokens(prediction)
    if not pred_tokens:
        return 0.0
    best = 0.0
    for ref in as_gold_list(references):
        best = max(best, _rouge_l_tokens(rouge_tokens(ref), pred_tokens))
    return best
