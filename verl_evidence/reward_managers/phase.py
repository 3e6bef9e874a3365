"""Tell the reward which phase of the trainer a sample comes from: training or validation.

verl 0.9 knows the phase (``_validate`` sets ``validate`` on the batch it hands
the agent loop manager) but does not pass it to the reward loop: the
``DataProto`` a reward manager receives is built from the row's own fields
(``AgentLoopWorker._compute_score``). A reward that scores validation
differently (GRACE: alpha = beta = 1) would otherwise have to trust a column of
the data file, which a file built with the default ``--split train`` gets wrong.

:class:`PhaseAgentLoopManager` is verl's own manager with one step added: before
dispatching a batch it writes the phase into every row's ``extra_info``
(``trainer_phase``: ``"train"`` | ``"validation"``, and ``validate``: bool, the
flag GRACE's scoring function reads). ``extra_info`` travels with the row to the
agent loop and from there to the reward manager, verl's built-in ones included
(``dapo`` passes it to ``compute_score``). Selected with verl's documented key
``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` (the recipes'
rollout presets set it); :class:`PhaseAgentLoopManagerV0` is the same for the
legacy trainer (``trainer.use_v1=false``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl.experimental.agent_loop import AgentLoopManager
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ
from verl.utils import tensordict_utils as tu
from verl.utils.ray_utils import auto_await

from verl_evidence.reward_managers.scorers import PHASE_KEY, TRAIN_PHASE, VALIDATION_PHASE

MANAGER_CLASS = "verl_evidence.reward_managers.phase.PhaseAgentLoopManager"


def with_phase(extra_info: Any, validate: bool) -> dict[str, Any]:
    """A copy of a row's ``extra_info`` carrying the trainer's phase (rows share dicts: never mutate them)."""
    info = dict(extra_info) if isinstance(extra_info, Mapping) else {}
    info[PHASE_KEY] = VALIDATION_PHASE if validate else TRAIN_PHASE
    info["validate"] = bool(validate)
    return info


def _row_values(batch: Any, key: str) -> list[Any]:
    """Per-row values of a non-tensor column of a v1 ``TensorDict`` batch (as ``AgentLoopWorkerTQ`` reads them)."""
    from tensordict import NonTensorData, NonTensorStack

    value = batch.get(key, None)
    if isinstance(value, NonTensorStack):
        return [value[i].data for i in range(len(batch))]
    if isinstance(value, NonTensorData):
        return [value.data] * len(batch)
    return [None] * len(batch)


def mark_phase_tensordict(batch: Any) -> None:
    """v1 trainer: the batch's ``validate`` entry (set by ``_validate``) into each row's ``extra_info``."""
    validate = bool(tu.get_non_tensor_data(batch, "validate", False))
    rows = [with_phase(info, validate) for info in _row_values(batch, "extra_info")]
    tu.assign_non_tensor_stack(batch, "extra_info", rows)


def mark_phase_dataproto(batch: Any) -> None:
    """Legacy trainer: ``meta_info["validate"]`` into each row's ``extra_info``."""
    import numpy as np

    validate = bool(batch.meta_info.get("validate", False))
    old = batch.non_tensor_batch.get("extra_info")
    rows = np.empty(len(batch), dtype=object)
    for i in range(len(batch)):
        rows[i] = with_phase(old[i] if old is not None else None, validate)
    batch.non_tensor_batch["extra_info"] = rows


class PhaseAgentLoopManager(AgentLoopManagerTQ):
    """verl 0.9's v1 agent loop manager, marking each row's phase before dispatch."""

    def generate_sequences(self, prompts):
        mark_phase_tensordict(prompts)
        return super().generate_sequences(prompts)


class PhaseAgentLoopManagerV0(AgentLoopManager):
    """verl 0.9's legacy agent loop manager, marking each row's phase before dispatch."""

    @auto_await
    async def generate_sequences(self, prompts):  # async there: awaited by callers inside an event loop
        mark_phase_dataproto(prompts)
        return await super().generate_sequences(prompts)
