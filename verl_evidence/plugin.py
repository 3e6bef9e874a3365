"""Entry point of group ``verl.plugins``: our adapters in verl's registries, in every process.

verl imports this module in each process that runs ``import verl`` (driver and
Ray workers) and swallows errors at DEBUG level, so the tests import it in a
fresh subprocess to prove that registration really happens.

The registrations are :mod:`verl_evidence.registration`'s (one table, verl's
public registration functions); each waits for its registry's module: a Ray
worker that never imports, say, the agent-loop package does not pay the 2-4 s
of importing it for us.
"""

from verl_evidence import registration
from verl_evidence.local import cpu_mode_selected
from verl_evidence.registration import when_imported

registration.install()  # done by ``import verl_evidence`` already; here so that the entry point says it


def _patch_trainer() -> None:
    from verl_evidence.trainer.patches import patch_rollout_dump

    patch_rollout_dump()  # the training rollout dump with each trajectory's reward components (version-gated)


when_imported("verl.trainer.ppo.v1.trainer_base", _patch_trainer)

# CPU training mode (VERL_PLATFORM=cpu): platform, engine and rollout for verl's trainer without accelerators.
# Loaded only when selected: a production run imports none of verl_evidence.local.
if cpu_mode_selected():
    from verl_evidence.local.cpu_mode import activate as _activate_cpu_mode

    _activate_cpu_mode()
