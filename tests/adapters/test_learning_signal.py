"""One policy update on a fixed batch moves the policy toward what the reward pays, and away when it is negated.

The whole sign chain of a training step, with verl's own pieces on a tiny policy: the real reward manager scores a
fixed GRPO group (verl's reward-loop worker), the recipe's advantage estimator (``grpo_clipstd``) turns the scores into
advantages, verl's configured policy loss (``actor.policy_loss.loss_mode``) is minimised by one optimiser step. The
measure is the reward-weighted change of each response's log-probability, ``sum_i (r_i - mean r) * dlogp_i``: above 0
when the update made the paid responses likelier. With the composite weight at -1 the same update must make them less
likely. Deterministic (fixed initialisation, fixed batch, no sampling), so it cannot flake; a sign or
credit-assignment bug anywhere between the score and the gradient flips one of the two.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_batch, score_with_worker

# One question, eight answers: three right, five wrong (a GRPO group with a spread).
QUESTION = "Question: which city is the capital of France?"
RESPONSES = [
    "<answer>Paris</answer>",
    "<answer>Lyon</answer>",
    "<answer>paris</answer>",
    "<answer>Marseille</answer>",
    "<answer>Nice</answer>",
    "<answer>Paris</answer>",
    "<answer>Toulouse</answer>",
    "<answer>Bordeaux</answer>",
]
EXACT_MATCH = "'verl_evidence.rewards.answer:compute_score'"


def composite_config(make_config, weight: float):
    return make_config(
        "reward.reward_manager.name=composite",
        f"+reward.reward_kwargs.components=[{{name:em,reward:{EXACT_MATCH},weight:{weight}}}]",
        "algorithm.adv_estimator=grpo_clipstd",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    )


def response_log_probs(model, input_ids, attention, response_width: int) -> torch.Tensor:
    """Per-token log-probabilities of the response tokens, (batch, response_width)."""
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, -response_width - 1 : -1]
    targets = input_ids[:, -response_width:]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def reward_weighted_change(make_config, tokenizer, weight: float) -> tuple[float, list[float]]:
    """(sum_i (r_i - mean r) * dlogp_i after one update, the original rewards r_i) for a composite weight."""
    import verl.trainer.ppo.core_algos as core_algos
    from verl.utils.config import omega_conf_to_dataclass

    import verl_evidence.trainer.advantage  # noqa: F401  (registers grpo_clipstd, as the plugin does in the trainer)
    from verl_evidence.local.tiny_models import tiny_causal_lm

    config = composite_config(make_config, weight)
    batch = make_batch(
        tokenizer, [{"prompt": QUESTION, "response": r, "ground_truth": {"target": ["Paris"]}} for r in RESPONSES]
    )
    scored = score_with_worker(config, batch)
    scores = torch.tensor([s["reward_score"] for s in scored], dtype=torch.float32)
    original = [s["reward_extra_info"]["em.score"] for s in scored]

    responses = batch.batch["responses"]
    width = responses.shape[1]
    response_mask = batch.batch["attention_mask"][:, -width:].float()
    last = response_mask.sum(-1).long() - 1
    token_rewards = torch.zeros_like(response_mask)
    token_rewards[torch.arange(len(RESPONSES)), last] = scores  # verl's outcome reward: on the last response token
    estimator = core_algos.get_adv_estimator_fn(config.algorithm.adv_estimator)
    advantages, _ = estimator(
        token_level_rewards=token_rewards,
        response_mask=response_mask,
        index=np.zeros(len(RESPONSES), dtype=object),  # one group
        config=config.algorithm,
    )

    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    loss_fn = core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)
    model = tiny_causal_lm(seed=0).train()
    optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
    input_ids, attention = batch.batch["input_ids"], batch.batch["attention_mask"]

    before = response_log_probs(model, input_ids, attention, width)
    loss, _ = loss_fn(
        old_log_prob=before.detach(),
        log_prob=before,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=actor.loss_agg_mode,
        config=actor,
    )
    optimiser.zero_grad()
    loss.backward()
    optimiser.step()
    with torch.no_grad():
        after = response_log_probs(model, input_ids, attention, width)
    change = ((after - before.detach()) * response_mask).sum(-1)  # each response's log-probability change
    centred = torch.tensor(original) - torch.tensor(original).mean()
    return float((centred * change).sum()), original


@pytest.mark.parametrize("weight, expected_sign", [(1.0, 1), (-1.0, -1)])
def test_one_update_follows_the_reward_and_reverses_when_negated(make_config, tokenizer, weight, expected_sign):
    weighted_change, original = reward_weighted_change(make_config, tokenizer, weight)
    assert original == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]  # the group has a spread (else nothing to learn)
    assert weighted_change * expected_sign > 0, (weight, weighted_change)
