"""What sits in a verl parquet row's ``reward_model.ground_truth``, as ``{"target", "evidence", "answerable"}``, and
:func:`parse_bool`, the one true/false parser for data rows and configs."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "FALSE_WORDS",
    "TRUE_WORDS",
    "GroundTruth",
    "as_gold_list",
    "coerce_ground_truth",
    "flatten_strings",
    "parse_bool",
]

GroundTruth = dict  # {"target": list[str], "evidence": list[str], "answerable": bool | None}

_TARGET_KEYS = ("target", "golden_answers", "answers", "answer")
_EVIDENCE_KEYS = ("evidence", "gold_evidence")


def flatten_strings(value: Any) -> list[str]:
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
            out.extend(flatten_strings(item))
        return out
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [str(value)]
    return []


def as_gold_list(golds: Any) -> list[str]:
    """A single gold string is a one-element list; None is no golds."""
    if golds is None:
        return []
    if isinstance(golds, str):
        return [golds]
    return flatten_strings(golds)


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
                    target = flatten_strings(gt[key])
                    break
            evidence: list[str] = []
            for key in _EVIDENCE_KEYS:
                if key in gt:
                    evidence = flatten_strings(gt[key])
                    break
            return {"target": target, "evidence": evidence, "answerable": parse_bool(gt.get("answerable"))}
        return {"target": flatten_strings(gt), "evidence": [], "answerable": None}
    except Exception as exc:
        logger.info("could not read ground truth of type %s (%s); using empty golds", type(gt).__name__, exc)
        return {"target": [], "evidence": [], "answerable": None}
