"""QA metrics in the SQuAD convention: normalisation, exact match, unigram F1, answer recall (max over the gold
answers), and the whitespace token count of the length fallback."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Any

from verl_evidence.text.ground_truth import as_gold_list, flatten_strings

__all__ = ["answer_recall", "exact_match", "f1_score", "normalize", "whitespace_token_count"]

_PUNCTUATION_TABLE = str.maketrans("", "", string.punctuation)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")


def normalize(s: str) -> str:
    """Lower-case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace."""
    if not isinstance(s, str):
        s = "" if s is None else str(s)
    s = s.lower().translate(_PUNCTUATION_TABLE)
    s = _ARTICLES_RE.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 if the normalized prediction equals a normalized gold answer, else 0.0.

    An empty (after normalization) prediction never matches, not even an empty
    gold: an empty answer is not a correct answer.
    """
    pred = normalize(prediction)
    if not pred:
        return 0.0
    return 1.0 if any(pred == normalize(g) for g in as_gold_list(golds)) else 0.0


def _unigram_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    common = Counter(pred_tokens) & Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: Sequence[str]) -> float:
    """Unigram F1 between normalized tokens, max over gold answers (0.0 without golds)."""
    pred_tokens = normalize(prediction).split()
    if not pred_tokens:
        return 0.0
    best = 0.0
    for gold in as_gold_list(golds):
        best = max(best, _unigram_f1(pred_tokens, normalize(gold).split()))
    return best


def answer_recall(text: str, golds: Any) -> float:
    """1.0 if any (non-empty) normalized gold answer is a substring of the normalized text."""
    haystack = normalize(text)
    for gold in as_gold_list(golds):
        needle = normalize(gold)
        if needle and needle in haystack:
            return 1.0
    return 0.0


def whitespace_token_count(text: Any) -> int:
    """Whitespace tokens of a string, or summed over a list of strings (the length fallback)."""
    if text is None:
        return 0
    if isinstance(text, str):
        return len(text.split())
    return sum(len(t.split()) for t in flatten_strings(text))
