"""What one training step's rollouts did, as verl metrics: reward components, rollout behaviour, masking.

Pure core (numpy only): a step's trajectories in, a flat ``{metric name: float}``
out, which verl's trainer logs beside its own (console, wandb, tensorboard, its
file logger). :mod:`verl_evidence.trainer.step_sampler` feeds it every training step.

- ``reward/<reward>/<component>/mean``: each numeric key of the reward manager's
  ``reward_extra_info`` (``score``, the method's components, ``reward_error``;
  the composite's ``<part>.<key>`` and ``<part>.weight``), averaged over the
  step's trajectories. verl 0.9.1 itself logs these for validation only.
- ``rollout/...``: searches per trajectory, note rate, answer rate, termination
  reasons, failed searches and retrievals, read from the agent loop's ``extra_fields``.
- ``masking/...``: the share of response tokens that came from retrieval
  (``retrieved_spans`` of the search loop) or from the knowledge-masked answers
  (``masked_answer_spans`` of the EviOmni loop), and how many of them carry
  loss mask 1 — which must be 0: :func:`check_masking` raises otherwise.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "MaskingError",
    "Trajectory",
    "check_masking",
    "masking_metrics",
    "reward_label",
    "reward_metrics",
    "rollout_metrics",
    "step_metrics",
]

REWARD_PREFIX = "reward"
ROLLOUT_PREFIX = "rollout"
MASKING_PREFIX = "masking"
# The loops' statistics that the reward managers also copy into reward_extra_info (for validation's val-aux/...):
# logged once, under rollout/ (the managers import this tuple).
ROLLOUT_STATS = (
    "num_searches",
    "summary_count",
    "context_tokens",
    "raw_context_tokens",
    "compression_ratio",
    "invalid_actions",
    "search_errors",
    "extractor_failures",
    "retrieval_failed",
)
# verl's own reward managers: with one of them the reward is named after its custom scoring function's module
VERL_MANAGERS = frozenset({"naive", "dapo", "gdpo", "rate_limited", "remote", "prime", "batch"})
# response positions (half-open [start, end) spans) that a loop reports as not the policy's own
SPAN_FIELDS = {"retrieved": "retrieved_spans", "masked_answer": "masked_answer_spans"}


class MaskingError(RuntimeError):
    """Response tokens that came from retrieval (or a masked-input answer) would be trained on."""


@dataclass
class Trajectory:
    """One trajectory of the step: the loop's ``extra_fields`` and the masks verl trains with."""

    extra_fields: Mapping[str, Any]
    response_mask: Sequence[int]
    loss_mask: Sequence[int] | None = None
    key: str = ""  # verl's ``{uid}_{session}_{index}``, named in errors
    reward_extra_info: Mapping[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        info = self.extra_fields.get("reward_extra_info") if isinstance(self.extra_fields, Mapping) else None
        self.reward_extra_info = info if isinstance(info, Mapping) else {}


def reward_label(manager: str | None, function_path: str | None = None) -> str:
    """The ``<reward>`` of ``reward/<reward>/...``: the manager's name, or for verl's own managers
    (``dapo`` scoring with ``pkg://verl_evidence.rewards.grace``) the scoring function's module."""
    manager = str(manager or "").strip()
    function_path = str(function_path or "").strip()
    if function_path and (not manager or manager in VERL_MANAGERS):
        module = function_path.split("://", 1)[-1].rsplit(":", 1)[0]
        module = module.removesuffix(".py")
        return module.replace("/", ".").rsplit(".", 1)[-1] or manager or REWARD_PREFIX
    return manager or REWARD_PREFIX


def _number(value: Any) -> float | None:
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    if isinstance(value, (int, float, np.integer, np.floating)):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return float(np.mean(values)) if values else 0.0


def reward_metrics(trajectories: Sequence[Trajectory], label: str) -> dict[str, float]:
    """``reward/<label>/<key>/mean`` over the trajectories whose ``reward_extra_info`` has a number at ``key``."""
    values: dict[str, list[float]] = {}
    for trajectory in trajectories:
        for key, value in trajectory.reward_extra_info.items():
            number = _number(value)
            if number is not None and key not in ROLLOUT_STATS:
                values.setdefault(key, []).append(number)
    return {f"{REWARD_PREFIX}/{label}/{key}/mean": _mean(numbers) for key, numbers in values.items()}


def _stat(trajectory: Trajectory, key: str) -> float | None:
    return _number(trajectory.extra_fields.get(key))


def rollout_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """The rollout's behaviour, for the trajectories whose loop reports it (verl's own loops report none of it)."""
    metrics: dict[str, float] = {}

    def mean_of(name: str, key: str, transform=lambda x: x) -> None:
        numbers = [transform(v) for v in (_stat(t, key) for t in trajectories) if v is not None]
        if numbers:
            metrics[f"{ROLLOUT_PREFIX}/{name}"] = _mean(numbers)

    mean_of("searches/mean", "num_searches")
    mean_of("note_rate", "summary_count", lambda n: float(n > 0))
    mean_of("notes/mean", "summary_count")
    mean_of("search_errors/mean", "search_errors")
    mean_of("search_error_rate", "search_errors", lambda n: float(n > 0))
    mean_of("retrieval_failed_rate", "retrieval_failed", lambda n: float(n > 0))
    mean_of("invalid_actions/mean", "invalid_actions")
    mean_of("extractor_failures/mean", "extractor_failures")
    mean_of("compression_ratio/mean", "compression_ratio")
    reasons = [t.extra_fields.get("termination") for t in trajectories]
    reasons = [str(r) for r in reasons if isinstance(r, str) and r]
    if reasons:
        counts = Counter(reasons)
        metrics[f"{ROLLOUT_PREFIX}/answer_rate"] = counts.get("answer", 0) / len(reasons)
        for reason, count in counts.items():
            metrics[f"{ROLLOUT_PREFIX}/termination/{reason}"] = count / len(reasons)
    return metrics


def _spans(trajectory: Trajectory, name: str) -> list[tuple[int, int]] | None:
    raw = trajectory.extra_fields.get(name)
    if raw is None:
        return None
    if hasattr(raw, "tolist"):
        raw = raw.tolist()
    return [(int(start), int(end)) for start, end in raw]


def _positions(spans: Sequence[tuple[int, int]], length: int) -> np.ndarray:
    """Response positions inside ``spans`` (cut at the response's length: verl keeps ``response_length`` tokens)."""
    chosen = np.zeros(length, dtype=bool)
    for start, end in spans:
        chosen[max(0, start) : min(length, end)] = True
    return chosen


def masking_metrics(trajectories: Sequence[Trajectory]) -> tuple[dict[str, float], list[str]]:
    """Token shares and trained counts per span kind, and one line per trajectory that trains such tokens."""
    total = sum(len(t.response_mask) for t in trajectories)
    metrics: dict[str, float] = {f"{MASKING_PREFIX}/response_tokens": float(total)}
    if total:
        context = sum(int((np.asarray(t.response_mask) == 0).sum()) for t in trajectories)
        metrics[f"{MASKING_PREFIX}/context_token_share"] = context / total
    problems: list[str] = []
    for kind, span_field in SPAN_FIELDS.items():
        reported = [(t, _spans(t, span_field)) for t in trajectories]
        if all(spans is None for _, spans in reported):
            continue
        tokens = trained = 0
        for trajectory, spans in reported:
            if not spans:
                continue
            masks = [np.asarray(trajectory.response_mask)]
            if trajectory.loss_mask is not None:
                masks.append(np.asarray(trajectory.loss_mask))
            chosen = _positions(spans, len(masks[0]))
            trained_here = np.zeros_like(chosen)
            for mask in masks:
                trained_here |= chosen & (mask[: len(chosen)] != 0)
            tokens += int(chosen.sum())
            trained += int(trained_here.sum())
            if trained_here.any():
                where = np.flatnonzero(trained_here)
                problems.append(
                    f"{trajectory.key or 'a trajectory'}: {int(trained_here.sum())} {kind} token(s) with loss mask 1 "
                    f"(response positions {where[:8].tolist()}{' ...' if len(where) > 8 else ''})"
                )
        metrics[f"{MASKING_PREFIX}/{kind}_token_share"] = tokens / total if total else 0.0
        metrics[f"{MASKING_PREFIX}/{kind}_tokens_trained"] = float(trained)
    return metrics, problems


def check_masking(problems: Sequence[str]) -> None:
    """Raise :class:`MaskingError` naming the trajectories that would train retrieved or masked-answer tokens."""
    if problems:
        shown = "\n  ".join(problems[:10])
        more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise MaskingError(
            f"{len(problems)} trajectory(ies) of this step would train on tokens the policy did not write "
            f"(their response_mask/loss_mask must be 0):\n  {shown}{more}\n"
            "The agent loop's masking is broken. The check runs before the update, so nothing was trained on them; "
            "it can be switched off with trainer.v1.sampler.sampler_kwargs.mask_check=false (docs/training-metrics.md)."
        )


def step_metrics(trajectories: Sequence[Trajectory], label: str, mask_check: bool = True) -> dict[str, float]:
    """Every metric of one training step; with ``mask_check`` a trained retrieved token raises :class:`MaskingError`."""
    metrics = reward_metrics(trajectories, label)
    metrics.update(rollout_metrics(trajectories))
    masking, problems = masking_metrics(trajectories)
    metrics.update(masking)
    if mask_check:
        check_masking(problems)
    return metrics
