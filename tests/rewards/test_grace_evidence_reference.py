"""GRACE's evidence reference for multi-hop questions: the supporting sentences joined into one, as the authors'
released code scores HotpotQA; the per-sentence maximum is the ``evidence_reference=per_sentence`` option."""

from __future__ import annotations

import pytest

from verl_evidence.rewards import grace
from verl_evidence.rewards.rouge import rouge_l

HOPS = [
    "The river that divides the city is the Danube.",
    "It rises in the Black Forest of southwestern Germany and runs east to the Black Sea.",
]
TRUTH = {"target": ["Black Forest"], "evidence": HOPS, "answerable": True}
ONE_HOP = f"<evidence>{HOPS[1]}</evidence><answer>Black Forest</answer>"
BOTH_HOPS = f"<evidence>{HOPS[0]} {HOPS[1]}</evidence><answer>Black Forest</answer>"
SENTENCES = {"evidence_sentences": True}


def evidence_rouge(response: str, extra_info: dict | None = None, **kwargs) -> float:
    return grace.compute_score("hotpotqa", response, TRUTH, extra_info, **kwargs)["evidence_rouge"]


def test_a_multi_hop_evidence_is_one_reference_by_default() -> None:
    """Quoting one hop of a two-hop answer no longer earns full evidence credit; quoting both does."""
    joined = " ".join(HOPS)
    assert evidence_rouge(BOTH_HOPS, SENTENCES) == pytest.approx(1.0)
    assert evidence_rouge(ONE_HOP, SENTENCES) == pytest.approx(rouge_l(HOPS[1], [joined]))
    assert evidence_rouge(ONE_HOP, SENTENCES) < 0.9
    # the hops joined in their order, by one space: the reversed order is a different reference
    reversed_hops = f"<evidence>{HOPS[1]} {HOPS[0]}</evidence><answer>Black Forest</answer>"
    assert evidence_rouge(reversed_hops, SENTENCES) < 1.0


def test_the_per_sentence_maximum_is_a_named_option() -> None:
    assert evidence_rouge(ONE_HOP, SENTENCES, evidence_reference="per_sentence") == pytest.approx(1.0)
    # validation scores with the same reference rule (alpha = beta = 1 there)
    assert evidence_rouge(ONE_HOP, {**SENTENCES, "validate": True}, evidence_reference="per_sentence") == 1.0
    assert evidence_rouge(ONE_HOP, {**SENTENCES, "validate": True}) < 0.9
    full = grace.compute_score("hotpotqa", ONE_HOP, TRUTH, SENTENCES, evidence_reference="per_sentence")
    assert full["score"] == pytest.approx(0.5 + 1 + 2 * 1.0 + 3 * 1.0)


def test_alternative_references_keep_the_best_match() -> None:
    """Rows that do not mark their evidence as one evidence's sentences (QASPER's pieces, answers-only data):
    every string is a reference of its own under both settings, as the released code scores QASPER."""
    for extra_info in (None, {}, {"evidence_sentences": False}):
        assert evidence_rouge(ONE_HOP, extra_info) == pytest.approx(1.0)
    assert grace.evidence_references(HOPS, sentences=True) == [" ".join(HOPS)]
    assert grace.evidence_references(HOPS, sentences=True, how="per_sentence") == HOPS
    assert grace.evidence_references(HOPS[:1], sentences=True) == HOPS[:1]


def test_an_unknown_reference_rule_fails_at_start_up() -> None:
    from verl_evidence.reward_managers.scorers import build_scorer

    with pytest.raises(ValueError, match="evidence_reference must be one of joined, per_sentence, got 'best'"):
        grace.config_from_kwargs({"evidence_reference": "best"})
    with pytest.raises(ValueError, match="evidence_reference"):
        build_scorer("grace", {"evidence_reference": "best"})
    assert build_scorer("grace", {"evidence_reference": "per_sentence"}).name == "grace"


@pytest.mark.parametrize(("override", "expected"), [(None, "joined"), ("per_sentence", "per_sentence")])
def test_the_recipe_preset_names_the_setting(override: str | None, expected: str, tmp_path) -> None:
    """The grace_dapo preset (the recipe's) sets evidence_reference; a command-line override reaches the scoring
    function verl loads from it."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from verl_evidence.local.tiny_models import save_tiny_tokenizer

    presets = Path(__file__).resolve().parents[2] / "recipes" / "presets"
    overrides = [f"actor_rollout_ref.model.path={save_tiny_tokenizer(tmp_path)}", "data.max_response_length=3072"]
    if override:
        overrides.append(f"++reward.custom_reward_function.reward_kwargs.evidence_reference={override}")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(presets), version_base=None):
        config = compose("grace_dapo", overrides=overrides)
    assert config.reward.custom_reward_function.reward_kwargs.evidence_reference == expected
    score = get_custom_reward_fn(config)
    one_hop = score(data_source="hotpotqa", solution_str=ONE_HOP, ground_truth=TRUTH, extra_info=SENTENCES)
    assert (one_hop["evidence_rouge"] == pytest.approx(1.0)) is (expected == "per_sentence")
