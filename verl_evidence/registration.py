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
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable
from types import ModuleType

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
