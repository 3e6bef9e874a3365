"""EviOmni / LEAR reward: golden values worked by hand from the spec formulas, and every edge case."""

from __future__ import annotations

import math

import pytest

from verl_evidence.rewards import eviomni
from verl_evidence.rewards.eviomni import (
    EviOmniConfig,
    compute_score,
    evidence_length_reward,
    format_reward,
    rationale_length_reward,
    score,
)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


GOOD = (
    "<reason>The question asks for the capital. Passage 2 states that Paris is the capital of France.</reason>"
    "<extract>Paris is the capital of France.</extract>"
    "<answer>Paris</answer>"
)


def test_defaults_and_variants() -> None:
    cfg = EviOmniConfig()
    assert (cfg.l1, cfg.l2, cfg.l3, cfg.omega, cfg.tau, cfg.gamma) == (0.8, 0.1, 0.1, 0.9, 0.5, 0.5)
    # the two papers ship the same reward numbers: LEAR is the same config
    assert EviOmniConfig.for_variant("lear") == EviOmniConfig.for_variant("eviomni") == cfg
    assert EviOmniConfig.for_variant("LEAR", tau=0.2).tau == 0.2
    with pytest.raises(ValueError, match="variant"):
        EviOmniConfig.for_variant("nope")
    for bad in ({"tau": 0.0}, {"gamma": -1.0}, {"omega": 1.5}, {"l1": -0.1}, {"tau": float("nan")}):
        with pytest.raises(ValueError):
            EviOmniConfig(**bad)


def test_rationale_length_reward_by_hand() -> None:
    # L_r >= L_e: sigmoid((L_r/L_e - 1)/tau) = sigmoid((10/5 - 1)/0.5) = sigmoid(2)
    assert rationale_length_reward(10, 5, 0.5) == pytest.approx(1 / (1 + math.exp(-2.0)), abs=1e-12)
    assert rationale_length_reward(10, 5, 0.5) == pytest.approx(0.8807970779778823, abs=1e-12)
    # L_r < L_e: sigmoid((1 - L_e/L_r)/tau) = sigmoid((1 - 8/4)/0.5) = sigmoid(-2)
    assert rationale_length_reward(4, 8, 0.5) == pytest.approx(0.11920292202211755, abs=1e-12)
    # equal lengths: sigmoid(0) = 0.5 for every tau
    assert rationale_length_reward(7, 7, 0.1) == 0.5
    # tau = 1: sigmoid(30/10 - 1) = sigmoid(2)
    assert rationale_length_reward(30, 10, 1.0) == pytest.approx(sigmoid(2.0), abs=1e-12)
    # empty parts give 0
    assert rationale_length_reward(0, 5, 0.5) == 0.0
    assert rationale_length_reward(5, 0, 0.5) == 0.0
    # extreme ratios stay finite and inside [0, 1] (no overflow in exp)
    assert rationale_length_reward(1, 10**9, 0.1) == pytest.approx(0.0, abs=1e-300)
    assert rationale_length_reward(10**9, 1, 0.1) == 1.0


def test_evidence_length_reward_by_hand() -> None:
    # 1 - 10/200 = 0.95 >= omega 0.9 -> 1
    assert evidence_length_reward(10, 200, 0.9, 0.5) == 1.0
    # exactly at the threshold: 1 - 20/200 = 0.9 >= 0.9 -> 1
    assert evidence_length_reward(20, 200, 0.9, 0.5) == 1.0
    # below: (1 - 50/100)^0.5 = sqrt(0.5)
    assert evidence_length_reward(50, 100, 0.9, 0.5) == pytest.approx(math.sqrt(0.5), abs=1e-12)
    # gamma 1: linear; 1 - 30/100 = 0.7
    assert evidence_length_reward(30, 100, 0.9, 1.0) == pytest.approx(0.7, abs=1e-12)
    # L_e > L_P: base clamped at 0 -> 0 (also for gamma 0, where 0**0 would be 1)
    assert evidence_length_reward(150, 100, 0.9, 0.5) == 0.0
    assert evidence_length_reward(150, 100, 0.9, 0.0) == 0.0
    assert evidence_length_reward(100, 100, 0.9, 0.5) == 0.0
    # empty evidence or no passages -> 0
    assert evidence_length_reward(0, 100, 0.9, 0.5) == 0.0
    assert evidence_length_reward(10, 0, 0.9, 0.5) == 0.0


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (GOOD, 1.0),
        ("<think>plan</think>" + GOOD, 1.0),  # thinking before the blocks is allowed
        ("<extract>e</extract><reason>r</reason><answer>a</answer>", 0.0),  # wrong order
        ("<reason>r</reason><answer>a</answer>", 0.0),  # missing extract
        ("<reason>r</reason><extract>e</extract><answer>a</answer><answer>b</answer>", 0.0),  # two answers
        ("<reason>r</reason><reason>r</reason><extract>e</extract><answer>a</answer>", 0.0),
        ("<reason>r<extract>e</extract></reason><answer>a</answer>", 0.0),  # nested
        ("<reason>r</reason><extract>e</extract><answer>a", 0.0),  # unclosed
        ("<reason> </reason><extract>e</extract><answer>a</answer>", 0.0),  # empty rationale
        ("<reason>r</reason><extract></extract><answer>a</answer>", 0.0),  # empty evidence
        ("", 0.0),
    ],
)
def test_format_reward(response: str, expected: float) -> None:
    assert format_reward(response) == expected


def test_score_golden_value() -> None:
    # o_r answers "Paris France" (F1 vs "Paris": P=1/2, R=1 -> 2/3), o_e "Paris" (1), o_f "Paris" (1)
    result = score(GOOD, "<answer>Paris France</answer>", "Paris", ["Paris"], 40, 10, 500, EviOmniConfig())
    ans = (2 / 3 + 1 + 1) / 3
    len_r = sigmoid((40 / 10 - 1) / 0.5)  # sigmoid(6)
    len_e = 1.0  # 1 - 10/500 = 0.98 >= 0.9
    expected = 0.8 * ans + 0.1 * (len_r + len_e) / 2 + 0.1 * 1.0
    assert result["ans_r"] == pytest.approx(2 / 3, abs=1e-12)
    assert result["ans_e"] == 1.0 and result["ans_f"] == 1.0
    assert result["ans"] == pytest.approx(ans, abs=1e-12)
    assert result["len_r_reward"] == pytest.approx(len_r, abs=1e-12)
    assert result["len_e_reward"] == 1.0
    assert result["len"] == pytest.approx((len_r + len_e) / 2, abs=1e-12)
    assert result["format"] == 1.0
    assert result["score"] == pytest.approx(expected, abs=1e-12)
    assert (result["len_r"], result["len_e"], result["len_p"]) == (40.0, 10.0, 500.0)


def test_score_second_golden_value_with_custom_config() -> None:
    cfg = EviOmniConfig(l1=0.6, l2=0.3, l3=0.1, omega=0.8, tau=0.2, gamma=0.3)
    # L_r < L_e: sigmoid((1 - 60/30)/0.2) = sigmoid(-5); 1 - 60/100 = 0.4 < 0.8 -> 0.4^0.3
    result = score(GOOD, "Lyon", None, ["Paris"], 30, 60, 100, cfg)
    len_r = sigmoid(-5.0)
    len_e = 0.4**0.3
    ans = (0.0 + 0.0 + 1.0) / 3
    assert result["score"] == pytest.approx(0.6 * ans + 0.3 * (len_r + len_e) / 2 + 0.1 * 1.0, abs=1e-12)


def test_missing_answers_score_zero_f1() -> None:
    no_answer = "<reason>because</reason><extract>Paris is the capital.</extract>"
    result = score(no_answer, None, "", ["Paris"], 5, 5, 100, EviOmniConfig())
    assert result["ans_f"] == 0.0 and result["ans_r"] == 0.0 and result["ans_e"] == 0.0
    assert result["format"] == 0.0
    # only the length part is left: 0.1 * (sigmoid(0) + 1) / 2
    assert result["score"] == pytest.approx(0.1 * (0.5 + 1.0) / 2, abs=1e-12)


def test_zero_lengths_zero_that_part_and_format() -> None:
    # the text looks fine but the tokenizer says the evidence is empty: its length part and format are 0
    result = score(GOOD, "Paris", "Paris", ["Paris"], 12, 0, 100, EviOmniConfig())
    assert result["len_r_reward"] == 0.0 and result["len_e_reward"] == 0.0
    assert result["format"] == 0.0
    assert result["score"] == pytest.approx(0.8 * 1.0, abs=1e-12)
    result = score(GOOD, "Paris", "Paris", ["Paris"], 0, 5, 100, EviOmniConfig())
    assert result["len_r_reward"] == 0.0 and result["len_e_reward"] == 1.0 and result["format"] == 0.0


def test_compute_score_reads_extra_info() -> None:
    extra = {
        "eviomni_answer_r": "It is <answer>Paris</answer>",
        "eviomni_answer_e": "Paris",
        "eviomni_len_r": 20,
        "eviomni_len_e": 10,
        "eviomni_len_p": 1000,
    }
    result = compute_score("nq", GOOD, {"target": ["Paris"]}, extra)
    expected = 0.8 * 1.0 + 0.1 * (sigmoid(2.0) + 1.0) / 2 + 0.1
    assert result["score"] == pytest.approx(expected, abs=1e-12)
    assert tuple(result) == eviomni.RESULT_KEYS
    # kwargs override config fields; variant is accepted
    result_tau = compute_score("nq", GOOD, {"target": ["Paris"]}, extra, tau=1.0, variant="lear")
    assert result_tau["len_r_reward"] == pytest.approx(sigmoid(1.0), abs=1e-12)


def test_compute_score_length_fallbacks() -> None:
    # reason has 16 whitespace tokens, extract 6, passages 2 strings with 5 + 3 = 8 tokens
    extra = {"eviomni_answer_r": "Paris", "eviomni_answer_e": "Paris", "passages": ["a b c d e", "f g h"]}
    result = compute_score("nq", GOOD, "Paris", extra)
    assert result["len_r"] == 16.0 and result["len_e"] == 6.0 and result["len_p"] == 8.0
    assert result["len_r_reward"] == pytest.approx(sigmoid((16 / 6 - 1) / 0.5), abs=1e-12)
    # 1 - 6/8 = 0.25 < 0.9 -> 0.25^0.5 = 0.5
    assert result["len_e_reward"] == pytest.approx(0.5, abs=1e-12)
    # no passages at all: L_P = 0 -> evidence length reward 0
    assert compute_score("nq", GOOD, "Paris", {})["len_e_reward"] == 0.0


def test_compute_score_same_keys_for_garbage() -> None:
    for response, gt, extra in [
        ("", None, None),
        ("<answer>", {"target": []}, {"eviomni_len_r": "ten"}),
        (None, 42, {"eviomni_len_e": float("nan"), "eviomni_len_p": -3}),
        ("<reason>r</reason>" * 3, ["x"], "not a dict"),
    ]:
        result = compute_score("nq", response, gt, extra)
        assert tuple(result) == eviomni.RESULT_KEYS
        assert all(isinstance(v, float) and math.isfinite(v) for v in result.values())
        assert 0.0 <= result["score"] <= 1.0
