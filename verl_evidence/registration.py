"""Register an adapter in a verl registry when that registry's module is imported, not before.

verl runs our ``verl.plugins`` entry point in every process that imports verl:
the driver, the task runner and every Ray worker (FSDP workers, rollout
replicas, agent-loop and reward workers). Importing the three registries we
fill (``core_algos``, the reward-manager and the agent-loop packages) costs
2-4 s each on top of verl's own ~7 s, and most workers never look in all three.
So the plugin only asks to be told when a registry module has finished
importing, and registers there; a process that never imports a registry never
pays for it. Measured on 2 vCPUs: ``import verl`` 14 s with eager registration,
~8 s with this (docs/debug-on-cpu.md).

Standard Python only (a ``sys.meta_path`` finder that wraps the module's loader),
no verl internals: a registry that is already imported is filled at once.
Hand-written rather than ``wrapt.register_post_import_hook``: wrapt fires a hook
at once for a module that is in ``sys.modules`` but still executing, which would
register into a half-built registry; this one waits for the module to finish.

Every adapter is registered here and only here (:data:`ADAPTERS`), through verl's public
registration functions, once both sides exist: verl's registry module and ours. Importing
verl's registry imports our adapter module; our module's import finishing registers it.
The second half is what lets one of our modules be imported first: it imports verl's
registry at its top, so at that moment its own class does not exist yet.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import ModuleType

logger = logging.getLogger(__name__)

_lock = threading.RLock()
_pending: dict[str, list[Callable[[], None]]] = {}


def when_imported(module_name: str, register: Callable[[], None]) -> None:
    """Run ``register()`` once ``module_name`` has been executed: now if it already was, else right after."""
    with _lock:
        module = sys.modules.get(module_name)
        if module is not None and not _initializing(module):
            pass  # fall through and register now, outside the lock
        else:
            _pending.setdefault(module_name, []).append(register)
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
            return
    register()


def _initializing(module: ModuleType) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(spec is not None and getattr(spec, "_initializing", False))


class _RegisterAfterExec(importlib.abc.Loader):
    """The module's own loader, then the registrations waiting for it."""

    def __init__(self, loader: importlib.abc.Loader, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        with _lock:
            callbacks = _pending.pop(self._name, [])
        for register in callbacks:
            register()  # an error here is ours and names itself; verl's import fails with it, visibly

    def __getattr__(self, attribute: str):  # get_source, get_code, is_package, ...: the real loader's
        return getattr(self._loader, attribute)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        with _lock:
            if fullname not in _pending:
                return None
        for finder in sys.meta_path:  # the finder that would have found it without us
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RegisterAfterExec(spec.loader, fullname)
        return spec


_FINDER = _AfterImportFinder()


AGENT_LOOPS = "verl.experimental.agent_loop"
REWARD_MANAGERS = "verl.experimental.reward_loop.reward_manager"
ADVANTAGE_ESTIMATORS = "verl.trainer.ppo.core_algos"


@dataclass(frozen=True)
class Adapter:
    """One of our classes or functions, under ``name`` in the verl registry that ``registry`` (its module) holds."""

    registry: str
    name: str
    target: str  # "package.module.attribute"

    @property
    def module(self) -> str:
        return self.target.rsplit(".", 1)[0]


ADAPTERS = (
    Adapter(AGENT_LOOPS, "evidence_search", "verl_evidence.agent_loops.search_loop.EvidenceSearchAgentLoop"),
    Adapter(AGENT_LOOPS, "eviomni", "verl_evidence.agent_loops.eviomni_loop.EviOmniAgentLoop"),
    Adapter(REWARD_MANAGERS, "eviomni", "verl_evidence.reward_managers.managers.EviOmniRewardManager"),
    Adapter(REWARD_MANAGERS, "evinote", "verl_evidence.reward_managers.managers.EviNoteRewardManager"),
    Adapter(REWARD_MANAGERS, "grace", "verl_evidence.reward_managers.managers.GraceRewardManager"),
    Adapter(REWARD_MANAGERS, "composite", "verl_evidence.reward_managers.managers.CompositeRewardManager"),
    Adapter(ADVANTAGE_ESTIMATORS, "grpo_clipstd", "verl_evidence.trainer.advantage.compute_grpo_clipstd_advantage"),
)


def names(registry: str) -> dict[str, str]:
    """Our names in one of verl's registries, each with its target."""
    return {adapter.name: adapter.target for adapter in ADAPTERS if adapter.registry == registry}


def register(adapter: Adapter) -> None:
    """Put ``adapter`` in its verl registry with verl's public function; doing it again changes nothing."""
    module_name, attribute = adapter.target.rsplit(".", 1)
    target = getattr(importlib.import_module(module_name), attribute)
    if adapter.registry == AGENT_LOOPS:
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
        from verl.experimental.agent_loop.agent_loop import register as register_loop

        # verl has no public reader. An entry already under our name that is not plainly ours is a user's
        # (agent_loop_config_path, maybe with kwargs, when our plugin was not loaded before it): keep it.
        existing = _agent_loop_registry.get(adapter.name)
        if existing is not None and existing != {"_target_": adapter.target}:
            logger.info("agent loop %r already registered as %s; leaving it", adapter.name, existing)
            return
        register_loop(adapter.name)(target)
    elif adapter.registry == REWARD_MANAGERS:
        from verl.experimental.reward_loop.reward_manager import register as register_manager

        register_manager(adapter.name)(target)
    elif adapter.registry == ADVANTAGE_ESTIMATORS:
        from verl.trainer.ppo.core_algos import register_adv_est

        register_adv_est(adapter.name)(target)
    else:
        raise ValueError(f"{adapter.target}: no verl registry {adapter.registry!r} (see ADAPTERS)")


def register_all(registry: str | None = None) -> None:
    """Register every adapter (of one ``registry``) now, importing them: for a test that cleared a registry."""
    for adapter in ADAPTERS:
        if registry in (None, adapter.registry):
            register(adapter)


_installed = False


def install() -> None:
    """Register each adapter as soon as both its verl registry and its module exist, in this process.

    Called by ``import verl_evidence``, before any of our adapter modules can be found, so that each of
    their imports is watched. Nothing is imported now: a process that never imports a registry pays nothing.
    """
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    for adapter in ADAPTERS:
        when_imported(adapter.registry, partial(importlib.import_module, adapter.module))
        when_imported(adapter.module, partial(register, adapter))
