"""EviOmni's answer-reward composition (Table 4 / LEAR Table 6): R^ans averages the chosen masked-input answers."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import pytest

from verl_evidence.rewards.eviomni import ANSWER_REWARDS, EviOmniConfig, compute_score, config_from_kwargs

PRESETS = Path(__file__).resolve().parents[2] / "recipes" / "presets"
RESPONSE = "<reason>Passage 1 names the capital.</reason><extract>Paris is the capital.</extract><answer>Paris</answer>"
# o_r wrong, o_e half right, o_f right: each subset's mean differs
EXTRA = {"eviomni_answer_r": "Lyon", "eviomni_answer_e": "Paris France", "eviomni_len_p": 200}
F1 = {"rationale": 0.0, "evidence": 2 / 3, "full": 1.0}
# Table 4's six rows
ROWS = [subset for size in (1, 2, 3) for subset in combinations(ANSWER_REWARDS, size)]


@pytest.mark.parametrize("subset", ROWS, ids=lambda s: "+".join(s))
def test_answer_reward_is_the_mean_of_the_chosen_answers(subset: tuple[str, ...]) -> None:
    result = compute_score("nq", RESPONSE, {"target": ["Paris"]}, EXTRA, answer_rewards=list(subset))
    assert result["ans"] == pytest.approx(sum(F1[name] for name in subset) / len(subset))
    # every component is still logged, whichever enter R^ans
    assert (result["ans_r"], result["ans_f"]) == (0.0, 1.0) and result["ans_e"] == pytest.approx(2 / 3)
    full = compute_score("nq", RESPONSE, {"target": ["Paris"]}, EXTRA)
    assert result["score"] - full["score"] == pytest.approx(0.8 * (result["ans"] - full["ans"]))


def test_the_default_is_the_papers_three() -> None:
    assert EviOmniConfig().answer_rewards == ("rationale", "evidence", "full")
    assert compute_score("nq", RESPONSE, {"target": ["Paris"]}, EXTRA)["ans"] == pytest.approx(5 / 9)


def test_order_and_shell_lists_name_one_setting() -> None:
    assert config_from_kwargs({"answer_rewards": ["full", "evidence"]}).answer_rewards == ("evidence", "full")
    assert config_from_kwargs({"answer_rewards": "evidence, full"}).answer_rewards == ("evidence", "full")


@pytest.mark.parametrize("bad", [[], ["evidence", "evidence"], ["answer"], "rationale,oops"])
def test_bad_compositions_fail_naming_the_setting(bad) -> None:
    with pytest.raises(ValueError, match="answer_rewards"):
        config_from_kwargs({"answer_rewards": bad})


def test_the_preset_states_the_default_and_a_hydra_override_picks_a_row() -> None:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(PRESETS), version_base=None):
        default = compose(config_name=None, overrides=["+reward_preset=eviomni"])
        row = compose(
            config_name=None,
            overrides=["+reward_preset=eviomni", "reward.reward_kwargs.answer_rewards=[evidence,full]"],
        )
    kwargs = OmegaConf.to_container(default.reward.reward_kwargs)
    assert config_from_kwargs(kwargs) == EviOmniConfig()
    assert config_from_kwargs(OmegaConf.to_container(row.reward.reward_kwargs)).answer_rewards == ("evidence", "full")
