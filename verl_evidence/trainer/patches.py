"""verl-internal workarounds that production runs need too (GPU clusters, not only the CPU mode), version-gated.

verl 0.9.1's v1 trainer dumps each training step's rollouts to
``trainer.rollout_data_dir/<step>.jsonl`` with the decoded prompt and response,
the ground truth and the total score, but, unlike verl's legacy trainer and its
own validation dump, without the reward manager's ``reward_extra_info``
(``PPOTrainer._log_rollout_data`` passes ``{"uid": ...}`` alone). There is no
public hook for the dump, so :func:`patch_rollout_dump` wraps the private
``PPOTrainer._dump_generations`` to add, per trajectory, two columns:
``reward_extra_info`` (the manager's components, as logged per step under
``reward/...`` by :mod:`verl_evidence.trainer.step_sampler`) and ``rollout`` (the loop's
scalar ``extra_fields``: searches, notes, termination, failures).

Only for the verl versions in :data:`SUPPORTED_VERL`; on any other the dump is
left as verl writes it, with a warning (training itself does not depend on it).
tests/adapters/test_step_metrics.py pins the internals relied on (the canary: it fails when verl changes them).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)

SUPPORTED_VERL = ("0.9.",)
# The signature of PPOTrainer._dump_generations this patch was checked against
DUMP_PARAMETERS = ("self", "inputs", "outputs", "gts", "scores", "reward_extra_infos_dict", "dump_path")
TRAIN_PARTITION = "train"
REWARD_COLUMN = "reward_extra_info"
ROLLOUT_COLUMN = "rollout"


def verl_supported(version: str | None = None) -> bool:
    if version is None:
        import verl

        version = verl.__version__
    return version.startswith(SUPPORTED_VERL)


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) or (hasattr(value, "item") and getattr(value, "ndim", 1) == 0)


def dump_columns(extra_fields: list[Any]) -> dict[str, list[dict]]:
    """The two added columns from the trajectories' ``extra_fields`` (in dump order)."""
    rewards, rollouts = [], []
    for fields in extra_fields:
        fields = getattr(fields, "data", fields)
        fields = fields if isinstance(fields, Mapping) else {}
        info = fields.get("reward_extra_info")
        rewards.append(dict(info) if isinstance(info, Mapping) else {})
        rollouts.append({k: v for k, v in fields.items() if k != "reward_extra_info" and _scalar(v)})
    return {REWARD_COLUMN: rewards, ROLLOUT_COLUMN: rollouts}


def _training_dump_keys(reward_extra_infos_dict: Any) -> list[str] | None:
    """The trajectory keys of a training-step dump (``{"uid": keys}`` only); None for any other dump."""
    if isinstance(reward_extra_infos_dict, dict) and set(reward_extra_infos_dict) == {"uid"}:
        return list(reward_extra_infos_dict["uid"])
    return None


def patch_rollout_dump(trainer_cls: type | None = None) -> bool:
    """Add the ``reward_extra_info`` and ``rollout`` columns to the training rollout dump; True when patched."""
    if trainer_cls is None:
        from verl.trainer.ppo.v1.trainer_base import PPOTrainer as trainer_cls
    if not verl_supported():
        import verl

        logger.warning(
            "verl %s is not one verl-evidence's rollout-dump columns were checked against (%s); "
            "trainer.rollout_data_dir is left as verl writes it",
            verl.__version__,
            SUPPORTED_VERL,
        )
        return False
    original = trainer_cls._dump_generations
    if getattr(original, "_verl_evidence", False):
        return True
    parameters = tuple(inspect.signature(original).parameters)
    if parameters != DUMP_PARAMETERS:
        raise RuntimeError(
            f"verl's PPOTrainer._dump_generations takes {parameters}, not {DUMP_PARAMETERS}: "
            "verl_evidence.trainer.patches needs checking against this verl"
        )

    @functools.wraps(original)
    def _dump_generations(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path):
        keys = _training_dump_keys(reward_extra_infos_dict)
        if keys:
            import transfer_queue as tq

            data = tq.kv_batch_get(keys=keys, partition_id=TRAIN_PARTITION, select_fields=["extra_fields"])
            reward_extra_infos_dict = {**reward_extra_infos_dict, **dump_columns(list(data["extra_fields"]))}
        return original(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path)

    _dump_generations._verl_evidence = True
    trainer_cls._dump_generations = _dump_generations
    return True
