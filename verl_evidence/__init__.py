"""verl-evidence: evidence-aware rewards, search rollouts and retrieval for verl.

Importing this package is cheap and imports neither verl nor torch. It arms the
registration of the verl adapters (:mod:`verl_evidence.registration`): each is
registered once both verl's registry and its own module are imported. verl
imports us in every process that runs ``import verl`` through the ``verl.plugins``
entry point (:mod:`verl_evidence.plugin`).
"""

from verl_evidence.registration import install as _install_registrations

__version__ = "0.1.0"

_install_registrations()  # first, so that the import of each of our adapter modules is watched
