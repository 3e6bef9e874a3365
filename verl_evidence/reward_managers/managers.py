"""verl 0.9 reward-loop managers: ``eviomni``, ``evinote``, ``grace``, ``composite``.

Selected with ``reward.reward_manager.name=<name>`` (registered by :mod:`verl_evidence.registration`);
options come from ``reward.reward_kwargs`` (``+reward.reward_kwargs.key=value``
on the command line). See docs/reward-managers.md.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf
from verl import DataProto
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

from verl_evidence.reward_managers.sample import decode_sample
from verl_evidence.reward_managers.scorers import Scorer, build_composite, build_scorer
from verl_evidence.trainer.step_metrics import ROLLOUT_STATS

logger = logging.getLogger(__name__)


# Rollout statistics copied from ``tool_extra_fields`` into ``reward_extra_info``: verl's
# AgentLoopMetrics drops custom keys, but its validation metrics aggregate every key of
# ``reward_extra_info`` per data source (``val-aux/<data_source>/<key>/mean@N``). verl takes
# the key list from the first sample, so every sample carries all of them (0.0 when absent). Defined once, beside
# the per-step metrics that skip them (trainer/step_metrics.py).
def rollout_stats(tool_extra_fields: Any) -> dict[str, float]:
    """The :data:`ROLLOUT_STATS` of a rollout's extra fields as floats (0.0 when absent or not numeric)."""
    fields = tool_extra_fields if isinstance(tool_extra_fields, dict) else {}
    stats = {}
    for key in ROLLOUT_STATS:
        value = fields.get(key)
        try:
            stats[key] = float(value) if value is not None and not isinstance(value, (str, bytes)) else 0.0
        except (TypeError, ValueError):
            stats[key] = 0.0
    return stats


def with_rollout_stats(result: dict[str, float], stats: dict[str, float]) -> dict[str, float]:
    """``result`` with ``stats`` inserted before ``reward_error`` (kept last, as for every manager)."""
    error_key = "reward_error"
    merged = {k: v for k, v in result.items() if k != error_key}
    merged.update(stats)
    if error_key in result:
        merged[error_key] = result[error_key]
    return merged


def reward_kwargs_from(config: Any) -> dict[str, Any]:
    """``config.reward.reward_kwargs`` as a plain dict ({} when absent)."""
    reward_config = config.get("reward") if hasattr(config, "get") else None
    kwargs = reward_config.get("reward_kwargs") if reward_config is not None else None
    if kwargs is None:
        return {}
    if isinstance(kwargs, DictConfig):
        return OmegaConf.to_container(kwargs, resolve=True)
    return dict(kwargs)


def custom_function_configured(config: Any) -> bool:
    try:
        return bool(config.reward.custom_reward_function.path)
    except Exception:
        return False


class EvidenceRewardManager(RewardManagerBase):
    """Decode one trajectory, score it with :attr:`scorer`, return verl's result dict.

    ``reward_extra_info`` always carries the scorer's fixed keys (``score``, the
    method's components, ``reward_error``), so verl can stack them across samples.
    """

    reward_name: ClassVar[str] = ""
    # whether ``reward_extra_info`` also carries the search rollout's statistics (ROLLOUT_STATS)
    logs_rollout_stats: ClassVar[bool] = False

    def __init__(
        self,
        config: DictConfig,
        tokenizer: Any,
        compute_score: Any = None,
        reward_router_address: str | None = None,
        reward_model_tokenizer: Any = None,
        **_: Any,
    ) -> None:
        super().__init__(config, tokenizer, compute_score)
        self.reward_kwargs = reward_kwargs_from(config)
        if custom_function_configured(config) and self.reward_name != "composite":
            logger.warning(
                "reward.custom_reward_function is set but the %s manager scores with its own reward; "
                "use the composite manager with a component {reward: custom} to include it",
                self.reward_name,
            )
        self.scorer: Scorer = self.build_scorer()
        if self.logs_rollout_stats:
            clash = sorted(set(ROLLOUT_STATS) & set(self.scorer.keys))
            if clash:
                raise ValueError(f"{self.reward_name} reward keys {clash} clash with the rollout statistics keys")
        logger.info("%s reward manager ready, logged keys: %s", self.reward_name, list(self.scorer.keys))

    def build_scorer(self) -> Scorer:
        return build_scorer(self.reward_name, self.reward_kwargs, judge_kwargs=self.reward_kwargs)

    async def run_single(self, data: DataProto) -> dict:
        try:
            sample = await decode_sample(data, self.tokenizer)
        except Exception as error:
            logger.warning(
                "%s reward: could not read the trajectory (%s: %s); scoring 0",
                self.reward_name,
                type(error).__name__,
                error,
            )
            result = self.scorer.failure()
            stats = dict.fromkeys(ROLLOUT_STATS, 0.0)
        else:
            stats = rollout_stats(sample.tool_extra_fields)
            if stats["retrieval_failed"]:
                reason = (sample.tool_extra_fields or {}).get("retrieval_error") or "no passages"
                logger.warning("%s reward: the rollout had no passages (%s); scoring 0", self.reward_name, reason)
                result = self.scorer.failure()
            else:
                result = await self.scorer.score(sample)
        if self.logs_rollout_stats:
            result = with_rollout_stats(result, stats)
        return {"reward_score": result["score"], "reward_extra_info": result}


class EviOmniRewardManager(EvidenceRewardManager):
    """EviOmni/LEAR reward (``variant``, ``l1``..``l3``, ``tau``, ``gamma``, ``omega`` in reward_kwargs)."""

    reward_name = "eviomni"
    logs_rollout_stats = True


class EviNoteRewardManager(EvidenceRewardManager):
    """EviNote reward with EQR from the shared NLI judge (``nli_model`` is required)."""

    reward_name = "evinote"
    logs_rollout_stats = True


class GraceRewardManager(EvidenceRewardManager):
    """GRACE gated reward (``mode``, ``alpha``, ``beta``, ``format_reward``, ``path_reward``, ``validation_splits``)."""

    reward_name = "grace"


class CompositeRewardManager(EvidenceRewardManager):
    """Weighted sum of rewards listed in ``reward_kwargs.components``."""

    reward_name = "composite"
    logs_rollout_stats = True

    def build_scorer(self) -> Scorer:
        if "components" not in self.reward_kwargs:
            raise ValueError(
                "the composite reward manager needs +reward.reward_kwargs.components="
                "[{reward: eviomni, weight: 0.5}, {reward: grace, weight: 0.5}]"
            )
        custom = self.compute_score if custom_function_configured(self.config) else None
        return build_composite(
            self.reward_kwargs["components"], judge_kwargs=self.reward_kwargs, custom_function=custom
        )
