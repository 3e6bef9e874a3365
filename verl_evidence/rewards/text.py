"""Shared text utilities for every reward family: one implementation each.

- QA metrics in the SQuAD convention: :func:`normalize`, :func:`exact_match`,
  :func:`f1_score`, :func:`answer_recall`.
- :func:`rouge_l`: ROUGE-L F1 that returns exactly what
  ``rouge_score.rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)`` returns
  (``fmeasure``, max over references), only faster: the Porter stems are cached
  and the longest common subsequence is computed bit-parallel on Python ints.
- Tag handling: :func:`extract_last`, :func:`find_blocks`, :func:`tag_events`,
  :func:`block_sequence`, :func:`strip_thinking`.
- :func:`cut_at_stop`: where generated token ids end at a stop string or stop
  token (the tokenizer is only asked to ``decode``).
- :func:`parse_bool`: the one true/false parser for data rows and configs.
- :func:`coerce_ground_truth`: turns whatever sits in a verl parquet row's
  ``reward_model.ground_truth`` into ``{"target", "evidence", "answerable"}``.

Nothing here raises on model output: any string goes in, a number (or ``None``
for "no such block") comes out.
"""

from __future__ import annotations

import json
import logging
import math
import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "GroundTruth",
    "answer_recall",
    "block_sequence",
    "coerce_ground_truth",
    "cut_at_stop",
    "exact_match",
    "extract_last",
    "f1_score",
    "find_blocks",
    "normalize",
    "parse_bool",
    "rouge_l",
    "rouge_tokens",
    "strip_thinking",
    "tag_events",
    "whitespace_token_count",
]

# ---------------------------------------------------------------------------
# SQuAD-style normalisation and QA metrics
# ---------------------------------------------------------------------------

_PUNCTUATION_TABLE = str.maketrans("", "", string.punctuation)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")


def normalize(s: str) -> str:
    """Lower-case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace."""
    if not isinstance(s, str):
        s = "" if s is None else str(s)
    s = s.lower().translate(_PUNCTUATION_TABLE)
    s = _ARTICLES_RE.sub(" ", s)
    return " ".join(s.split())


def _as_gold_list(golds: Any) -> list[str]:
    """A single gold string is a one-element list; None is no golds."""
    if golds is None:
        return []
    if isinstance(golds, str):
        return [golds]
    return _flatten_strings(golds)


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 if the normalized prediction equals a normalized gold answer, else 0.0.

    An empty (after normalization) prediction never matches, not even an empty
    gold: an empty answer is not a correct answer.
    """
    pred = normalize(prediction)
    if not pred:
        return 0.0
    return 1.0 if any(pred == normalize(g) for g in _as_gold_list(golds)) else 0.0


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
    for gold in _as_gold_list(golds):
        best = max(best, _unigram_f1(pred_tokens, normalize(gold).split()))
    return best


def answer_recall(text: str, golds: Any) -> float:
    """1.0 if any (non-empty) normalized gold answer is a substring of the normalized text."""
    haystack = normalize(text)
    for gold in _as_gold_list(golds):
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
    return sum(len(t.split()) for t in _flatten_strings(text))


# ---------------------------------------------------------------------------
# ROUGE-L, identical to rouge-score's RougeScorer(["rougeL"], use_stemmer=True)
# ---------------------------------------------------------------------------

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
    for ref in _as_gold_list(references):
        best = max(best, _rouge_l_tokens(rouge_tokens(ref), pred_tokens))
    return best


# ---------------------------------------------------------------------------
# Tags
# ---------------------------------------------------------------------------


@lru_cache(maxsize=256)
def _tag_event_re(tags: tuple[str, ...]) -> re.Pattern[str]:
    names = "|".join(re.escape(t) for t in tags)
    return re.compile(rf"<(/?)({names})>")


def tag_events(text: str, tags: Iterable[str]) -> list[tuple[str, bool, int, int]]:
    """Every literal ``<tag>`` / ``</tag>`` of the given names, in order.

    Each event is ``(tag, is_close, start, end)`` with character offsets.
    """
    tags = tuple(tags)
    if not tags or not isinstance(text, str):
        return []
    return [(m.group(2), m.group(1) == "/", m.start(), m.end()) for m in _tag_event_re(tags).finditer(text)]


def block_sequence(text: str, tags: Iterable[str]) -> list[str] | None:
    """The named blocks of ``text`` in order, if they are well formed; else None.

    Well formed: every ``<tag>`` of the given names is closed by its own
    ``</tag>`` before any other listed tag opens or closes (no nesting, no
    stray or unclosed tags). Text between blocks is not inspected.
    """
    sequence: list[str] = []
    open_tag: str | None = None
    for tag, is_close, _, _ in tag_events(text, tags):
        if open_tag is None:
            if is_close:
                return None  # closes something never opened
            open_tag = tag
        else:
            if not is_close or tag != open_tag:
                return None  # nested open, or closes a different tag
            sequence.append(tag)
            open_tag = None
    if open_tag is not None:
        return None  # unclosed at the end
    return sequence


def find_blocks(text: str, tag: str) -> list[str]:
    """Contents of all complete ``<tag>...</tag>`` blocks, in order, stripped.

    Each close pairs with the nearest preceding unpaired open of the same tag
    after the previous block, so ``<a>x<a>y</a>`` yields ``["y"]`` and an
    unclosed ``<a>`` yields nothing.
    """
    blocks: list[str] = []
    open_end: int | None = None
    for _, is_close, start, end in tag_events(text, (tag,)):
        if is_close:
            if open_end is not None:
                blocks.append(text[open_end:start].strip())
                open_end = None
        else:
            open_end = end  # a later open supersedes an unclosed earlier one
    return blocks


def extract_last(text: str, tag: str) -> str | None:
    """Stripped content of the LAST complete ``<tag>...</tag>`` block; None if there is none."""
    if not isinstance(text, str):
        return None
    opening, closing = f"<{tag}>", f"</{tag}>"
    close = text.rfind(closing)
    # Same pairing as find_blocks: a block is a close whose nearest preceding tag is an open;
    # walk back over stray closes ("<a>x</a></a>" -> "x").
    while close >= 0:
        start = text.rfind(opening, 0, close)
        previous_close = text.rfind(closing, 0, close)
        if start > previous_close:
            return text[start + len(opening) : close].strip()
        close = previous_close
    return None


def strip_thinking(text: str) -> str:
    """Text after the last ``</think>``, or the text unchanged if there is none."""
    if not isinstance(text, str):
        return "" if text is None else str(text)
    idx = text.rfind("</think>")
    return text if idx < 0 else text[idx + len("</think>") :]


def cut_at_stop(token_ids: list[int], tokenizer, stops: Sequence[str], stop_ids: set[int]) -> tuple[list[int], str]:
    """Cut ``token_ids`` after the first token that ends a stop string or is a stop token.

    Returns the kept ids and why generation ended: ``"stop"`` (stop string or
    stop token) or ``"length"`` (no stop seen).
    """
    # Every token decodes to at least one character, so a stop string that the
    # current token completes lies within the last len(stop) tokens: decoding
    # that window keeps the scan linear.
    window = max((len(s) for s in stops), default=0) + 1
    for index, token_id in enumerate(token_ids):
        if token_id in stop_ids:
            return token_ids[: index + 1], "stop"
        if stops:
            tail = tokenizer.decode(token_ids[max(0, index + 1 - window) : index + 1], skip_special_tokens=False)
            if any(s in tail for s in stops):
                return token_ids[: index + 1], "stop"
    return list(token_ids), "length"


# ---------------------------------------------------------------------------
# Ground truth
# ---------------------------------------------------------------------------

GroundTruth = dict  # {"target": list[str], "evidence": list[str], "answerable": bool | None}

_TARGET_KEYS = ("target", "golden_answers", "answers", "answer")
_EVIDENCE_KEYS = ("evidence", "gold_evidence")


def _flatten_strings(value: Any) -> list[str]:
    """Strings out of str / bytes / numbers / (nested) lists / numpy arrays; None and blanks dropped."""
    if value is None:
        return []
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()  # numpy arrays and scalars, without importing numpy
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, dict):
        return []
    if isinstance(value, (list, tuple, set, frozenset)):
        out: list[str] = []
        for item in value:
            out.extend(_flatten_strings(item))
        return out
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [str(value)]
    return []


# The one word list for true/false strings in data rows and configs (``extra_info.validate``, ``answerable``).
TRUE_WORDS = ("true", "yes", "1")
FALSE_WORDS = ("false", "no", "0")


def parse_bool(value: Any) -> bool | None:
    """``True``/``False`` from a bool, a number, a word of :data:`TRUE_WORDS`/:data:`FALSE_WORDS` (any case)
    or a one-element list/array of those; ``None`` for anything else (NaN, infinities, other words, empty values)."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, list):
        value = value[0] if len(value) == 1 else None
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    if isinstance(value, float):
        return value != 0.0 if math.isfinite(value) else None
    if isinstance(value, str):
        low = value.strip().lower()
        if low in TRUE_WORDS:
            return True
        if low in FALSE_WORDS:
            return False
    return None


def coerce_ground_truth(gt: Any) -> dict:
    """``{"target": list[str], "evidence": list[str], "answerable": bool | None}`` from anything.

    Accepts the documented dict (values may be lists, numpy arrays or bare
    strings), Search-R1's ``{"target": array}``, a JSON string of such a dict,
    a bare answer string, or a list of answers. Unknown shapes give empty lists
    and ``answerable=None``; this function never raises.
    """
    try:
        if hasattr(gt, "tolist") and not isinstance(gt, (str, bytes, dict)):
            gt = gt.tolist()
        if isinstance(gt, bytes):
            gt = gt.decode("utf-8", errors="replace")
        if isinstance(gt, str) and gt.lstrip().startswith("{"):
            try:
                parsed = json.loads(gt)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                gt = parsed
        if hasattr(gt, "keys") and hasattr(gt, "get") and not isinstance(gt, dict):
            gt = {k: gt.get(k) for k in gt}  # Mapping-like (e.g. an omegaconf DictConfig)
        if isinstance(gt, dict):
            target: list[str] = []
            for key in _TARGET_KEYS:
                if key in gt:
                    target = _flatten_strings(gt[key])
                    break
            evidence: list[str] = []
            for key in _EVIDENCE_KEYS:
                if key in gt:
                    evidence = _flatten_strings(gt[key])
                    break
            return {"target": target, "evidence": evidence, "answerable": parse_bool(gt.get("answerable"))}
        return {"target": _flatten_strings(gt), "evidence": [], "answerable": None}
    except Exception as exc:
        logger.info("could not read ground truth of type %s (%s); using empty golds", type(gt).__name__, exc)
        return {"target": [], "evidence": [], "answerable": None}
