"""GRPO advantage with the group std clipped from below (EviOmni/LEAR).

``A_i = (R_i - mean(R_group)) / max(std(R_group), eps_std)``

Plain GRPO divides by ``std + 1e-6``: a group whose rewards differ only slightly
(e.g. the small length-reward differences of EviOmni) gets its noise blown up to
unit scale. Clipping the std at ``eps_std`` keeps such advantages small. When
``std > eps_std`` the result equals verl's ``grpo`` (same unbiased std, same
grouping by uid) up to verl's 1e-6 epsilon.

Select with ``algorithm.adv_estimator=grpo_clipstd`` and set the floor with
``+algorithm.eps_std=0.1``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

ESTIMATOR_NAME = "grpo_clipstd"
DEFAULT_EPS_STD = 0.1


def _eps_std_from(config: Any) -> float:
    if config is None:
        return DEFAULT_EPS_STD
    value = config.get("eps_std", None) if hasattr(config, "get") else getattr(config, "eps_std", None)
    if value is None:
        return DEFAULT_EPS_STD
    value = float(value)
    if not value > 0:
        raise ValueError(f"algorithm.eps_std must be > 0, got {value}")
    return value


def compute_grpo_clipstd_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    config: Any = None,
    eps_std: float | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome advantages, one scalar per response broadcast over its response tokens.

    Args:
        token_level_rewards: (batch, response_length); a response's reward is its row sum.
        response_mask: (batch, response_length), 1 on response tokens.
        index: group id (verl's ``uid``) of each row.
        config: verl's ``algorithm`` config; ``eps_std`` is read from it (default 0.1).
        eps_std: explicit floor, overriding the config.

    A group of one response has no baseline to compare against: its advantage is 0.
    The std is the unbiased (Bessel-corrected) one, as in verl's ``grpo``.

    Returns:
        (advantages, returns), both (batch, response_length) and equal, as verl's GRPO.
    """
    floor = float(eps_std) if eps_std is not None else _eps_std_from(config)
    scores = token_level_rewards.sum(dim=-1)
    if not scores.is_floating_point():
        scores = scores.float()
    advantages = torch.zeros_like(scores)
    groups: dict[Any, list[int]] = {}
    for row, group_id in enumerate(np.asarray(index, dtype=object).tolist()):
        groups.setdefault(group_id, []).append(row)
    with torch.no_grad():
        for rows in groups.values():
            if len(rows) < 2:
                continue  # advantage stays 0
            selected = torch.tensor(rows, dtype=torch.long, device=scores.device)
            group_scores = scores[selected]
            denominator = torch.clamp(torch.std(group_scores), min=floor)
            advantages[selected] = (group_scores - group_scores.mean()) / denominator
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages
