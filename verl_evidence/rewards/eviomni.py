"""EviOmni / LEAR reward: rational evidence extraction (seeds 000 and 001).

The policy writes ``<reason>r</reason><extract>e</extract><answer>o_f</answer>``.
The rollout additionally generates ``o_r`` (from question, passages and r, with
e masked out) and ``o_e`` (from question and e only) and passes them, with the
token lengths L_r, L_e and L_P, in ``extra_info`` (docs/data-contracts.md).

    R_*^ans  = F1(gold, o_*)                       for * in {r, e, f}
    R^ans    = mean(R_r^ans, R_e^ans, R_f^ans)      (answer_rewards: any non-empty subset, Table 4's rows)
    R_r^len  = sigmoid((L_r/L_e - 1)/tau)  if L_r >= L_e
               sigmoid((1 - L_e/L_r)/tau)  otherwise
    R_e^len  = 1                            if 1 - L_e/L_P >= omega
               max(0, 1 - L_e/L_P)^gamma    otherwise
    R^len    = mean(R_r^len, R_e^len)
    R^fmt    = 1 if exactly one reason, one extract, one answer block, in that order
    R        = l1*R^ans + l2*R^len + l3*R^fmt          (in [0, l1+l2+l3] = [0, 1] by default)

Edge cases (docs/methods/eviomni.md): L_r = 0 or L_e = 0 gives 0 for the length
part that needs it and format 0; L_P <= 0 gives R_e^len = 0 (no reference to be
short against); a clamped base of 0 gives R_e^len = 0 for every gamma; a
missing answer gives F1 = 0.

LEAR (seed 001) is the earlier version of the same method: its reward defaults
are the same numbers (omega 0.9, weights 0.8/0.1/0.1, the same tau and gamma
grids), so ``EviOmniConfig.for_variant("lear")`` equals the EviOmni defaults;
the variant exists so recipes can name the method they reproduce.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any

from verl_evidence.rewards.qa_metrics import f1_score, whitespace_token_count
from verl_evidence.text.ground_truth import coerce_ground_truth
from verl_evidence.text.tags import block_sequence, extract_last, strip_thinking

logger = logging.getLogger(__name__)

__all__ = [
    "RESULT_KEYS",
    "EviOmniConfig",
    "compute_score",
    "config_from_kwargs",
    "evidence_length_reward",
    "format_reward",
    "rationale_length_reward",
    "score",
]

VARIANTS = ("eviomni", "lear")
# The masked-input answers R^ans can average (EviOmni Table 4 / LEAR Table 6 train on each non-empty subset).
ANSWER_REWARDS = ("rationale", "evidence", "full")
FORMAT_TAGS = ("reason", "extract", "answer")

RESULT_KEYS = (
    "score",
    "ans_r",
    "ans_e",
    "ans_f",
    "ans",
    "len_r_reward",
    "len_e_reward",
    "len",
    "format",
    "len_r",
    "len_e",
    "len_p",
)


@dataclass(frozen=True)
class EviOmniConfig:
    """Weights and shape parameters of the EviOmni/LEAR reward.

    l1, l2, l3: weights of the answer, length and format rewards (papers: 0.8, 0.1, 0.1).
    omega: evidence-compression threshold (papers: 0.9).
    tau: rationale-length temperature; papers tune it in {0.1, 0.2, 0.5, 1.0}; shipped 0.5.
    gamma: evidence-length skew; papers tune it in {0.1, 0.3, 0.5, 0.8, 1.0}; shipped 0.5.
    answer_rewards: which of R_r^ans, R_e^ans, R_f^ans R^ans averages (papers: all three; Table 4 ablates it).
    """

    l1: float = 0.8
    l2: float = 0.1
    l3: float = 0.1
    omega: float = 0.9
    tau: float = 0.5
    gamma: float = 0.5
    answer_rewards: tuple[str, ...] = ANSWER_REWARDS

    def __post_init__(self) -> None:
        chosen = self.answer_rewards
        chosen = (chosen,) if isinstance(chosen, str) else tuple(str(name) for name in chosen)
        unknown = [name for name in chosen if name not in ANSWER_REWARDS]
        if not chosen or unknown or len(set(chosen)) != len(chosen):
            raise ValueError(
                f"EviOmniConfig.answer_rewards must be distinct names among {ANSWER_REWARDS}, "
                f"got {self.answer_rewards!r}"
            )
        # stored in the papers' order, so [full, evidence] and [evidence, full] are one setting
        object.__setattr__(self, "answer_rewards", tuple(name for name in ANSWER_REWARDS if name in chosen))
        for name in ("l1", "l2", "l3", "omega", "tau", "gamma"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"EviOmniConfig.{name} must be a finite number, got {value!r}")
        if min(self.l1, self.l2, self.l3) < 0:
            raise ValueError(f"EviOmniConfig weights must be >= 0, got l1={self.l1}, l2={self.l2}, l3={self.l3}")
        if self.tau <= 0:
            raise ValueError(f"EviOmniConfig.tau must be > 0, got {self.tau}")
        if self.gamma < 0:
            raise ValueError(f"EviOmniConfig.gamma must be >= 0, got {self.gamma}")
        if not 0.0 <= self.omega <= 1.0:
            raise ValueError(f"EviOmniConfig.omega must be in [0, 1], got {self.omega}")

    @property
    def max_score(self) -> float:
        return self.l1 + self.l2 + self.l3

    @classmethod
    def for_variant(cls, name: str = "eviomni", **overrides: Any) -> EviOmniConfig:
        """Defaults of ``eviomni`` or ``lear`` (identical numbers, see module docstring), with overrides."""
        key = str(name).strip().lower()
        if key not in VARIANTS:
            raise ValueError(f"unknown EviOmni variant {name!r}; choose one of {', '.join(VARIANTS)}")
        return cls(**overrides)


def _sigmoid(x: float) -> float:
    # Stable for any finite x: never calls exp on a large positive number.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def rationale_length_reward(len_r: int, len_e: int, tau: float) -> float:
    """R_r^len: rewards a rationale that is long relative to the evidence; 0 if either length is 0."""
    if len_r <= 0 or len_e <= 0:
        return 0.0
    if len_r >= len_e:
        return _sigmoid((len_r / len_e - 1.0) / tau)
    return _sigmoid((1.0 - len_e / len_r) / tau)


def evidence_length_reward(len_e: int, len_p: int, omega: float, gamma: float) -> float:
    """R_e^len: 1 when the evidence compresses the passages by at least omega, else (1 - L_e/L_P)^gamma.

    0 when the evidence is empty (L_e = 0), when there are no passages to
    compare with (L_P <= 0), or when the evidence is as long as the passages
    or longer (the base is clamped at 0, and 0 scores 0 for every gamma).
    """
    if len_e <= 0 or len_p <= 0:
        return 0.0
    base = max(0.0, 1.0 - len_e / len_p)
    if base >= omega:
        return 1.0
    if base <= 0.0:
        return 0.0
    return base**gamma


def format_reward(response: str) -> float:
    """1.0 if the response (after any ``</think>``) is exactly reason, extract, answer blocks, in that order.

    The reason and extract blocks must be non-empty (an empty r or e is a
    format failure per the spec). Text outside the blocks is not judged.
    """
    text = strip_thinking(response)
    if block_sequence(text, FORMAT_TAGS) != list(FORMAT_TAGS):
        return 0.0
    if not extract_last(text, "reason") or not extract_last(text, "extract"):
        return 0.0
    return 1.0


def _answer_text(output: Any) -> str:
    """o_r / o_e: their <answer> block if they wrote one, else their stripped text."""
    if output is None:
        return ""
    if not isinstance(output, str):
        output = str(output)
    output = strip_thinking(output)
    block = extract_last(output, "answer")
    return block if block is not None else output.strip()


def score(
    response: str,
    answer_r: str,
    answer_e: str,
    golds: Any,
    len_r: int,
    len_e: int,
    len_p: int,
    config: EviOmniConfig | None = None,
) -> dict[str, float]:
    """All reward components for one response; see the module docstring for the formulas.

    ``answer_r`` / ``answer_e`` are o_r / o_e as generated (their <answer>
    block is used if present); o_f is the response's own last <answer> block.
    """
    config = config or EviOmniConfig()
    golds = coerce_ground_truth(golds)["target"]
    text = strip_thinking(response if isinstance(response, str) else "")
    len_r, len_e, len_p = _as_length(len_r), _as_length(len_e), _as_length(len_p)

    answer_f = extract_last(text, "answer")
    if answer_f is None:
        logger.debug("eviomni: response has no complete <answer> block; R_f^ans = 0")
    ans_r = f1_score(_answer_text(answer_r), golds)
    ans_e = f1_score(_answer_text(answer_e), golds)
    ans_f = f1_score(answer_f, golds) if answer_f is not None else 0.0
    parts = {"rationale": ans_r, "evidence": ans_e, "full": ans_f}
    ans = sum(parts[name] for name in config.answer_rewards) / len(config.answer_rewards)

    len_r_reward = rationale_length_reward(len_r, len_e, config.tau)
    len_e_reward = evidence_length_reward(len_e, len_p, config.omega, config.gamma)
    length = (len_r_reward + len_e_reward) / 2.0

    fmt = format_reward(text)
    if fmt and (len_r == 0 or len_e == 0):
        logger.debug("eviomni: empty rationale or evidence (L_r=%d, L_e=%d); format reward 0", len_r, len_e)
        fmt = 0.0
    elif not fmt:
        logger.debug("eviomni: response is not exactly <reason>, <extract>, <answer> in order; format reward 0")

    total = config.l1 * ans + config.l2 * length + config.l3 * fmt
    return {
        "score": float(total),
        "ans_r": float(ans_r),
        "ans_e": float(ans_e),
        "ans_f": float(ans_f),
        "ans": float(ans),
        "len_r_reward": float(len_r_reward),
        "len_e_reward": float(len_e_reward),
        "len": float(length),
        "format": float(fmt),
        "len_r": float(len_r),
        "len_e": float(len_e),
        "len_p": float(len_p),
    }


def _as_length(value: Any) -> int:
    """A token count from an int-like value; anything unusable (None, NaN, negative, text) is 0."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, float):
        return max(0, int(value)) if math.isfinite(value) else 0
    return 0


def _length_or_fallback(extra: dict, key: str, fallback_text: Any) -> int:
    value = extra.get(key)
    if value is None:
        return whitespace_token_count(fallback_text)
    return _as_length(value)


def compute_score(
    data_source: Any = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """verl-compatible entry point (``reward.custom_reward_function``), keys :data:`RESULT_KEYS`.

    ``extra_info`` keys: ``eviomni_answer_r``, ``eviomni_answer_e`` (o_r, o_e;
    missing means F1 0), ``eviomni_len_r``, ``eviomni_len_e``,
    ``eviomni_len_p`` (policy-tokenizer token counts). A missing length falls
    back to the whitespace-token count of the <reason> / <extract> block, and
    of ``extra_info["passages"]`` (a string or list of strings) for L_P.
    ``kwargs``: ``variant`` (eviomni | lear) and any :class:`EviOmniConfig`
    field; other keyword arguments verl passes are ignored.
    """
    config = config_from_kwargs(kwargs)
    extra = extra_info if isinstance(extra_info, dict) else {}
    if not isinstance(solution_str, str):
        solution_str = "" if solution_str is None else str(solution_str)
    text = strip_thinking(solution_str)
    len_r = _length_or_fallback(extra, "eviomni_len_r", extract_last(text, "reason"))
    len_e = _length_or_fallback(extra, "eviomni_len_e", extract_last(text, "extract"))
    len_p = _length_or_fallback(extra, "eviomni_len_p", extra.get("passages"))
    return score(
        solution_str,
        extra.get("eviomni_answer_r"),
        extra.get("eviomni_answer_e"),
        ground_truth,
        len_r,
        len_e,
        len_p,
        config,
    )


_CONFIG_FIELDS = {f.name for f in dataclasses.fields(EviOmniConfig)}


def config_from_kwargs(kwargs: dict[str, Any]) -> EviOmniConfig:
    """An :class:`EviOmniConfig` from ``variant`` plus field overrides; unrelated keys are ignored."""
    overrides = {k: v for k, v in kwargs.items() if k in _CONFIG_FIELDS and v is not None}
    overrides = {k: (v if k == "answer_rewards" else float(v)) for k, v in overrides.items()}
    if isinstance(overrides.get("answer_rewards"), str):  # one name, or a comma-separated list from a shell
        overrides["answer_rewards"] = tuple(part.strip() for part in overrides["answer_rewards"].split(","))
    return EviOmniConfig.for_variant(kwargs.get("variant") or "eviomni", **overrides)
