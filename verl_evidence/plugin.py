"""Entry point of group ``verl.plugins``: importing it registers every adapter.

verl imports this module in each process that runs ``import verl`` (driver and
Ray workers) and swallows errors at DEBUG level, so the tests import it in a
fresh subprocess to prove that registration really happens.
"""

from verl_evidence import advantage, reward_managers  # noqa: F401  (registration side effects)
from verl_evidence.agent_loops import register_all as _register_agent_loops

_register_agent_loops()

# CPU training mode (VERL_PLATFORM=cpu): platform, engine and rollout for verl's trainer without accelerators.
from verl_evidence import cpu_mode as _cpu_mode  # noqa: E402

_cpu_mode.activate()
