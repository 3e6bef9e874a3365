"""CPU training mode: verl 0.9's own trainer on a machine without accelerators.

Users debug a recipe on a laptop (or in CI) before spending GPU hours: the
same ``python -m verl.trainer.main_ppo`` command, the same agent loops, reward
managers and advantage estimator, with a tiny policy. Selected by
``VERL_PLATFORM=cpu`` (the recipes' ``--smoke`` flag sets it); nothing here
runs otherwise.

What the mode changes, and through which of verl's extension points:

- platform ``cpu`` (``PlatformRegistry.register``; :mod:`.cpu_platform`): torch's
  CPU device, gloo collectives, and Ray's logical ``GPU`` resource as the count
  of training slots, so verl's resource pools and placement groups work unchanged;
- the FSDP engine for that platform (``EngineRegistry.register(device="cpu")``);
  FSDP2 only (FSDP1 cannot sync CPU parameters), sdpa attention, fp32;
- rollout ``hf`` (``RolloutReplicaRegistry.register``; :mod:`.cpu_rollout`): a Ray
  actor per replica that generates with a Hugging Face causal LM through our
  :class:`~verl_evidence.local.backends.HFGenerationBackend`, behind verl's own
  server client and load balancer, and that receives the actor's weights after
  every step.

Five things verl 0.9 offers no public hook for are patched, only in
:mod:`.verl_patches` and only for the verl versions it supports (tests/cpu_mode
fails loudly when verl changes under them).
"""

from __future__ import annotations

import logging

from verl_evidence.local import CPU_PLATFORM, cpu_mode_selected, verl_patches
from verl_evidence.local.cpu_rollout import ROLLOUT_NAME

logger = logging.getLogger(__name__)

_activated = False


def register_engine() -> None:
    """verl's FSDP engine for device ``cpu`` (``EngineRegistry.register``), its offload policy unpinned."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    registered = EngineRegistry._engines.get("language_model", {}).get("fsdp2", {})
    if CPU_PLATFORM not in registered:
        EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device=CPU_PLATFORM)(
            transformer_impl.FSDPEngineWithLMHead
        )
    verl_patches.patch_offload_policy(transformer_impl)
    verl_patches.patch_log_probs(transformer_impl)


def activate() -> None:
    """Register the CPU platform, engine and rollout with verl. Idempotent; a no-op unless selected."""
    global _activated
    if _activated or not cpu_mode_selected():
        return
    verl_patches.check_verl_version()
    from verl.plugin.platform.platform_manager import PlatformRegistry

    from verl_evidence.local.cpu_platform import platform_class
    from verl_evidence.local.cpu_rollout import register_rollout_replica
    from verl_evidence.registration import when_imported

    PlatformRegistry.register(platform=CPU_PLATFORM)(platform_class())  # now: verl resolves its platform early
    # The rest waits for the verl module it changes (see verl_evidence.registration): a Ray worker that never
    # builds an engine or a rollout does not import them for us.
    when_imported("verl.workers.engine", register_engine)
    when_imported("verl.workers.rollout.replica", register_rollout_replica)
    when_imported("verl.workers.rollout.base", verl_patches.patch_rollout_adapter_registry)
    when_imported("verl.utils.distributed", verl_patches.patch_process_group_backend)
    when_imported("verl.trainer.ppo.v1.replay_buffer", verl_patches.patch_replay_buffer_poll)
    when_imported("verl.trainer.ppo.v1.replay_buffer", verl_patches.patch_batch_order)
    when_imported("verl.trainer.ppo.v1.trainer_base", verl_patches.patch_trainer_uids)
    _activated = True
    logger.info("verl-evidence CPU training mode active (platform %s, rollout %s)", CPU_PLATFORM, ROLLOUT_NAME)
