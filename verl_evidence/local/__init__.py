"""verl-evidence without a GPU cluster: the CPU training mode, the local generation backends and the smoke runs.

- :mod:`.cpu_mode` (with :mod:`.cpu_platform`, :mod:`.cpu_rollout` and the
  version-gated :mod:`.verl_patches`): verl's own trainer on CPU, selected by
  ``VERL_PLATFORM=cpu``;
- :mod:`.backends`: generation backends behind verl's server-manager interface
  (a local HF model, scripted texts, an OpenAI-compatible server) for the demo,
  the eval harness and the tests;
- :mod:`.smoke`: the recipes' ``--smoke`` runs (tiny warmed-up policy, data, log parsing);
- :mod:`.tiny_models`: the offline tiny tokenizer and NLI judges those runs use.

A production rollout on GPUs imports none of this; only this file, whose
:func:`cpu_mode_selected` the plugin asks before it loads the CPU mode.
"""

from __future__ import annotations

import os

CPU_PLATFORM = "cpu"


def cpu_mode_selected() -> bool:
    """The CPU mode is on in every process (driver and Ray workers) that sees ``VERL_PLATFORM=cpu``."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == CPU_PLATFORM
