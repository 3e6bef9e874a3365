"""Rollout ``hf`` of the CPU training mode: a Hugging Face causal LM as verl's rollout replica.

Registered with ``RolloutReplicaRegistry.register`` by
:func:`verl_evidence.local.cpu_mode.activate`: a Ray actor per replica
(:class:`HFRolloutServer`) that generates with a Hugging Face causal LM
through :class:`~verl_evidence.local.backends.HFGenerationBackend`, behind
verl's own server client and load balancer, and that receives the actor's
weights after every step from :class:`HFRolloutAdapter` in each trainer worker.
"""

from __future__ import annotations

import os
from typing import Any

ROLLOUT_NAME = "hf"
SERVER_ACTOR_PREFIX = "verl_evidence_hf_rollout_"
# The dotted path verl imports the weight-sync adapter from (see verl_patches.patch_rollout_adapter_registry).
ADAPTER_PATH = f"{__name__}.HFRolloutAdapter"


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

        from verl_evidence.local.backends import HFGenerationBackend

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
            model, tokenizer, default_max_tokens=config.response_length, seed=getattr(config, "seed", 0)
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


def replica_class():
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


def register_rollout_replica() -> None:
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(ROLLOUT_NAME, replica_class)


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
