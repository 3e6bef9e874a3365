"""GRACE reward: gated reward for grounded answers and abstention (seed 004).

After the last ``</think>`` the model writes EITHER ``<evidence>quoted
sentences</evidence>`` (context sufficient) OR ``<llm>own recall</llm>``
(insufficient), and ``<answer>...</answer>``. The reward is gated, stopping at
the first failure:

    structure invalid                         -> 0
    valid, wrong path                         -> format_reward                       (0.5)
    valid, right <llm> path (unanswerable)    -> format_reward + path_reward         (1.5)
    valid, right <evidence> path (answerable) -> format_reward + path_reward
                                                 + alpha * ROUGE-L(evidence, gold evidence)
                                                 + beta  * ROUGE-L(answer, gold answers)

so the score is in [0, format_reward + path_reward + alpha + beta] (6.5 for
training defaults, 3.5 for validation). ROUGE-L is F1 with Porter stemming,
max over references, identical to rouge-score (``text.rouge_l``).

Which strings are the evidence references: a row whose ``extra_info.evidence_sentences``
is true lists the supporting sentences of ONE evidence (HotpotQA's supporting facts, one
per hop). With ``evidence_reference="joined"`` (the default, as the authors' released
code scores HotpotQA) they are one reference, joined by a space in their order, so
quoting one hop of a two-hop answer earns less than quoting both;
``evidence_reference="per_sentence"`` makes each sentence a reference of its own and
takes the best. Other rows' strings are alternatives (QASPER's annotated pieces, the
answer-bearing sentences of answers-only data): the best of them counts in both settings.

Use it directly in verl::

    reward.custom_reward_function.path=pkg://verl_evidence.rewards.grace
    reward.custom_reward_function.name=compute_score
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from verl_evidence.rewards.rouge import rouge_l
from verl_evidence.text.ground_truth import coerce_ground_truth, parse_bool
from verl_evidence.text.tags import block_sequence, extract_last, strip_thinking

logger = logging.getLogger(__name__)

__all__ = [
    "EVIDENCE_REFERENCES",
    "GRACE_TRAIN",
    "GRACE_VALIDATION",
    "RESULT_KEYS",
    "GraceConfig",
    "compute_score",
    "config_from_kwargs",
    "score",
    "structure_ok",
]

GRACE_TAGS = ("answer", "evidence", "llm")
RESULT_KEYS = ("score", "format", "path", "content", "evidence_rouge", "answer_rouge", "answerable", "chose_evidence")
# How a row's supporting sentences (extra_info.evidence_sentences) are scored: one joined reference (the released
# code's HotpotQA scoring) or each its own reference, the best counting.
JOINED, PER_SENTENCE = "joined", "per_sentence"
EVIDENCE_REFERENCES = (JOINED, PER_SENTENCE)
SENTENCES_KEY = "evidence_sentences"


@dataclass(frozen=True)
class GraceConfig:
    """format_reward: for a valid structure; path_reward: for the right path;
    alpha / beta: weights of ROUGE-L on evidence / answer; evidence_reference:
    how a row's supporting sentences are scored (``joined`` | ``per_sentence``).

    Where each default comes from: format_reward = 0.5 and path_reward = 1 are
    the paper's (§3.2, eq. 1). The paper gives no number for alpha or beta;
    alpha = 2, beta = 3 (training) and alpha = beta = 1 (validation) are the
    authors' released code's settings, and so is ``joined`` (its HotpotQA
    reference is ``" ".join`` of the supporting sentences; the paper only says
    that the best score over several references counts)."""

    format_reward: float = 0.5
    path_reward: float = 1.0
    alpha: float = 2.0
    beta: float = 3.0
    evidence_reference: str = JOINED

    def __post_init__(self) -> None:
        if self.evidence_reference not in EVIDENCE_REFERENCES:
            raise ValueError(
                f"GraceConfig.evidence_reference must be one of {', '.join(EVIDENCE_REFERENCES)}, "
                f"got {self.evidence_reference!r}"
            )
        for name in ("format_reward", "path_reward", "alpha", "beta"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ValueError(f"GraceConfig.{name} must be a finite number >= 0, got {value!r}")

    @property
    def max_score(self) -> float:
        return self.format_reward + self.path_reward + self.alpha + self.beta


GRACE_TRAIN = GraceConfig()
GRACE_VALIDATION = GraceConfig(alpha=1.0, beta=1.0)
MODES = {"train": GRACE_TRAIN, "training": GRACE_TRAIN, "validation": GRACE_VALIDATION, "val": GRACE_VALIDATION}


def structure_ok(text: str) -> bool:
    """Valid GRACE structure after the last ``</think>``.

    Exactly one ``<evidence>`` or ``<llm>`` block (never both) followed by
    exactly one ``<answer>`` block; each tag opened and closed exactly once,
    no block inside another, no stray tag. The order (path, then answer) is the
    paper's "followed by an independent <answer> block"; text outside the
    blocks is not judged.
    """
    return block_sequence(strip_thinking(text), GRACE_TAGS) in _VALID_SEQUENCES


_VALID_SEQUENCES = (["evidence", "answer"], ["llm", "answer"])


def _zero(answerable: bool) -> dict[str, float]:
    return {
        "score": 0.0,
        "format": 0.0,
        "path": 0.0,
        "content": 0.0,
        "evidence_rouge": 0.0,
        "answer_rouge": 0.0,
        "answerable": float(answerable),
        "chose_evidence": 0.0,
    }


def evidence_references(gold_evidence: list[str], sentences: bool, how: str = JOINED) -> list[str]:
    """The references an ``<evidence>`` block is scored against.

    ``sentences``: ``gold_evidence`` lists the supporting sentences of one evidence; under ``joined`` they
    become one reference, joined by a space in their order. Otherwise every string is a reference.
    """
    if sentences and how == JOINED and len(gold_evidence) > 1:
        return [" ".join(text.strip() for text in gold_evidence)]
    return list(gold_evidence)


def score(
    response: str,
    gold_answers: Any,
    gold_evidence: Any,
    answerable: bool | None,
    config: GraceConfig | None = None,
    evidence_sentences: bool = False,
) -> dict[str, float]:
    """All reward components for one response. ``answerable=None``: answerable iff gold evidence is non-empty.

    ``evidence_sentences``: ``gold_evidence`` lists one evidence's supporting sentences (scored as
    ``config.evidence_reference`` says), not alternative references.
    """
    config = config or GRACE_TRAIN
    answers = coerce_ground_truth(gold_answers)["target"]
    evidence_refs = coerce_ground_truth(gold_evidence)["target"]
    if answerable is None:
        answerable = bool(evidence_refs)
    answerable = bool(answerable)

    text = strip_thinking(response if isinstance(response, str) else "")
    if not structure_ok(text):
        logger.debug("grace: invalid structure (needs one <evidence> or <llm> block, then one <answer>); reward 0")
        return _zero(answerable)

    evidence = extract_last(text, "evidence")
    chose_evidence = evidence is not None
    result = _zero(answerable)
    result["format"] = float(config.format_reward)
    result["chose_evidence"] = float(chose_evidence)
    if chose_evidence != answerable:
        logger.debug("grace: wrong path (chose %s, answerable=%s)", "evidence" if chose_evidence else "llm", answerable)
        result["score"] = float(config.format_reward)
        return result

    result["path"] = float(config.path_reward)
    if chose_evidence:
        answer = extract_last(text, "answer") or ""
        references = evidence_references(evidence_refs, evidence_sentences, config.evidence_reference)
        result["evidence_rouge"] = float(rouge_l(evidence, references))
        result["answer_rouge"] = float(rouge_l(answer, answers))
        result["content"] = float(config.alpha * result["evidence_rouge"] + config.beta * result["answer_rouge"])
    result["score"] = float(result["format"] + result["path"] + result["content"])
    return result


# Keyword overrides per mode. alpha/beta (2, 3: the authors' released training code; the paper states no values) are
# training weights: a preset passing them must not also change validation, which that code scores with
# alpha = beta = 1 (``validation_alpha``/``_beta`` change it).
SHARED_FIELDS = ("format_reward", "path_reward")
TEXT_FIELDS = ("evidence_reference",)  # a word, the same in both modes
MODE_FIELDS = {
    "train": {"alpha": "alpha", "beta": "beta"},
    "validation": {"validation_alpha": "alpha", "validation_beta": "beta"},
}


def config_from_kwargs(kwargs: dict[str, Any], extra_info: dict | None = None) -> GraceConfig:
    """Mode defaults (``mode`` kwarg, else ``extra_info["validate"]``, else train) plus that mode's overrides.

    ``format_reward`` / ``path_reward`` / ``evidence_reference`` apply in both modes; ``alpha`` / ``beta`` only
    in training, and ``validation_alpha`` / ``validation_beta`` only in validation.
    """
    mode = kwargs.get("mode")
    if mode is None:
        mode = "validation" if extra_info and parse_bool(extra_info.get("validate")) else "train"
    key = str(mode).strip().lower()
    if key not in MODES:
        raise ValueError(f"unknown GRACE mode {mode!r}; choose train or validation")
    base = MODES[key]
    names = {name: name for name in SHARED_FIELDS}
    names.update(MODE_FIELDS["validation" if base is GRACE_VALIDATION else "train"])
    overrides: dict[str, Any] = {
        field: float(kwargs[name]) for name, field in names.items() if kwargs.get(name) is not None
    }
    overrides.update({name: str(kwargs[name]) for name in TEXT_FIELDS if kwargs.get(name) is not None})
    if not overrides:
        return base
    return GraceConfig(**{**base.__dict__, **overrides})


def compute_score(
    data_source: Any = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """verl-compatible entry point, keys :data:`RESULT_KEYS`.

    ``ground_truth``: ``{"target": [...], "evidence": [...], "answerable": bool}``
    (``answerable`` absent: derived from ``evidence`` being non-empty); a truthy
    ``extra_info["evidence_sentences"]`` says ``evidence`` lists one evidence's
    supporting sentences (``verl-evidence data grace`` writes it for HotpotQA and the
    bundled set).
    ``kwargs``: ``mode`` = train | validation, ``format_reward`` / ``path_reward``
    overrides, ``evidence_reference`` = joined | per_sentence, ``alpha`` / ``beta``
    (training only) and ``validation_alpha`` / ``validation_beta`` (validation only). verl 0.9.1 does not tell a
    custom reward function whether it is validating (the flag stays in the
    batch's ``meta_info``); a truthy ``extra_info["validate"]``, if a reward
    manager or dataset puts one there, selects the validation defaults.
    """
    extra = extra_info if isinstance(extra_info, dict) else None
    config = config_from_kwargs(kwargs, extra)
    gt = coerce_ground_truth(ground_truth)
    sentences = bool(parse_bool(extra.get(SENTENCES_KEY))) if extra else False
    return score(solution_str, gt["target"], gt["evidence"], gt["answerable"], config, sentences)
