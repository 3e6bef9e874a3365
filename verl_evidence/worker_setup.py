"""Set-up of every Ray worker process of a training run (Ray's ``runtime_env.worker_process_setup_hook``).

The recipes pass ``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=verl_evidence.worker_setup.setup_worker``,
so Ray calls :func:`setup_worker` in each worker it starts for the run (task runner, FSDP workers, rollout servers,
agent-loop and reward workers, TransferQueue), before the worker imports verl.

What it does: raise Python's garbage-collector thresholds. Each of those processes imports torch, transformers,
tensordict and verl (~540,000 objects); with Python's default thresholds (700, 10, 10) the collector runs eight
full collections over that growing heap during the import: 1.0 of the 4.5 CPU-seconds of
``import verl.trainer.main_ppo`` measured here, 0.2 with (100000, 100, 100). Reference counting still frees
everything that is not in a cycle at once; cyclic garbage waits for 100,000 new objects instead of 700.

``VERL_EVIDENCE_GC_THRESHOLD`` picks other thresholds (``"50000,50,50"``) or ``python`` for Python's own. This
module imports nothing heavy: it runs before the worker's first import of verl.
"""

from __future__ import annotations

import gc
import os

GC_THRESHOLD_ENV = "VERL_EVIDENCE_GC_THRESHOLD"
DEFAULT_GC_THRESHOLD = (100_000, 100, 100)
PYTHON_GC_THRESHOLD = "python"  # the value of GC_THRESHOLD_ENV that leaves the interpreter's thresholds alone


def gc_threshold(value: str | None) -> tuple[int, ...] | None:
    """The thresholds ``value`` names (None: :data:`DEFAULT_GC_THRESHOLD`; ``python``: None, keep Python's)."""
    if value is None or not value.strip():
        return DEFAULT_GC_THRESHOLD
    if value.strip().lower() == PYTHON_GC_THRESHOLD:
        return None
    try:
        numbers = tuple(int(part) for part in value.split(","))
    except ValueError:
        numbers = ()
    if not 1 <= len(numbers) <= 3 or any(number < 0 for number in numbers):
        raise ValueError(
            f"{GC_THRESHOLD_ENV}={value!r}: expected one to three non-negative integers separated by commas "
            f"(Python's gc.set_threshold, e.g. '100000,100,100') or {PYTHON_GC_THRESHOLD!r}"
        )
    return numbers


def setup_worker() -> None:
    """Ray's worker set-up hook: the garbage-collector thresholds (:data:`GC_THRESHOLD_ENV`)."""
    threshold = gc_threshold(os.environ.get(GC_THRESHOLD_ENV))
    if threshold is not None:
        gc.set_threshold(*threshold)
