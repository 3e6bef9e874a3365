"""Small reward functions the evaluation's ``composite`` manager combines with the paper rewards.

They follow verl's ``compute_score(data_source, solution_str, ground_truth,
extra_info=None, **kwargs)`` convention, so the composite manager loads them
by ``module:function`` like any user function.
"""

from __future__ import annotations

from typing import Any

from verl_evidence.rewards.text import coerce_ground_truth, extract_last, f1_score, strip_thinking

__all__ = ["answer_f1"]


def answer_f1(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any) -> dict:
    """Unigram F1 of the last ``<answer>`` block against the gold answers (0 without an answer)."""
    answer = extract_last(strip_thinking(solution_str), "answer")
    golds = coerce_ground_truth(ground_truth)["target"]
    return {"score": f1_score(answer, golds) if answer is not None else 0.0}
