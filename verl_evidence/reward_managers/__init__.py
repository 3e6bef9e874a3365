"""Reward-loop managers for verl 0.9.

``eviomni``, ``evinote``, ``grace`` and ``composite`` are selectable with
``reward.reward_manager.name=...``: :mod:`verl_evidence.registration` registers
them in every process that imports verl's reward-manager registry or this package.
"""

from verl_evidence.registration import REWARD_MANAGERS, names
from verl_evidence.reward_managers.managers import (
    CompositeRewardManager,
    EvidenceRewardManager,
    EviNoteRewardManager,
    EviOmniRewardManager,
    GraceRewardManager,
)
from verl_evidence.reward_managers.sample import Sample, decode_sample
from verl_evidence.reward_managers.scorers import ERROR_KEY, Scorer, build_composite, build_scorer

MANAGER_NAMES = tuple(names(REWARD_MANAGERS))

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
