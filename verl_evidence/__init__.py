"""verl-evidence: evidence-aware rewards, search rollouts and retrieval for verl.

Importing this package is cheap and imports neither verl nor torch; the verl
adapters are registered by :mod:`verl_evidence.plugin`, which verl loads through
the ``verl.plugins`` entry point in every process that runs ``import verl``.
"""

__version__ = "0.1.0"
