"""This project's agent loops, registered in verl's agent-loop registry.

=================== ============================================== =====================================
name                class                                          protocol
=================== ============================================== =====================================
``evidence_search`` :class:`.search_loop.EvidenceSearchAgentLoop`  Search-R1 / EviNote text tags
``eviomni``         :class:`.eviomni_loop.EviOmniAgentLoop`        EviOmni reason/extract + masked answers
=================== ============================================== =====================================

Registered by :mod:`verl_evidence.registration`. GRACE uses verl's own
``single_turn_agent``. Select a loop per dataset row with the ``agent_name``
column or for all rows with ``actor_rollout_ref.rollout.agent.default_agent_loop``.
"""

from __future__ import annotations

from verl_evidence.registration import AGENT_LOOPS, names

LOOPS = names(AGENT_LOOPS)  # name -> class; verl_evidence.registration registers them
