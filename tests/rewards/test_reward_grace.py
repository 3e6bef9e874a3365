"""GRACE gated reward: structure check, path gate, content by hand, modes and overrides."""

from __future__ import annotations

import math

import pytest
from rouge_score import rouge_scorer

from verl_evidence.rewards import grace
from verl_evidence.rewards.grace import GRACE_TRAIN, GRACE_VALIDATION, GraceConfig, compute_score, score, structure_ok

SCORER = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)

GOLD = {
    "target": ["Paris"],
    "evidence": ["Paris is the capital and most populous city of France."],
    "answerable": True,
}
EVIDENCE_RESPONSE = (
    "<think>The passages mention it.</think>"
    "<evidence>Paris is the capital of France.</evidence><answer>Paris, France</answer>"
)
LLM_RESPONSE = "<think>Nothing relevant.</think><llm>I recall it is Paris.</llm><answer>Paris</answer>"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<evidence>e</evidence><answer>a</answer>", True),
        ("<llm>k</llm><answer>a</answer>", True),
        ("<answer>a</answer><evidence>e</evidence>", False),  # the path block comes first
        ("<answer>a</answer><llm>k</llm>", False),
        ("Sure. <evidence>e</evidence>\nSo: <answer>a</answer> Done.", True),  # text outside blocks is free
        ("<think>x <answer>draft</answer></think><llm>k</llm><answer>a</answer>", True),  # only after </think>
        ("<evidence>e</evidence><llm>k</llm><answer>a</answer>", False),  # both paths
        ("<answer>a</answer>", False),  # no path
        ("<evidence>e</evidence>", False),  # no answer
        ("<evidence>e</evidence><answer>a</answer><answer>b</answer>", False),  # two answers
        ("<evidence>e</evidence><evidence>f</evidence><answer>a</answer>", False),  # two evidence blocks
        ("<evidence>e<answer>a</answer></evidence>", False),  # nested
        ("<evidence>e</evidence><answer>a", False),  # unclosed
        ("<evidence>e</evidence></evidence><answer>a</answer>", False),  # closed twice
        ("<evidence>e</answer><answer>a</evidence>", False),  # crossed
        ("", False),
    ],
)
def test_structure_ok(text: str, expected: bool) -> None:
    assert structure_ok(text) is expected


def test_defaults() -> None:
    assert GraceConfig(format_reward=0.5, path_reward=1.0, alpha=2.0, beta=3.0) == GRACE_TRAIN
    assert GraceConfig(format_reward=0.5, path_reward=1.0, alpha=1.0, beta=1.0) == GRACE_VALIDATION
    assert GRACE_TRAIN.max_score == 0.5 + 1.0 + 2.0 + 3.0 and GRACE_VALIDATION.max_score == 3.5
    with pytest.raises(ValueError):
        GraceConfig(alpha=-1.0)


def test_gate_by_hand() -> None:
    # invalid structure: 0
    assert score("<answer>Paris</answer>", ["Paris"], GOLD["evidence"], True)["score"] == 0.0
    # valid, wrong path (llm on an answerable sample): 0.5
    result = score(LLM_RESPONSE, ["Paris"], GOLD["evidence"], True)
    assert result["score"] == 0.5 and result["path"] == 0.0 and result["chose_evidence"] == 0.0
    # valid, wrong path (evidence on an unanswerable sample): 0.5
    assert score(EVIDENCE_RESPONSE, ["Paris"], [], False)["score"] == 0.5
    # right llm path: 0.5 + 1, answer not scored even if wrong
    result = score(LLM_RESPONSE.replace("Paris</answer>", "Lyon</answer>"), ["Paris"], [], False)
    assert result["score"] == 1.5 and result["content"] == 0.0 and result["answer_rouge"] == 0.0


def test_content_by_hand() -> None:
    # evidence tokens [pari, is, the, capit, of, franc]
    # vs gold [pari, is, the, capit, and, most, popul, citi, of, franc]
    # LCS = 6, P = 6/6, R = 6/10, F = 2*1*0.6/1.6 = 0.75
    # answer [pari, franc] vs [pari]: LCS 1, P = 1/2, R = 1, F = 2/3
    result = score(EVIDENCE_RESPONSE, ["Paris"], GOLD["evidence"], True, GRACE_TRAIN)
    assert result["evidence_rouge"] == pytest.approx(0.75, abs=1e-12)
    assert result["answer_rouge"] == pytest.approx(2 / 3, abs=1e-12)
    assert result["content"] == pytest.approx(2.0 * 0.75 + 3.0 * 2 / 3, abs=1e-12)
    assert result["score"] == pytest.approx(0.5 + 1.0 + 1.5 + 2.0, abs=1e-12)
    assert result["format"] == 0.5 and result["path"] == 1.0
    assert result["answerable"] == 1.0 and result["chose_evidence"] == 1.0
    # the same numbers from rouge-score directly
    ev = SCORER.score(GOLD["evidence"][0], "Paris is the capital of France.")["rougeL"].fmeasure
    an = SCORER.score("Paris", "Paris, France")["rougeL"].fmeasure
    assert result["score"] == pytest.approx(1.5 + 2 * ev + 3 * an, abs=1e-12)
    # validation weights: 1.5 + 0.75 + 2/3
    result = score(EVIDENCE_RESPONSE, ["Paris"], GOLD["evidence"], True, GRACE_VALIDATION)
    assert result["score"] == pytest.approx(1.5 + 0.75 + 2 / 3, abs=1e-12)


def test_answerable_derived_from_evidence() -> None:
    assert compute_score("x", LLM_RESPONSE, {"target": ["Paris"], "evidence": []})["score"] == 1.5
    assert compute_score("x", LLM_RESPONSE, {"target": ["Paris"]})["answerable"] == 0.0
    derived = compute_score("x", EVIDENCE_RESPONSE, {"target": ["Paris"], "evidence": GOLD["evidence"]})
    assert derived["answerable"] == 1.0 and derived["path"] == 1.0
    # an explicit flag wins over the derivation
    explicit = compute_score("x", EVIDENCE_RESPONSE, {**GOLD, "answerable": False})
    assert explicit["score"] == 0.5


def test_compute_score_modes_and_overrides() -> None:
    train = compute_score("x", EVIDENCE_RESPONSE, GOLD)
    assert train["score"] == pytest.approx(5.0, abs=1e-12)
    val = compute_score("x", EVIDENCE_RESPONSE, GOLD, mode="validation")
    assert val["score"] == pytest.approx(1.5 + 0.75 + 2 / 3, abs=1e-12)
    assert compute_score("x", EVIDENCE_RESPONSE, GOLD, {"validate": True})["score"] == val["score"]
    assert compute_score("x", EVIDENCE_RESPONSE, GOLD, {"validate": False})["score"] == train["score"]
    # an explicit mode wins over extra_info
    assert compute_score("x", EVIDENCE_RESPONSE, GOLD, {"validate": True}, mode="train")["score"] == train["score"]
    custom = compute_score("x", EVIDENCE_RESPONSE, GOLD, alpha=0.0, beta=1.0, format_reward=0.1, path_reward=0.2)
    assert custom["score"] == pytest.approx(0.1 + 0.2 + 2 / 3, abs=1e-12)
    # unknown kwargs that verl passes (e.g. reward_router_address) are ignored
    assert compute_score("x", EVIDENCE_RESPONSE, GOLD, reward_router_address=None)["score"] == train["score"]
    with pytest.raises(ValueError, match="mode"):
        compute_score("x", EVIDENCE_RESPONSE, GOLD, mode="bogus")


def test_compute_score_keys_and_garbage() -> None:
    for response, gt in [
        ("", None),
        (None, "Paris"),
        ("<evidence></evidence><answer></answer>", GOLD),
        ("<llm>" * 10, ["a"]),
        (EVIDENCE_RESPONSE, {"target": [], "evidence": []}),
    ]:
        result = compute_score("x", response, gt)
        assert tuple(result) == grace.RESULT_KEYS
        assert all(isinstance(v, float) and math.isfinite(v) for v in result.values())
        assert 0.0 <= result["score"] <= GRACE_TRAIN.max_score
    # an answerable sample with empty evidence and answer still passes the gate but earns no content
    empty = compute_score("x", "<evidence></evidence><answer></answer>", GOLD)
    assert empty["score"] == 1.5


def test_usable_as_verl_custom_reward_function() -> None:
    # Load it exactly as verl does for reward.custom_reward_function.path=pkg://... name=compute_score,
    # with reward_kwargs merged into the call.
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://verl_evidence.rewards.grace",
                    "name": "compute_score",
                    "reward_kwargs": {"mode": "validation"},
                }
            }
        }
    )
    fn = get_custom_reward_fn(config)
    result = fn(data_source="grace", solution_str=EVIDENCE_RESPONSE, ground_truth=GOLD, extra_info={"index": 0})
    assert tuple(result) == grace.RESULT_KEYS
    assert result["score"] == pytest.approx(1.5 + 0.75 + 2 / 3, abs=1e-12)
