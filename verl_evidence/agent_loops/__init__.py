"""This project's agent loops, registered in verl's agent-loop registry.

=================== ============================================== =====================================
name                class                                          protocol
=================== ============================================== =====================================
``evidence_search`` :class:`.search_loop.EvidenceSearchAgentLoop`  Search-R1 / EviNote text tags
``eviomni``         :class:`.eviomni_loop.EviOmniAgentLoop`        EviOmni reason/extract + masked answers
=================== ============================================== =====================================

GRACE uses verl's own ``single_turn_agent``. Select a loop per dataset row with
the ``agent_name`` column or for all rows with
``actor_rollout_ref.rollout.agent.default_agent_loop``.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

LOOPS = {
    "evidence_search": "verl_evidence.agent_loops.search_loop.EvidenceSearchAgentLoop",
    "eviomni": "verl_evidence.agent_loops.eviomni_loop.EviOmniAgentLoop",
}


def register_all() -> None:
    """Register every loop of :data:`LOOPS` with verl's ``register(name)``.

    Idempotent: registering sets a dict entry, so calling this again (each
    ``import verl`` in each Ray worker runs the plugin) changes nothing. An entry
    a user already put under the same name (through
    ``rollout.agent.agent_loop_config_path``, with its own kwargs) is kept.
    """
    for name in LOOPS:
        register_loop(name)


def register_loop(name: str) -> None:
    """Register one loop of :data:`LOOPS`; each loop module also calls this for itself when it is done.

    The plugin registers when verl's agent-loop package has been imported. If one of our loop modules is
    what imported it, that module is still half-executed then: its registration is left to its own last line.

    verl's ``register(name)`` does the registering, called here rather than as a class decorator: a decorator
    runs when hydra first imports the module for a user's ``agent_loop_config_path`` entry of the same name
    (a worker without our plugin) and would replace that entry, kwargs and all, for every later trajectory;
    so the registry is read first and a user's entry is kept.
    """
    import importlib
    import sys

    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry, register

    target = LOOPS[name]
    existing = _agent_loop_registry.get(name)
    if existing is not None and existing.get("_target_") != target:
        logger.info("agent loop %r already registered as %s; leaving it", name, existing.get("_target_"))
        return
    module_name, class_name = target.rsplit(".", 1)
    importing = sys.modules.get(module_name)
    if importing is not None and not hasattr(importing, class_name):
        return  # mid-import (see above): it registers itself at its end
    cls = getattr(importlib.import_module(module_name), class_name)
    if existing is not None and len(existing) > 1:
        return  # same class with user kwargs: keep them
    register(name)(cls)
