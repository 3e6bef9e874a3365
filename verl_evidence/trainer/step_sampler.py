"""Per-step reward components, rollout behaviour and the masking check, through verl's custom-sampler hook.

verl 0.9.1's v1 trainer logs the reward manager's ``reward_extra_info`` for
validation only. The one public place where a plugin sees each training batch
and can add to that step's metrics is the replay buffer: the trainer builds
the class named by ``trainer.v1.sampler.custom_sampler.{path,name}`` and logs
the metrics dict its ``sample()`` returns with the step's own. So
:class:`EvidenceReplayBuffer` is verl's own buffer (``ReplayBuffer`` in
``sync`` mode, ``ReplayBufferAsync`` otherwise), unchanged, plus one read of
the sampled trajectories' ``extra_fields`` and masks from TransferQueue, turned
into metrics by :func:`verl_evidence.trainer.step_metrics.step_metrics`. The check runs
before the batch is trained on: a retrieved token with loss mask 1 stops the run.

Selected with::

    trainer.v1.sampler.custom_sampler.path=pkg://verl_evidence.trainer.step_sampler
    trainer.v1.sampler.custom_sampler.name=EvidenceReplayBuffer

Options (``++trainer.v1.sampler.sampler_kwargs.<key>=``): ``reward_manager`` and
``reward_function`` (the metric prefix, see :func:`~verl_evidence.trainer.step_metrics.reward_label`;
the recipes pass ``${reward.reward_manager.name}`` and
``${reward.custom_reward_function.path}``), ``mask_check`` (default true).
verl hands a custom sampler fewer arguments than its built-in one; the options it
leaves out (``filter_groups_metric``, ``train_batch_size``, ``gen_batch_size``,
``max_inflight_gen_batches``, ``sync_refill_failed_groups``) are taken from
``sampler_kwargs`` when set there and passed on to verl's buffer.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from typing import Any

from verl_evidence.trainer.step_metrics import Trajectory, reward_label, step_metrics

logger = logging.getLogger(__name__)

OWN_OPTIONS = ("reward_manager", "reward_function", "mask_check")
# ReplayBuffer arguments that verl passes only to its built-in sampler (trainer_base._build_replay_buffer)
BUILTIN_ONLY_OPTIONS = (
    "filter_groups_metric",
    "train_batch_size",
    "gen_batch_size",
    "max_inflight_gen_batches",
    "sync_refill_failed_groups",
)
TRAIN_PARTITION = "train"
FIELDS = ("extra_fields", "response_mask", "loss_mask")


def _plain(value: Any) -> Any:
    if hasattr(value, "items") and not isinstance(value, dict):  # DictConfig
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return value


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        if value.strip().lower() in ("true", "1", "yes", "on"):
            return True
        if value.strip().lower() in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"mask_check must be true or false, got {value!r}")
    return bool(value)


def _rows(jagged) -> list[list[int]]:
    """Rows of a TransferQueue jagged tensor (or a padded one, as a list of lists)."""
    if hasattr(jagged, "offsets"):
        offsets = jagged.offsets().tolist()
        values = jagged.values().tolist()
        return [values[start:end] for start, end in itertools.pairwise(offsets)]
    return [list(row) for row in jagged.tolist()]


def read_trajectories(keys: list[str], partition_id: str) -> list[Trajectory]:
    """The sampled trajectories' ``extra_fields``, ``response_mask`` and ``loss_mask`` from TransferQueue."""
    import transfer_queue as tq

    data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=list(FIELDS))
    extra_fields = [getattr(value, "data", value) for value in list(data["extra_fields"])]
    response_masks = _rows(data["response_mask"])
    # TensorDict refuses `key in td`: its keys() it is
    loss_masks = _rows(data["loss_mask"]) if "loss_mask" in data.keys() else [None] * len(keys)  # noqa: SIM118
    return [
        Trajectory(
            extra_fields=fields if isinstance(fields, Mapping) else {}, response_mask=mask, loss_mask=loss, key=key
        )
        for key, fields, mask, loss in zip(keys, extra_fields, response_masks, loss_masks, strict=True)
    ]


class EvidenceReplayBuffer:
    """verl's replay buffer for the trainer mode, whose training samples also report this step's metrics."""

    def __init__(self, trainer_mode: str, sampler_kwargs: Any = None, **verl_kwargs: Any) -> None:
        from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

        options = dict(_plain(sampler_kwargs) or {})
        own = {key: options.pop(key) for key in OWN_OPTIONS if key in options}
        builtin = {key: options.pop(key) for key in BUILTIN_ONLY_OPTIONS if key in options}
        self.label = reward_label(own.get("reward_manager"), own.get("reward_function"))
        self.mask_check = _flag(own.get("mask_check", True))
        buffer_cls = ReplayBuffer if trainer_mode == "sync" else ReplayBufferAsync
        self.buffer = buffer_cls(trainer_mode=trainer_mode, sampler_kwargs=options, **verl_kwargs, **builtin)
        logger.info(
            "per-step metrics reward/%s/..., rollout/..., masking/... (mask check %s) on verl's %s",
            self.label,
            "on" if self.mask_check else "off",
            buffer_cls.__name__,
        )

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        batch, metrics = self.buffer.sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
        if partition_id == TRAIN_PARTITION and batch.keys:
            trajectories = read_trajectories(list(batch.keys), partition_id)
            metrics = {**metrics, **step_metrics(trajectories, self.label, mask_check=self.mask_check)}
        return batch, metrics

    def __getattr__(self, name: str) -> Any:  # everything else is verl's buffer's
        if name == "buffer":
            raise AttributeError(name)
        return getattr(self.buffer, name)
