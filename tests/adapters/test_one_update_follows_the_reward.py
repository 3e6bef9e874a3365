"""For every method, one policy update on a fixed batch follows the sign of the method's reward.

Each method as its recipe configures it (``recipes/presets/<recipe>.yaml`` composed by Hydra: its reward preset,
its advantage estimator) scores a fixed batch, 2 questions x 4 responses whose rewards differ within each group,
through verl's real reward-loop worker (EviNote's judge: the in-process overlap NLI model). verl's registered
estimator (``grpo_clipstd`` for EviOmni/LEAR, ``grpo`` for the others) turns the scores into advantages over the
batch's uid groups, and verl's configured policy loss (``vanilla``; first PPO step, ratio 1) is minimised by one AdamW
step of a seeded tiny policy. The measure, ``sum_i A_i * mean_t(logp_new - logp_old)`` over each response's tokens
with ``A_i`` the method's score minus its group's mean (computed here, so an estimator that flipped the sign would
not flip the weights with it), is above 0: the update made the responses the reward pays likelier. The same batch
scored by the composite manager at weight -1, exactly as ``benchmarks/learning.py``'s sign control builds it
(``negated_components``), must score exactly minus the plain scores, get exactly minus the advantages from verl, and
drive the measure below 0.

What this proves: the reward's sign reaches the gradient through the real manager, verl's advantage and verl's loss
(a sign or credit-assignment bug anywhere on that path flips one of the two). What it does not: that a method
learns. That is benchmarks/learning.py's job; a direction from a training run is never asserted in a test.
Deterministic (fixed batch, seeded initialisation, no sampling), so it cannot flake.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from benchmark_scripts import load_benchmark
from conftest import compose_trainer_config, make_batch, score_with_worker
from test_managers import EVINOTE_RESPONSES, EVIOMNI_FIELDS, EVIOMNI_RESPONSES, GOLD, GRACE_RESPONSES

REPO = Path(__file__).resolve().parents[2]
PRESETS = REPO / "recipes" / "presets"
QUESTIONS = ["Who wrote the report?", "Which body wrote the report in 1998?"]
GROUP_SIZE = 4


# method -> (recipe preset, the responses its rows produce, the rollout fields its reward reads)
METHODS = {
    "eviomni": ("eviomni_grpo", EVIOMNI_RESPONSES, lambda question: EVIOMNI_FIELDS),
    "lear": ("lear_grpo", EVIOMNI_RESPONSES, lambda question: EVIOMNI_FIELDS),
    "grace": ("grace_dapo", GRACE_RESPONSES, lambda question: {}),
    "evinote": ("evinote_grpo", EVINOTE_RESPONSES, lambda question: {"question": question}),
    "search_r1": ("search_r1_baseline", EVINOTE_RESPONSES, lambda question: {"question": question}),
}


def fixed_samples(method: str) -> list[dict]:
    """Two groups: the method's well-formed right and wrong answers beside malformed ones, in two orders."""
    _, responses, fields = METHODS[method]
    groups = [responses[:GROUP_SIZE], [responses[1], responses[0], *responses[-2:]]]
    return [
        {
            "prompt": f"Question: {question}",
            "response": response,
            "ground_truth": GOLD,
            "tool_extra_fields": dict(fields(question)),
        }
        for question, group in zip(QUESTIONS, groups)
        for response in group
    ]


def recipe_config(tokenizer_dir: Path, nli_dir: Path, method: str, negated: bool):
    """The recipe's composed config; negated: its reward swapped for the benchmark's composite at weight -1."""
    preset = METHODS[method][0]
    overrides = [
        "data.max_response_length=3072",  # the recipes' length: DAPO's overlong buffer stays out of reach
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",  # the recipes set it; verl's actor config needs it
    ]
    if negated:
        components = load_benchmark("learning").negated_components(method)
        overrides += ["reward_preset=composite", f"++reward.reward_kwargs.components={components}"]
    if method in {"evinote", "search_r1"} and (negated or method == "evinote"):
        overrides += [
            f"reward.reward_kwargs.nli_model={nli_dir}",
            "+reward.reward_kwargs.nli_in_process=true",
            "+reward.reward_kwargs.nli_device=cpu",
        ]
    return compose_trainer_config(tokenizer_dir, overrides, config_dir=PRESETS, config_name=preset)


def response_log_probs(model, batch) -> torch.Tensor:
    """Each response token's log-probability given everything before it, (batch, response_width)."""
    from verl.utils.torch_functional import logprobs_from_logits

    width = batch.batch["responses"].shape[1]
    logits = model(
        input_ids=batch.batch["input_ids"],
        attention_mask=batch.batch["attention_mask"],
        position_ids=batch.batch["position_ids"],
    ).logits[:, -width - 1 : -1]
    return logprobs_from_logits(logits.float(), batch.batch["responses"])


def one_update(config, batch, scores: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """(each response's advantage, each response's mean per-token log-prob change) after one update on ``batch``."""
    import verl.trainer.ppo.core_algos as core_algos
    from verl.trainer.ppo.reward import resolve_reward_manager_cls
    from verl.utils.config import omega_conf_to_dataclass

    import verl_evidence.trainer.advantage  # noqa: F401  (registers grpo_clipstd, as the plugin does in the trainer)
    from verl_evidence.local.tiny_models import tiny_causal_lm

    width = batch.batch["responses"].shape[1]
    response_mask = batch.batch["attention_mask"][:, -width:].float()
    # the trainer's path: the manager puts each outcome score on its response's last valid token
    token_rewards = resolve_reward_manager_cls(config).assemble_rm_scores(batch, scores)
    estimator = core_algos.get_adv_estimator_fn(config.algorithm.adv_estimator)
    advantages, _ = estimator(
        token_level_rewards=token_rewards,
        response_mask=response_mask,
        index=batch.non_tensor_batch["uid"],
        config=config.algorithm,
    )

    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert actor.policy_loss.loss_mode == "vanilla"
    loss_fn = core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)
    model = tiny_causal_lm(seed=0).train()
    torch.manual_seed(0)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-3)

    before = response_log_probs(model, batch)
    loss, _ = loss_fn(
        old_log_prob=before.detach(),  # the first PPO step: ratio 1
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
        after = response_log_probs(model, batch)
    tokens = response_mask.sum(-1).clamp(min=1)  # an empty response moves nothing
    mean_change = ((after - before.detach()) * response_mask).sum(-1) / tokens
    return advantages[:, 0], mean_change  # the outcome advantage, broadcast over the response (0 for an empty one)


@pytest.mark.parametrize("method", list(METHODS))
def test_one_update_follows_the_reward_and_reverses_when_negated(tokenizer_dir, tokenizer, nli_dir, method):
    samples = fixed_samples(method)
    batch = make_batch(tokenizer, samples)
    batch.non_tensor_batch["uid"] = np.array([f"q{i // GROUP_SIZE}" for i in range(len(samples))], dtype=object)

    outcomes = {}
    for negated in (False, True):
        config = recipe_config(tokenizer_dir, nli_dir, method, negated)
        scores = [o["reward_score"] for o in score_with_worker(config, batch)]
        outcomes[negated] = (scores, *one_update(config, batch, scores))
    (plain, advantages, plain_change), (negated, negated_advantages, negated_change) = outcomes[False], outcomes[True]

    assert negated == [-score for score in plain], (plain, negated)
    for group in range(len(QUESTIONS)):  # the batch has a signal in every group
        group_scores = plain[group * GROUP_SIZE : (group + 1) * GROUP_SIZE]
        assert max(group_scores) > min(group_scores), (group, plain)
    assert advantages.abs().sum() > 0 and torch.equal(negated_advantages, -advantages)
    # The weights are what the reward pays against its group, computed here, not verl's advantages: weighing by the
    # estimator's own output would hide a sign bug in the estimator (it would flip the update and the weights alike).
    paid = torch.tensor(plain).view(len(QUESTIONS), GROUP_SIZE)
    weights = (paid - paid.mean(-1, keepdim=True)).flatten()
    toward_plain, toward_negated = float(weights @ plain_change), float(weights @ negated_change)
    assert toward_plain > 0, (method, plain, advantages.tolist(), plain_change.tolist())
    assert toward_negated < 0, (method, plain, advantages.tolist(), negated_change.tolist())
