"""Entry point of group ``verl.plugins``: registers every adapter in verl's registries.

verl imports this module in each process that runs ``import verl`` (driver and
Ray workers) and swallows errors at DEBUG level, so the tests import it in a
fresh subprocess to prove that registration really happens.

Each registration waits for its registry's module (``verl_evidence.registration``):
a Ray worker that never imports, say, the agent-loop package does not pay the
2-4 s of importing it for us.
"""

from verl_evidence.local import cpu_mode_selected
from verl_evidence.registration import when_imported


def _register_estimator() -> None:
    from verl_evidence.trainer import advantage  # noqa: F401  (its decorator registers grpo_clipstd)


def _register_reward_managers() -> None:
    from verl_evidence import reward_managers  # noqa: F401  (its decorators register the managers)


def _register_agent_loops() -> None:
    from verl_evidence.agent_loops import register_all

    register_all()


def _patch_trainer() -> None:
    from verl_evidence.trainer.patches import patch_rollout_dump

    patch_rollout_dump()  # the training rollout dump with each trajectory's reward components (version-gated)


when_imported("verl.trainer.ppo.core_algos", _register_estimator)
when_imported("verl.experimental.reward_loop.reward_manager", _register_reward_managers)
when_imported("verl.experimental.agent_loop", _register_agent_loops)
when_imported("verl.trainer.ppo.v1.trainer_base", _patch_trainer)

# CPU training mode (VERL_PLATFORM=cpu): platform, engine and rollout for verl's trainer without accelerators.
# Loaded only when selected: a production run imports none of verl_evidence.local.
if cpu_mode_selected():
    from verl_evidence.local.cpu_mode import activate as _activate_cpu_mode

    _activate_cpu_mode()
