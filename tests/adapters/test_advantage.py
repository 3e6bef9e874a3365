"""grpo_clipstd: hand computation, equality with verl's grpo when std > eps_std, clipping, singletons."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_adv_estimator_fn
from verl.trainer.ppo.ray_trainer import compute_advantage

from verl_evidence.trainer.advantage import compute_grpo_clipstd_advantage


def outcome_rewards(scores: list[float], lengths: list[int], width: int = 6):
    """Token-level rewards with each score on the last valid token, and the response mask."""
    rewards = torch.zeros(len(scores), width)
    mask = torch.zeros(len(scores), width)
    for row, (score, length) in enumerate(zip(scores, lengths)):
        mask[row, :length] = 1
        rewards[row, length - 1] = score
    return rewards, mask


def test_hand_computed_group_with_clipped_std():
    # group a: rewards 0.50, 0.52, 0.54 -> mean 0.52, unbiased std 0.02 < 0.1, so divide by 0.1
    # group b: rewards 0, 1 -> mean 0.5, unbiased std sqrt(0.5) = 0.7071 > 0.1
    rewards, mask = outcome_rewards([0.50, 0.52, 0.54, 0.0, 1.0], [2, 3, 6, 1, 4])
    index = np.array(["a", "a", "a", "b", "b"], dtype=object)
    advantages, returns = compute_grpo_clipstd_advantage(rewards, mask, index, config=OmegaConf.create({}))
    expected = [-0.2, 0.0, 0.2, -0.5 / math.sqrt(0.5), 0.5 / math.sqrt(0.5)]
    for row, value in enumerate(expected):
        valid = mask[row].bool()
        assert torch.allclose(advantages[row, valid], torch.full((int(valid.sum()),), value), atol=1e-5)
        assert torch.all(advantages[row, ~valid] == 0)
    assert torch.equal(advantages, returns)


def test_equals_verl_grpo_when_std_exceeds_floor():
    generator = torch.Generator().manual_seed(0)
    groups, group_size = 16, 5
    scores = (torch.rand(groups * group_size, generator=generator) * 3).tolist()
    lengths = torch.randint(1, 9, (groups * group_size,), generator=generator).tolist()
    rewards, mask = outcome_rewards(scores, lengths, width=8)
    index = np.repeat(np.array([f"uid-{g}" for g in range(groups)], dtype=object), group_size)
    stds = [torch.tensor(scores[g * group_size : (g + 1) * group_size]).std().item() for g in range(groups)]
    assert min(stds) > 0.1  # precondition of the comparison
    ours, _ = compute_grpo_clipstd_advantage(rewards, mask, index, config={"eps_std": 0.1})
    theirs, _ = compute_grpo_outcome_advantage(rewards.clone(), mask, index, norm_adv_by_std_in_grpo=True)
    # verl divides by std + 1e-6, we by max(std, eps_std) = std
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_floor_changes_result_only_below_it():
    rewards, mask = outcome_rewards([0.0, 0.05, 0.10], [3, 3, 3])
    index = np.array([7, 7, 7], dtype=object)
    clipped, _ = compute_grpo_clipstd_advantage(rewards, mask, index, config=OmegaConf.create({"eps_std": 0.1}))
    loose, _ = compute_grpo_clipstd_advantage(rewards, mask, index, config=OmegaConf.create({"eps_std": 0.01}))
    verl, _ = compute_grpo_outcome_advantage(rewards.clone(), mask, index)
    assert clipped[0, 0].item() == pytest.approx(-0.5, abs=1e-5)  # -0.05 / 0.1
    assert loose[0, 0].item() == pytest.approx(-1.0, abs=1e-4)  # std 0.05 > 0.01: plain GRPO
    torch.testing.assert_close(loose, verl, rtol=1e-4, atol=1e-4)


def test_singleton_and_constant_groups_get_zero_advantage():
    rewards, mask = outcome_rewards([3.0, 1.0, 1.0, 2.0], [2, 2, 2, 2])
    index = np.array(["solo", "same", "same", "other_solo"], dtype=object)
    advantages, _ = compute_grpo_clipstd_advantage(rewards, mask, index)
    assert torch.all(advantages == 0)


def test_default_floor_and_bad_floor():
    rewards, mask = outcome_rewards([0.0, 0.02], [1, 1])
    index = np.array([0, 0], dtype=object)
    default, _ = compute_grpo_clipstd_advantage(rewards, mask, index, config=None)
    assert default[1, 0].item() == pytest.approx(0.01 / 0.1, abs=1e-6)
    with pytest.raises(ValueError, match="eps_std"):
        compute_grpo_clipstd_advantage(rewards, mask, index, config={"eps_std": 0})


def test_verl_trainer_path_resolves_and_reads_algorithm_config(make_config):
    """``algorithm.adv_estimator=grpo_clipstd +algorithm.eps_std=0.5`` through verl's compute_advantage."""
    config = make_config("algorithm.adv_estimator=grpo_clipstd", "+algorithm.eps_std=0.5")
    assert get_adv_estimator_fn("grpo_clipstd") is compute_grpo_clipstd_advantage
    rewards, mask = outcome_rewards([0.0, 0.2, 0.4, 1.0, 1.0], [2, 2, 2, 3, 3])
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": np.array(["p", "p", "p", "q", "q"], dtype=object)},
    )
    data = compute_advantage(data, adv_estimator=config.algorithm.adv_estimator, config=config.algorithm)
    # group p: mean 0.2, std 0.2 < 0.5 -> (r - 0.2) / 0.5; group q: constant -> 0
    expected = torch.tensor([-0.4, 0.0, 0.4, 0.0, 0.0])
    torch.testing.assert_close(data.batch["advantages"][:, 0], expected, atol=1e-6, rtol=0)
