"""Reward-loop managers for verl 0.9; importing this package registers them.

``eviomni``, ``evinote``, ``grace`` and ``composite`` become selectable with
``reward.reward_manager.name=...`` (``verl_evidence.plugin`` imports this in
every process through the ``verl.plugins`` entry point).
"""

from verl_evidence.reward_managers.managers import (
    CompositeRewardManager,
    EvidenceRewardManager,
    EviNoteRewardManager,
    EviOmniRewardManager,
    GraceRewardManager,
)
from verl_evidence.reward_managers.sample import Sample, decode_sample
from verl_evidence.reward_managers.scorers import ERROR_KEY, Scorer, build_composite, build_scorer

MANAGER_NAMES = ("eviomni", "evinote", "grace", "composite")

__all__ = [
    "CompositeRewardManager",
    "ERROR_KEY",
    "EviNoteRewardManager",
    "EviOmniRewardManager",
    "EvidenceRewardManager",
    "GraceRewardManager",
    "MANAGER_NAMES",
    "Sample",
    "Scorer",
    "build_composite",
    "build_scorer",
    "decode_sample",
]
