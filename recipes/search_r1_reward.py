"""Exact-match reward of the Search-R1 baseline, as a verl ``compute_score``.

Used by ``search_r1_baseline.sh`` through
``reward.custom_reward_function.path=<this file>``: 1.0 when the last
``<answer>`` block matches a gold answer after SQuAD normalisation, else 0.0
(no answer block: 0.0). Built from the project's shared text utilities.
"""

from __future__ import annotations

from typing import Any

from verl_evidence.rewards.text import coerce_ground_truth, exact_match, extract_last, strip_thinking


def compute_score(
    data_source: Any = None, solution_str: str = "", ground_truth: Any = None, extra_info: dict | None = None, **_: Any
) -> dict[str, float]:
    answer = extract_last(strip_thinking(solution_str or ""), "answer")
    targets = coerce_ground_truth(ground_truth)["target"]
    em = exact_match(answer, targets) if answer is not None else 0.0
    return {"score": float(em), "em": float(em), "has_answer": float(answer is not None)}
