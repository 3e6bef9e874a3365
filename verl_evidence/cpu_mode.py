"""CPU training mode: verl 0.9's own trainer on a machine without accelerators.

Users debug a recipe on a laptop (or in CI) before spending GPU hours: the
same ``python -m verl.trainer.main_ppo`` command, the same agent loops, reward
managers and advantage estimator, with a tiny policy. Selected by
``VERL_PLATFORM=cpu`` (the recipes' ``--smoke`` flag sets it); nothing here
runs otherwise.

What the mode changes, and through which of verl's extension points:

- platform ``cpu`` (``PlatformRegistry.register``): torch's CPU device, gloo
  collectives, and Ray's logical ``GPU`` resource as the count of training
  slots (one per trainer process; ``ray_kwargs.ray_init.num_gpus``), so
  verl's resource pools and placement groups work unchanged;
- the FSDP engine for that platform (``EngineRegistry.register(device="cpu")``);
  FSDP2 only (FSDP1 cannot sync CPU parameters), sdpa attention, fp32;
- rollout ``hf`` (``RolloutReplicaRegistry.register``): a Ray actor per replica
  that generates with Hugging Face ``generate`` through our
  :class:`~verl_evidence.backends.HFGenerationBackend`, behind verl's own
  server client and load balancer, and that receives the actor's weights after
  every step.

Four things verl 0.9 offers no public hook for; they are patched here, and only
here, for the verl versions in :data:`SUPPORTED_VERL` (tests/cpu_mode fails
loudly when verl changes under them):

- the rollout adapter that the trainer's worker builds for weight sync is
  looked up in ``verl.workers.rollout.base._ROLLOUT_REGISTRY`` (a private dict
  with no register function): we add ``("hf", "async")``;
- ``initialize_global_process_group_ray`` builds the backend string
  ``"cpu:gloo,<device>:<backend>"``, which torch rejects for device ``cpu``
  (``"cpu:gloo,cpu:gloo"``): on this platform it is given plain ``gloo``;
- the FSDP engine keeps a forward-only model (the reference policy) under
  ``CPUOffloadPolicy(pin_memory=True)``; pinning needs an accelerator, and
  "offloading" to the CPU from the CPU moves nothing: the policy is built
  without pinning;
- the trainer's replay buffer waits ``poll_interval`` seconds (2 by default,
  not a config key) between checks for finished trajectories, so a step's
  generation time comes in whole multiples of 2 s. On a GPU cluster that is
  noise next to minutes of rollout; a CPU smoke step generates in 4-6 s, so
  the mode polls every :data:`REPLAY_BUFFER_POLL_S` seconds instead
  (``VERL_EVIDENCE_CPU_POLL_S``), unless the caller passed its own interval.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform as _platform_module
import sys
import types
from typing import Any

logger = logging.getLogger(__name__)

PLATFORM_NAME = "cpu"
ROLLOUT_NAME = "hf"
SUPPORTED_VERL = ("0.9.",)  # version prefixes whose private internals the patches below were checked against
SERVER_ACTOR_PREFIX = "verl_evidence_hf_rollout_"
# Each poll is one metadata sync with TransferQueue (a few ms); 2 s of verl's default is ~1 s lost per wait.
REPLAY_BUFFER_POLL_S = 0.1
VERL_REPLAY_BUFFER_POLL_DEFAULT = 2.0  # the default this patch was checked against

_activated = False


def is_selected() -> bool:
    """The mode is on in every process (driver and Ray workers) that sees ``VERL_PLATFORM=cpu``."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


def check_verl_version(version: str | None = None) -> str:
    if version is None:
        import verl

        version = verl.__version__
    if not version.startswith(SUPPORTED_VERL):
        raise RuntimeError(
            f"verl-evidence's CPU training mode supports verl {', '.join(v + 'x' for v in SUPPORTED_VERL)}; "
            f"verl {version} is installed. Unset VERL_PLATFORM=cpu, or install a supported verl."
        )
    return version


# --------------------------------------------------------------------------- platform


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


def _platform_class():
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
            return is_selected()  # never auto-detected: only when asked for

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


# --------------------------------------------------------------------------- rollout


def server_actor_name(replica_rank: int) -> str:
    return f"{SERVER_ACTOR_PREFIX}{replica_rank}"


class HFRolloutServer:
    """One rollout replica on CPU: a Hugging Face causal LM behind verl's server protocol.

    verl's ``LLMServerClient`` (via its load balancer) calls ``generate`` with
    token ids and vLLM-style sampling parameters and reads a ``TokenOutput``;
    the trainer sleeps and wakes replicas around each update; the actor
    worker's ``HFRolloutAdapter`` pushes the new weights with
    ``load_weights`` and the step number with ``set_global_steps``.
    """

    def __init__(self, config, model_config, replica_rank: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from verl.utils.config import omega_conf_to_dataclass

        from verl_evidence.backends import HFGenerationBackend

        if not hasattr(model_config, "local_path"):  # a DictConfig from the replica; HFModelConfig resolves the path
            model_config = omega_conf_to_dataclass(model_config)
        self.config = config
        self.replica_rank = replica_rank
        torch.set_num_threads(max(1, int(os.environ.get("VERL_EVIDENCE_ROLLOUT_THREADS", "1"))))
        path = model_config.local_path
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=model_config.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="sdpa", trust_remote_code=model_config.trust_remote_code
        )
        self.backend = HFGenerationBackend(
            model, tokenizer, default_max_tokens=config.response_length, seed=config.seed if hasattr(config, "seed") else 0
        )
        self.state_names = set(model.state_dict())  # includes tied weights (lm_head.weight) under both names
        self.global_steps: int | None = None
        self.weight_syncs = 0

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ):
        if image_data or video_data:
            raise ValueError("the CPU rollout (rollout.name=hf) serves text-only policies")
        params = dict(sampling_params)
        if "max_tokens" not in params and "max_new_tokens" not in params:
            # As verl's vLLM server: the response budget, capped by what the prompt leaves of the context.
            room = self.config.prompt_length + self.config.response_length - len(prompt_ids)
            params["max_tokens"] = max(1, min(self.config.response_length, room))
        output = await self.backend.generate(request_id, prompt_ids=list(prompt_ids), sampling_params=params)
        output.extra_fields = {"global_steps": self.global_steps}
        return output

    async def load_weights(self, named_tensors: dict[str, Any]) -> int:
        import torch

        unknown = sorted(set(named_tensors) - self.state_names)
        if unknown:
            raise KeyError(f"rollout replica {self.replica_rank}: weights for unknown parameters {unknown[:5]}")
        with self.backend._lock, torch.no_grad():  # never swap weights under a running generate
            state = self.backend.model.state_dict()
            for name, tensor in named_tensors.items():
                state[name].copy_(tensor.to(state[name].dtype))
        self.weight_syncs += 1
        return len(named_tensors)

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def describe(self) -> dict[str, Any]:
        return {"replica_rank": self.replica_rank, "global_steps": self.global_steps, "weight_syncs": self.weight_syncs}

    # Memory management and request control that a GPU engine needs; the CPU replica keeps its
    # weights in host memory and has no KV cache to free, and serves every request to its end.
    async def wake_up(self) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        return None

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


def _replica_class():
    import ray
    from verl.workers.rollout.replica import RolloutMode, RolloutReplica

    class HFRolloutReplica(RolloutReplica):
        """verl's rollout replica for ``rollout.name=hf``: one :class:`HFRolloutServer` actor."""

        async def launch_servers(self) -> None:
            if self.rollout_mode != RolloutMode.HYBRID:
                raise ValueError(
                    "the CPU rollout (rollout.name=hf) runs colocated with the trainer (hybrid engine); "
                    f"{self.rollout_mode.value} rollout replicas are not supported"
                )
            server = (
                ray.remote(HFRolloutServer)
                .options(name=server_actor_name(self.replica_rank), num_cpus=0, max_concurrency=self.max_concurrency)
                .remote(self.config, self.model_config, self.replica_rank)
            )
            await server.describe.remote()  # surfaces a failed model load here, not at the first generate
            self.servers = [server]
            self._server_handle = server
            self._server_address = f"hf-rollout-{self.replica_rank}"  # no HTTP endpoint: the load balancer's key

    return HFRolloutReplica


def _register_rollout_replica() -> None:
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(ROLLOUT_NAME, _replica_class)


def _adapter_base():
    from verl.workers.rollout.base import BaseRollout

    return BaseRollout


def _build_adapter_class():
    BaseRollout = _adapter_base()

    class HFRolloutAdapter(BaseRollout):
        """Lives in each trainer worker; sends the actor's weights to its replica's server after each step."""

        def __init__(self, config, model_config, device_mesh, replica_rank: int = -1) -> None:
            super().__init__(config, model_config, device_mesh)
            rank = int(os.environ.get("RANK", "0"))
            world = (
                self.config.tensor_model_parallel_size
                * self.config.data_parallel_size
                * self.config.pipeline_model_parallel_size
            )
            self.replica_rank = rank // world if replica_rank == -1 else replica_rank
            self.is_leader = rank % world == 0
            self.sleep_level = 2

        async def resume(self, tags: list[str]) -> None:
            return None  # the replica keeps its weights in host memory

        async def release(self) -> None:
            return None

        async def update_weights(self, weights, wire_format: str = "named_tensors", **kwargs) -> None:
            import ray
            import torch

            if wire_format != "named_tensors":
                raise ValueError(f"the CPU rollout takes full named tensors, not {wire_format!r} weight updates")
            if kwargs.get("peft_config") is not None:
                raise ValueError("the CPU rollout takes merged weights: set actor_rollout_ref.model.lora.merge=true")
            # Every rank iterates the generator: FSDP gathers each full tensor collectively.
            tensors = {name: tensor.detach().to("cpu", dtype=torch.float32).clone() for name, tensor in weights}
            if not self.is_leader:
                return
            server = ray.get_actor(server_actor_name(self.replica_rank))
            await server.load_weights.remote(tensors)
            if kwargs.get("global_steps") is not None:
                await server.set_global_steps.remote(kwargs["global_steps"])

    return HFRolloutAdapter


def __getattr__(name: str):
    # verl imports the adapter by dotted path inside its workers; build the BaseRollout subclass lazily so
    # importing this module (at plugin load, inside ``import verl``) pulls in no worker code.
    if name == "HFRolloutAdapter":
        cls = _build_adapter_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


# --------------------------------------------------------------------------- engine and the patches


def _register_engine() -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    registered = EngineRegistry._engines.get("language_model", {}).get("fsdp2", {})
    if PLATFORM_NAME not in registered:
        EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device=PLATFORM_NAME)(
            transformer_impl.FSDPEngineWithLMHead
        )
    _patch_offload_policy(transformer_impl)


def _patch_offload_policy(transformer_impl) -> None:
    policy = getattr(transformer_impl, "CPUOffloadPolicy", None)
    if policy is None:
        raise RuntimeError("verl's FSDP engine no longer imports CPUOffloadPolicy; the CPU mode needs checking")
    if getattr(policy, "_verl_evidence_cpu", False):
        return

    class UnpinnedCPUOffloadPolicy(policy):
        _verl_evidence_cpu = True

        def __init__(self, pin_memory: bool = True) -> None:
            super().__init__(pin_memory=False)  # pinning needs an accelerator

    transformer_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def _patch_rollout_adapter_registry() -> None:
    from verl.workers.rollout import base

    registry = getattr(base, "_ROLLOUT_REGISTRY", None)
    if not isinstance(registry, dict) or ("vllm", "async") not in registry:
        raise RuntimeError(
            "verl.workers.rollout.base._ROLLOUT_REGISTRY is gone or changed shape in this verl; "
            "the CPU rollout cannot register its weight-sync adapter"
        )
    registry[(ROLLOUT_NAME, "async")] = f"{__name__}.HFRolloutAdapter"


def _patch_process_group_backend() -> None:
    import datetime

    import torch.distributed
    import verl.utils.distributed as distributed

    ray_variant = distributed.initialize_global_process_group_ray
    if getattr(ray_variant, "_verl_evidence_cpu", False):
        return
    torchrun_variant = distributed.initialize_global_process_group

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        # verl's default is "cpu:gloo,<device>:<backend>"; for device cpu that names cpu twice.
        return ray_variant(timeout_second=timeout_second, backend=backend or "gloo")

    def initialize_global_process_group(timeout_second=36000):
        # verl's torchrun entry points (the SFT trainer): same as verl's, with a backend torch accepts on CPU.
        torch.distributed.init_process_group(
            backend="gloo",
            timeout=datetime.timedelta(seconds=timeout_second),
            init_method=os.environ.get("DIST_INIT_METHOD", None),
        )
        return int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    for replacement, original in (
        (initialize_global_process_group_ray, ray_variant),
        (initialize_global_process_group, torchrun_variant),
    ):
        replacement._verl_evidence_cpu = True
        replacement.__wrapped__ = original
        setattr(distributed, original.__name__, replacement)
        # Modules that imported the function by name before this ran hold the original.
        for module_name, module in list(sys.modules.items()):
            if module_name.startswith("verl.") and getattr(module, original.__name__, None) is original:
                setattr(module, original.__name__, replacement)


def replay_buffer_poll_s() -> float:
    raw = os.environ.get("VERL_EVIDENCE_CPU_POLL_S", "").strip()
    if not raw:
        return REPLAY_BUFFER_POLL_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"VERL_EVIDENCE_CPU_POLL_S must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"VERL_EVIDENCE_CPU_POLL_S must be > 0, got {raw!r}")
    return value


def _patch_replay_buffer_poll() -> None:
    import functools
    import inspect

    from verl.trainer.ppo.v1 import replay_buffer

    cls = replay_buffer.ReplayBuffer
    original = cls.__init__
    if getattr(original, "_verl_evidence_cpu", False):
        return
    signature = inspect.signature(original)
    parameter = signature.parameters.get("poll_interval")
    if parameter is None or parameter.default != VERL_REPLAY_BUFFER_POLL_DEFAULT:
        raise RuntimeError(
            "verl's ReplayBuffer no longer takes poll_interval (default 2.0) in this verl; "
            "the CPU mode's shorter poll needs checking"
        )
    poll_s = replay_buffer_poll_s()

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        bound = signature.bind_partial(self, *args, **kwargs)
        if "poll_interval" not in bound.arguments:  # a caller's own interval wins
            kwargs["poll_interval"] = poll_s
        original(self, *args, **kwargs)

    __init__._verl_evidence_cpu = True
    cls.__init__ = __init__


# --------------------------------------------------------------------------- activation


def activate() -> None:
    """Register the CPU platform, engine and rollout with verl. Idempotent; a no-op unless selected."""
    global _activated
    if _activated or not is_selected():
        return
    check_verl_version()
    from verl.plugin.platform.platform_manager import PlatformRegistry

    from verl_evidence.registration import when_imported

    PlatformRegistry.register(platform=PLATFORM_NAME)(_platform_class())  # now: verl resolves its platform early
    # The rest waits for the verl module it changes (see verl_evidence.registration): a Ray worker that never
    # builds an engine or a rollout does not import them for us.
    when_imported("verl.workers.engine", _register_engine)
    when_imported("verl.workers.rollout.replica", _register_rollout_replica)
    when_imported("verl.workers.rollout.base", _patch_rollout_adapter_registry)
    when_imported("verl.utils.distributed", _patch_process_group_backend)
    when_imported("verl.trainer.ppo.v1.replay_buffer", _patch_replay_buffer_poll)
    _activated = True
    logger.info("verl-evidence CPU training mode active (platform %s, rollout %s)", PLATFORM_NAME, ROLLOUT_NAME)
