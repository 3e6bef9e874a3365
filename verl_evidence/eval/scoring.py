"""Score rollouts with reward managers exactly as verl's trainer does.

verl 0.9 scores a finished trajectory by building a one-row ``DataProto`` from
the agent loop's output and the dataset row (``AgentLoopWorker._compute_score``)
and handing it to a ``RewardLoopWorker``, which owns the reward manager loaded
from ``reward.reward_manager.name`` and calls its ``run_single``. This module
does the same in-process: it composes verl's own ``ppo_trainer`` Hydra config
with the manager selected, instantiates verl's ``RewardLoopWorker`` from it, and
feeds it the ``DataProto`` verl would build. Nothing is re-implemented.
"""

from __future__ import annotations

import copy
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

logger = logging.getLogger(__name__)

__all__ = ["RewardScorer", "build_reward_dataproto", "compose_trainer_config", "numeric_components"]


def compose_trainer_config(model_path: str | Path, overrides: Sequence[str] = ()) -> DictConfig:
    """verl's ``ppo_trainer`` config, composed with Hydra as ``main_ppo`` would, plus ``overrides``."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            config_name="ppo_trainer",
            overrides=[f"actor_rollout_ref.model.path={model_path}", *overrides],
        )


def build_reward_dataproto(
    prompt_ids: Sequence[int],
    response_ids: Sequence[int],
    row: Mapping[str, Any],
    extra_fields: Mapping[str, Any],
    num_turns: int,
):
    """The one-trajectory ``DataProto`` verl's ``AgentLoopWorker._compute_score`` hands to the reward loop."""
    from tensordict import TensorDict
    from verl import DataProto

    prompts = torch.tensor(list(prompt_ids), dtype=torch.int64)
    responses = torch.tensor(list(response_ids), dtype=torch.int64)
    input_ids = torch.cat([prompts, responses], dim=0)
    attention_mask = torch.ones_like(input_ids)
    position_ids = torch.arange(input_ids.shape[0], dtype=torch.int64)
    batch = TensorDict(
        {
            "prompts": prompts.unsqueeze(0),
            "responses": responses.unsqueeze(0),
            "attention_mask": attention_mask.unsqueeze(0),
            "input_ids": input_ids.unsqueeze(0),
            "position_ids": position_ids.unsqueeze(0),
        },
        batch_size=1,
    )
    non_tensor: dict[str, np.ndarray] = {}
    for key, value in row.items():
        column = np.empty(1, dtype=object)
        column[0] = value
        non_tensor[key] = column
    extra = np.empty(1, dtype=object)
    extra[0] = dict(extra_fields)
    non_tensor.update(
        {
            "__num_turns__": np.array([num_turns]),
            "tool_extra_fields": extra,
            "prompt_len": np.array([len(prompt_ids)]),
            "response_len": np.array([len(response_ids)]),
        }
    )
    return DataProto(batch=batch, non_tensor_batch=non_tensor)


def numeric_components(result: Mapping[str, Any]) -> dict[str, float]:
    """``{"score": ..., component: ...}`` from a reward-loop result, numbers only (bools as 0/1)."""
    out: dict[str, float] = {"score": float(result["reward_score"])}
    for key, value in (result.get("reward_extra_info") or {}).items():
        if key == "score":
            continue
        if hasattr(value, "item") and getattr(value, "size", 1) == 1:
            value = value.item()
        if isinstance(value, bool):
            out[key] = 1.0 if value else 0.0
        elif isinstance(value, (int, float)) and math.isfinite(float(value)):
            out[key] = float(value)
    return out


class RewardScorer:
    """One verl ``RewardLoopWorker`` per reward manager, all built from one composed config.

    ``managers`` maps a label to ``(manager_name, reward_kwargs)``; the kwargs
    land under ``reward.reward_kwargs`` like ``+reward.reward_kwargs.*=``
    overrides on the trainer's command line.
    """

    def __init__(
        self,
        model_path: str | Path,
        managers: Mapping[str, tuple[str, Mapping[str, Any]]],
        base_config: DictConfig | None = None,
    ) -> None:
        from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

        base = base_config if base_config is not None else compose_trainer_config(model_path)
        self.workers: dict[str, Any] = {}
        for label, (name, reward_kwargs) in managers.items():
            config = copy.deepcopy(base)
            with open_dict(config):
                config.reward.reward_manager.name = name
                config.reward.reward_kwargs = OmegaConf.create(dict(reward_kwargs))
            self.workers[label] = RewardLoopWorker(config)

    @property
    def labels(self) -> list[str]:
        return list(self.workers)

    async def score(self, label: str, data) -> dict[str, float]:
        result = await self.workers[label].compute_score(data)
        return numeric_components(result)
