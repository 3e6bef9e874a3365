"""EviNote-RAG reward: Supportive-Evidence Notes gated by format and answer, plus EQR (seed 002).

The multi-turn response interleaves ``<think>``, ``<search>``, system-inserted
``<information>`` blocks, optional ``<summary>`` notes and a final ``<answer>``.

    R = correct_reward + EQR   if format ok and EM(answer, golds) = 1
    R = note_reward + EQR      if format ok, answer wrong, note-taking ok
    R = 0                      otherwise
    (defaults 1.0 and 0.1; EQR in [0, 1], so R is in [0, 2])

The paper's ablations (Tables 2-5) are settings of the same function
(:data:`ABLATIONS`, docs/methods/evinote.md): which tag holds the notes
(``note_tag``: NE writes ``<evidence>``), when a note is required
(``note_policy``: optional for NS/NE, after every retrieval for FS), whether the
wrong-answer branch asks for annotations (``annotations``: SEN only), whether
EQR is added (``eqr``) and FS+SR's stochastic bonus (``stochastic_reward`` with
``stochastic_probability``, drawn from a hash of the seed, question and
response, so a trajectory always draws the same).

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

import hashlib
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
    "ABLATIONS",
    "NOTE_POLICIES",
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
# optional: nothing asks for a note (NS, NE); at_least_one: the paper's format criterion (SEN);
# after_each_retrieval: every <information> is followed by a note before the next search or the answer (FS)
NOTE_POLICIES = ("optional", "at_least_one", "after_each_retrieval")
NOTE_TAGS = ("summary", "evidence")


@dataclass(frozen=True)
class EviNoteConfig:
    """markers: SEN annotation markers (paper: ``*`` key, ``-`` uncertain; the released code used ``*`` and ``#``).
    claim_template: NLI hypothesis, with ``{answer}`` and ``{question}`` fields.
    correct_reward / note_reward: gate values for a correct answer / a wrong answer with good notes.
    note_tag, note_policy, annotations, eqr, stochastic_*: the ablation settings (module docstring).
    """

    markers: tuple[str, ...] = ("*", "-")
    claim_template: str = DEFAULT_CLAIM_TEMPLATE
    correct_reward: float = 1.0
    note_reward: float = 0.1
    note_tag: str = "summary"
    note_policy: str = "at_least_one"
    annotations: bool = True
    eqr: bool = True
    stochastic_reward: float = 0.0
    stochastic_probability: float = 1.0 / 3.0
    stochastic_seed: int = 0

    def __post_init__(self) -> None:
        markers = self.markers
        if isinstance(markers, str):
            markers = (markers,)
        markers = tuple(str(m) for m in markers)
        if not markers or any(not m or m.isspace() or any(ch.isalnum() for ch in m) for m in markers):
            raise ValueError(f"EviNoteConfig.markers must be non-empty strings of punctuation, got {self.markers!r}")
        object.__setattr__(self, "markers", markers)
        for name in ("correct_reward", "note_reward", "stochastic_reward"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ValueError(f"EviNoteConfig.{name} must be a finite number >= 0, got {value!r}")
        p = self.stochastic_probability
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
            raise ValueError(f"EviNoteConfig.stochastic_probability must be in [0, 1], got {p!r}")
        if self.note_tag not in NOTE_TAGS:
            raise ValueError(f"EviNoteConfig.note_tag must be one of {NOTE_TAGS}, got {self.note_tag!r}")
        if self.note_policy not in NOTE_POLICIES:
            raise ValueError(f"EviNoteConfig.note_policy must be one of {NOTE_POLICIES}, got {self.note_policy!r}")
        for name in ("annotations", "eqr"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"EviNoteConfig.{name} must be true or false, got {getattr(self, name)!r}")
        try:
            self.claim_template.format(answer="a", question="q")
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise ValueError(
                "EviNoteConfig.claim_template must use only {answer} and {question}: "
                f"{self.claim_template!r} ({exc})"
            ) from exc

    @property
    def max_score(self) -> float:
        return max(self.correct_reward, self.note_reward + self.stochastic_reward) + (1.0 if self.eqr else 0.0)

    @property
    def protocol_tags(self) -> tuple[str, ...]:
        return ("think", "search", "information", self.note_tag, "answer")


# The paper's ablation rows (EviNote Tables 2-5) as reward settings; the rollout presets of the same names give the
# policy the matching instructions. "sen_eqr" is the method itself (the defaults).
ABLATIONS: dict[str, dict[str, Any]] = {
    "sen_eqr": {},
    "sen": {"eqr": False},
    "naive_summary": {"note_policy": "optional", "annotations": False, "note_reward": 0.0, "eqr": False},
    "naive_evidence": {
        "note_tag": "evidence",
        "note_policy": "optional",
        "annotations": False,
        "note_reward": 0.0,
        "eqr": False,
    },
    "force_summary": {"note_policy": "after_each_retrieval", "annotations": False, "note_reward": 0.0, "eqr": False},
    "force_summary_sr": {
        "note_policy": "after_each_retrieval",
        "annotations": False,
        "note_reward": 0.0,
        "eqr": False,
        "stochastic_reward": 0.1,
    },
    "force_summary_eqr": {"note_policy": "after_each_retrieval", "annotations": False, "note_reward": 0.0},
}


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


def format_ok(response: str, config: EviNoteConfig | None = None) -> bool:
    """An ``<answer>`` block, the notes the note policy asks for, and well-formed protocol tags.

    Well formed: every think/search/note/answer (and information) tag the
    policy wrote is closed by its own tag with no other protocol tag opened or
    closed inside it. Notes asked for (``config.note_policy``): at least one
    (the paper's criterion, the default), none, or one after every retrieval.
    """
    config = config or DEFAULT_CONFIG
    blocks = block_sequence(policy_text(response), config.protocol_tags)
    if blocks is None or "answer" not in blocks:
        return False
    if config.note_policy == "at_least_one":
        return config.note_tag in blocks
    if config.note_policy == "after_each_retrieval":
        return notes_follow_every_retrieval(response, config.note_tag)
    return True


def notes_follow_every_retrieval(response: str, note_tag: str = "summary") -> bool:
    """Force Summary's rule: after each ``<information>`` block a note comes before the next search or answer.

    The retrieved text is emptied first, so tags quoted inside a passage are not read as the policy's.
    """
    if not isinstance(response, str):
        return False
    emptied = _INFORMATION_RE.sub("<information></information>", response)
    blocks = block_sequence(emptied, ("think", "search", "information", note_tag, "answer"))
    if blocks is None:
        return False
    waiting = False  # a retrieval whose note has not come yet
    for block in blocks:
        if block == "information":
            if waiting:
                return False
            waiting = True
        elif block == note_tag:
            waiting = False
        elif block in ("search", "answer") and waiting:
            return False
    return not waiting


def last_summary(response: str, note_tag: str = "summary") -> str:
    """Text of the last complete note (``<summary>`` unless told) the policy wrote ("" if none): the EQR premise."""
    notes = find_blocks(policy_text(response), note_tag)
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


def stochastic_draw(seed: int, question: Any, response: str) -> float:
    """A uniform number in [0, 1) fixed by (seed, question, response): FS+SR's coin, the same on every run."""
    digest = hashlib.sha256(f"{seed}\x1f{question or ''}\x1f{response}".encode("utf-8", "replace")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def score(
    response: str, golds: Any, eqr: float, config: EviNoteConfig | None = None, question: Any = None
) -> dict[str, float]:
    """All reward components for one response (see the module docstring)."""
    config = config or DEFAULT_CONFIG
    golds = coerce_ground_truth(golds)["target"]
    text = policy_text(response)
    summaries = find_blocks(text, config.note_tag)
    fmt = format_ok(response, config)
    answer = extract_last(text, "answer")
    em = exact_match(answer, golds) if answer is not None else 0.0
    notes = note_taking_ok(summaries, config.markers)
    eqr = _clamp_probability(eqr) if summaries and config.eqr else 0.0

    if fmt and em:
        gate = config.correct_reward
        passed = True
    elif fmt and (notes or not config.annotations):
        gate = config.note_reward
        passed = True
        if config.stochastic_reward and stochastic_draw(config.stochastic_seed, question, response) < (
            config.stochastic_probability
        ):
            gate += config.stochastic_reward
    else:
        gate = 0.0
        passed = False
        if not fmt:
            logger.debug(
                "evinote: format check failed (needs <answer>, the %s notes the policy %r asks for, well-formed "
                "tags); reward 0",
                config.note_tag,
                config.note_policy,
            )
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
    config = config_from_kwargs(kwargs)
    return score(solution_str, ground_truth, extra.get("eqr", 0.0), config, extra.get("question"))


def config_from_kwargs(kwargs: dict[str, Any]) -> EviNoteConfig:
    """An :class:`EviNoteConfig` from keyword overrides (lists from YAML become tuples).

    ``ablation``: one of :data:`ABLATIONS` (the paper's ablation rows); explicit fields win over it.
    """
    overrides: dict[str, Any] = {}
    ablation = kwargs.get("ablation")
    if ablation is not None:
        if ablation not in ABLATIONS:
            raise ValueError(f"unknown EviNote ablation {ablation!r}; choose one of {', '.join(ABLATIONS)}")
        overrides.update(ABLATIONS[ablation])
    if kwargs.get("markers") is not None:
        markers = kwargs["markers"]
        overrides["markers"] = (markers,) if isinstance(markers, str) else tuple(str(m) for m in markers)
    if kwargs.get("claim_template") is not None:
        overrides["claim_template"] = str(kwargs["claim_template"])
    for name in ("correct_reward", "note_reward", "stochastic_reward", "stochastic_probability"):
        if kwargs.get(name) is not None:
            overrides[name] = float(kwargs[name])
    for name in ("note_tag", "note_policy"):
        if kwargs.get(name) is not None:
            overrides[name] = str(kwargs[name])
    for name in ("annotations", "eqr"):
        if kwargs.get(name) is not None:
            overrides[name] = kwargs[name]
    if kwargs.get("stochastic_seed") is not None:
        overrides["stochastic_seed"] = int(kwargs["stochastic_seed"])
    return EviNoteConfig(**overrides)


DEFAULT_CONFIG = EviNoteConfig()
