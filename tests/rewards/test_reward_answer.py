"""Answer-only rewards (Search-R1 exact match, answer F1)."""

from verl_evidence.rewards.answer import answer_f1, compute_score

GT = {"target": ["Paris", "City of Light"]}


def test_exact_match_reads_the_final_answer_after_thinking() -> None:
    assert compute_score("nq", "<think><answer>Lyon</answer></think><answer> paris. </answer>", GT)["score"] == 1.0
    assert compute_score("nq", "<answer>Lyon</answer>", GT)["score"] == 0.0


def test_no_answer_block_scores_zero() -> None:
    assert compute_score("nq", "Paris", GT) == {"score": 0.0, "em": 0.0, "has_answer": 0.0}
    assert answer_f1("nq", "Paris", GT) == {"score": 0.0}
    assert compute_score("nq", None, GT)["score"] == 0.0  # type: ignore[arg-type]


def test_answer_f1_by_hand() -> None:
    # "the city of lights" -> tokens [city, of, lights] vs [city, of, light]: P = R = 2/3 -> F1 = 2/3
    assert answer_f1("nq", "<answer>the city of lights</answer>", GT)["score"] == 2 / 3
