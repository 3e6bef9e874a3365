"""The ``cpu`` platform of the CPU training mode: torch's CPU as verl's device.

Registered with ``PlatformRegistry.register`` (verl's platform plugin point) by
:func:`verl_evidence.local.cpu_mode.activate`: gloo collectives, and Ray's
logical ``GPU`` resource as the count of training slots (one per trainer
process; ``ray_kwargs.ray_init.num_gpus``), so verl's resource pools and
placement groups work unchanged.
"""

from __future__ import annotations

import contextlib
import platform as _platform_module
import types
from typing import Any

from verl_evidence.local import cpu_mode_selected


class _CPUDeviceModule(types.ModuleType):
    """What verl calls on ``get_torch_device()``, for the CPU.

    torch.cpu has the stream/event/synchronize API; the memory and RNG calls
    verl makes on an accelerator module are answered for the host here (no
    cache to empty, memory as the process and the machine report it). An
    attribute verl needs and this lacks raises AttributeError, never a silent no-op.
    """

    def __init__(self) -> None:
        super().__init__("verl_evidence_cpu_device")
        import torch

        self._torch = torch
        for name in ("synchronize", "Stream", "Event", "current_stream", "stream", "set_device", "device_count"):
            setattr(self, name, getattr(torch.cpu, name))

    def is_available(self) -> bool:
        return True

    def current_device(self) -> str:
        return "cpu"  # verl moves tensors with .to(current_device())

    def empty_cache(self) -> None:
        return None  # the CPU allocator keeps no cache to release

    def ipc_collect(self) -> None:
        return None

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        self._torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def get_rng_state(self, device: Any = None):
        return self._torch.get_rng_state()

    def set_rng_state(self, state, device: Any = None) -> None:
        self._torch.set_rng_state(state)

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        import psutil

        memory = psutil.virtual_memory()
        return memory.available, memory.total

    def memory_allocated(self, device: Any = None) -> int:
        import psutil

        return psutil.Process().memory_info().rss

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    def get_device_name(self, device: Any = None) -> str:
        return _platform_module.processor() or "cpu"


def platform_class():
    from verl.plugin.platform.platform_base import PlatformBase

    class PlatformCPU(PlatformBase):
        """Host CPU as verl's device: gloo collectives, Ray logical GPUs as training slots."""

        _device_module = None

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self):
            if PlatformCPU._device_module is None:
                PlatformCPU._device_module = _CPUDeviceModule()
            return PlatformCPU._device_module

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return cpu_mode_selected()  # never auto-detected: only when asked for

        def current_device(self):
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index) -> None:
            return None

        def synchronize(self, device_index=None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            import torch

            torch.manual_seed(seed)

        manual_seed_all = manual_seed

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0):
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"  # what Ray sets for its logical GPUs; torch's CPU build ignores it

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            # Logical slots: ray.init(num_gpus=N) on a CPU-only machine declares N of them.
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self):
            return None

    return PlatformCPU
