"""Answer-only rewards: the Search-R1 baseline's exact match, and answer F1.

Both score the last ``<answer>`` block (after any ``</think>``) against the gold
answers with SQuAD normalisation; no answer block scores 0. They follow verl's
``compute_score`` convention, so they work as a custom reward function::

    reward.custom_reward_function.path=pkg://verl_evidence.rewards.answer
    reward.custom_reward_function.name=compute_score      # exact match (Search-R1)
    reward.custom_reward_function.name=answer_f1          # unigram F1

and as components of the ``composite`` manager
(``verl_evidence.rewards.answer:answer_f1``).
"""

from __future__ import annotations

from typing import Any

from verl_evidence.rewards.qa_metrics import exact_match, f1_score
from verl_evidence.text.ground_truth import coerce_ground_truth
from verl_evidence.text.tags import extract_last, strip_thinking

__all__ = ["answer_f1", "compute_score", "final_answer"]


def final_answer(solution_str: Any) -> str | None:
    """The last ``<answer>`` block after any thinking, or None."""
    return extract_last(strip_thinking(solution_str if isinstance(solution_str, str) else ""), "answer")


def compute_score(
    data_source: Any = None, solution_str: str = "", ground_truth: Any = None, extra_info: Any = None, **_: Any
) -> dict[str, float]:
    """Exact match of the final answer (the Search-R1 outcome reward)."""
    answer = final_answer(solution_str)
    em = exact_match(answer, coerce_ground_truth(ground_truth)["target"]) if answer is not None else 0.0
    return {"score": float(em), "em": float(em), "has_answer": float(answer is not None)}


def answer_f1(
    data_source: Any = None, solution_str: str = "", ground_truth: Any = None, extra_info: Any = None, **_: Any
) -> dict[str, float]:
    """Unigram F1 of the final answer against the gold answers."""
    answer = final_answer(solution_str)
    f1 = f1_score(answer, coerce_ground_truth(ground_truth)["target"]) if answer is not None else 0.0
    return {"score": float(f1)}
