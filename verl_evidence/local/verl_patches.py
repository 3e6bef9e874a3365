"""The CPU training mode's workarounds for hooks verl 0.9 does not offer, gated on verl's version.

Everything here changes verl's private internals, so it lives in this one
module, runs only for the verl versions in :data:`SUPPORTED_VERL`
(:func:`check_verl_version`), and tests/cpu_mode pins each internal it relies
on (those tests fail loudly when verl changes under them):

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
  (``VERL_EVIDENCE_CPU_POLL_S``), unless the caller passed its own interval;
- under verl's ``rollout.full_determinism`` (``VERL_FULL_DETERMINISM=1``, which
  verl's ``main_ppo`` sets with ``PYTHONHASHSEED`` = the rollout seed), a run
  repeats with its seed only if every step's batch does. verl's trainer names
  each prompt with ``uuid.uuid4()`` and its replay buffer hands the batch over
  in the order trajectories finished, so the trainer's mini-batches hold other
  samples from run to run. The mode draws the names from a generator seeded
  with that seed, and orders a step's batch by name and sample
  (:func:`patch_trainer_uids`, :func:`patch_batch_order`). Without the switch
  both are verl's own.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import sys
import uuid

from verl_evidence.local.cpu_rollout import ADAPTER_PATH, ROLLOUT_NAME

logger = logging.getLogger(__name__)

SUPPORTED_VERL = ("0.9.",)  # version prefixes whose private internals the patches below were checked against
# Each poll is one metadata sync with TransferQueue (a few ms); 2 s of verl's default is ~1 s lost per wait.
REPLAY_BUFFER_POLL_S = 0.1
VERL_REPLAY_BUFFER_POLL_DEFAULT = 2.0  # the default this patch was checked against


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


def patch_offload_policy(transformer_impl) -> None:
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


# Elements of logits per logsumexp call in :func:`patch_log_probs` (64 MB of fp32: a chunk of rows, not the batch)
LOG_PROB_CHUNK_ELEMENTS = 1 << 24


def patch_log_probs(transformer_impl) -> None:
    """The FSDP engine's token log-probs on CPU, in chunks of rows instead of verl's loop over single rows.

    Without flash-attn's cross-entropy, verl's ``logprobs_from_logits_v2`` calls ``logsumexp`` once per row to
    bound peak memory: with padding removed a row is a token, so ~20k Python-level calls per smoke step (12 % of
    the actor worker's CPU in py-spy). Same formula (label logit minus logsumexp), same float32/float64 scope;
    anything else (bfloat16, an accelerator) goes to verl's own function.
    """
    import torch

    original = getattr(transformer_impl, "logprobs_from_logits", None)
    if original is None:
        raise RuntimeError(
            "verl.workers.engine.fsdp.transformer_impl no longer imports logprobs_from_logits in this verl; "
            "the CPU mode's log-prob patch must be checked against it"
        )
    if getattr(original, "_verl_evidence_cpu", False):
        return

    def logprobs_from_logits(logits, labels, inplace_backward=True):
        if logits.device.type != "cpu" or logits.dtype not in (torch.float32, torch.float64):
            return original(logits, labels, inplace_backward=inplace_backward)
        picked = torch.gather(logits, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
        rows = logits.reshape(-1, logits.shape[-1])
        chunk = max(1, LOG_PROB_CHUNK_ELEMENTS // logits.shape[-1])
        normalizer = torch.cat([torch.logsumexp(part, dim=-1) for part in rows.split(chunk)])
        return picked - normalizer.view(picked.shape)

    logprobs_from_logits._verl_evidence_cpu = True
    logprobs_from_logits.__wrapped__ = original
    transformer_impl.logprobs_from_logits = logprobs_from_logits


def patch_rollout_adapter_registry() -> None:
    from verl.workers.rollout import base

    registry = getattr(base, "_ROLLOUT_REGISTRY", None)
    if not isinstance(registry, dict) or ("vllm", "async") not in registry:
        raise RuntimeError(
            "verl.workers.rollout.base._ROLLOUT_REGISTRY is gone or changed shape in this verl; "
            "the CPU rollout cannot register its weight-sync adapter"
        )
    registry[(ROLLOUT_NAME, "async")] = ADAPTER_PATH


def patch_process_group_backend() -> None:
    import datetime

    import torch.distributed
    from verl.utils import distributed

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


def patch_replay_buffer_poll() -> None:
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


def full_determinism() -> bool:
    """verl's ``rollout.full_determinism`` switch, as ``main_ppo`` hands it to every Ray worker."""
    return os.environ.get("VERL_FULL_DETERMINISM") == "1"


def determinism_seed() -> int:
    """The run's rollout seed, which ``main_ppo`` puts in ``PYTHONHASHSEED`` under full determinism. Missing (a worker
    that did not inherit ``main_ppo``'s environment), it is 0, with a warning: every seed names prompts alike."""
    raw = os.environ.get("PYTHONHASHSEED", "").strip()
    if raw.isdigit():
        return int(raw)
    logger.warning(
        "VERL_FULL_DETERMINISM=1 but PYTHONHASHSEED=%r is not the rollout seed verl's main_ppo sets: prompt names "
        "are drawn with seed 0, the same for every rollout seed",
        raw,
    )
    return 0


class SeededUUIDs:
    """The ``uuid`` module, as verl's trainer sees it: under full determinism ``uuid4()`` draws its 128 bits from a
    generator seeded with the run's seed (the same prompt names in every run); otherwise the real ``uuid4``."""

    def __init__(self) -> None:
        self._random: random.Random | None = None

    def __getattr__(self, name: str):
        return getattr(uuid, name)

    def uuid4(self) -> uuid.UUID:
        if not full_determinism():
            return uuid.uuid4()
        if self._random is None:
            self._random = random.Random(determinism_seed())
        return uuid.UUID(int=self._random.getrandbits(128), version=4)


def patch_trainer_uids() -> None:
    from verl.trainer.ppo.v1 import trainer_base

    if isinstance(trainer_base.uuid, SeededUUIDs):
        return
    if trainer_base.uuid is not uuid:
        raise RuntimeError(
            "verl's trainer_base no longer imports the uuid module; the CPU mode's seeded uids need checking"
        )
    trainer_base.uuid = SeededUUIDs()


def batch_position(key: str) -> tuple[str, int, int]:
    """Where a trajectory goes in a deterministic batch: its replay-buffer key ``{uid}_{session}_{output}`` as (the
    prompt's name, the sample, the agent loop output), numbers compared as numbers."""
    uid, session, output = key.rsplit("_", 2)
    return uid, int(session), int(output)


def patch_batch_order() -> None:
    import functools

    from verl.trainer.ppo.v1 import replay_buffer

    cls = replay_buffer.ReplayBuffer
    original = cls._materialize_batch
    if getattr(original, "_verl_evidence_cpu", False):
        return

    @functools.wraps(original)
    def _materialize_batch(self, *args, **kwargs):
        meta = original(self, *args, **kwargs)
        if not full_determinism():
            return meta
        order = sorted(range(len(meta.keys)), key=lambda i: batch_position(meta.keys[i]))
        return dataclasses.replace(meta, keys=[meta.keys[i] for i in order], tags=[meta.tags[i] for i in order])

    _materialize_batch._verl_evidence_cpu = True
    cls._materialize_batch = _materialize_batch
