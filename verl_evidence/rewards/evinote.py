"""EviNote-RAG reward: Supportive-Evidence Notes gated by format and answer, plus EQR (seed 002).

The multi-turn response interleaves ``<think>``, ``<search>``, system-inserted
``<information>`` blocks, optional ``<summary>`` notes and a final ``<answer>``.

    R = correct_reward + EQR   if format ok and EM(answer, golds) = 1
    R = note_reward + EQR      if format ok, answer wrong, note-taking ok
    R = 0                      otherwise
    (defaults 1.0 and 0.1; EQR in [0, 1], so R is in [0, 2])

EQR (Evidence Quality Reward) is the NLI entailment probability of the claim
``build_claim(first gold answer, question)`` given the LAST ``<summary>``. The
reward manager computes it with the NLI judge and passes it as
``extra_info["eqr"]``; this module only gates and adds it (no summary: EQR 0).

Decisions (docs/methods/evinote.md):
- Content of ``<information>`` blocks is the system's, not the policy's: it is
  removed before any format, note or answer check.
- Note-taking (:func:`note_taking_ok`, the spec's criterion) holds when the
  notes hold at least one annotation and every marker is closed. The notes are
  all of the response's ``<summary>`` blocks: the annotation may be in any of
  them (a plain or empty summary beside an annotated one is fine), but markers
  pair up within one summary, never across two.
- A marker is a run of one marker string (``**`` counts once). A run flanked by
  letters/digits on both sides is part of a word (``well-known``, ``2-3``,
  ``5*3``) and a run with whitespace (or the text edge) on both sides is free
  punctuation (``Paris - France``, list bullets): neither counts. The remaining
  runs of each marker must pair up; an annotation is a pair enclosing
  non-blank text.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from verl_evidence.rewards.qa_metrics import exact_match
from verl_evidence.text.ground_truth import coerce_ground_truth
from verl_evidence.text.tags import block_sequence, extract_last, find_blocks

logger = logging.getLogger(__name__)

__all__ = [
    "RESULT_KEYS",
    "EviNoteConfig",
    "build_claim",
    "compute_score",
    "config_from_kwargs",
    "format_ok",
    "last_summary",
    "note_taking_ok",
    "notes_ok",
    "policy_text",
    "score",
]

PROTOCOL_TAGS = ("think", "search", "information", "summary", "answer")
DEFAULT_CLAIM_TEMPLATE = "{answer} is the answer to the question: {question}"

RESULT_KEYS = ("score", "em", "format_ok", "notes_ok", "has_summary", "num_summaries", "eqr", "gate")


@dataclass(frozen=True)
class EviNoteConfig:
    """markers: SEN annotation markers (paper: ``*`` key, ``-`` uncertain; the released code used ``*`` and ``#``).
    claim_template: NLI hypothesis, with ``{answer}`` and ``{question}`` fields.
    correct_reward / note_reward: gate values for a correct answer / a wrong answer with good notes.
    """

    markers: tuple[str, ...] = ("*", "-")
    claim_template: str = DEFAULT_CLAIM_TEMPLATE
    correct_reward: float = 1.0
    note_reward: float = 0.1

    def __post_init__(self) -> None:
        markers = self.markers
        if isinstance(markers, str):
            markers = (markers,)
        markers = tuple(str(m) for m in markers)
        if not markers or any(not m or m.isspace() or any(ch.isalnum() for ch in m) for m in markers):
            raise ValueError(f"EviNoteConfig.markers must be non-empty strings of punctuation, got {self.markers!r}")
        object.__setattr__(self, "markers", markers)
        for name in ("correct_reward", "note_reward"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ValueError(f"EviNoteConfig.{name} must be a finite number >= 0, got {value!r}")
        try:
            self.claim_template.format(answer="a", question="q")
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise ValueError(
                "EviNoteConfig.claim_template must use only {answer} and {question}: "
                f"{self.claim_template!r} ({exc})"
            ) from exc

    @property
    def max_score(self) -> float:
        return max(self.correct_reward, self.note_reward) + 1.0


@lru_cache(maxsize=64)
def _marker_run_re(marker: str) -> re.Pattern[str]:
    return re.compile(f"(?:{re.escape(marker)})+")


def _marker_runs(text: str, marker: str) -> list[tuple[int, int]]:
    """Runs of ``marker`` that act as annotation markers (not word-internal, not free-standing)."""
    runs = []
    for m in _marker_run_re(marker).finditer(text):
        before = text[m.start() - 1] if m.start() > 0 else ""
        after = text[m.end()] if m.end() < len(text) else ""
        if before.isalnum() and after.isalnum():
            continue  # inside a word or number: well-known, 2-3, 5*3
        if (not before or before.isspace()) and (not after or after.isspace()):
            continue  # a free-standing dash or bullet
        runs.append((m.start(), m.end()))
    return runs


def _check_markers(text: str, markers: tuple[str, ...] | list[str] | str) -> tuple[bool, bool]:
    """(every marker of every kind in ``text`` is closed, ``text`` holds an annotation)."""
    if isinstance(markers, str):
        markers = (markers,)
    annotated = False
    for marker in markers:
        if not marker:
            continue
        runs = _marker_runs(text, marker)
        if len(runs) % 2:
            return False, annotated  # an unclosed marker
        for (_, open_end), (close_start, _) in zip(runs[::2], runs[1::2]):
            if text[open_end:close_start].strip():
                annotated = True
    return True, annotated


def note_taking_ok(notes: list[str] | tuple[str, ...], markers: tuple[str, ...] | list[str] = ("*", "-")) -> bool:
    """The note-taking criterion over all of a response's notes (its ``<summary>`` texts).

    True when at least one note holds an annotation and no note has an unclosed
    marker. Each note is checked on its own, so a pair never spans two notes;
    plain or empty notes beside an annotated one do not fail the criterion.
    """
    annotated = False
    for note in notes:
        if not isinstance(note, str):
            return False
        closed, has_annotation = _check_markers(note, markers)
        if not closed:
            return False
        annotated = annotated or has_annotation
    return annotated


def notes_ok(text: str, markers: tuple[str, ...] | list[str] = ("*", "-")) -> bool:
    """True if ``text`` (one note) holds at least one annotation and every marker of every kind is paired."""
    if not isinstance(text, str) or not text.strip():
        return False
    return note_taking_ok([text], markers)


_INFORMATION_RE = re.compile(r"<information>.*?</information>", re.DOTALL)


def policy_text(response: str) -> str:
    """The response without the system-inserted ``<information>...</information>`` blocks."""
    if not isinstance(response, str):
        return "" if response is None else str(response)
    return _INFORMATION_RE.sub(" ", response)


def format_ok(response: str) -> bool:
    """An ``<answer>`` block, at least one ``<summary>``, and well-formed protocol tags.

    Well formed: every think/search/summary/answer (and information) tag the
    policy wrote is closed by its own tag with no other protocol tag opened or
    closed inside it.
    """
    blocks = block_sequence(policy_text(response), PROTOCOL_TAGS)
    if blocks is None:
        return False
    return "answer" in blocks and "summary" in blocks


def last_summary(response: str) -> str:
    """Text of the last complete ``<summary>`` the policy wrote ("" if none): the EQR premise."""
    notes = find_blocks(policy_text(response), "summary")
    return notes[-1] if notes else ""


def build_claim(answer: Any, question: Any, template: str = DEFAULT_CLAIM_TEMPLATE) -> str:
    """The NLI hypothesis. ``answer`` may be a list of gold answers: the FIRST one is used
    (the canonical answer; aliases are for EM, and one claim keeps a single NLI call per sample)."""
    if not isinstance(answer, str):
        golds = coerce_ground_truth(answer)["target"]
        answer = golds[0] if golds else ""
    question = "" if question is None else str(question)
    return template.format(answer=answer.strip(), question=question.strip())


def _clamp_probability(value: Any) -> float:
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, list):
        value = value[0] if len(value) == 1 else 0.0
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 0.0
    if not math.isfinite(value):
        return 0.0
    return min(1.0, max(0.0, value))


def score(response: str, golds: Any, eqr: float, config: EviNoteConfig | None = None) -> dict[str, float]:
    """All reward components for one response (see the module docstring)."""
    config = config or EviNoteConfig()
    golds = coerce_ground_truth(golds)["target"]
    text = policy_text(response)
    summaries = find_blocks(text, "summary")
    fmt = format_ok(response)
    answer = extract_last(text, "answer")
    em = exact_match(answer, golds) if answer is not None else 0.0
    notes = note_taking_ok(summaries, config.markers)
    eqr = _clamp_probability(eqr) if summaries else 0.0

    if fmt and em:
        gate = config.correct_reward
        passed = True
    elif fmt and notes:
        gate = config.note_reward
        passed = True
    else:
        gate = 0.0
        passed = False
        if not fmt:
            logger.debug("evinote: format check failed (needs <answer>, a <summary>, well-formed tags); reward 0")
        else:
            logger.debug("evinote: wrong answer and no annotation in the notes or an unclosed marker; reward 0")
    total = gate + eqr if passed else 0.0
    return {
        "score": float(total),
        "em": float(em),
        "format_ok": float(fmt),
        "notes_ok": float(notes),
        "has_summary": float(bool(summaries)),
        "num_summaries": float(len(summaries)),
        "eqr": float(eqr),
        "gate": float(gate),
    }


def compute_score(
    data_source: Any = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """verl-compatible entry point, keys :data:`RESULT_KEYS`.

    ``extra_info["eqr"]``: the entailment probability computed by the reward
    manager's NLI judge (absent: 0). ``kwargs`` may override any
    :class:`EviNoteConfig` field; other keyword arguments are ignored.
    """
    extra = extra_info if isinstance(extra_info, dict) else {}
    return score(solution_str, ground_truth, extra.get("eqr", 0.0), config_from_kwargs(kwargs))


def config_from_kwargs(kwargs: dict[str, Any]) -> EviNoteConfig:
    """An :class:`EviNoteConfig` from keyword overrides (lists from YAML become tuples)."""
    overrides: dict[str, Any] = {}
    if kwargs.get("markers") is not None:
        markers = kwargs["markers"]
        overrides["markers"] = (markers,) if isinstance(markers, str) else tuple(str(m) for m in markers)
    if kwargs.get("claim_template") is not None:
        overrides["claim_template"] = str(kwargs["claim_template"])
    for name in ("correct_reward", "note_reward"):
        if kwargs.get(name) is not None:
            overrides[name] = float(kwargs[name])
    return EviNoteConfig(**overrides)
