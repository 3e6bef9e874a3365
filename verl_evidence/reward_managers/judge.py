"""NLI judge for EviNote's Evidence Quality Reward (EQR).

Three layers, each usable alone:

- :class:`NLIJudge` wraps any Hugging Face sequence-classification NLI model and
  returns the probability of its entailment class for (premise, hypothesis)
  pairs, in batches, truncating only the premise by tokens.
- :class:`BatchingJudge` collects requests that arrive concurrently (from many
  ``run_single`` coroutines) for a few milliseconds, or until a batch is full,
  and answers them with one forward pass (the retrieval server's batcher).
- :class:`NLIJudgeActor` is that batching judge inside an async Ray actor, so one
  model instance (on its own GPU or on CPU) serves every reward worker of a job.

:func:`connect_judge` turns a :class:`JudgeConfig` (read from
``reward.reward_kwargs.nli_*``) into a client with one async method,
``entailment_probs``, backed by either the shared actor or an in-process judge.
A model that cannot be loaded raises :class:`NLIJudgeLoadError` naming the model,
at construction time, so a misconfigured job stops at start-up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field

logger = logging.getLogger(__name__)

DEFAULT_MAX_LENGTH = 512
# The JudgeConfig fields that configure the model itself (NLIJudge's keywords); the rest place and batch it.
_MODEL_SETTINGS = ("device", "batch_size", "max_length", "fp16_on_gpu", "torch_threads")


class NLIJudgeLoadError(RuntimeError):
    """The NLI model could not be loaded or is not an NLI classifier."""


def find_entailment_index(id2label: Mapping[Any, str], model_name: str) -> int:
    """Index of the class whose label contains "entail" (case-insensitive).

    Never a hard-coded position: MNLI checkpoints disagree on the label order.
    """
    lowered = {int(index): str(label).lower() for index, label in id2label.items()}
    entail_labels = {index: label for index, label in lowered.items() if "entail" in label}
    # "not_entailment" (binary RTE/QNLI heads) also contains "entail": only the positive class counts.
    matches = [index for index, label in entail_labels.items() if not label.startswith("not")]
    if len(matches) != 1:
        raise NLIJudgeLoadError(
            f"NLI model {model_name!r} has no unique entailment class in config.id2label={dict(id2label)}; "
            "expected exactly one label containing 'entail'"
        )
    return matches[0]


class JudgeConfig(BaseModel):
    """The judge's settings, the one list: read from ``reward.reward_kwargs`` keys prefixed ``nli_``
    (``nli_model``, ``nli_batch_size`` ...), and documented from these fields (docs/configuration.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(description="NLI checkpoint, hub name or local directory (required by `evinote`)")
    device: str = Field("auto", description="`auto` (GPU if the actor has one), `cpu`, `cuda`, `cuda:1`")
    batch_size: int = Field(32, description="pairs per forward pass")
    max_length: int | None = Field(
        None, description="token limit of a pair (null: the model's limit); only the premise is truncated"
    )
    fp16_on_gpu: bool = Field(True, description="float16 weights on GPU")
    in_process: bool = Field(False, description="load the judge in each reward worker instead of one shared Ray actor")
    num_gpus: float = Field(0.0, description="GPUs reserved for the judge actor (e.g. 1, or 0.2 to share one)")
    num_cpus: float = Field(1.0, description="CPUs reserved for the judge actor")
    max_wait_ms: float = Field(5.0, description="how long a batch waits for more requests")
    actor_name: str | None = Field(
        None, description="name of the shared actor (null: derived from model, device, max length)"
    )
    detached: bool = Field(False, description="detached actor, outlives the worker that created it")
    torch_threads: int | None = Field(
        None,
        description=(
            "torch threads of a CPU judge (null: the actor uses its `num_cpus`, in-process leaves torch's setting)"
        ),
    )

    PREFIX: ClassVar[str] = "nli_"

    @classmethod
    def from_reward_kwargs(cls, reward_kwargs: Mapping[str, Any]) -> JudgeConfig:
        known = set(cls.model_fields)
        values = {
            key[len(cls.PREFIX) :]: value
            for key, value in reward_kwargs.items()
            if key.startswith(cls.PREFIX) and key[len(cls.PREFIX) :] in known
        }
        unknown = sorted(k for k in reward_kwargs if k.startswith(cls.PREFIX) and k[len(cls.PREFIX) :] not in known)
        if unknown:
            raise ValueError(f"unknown NLI judge options {unknown}; known: {sorted(cls.PREFIX + k for k in known)}")
        if not values.get("model"):
            raise ValueError(
                "the evinote reward needs an NLI model: set +reward.reward_kwargs.nli_model=<hub name or local path>"
            )
        return cls(**values)

    @property
    def actor_torch_threads(self) -> int:
        """CPU threads of the shared actor: as set, else the CPUs it reserves."""
        if self.torch_threads is not None:
            return int(self.torch_threads)
        return max(1, int(self.num_cpus))

    @property
    def resolved_actor_name(self) -> str:
        if self.actor_name:
            return self.actor_name
        digest = hashlib.sha1(f"{self.model}|{self.device}|{self.max_length}".encode()).hexdigest()[:10]
        return f"verl_evidence_nli_judge_{digest}"


def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class NLIJudge:
    """Entailment probabilities from an HF ``AutoModelForSequenceClassification``.

    ``NLIJudge(model_name_or_path, device="cpu", batch_size=8)``: the keywords are :class:`JudgeConfig`'s
    model settings (``device``, ``batch_size``, ``max_length``, ``fp16_on_gpu``, ``torch_threads``), with
    its defaults; :meth:`from_config` takes a whole config. ``max_length`` None is the tokenizer's
    ``model_max_length`` capped by the model's position limit. ``torch_threads`` sets torch's intra-op
    threads on CPU (process-wide; None leaves torch's setting): batched scoring gains most from a small,
    explicit count, since on a shared CPU extra spinning threads slow every forward pass.
    """

    def __init__(self, model_name_or_path: str, **settings: Any) -> None:
        unknown = sorted(set(settings) - set(_MODEL_SETTINGS))
        if unknown:
            raise TypeError(f"NLIJudge got unknown setting(s) {unknown}; known: {list(_MODEL_SETTINGS)}")
        self.config = config = JudgeConfig(model=str(model_name_or_path), **settings)
        batch_size, torch_threads = config.batch_size, config.torch_threads
        if batch_size < 1:
            raise ValueError(f"NLI judge batch_size must be >= 1, got {batch_size}")
        if torch_threads is not None and int(torch_threads) < 1:
            raise ValueError(f"NLI judge torch_threads must be >= 1 or None, got {torch_threads}")
        self.model_name = str(model_name_or_path)
        if os.path.isabs(self.model_name) and not os.path.exists(self.model_name):  # a hub id is never absolute
            # before seconds of importing torch and transformers: a judge actor that cannot start says so at once
            raise NLIJudgeLoadError(f"NLI judge could not load model {self.model_name!r}: no such directory")

        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.batch_size = int(batch_size)
        self.device = _resolve_device(config.device)
        if torch_threads is not None and self.device == "cpu":
            torch.set_num_threads(int(torch_threads))
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_name)
            dtype = torch.float16 if (config.fp16_on_gpu and self.device.startswith("cuda")) else torch.float32
            self.model = AutoModelForSequenceClassification.from_pretrained(self.model_name, dtype=dtype)
            self.model.to(self.device).eval()
        except Exception as error:  # any loading failure must name the model
            raise NLIJudgeLoadError(f"NLI judge could not load model {self.model_name!r}: {error}") from error
        self.entailment_index = find_entailment_index(self.model.config.id2label, self.model_name)
        self.entailment_label = self.model.config.id2label[self.entailment_index]
        self.max_length = int(config.max_length) if config.max_length else self._default_max_length()
        # The model is not safe to call from several threads at once.
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: JudgeConfig, torch_threads: int | None = None) -> NLIJudge:
        """The judge of ``config`` (``torch_threads`` given: instead of the config's)."""
        settings = {name: getattr(config, name) for name in _MODEL_SETTINGS}
        if torch_threads is not None:
            settings["torch_threads"] = torch_threads
        return cls(config.model, **settings)

    def _default_max_length(self) -> int:
        limits = [DEFAULT_MAX_LENGTH]
        tokenizer_limit = getattr(self.tokenizer, "model_max_length", None)
        if isinstance(tokenizer_limit, int) and 0 < tokenizer_limit < 1_000_000:
            limits = [tokenizer_limit]
        position_limit = getattr(self.model.config, "max_position_embeddings", None)
        if isinstance(position_limit, int) and position_limit > 0:
            limits.append(position_limit)
        return min(limits)

    def describe(self) -> dict[str, Any]:
        import torch

        return {
            "model": self.model_name,
            "device": self.device,
            "entailment_index": self.entailment_index,
            "entailment_label": self.entailment_label,
            "max_length": self.max_length,
            "batch_size": self.batch_size,
            "torch_threads": torch.get_num_threads(),
        }

    def _encode(self, premises: list[str], hypotheses: list[str]) -> dict[str, Any]:
        """Tokenize pairs, cutting tokens from the premise only.

        A hypothesis too long to fit even with an empty premise cannot use
        ``only_first``; such pairs alone fall back to ``longest_first``.
        """
        try:
            return self.tokenizer(
                premises,
                hypotheses,
                truncation="only_first",
                max_length=self.max_length,
                padding=True,
                return_tensors="pt",
            )
        except Exception:  # some hypothesis alone exceeds max_length: handle the pairs one by one
            pass
        rows = []
        for premise, hypothesis in zip(premises, hypotheses):
            try:
                row = self.tokenizer(premise, hypothesis, truncation="only_first", max_length=self.max_length)
            except Exception:
                logger.warning("NLI hypothesis longer than max_length=%d; truncating both sides", self.max_length)
                row = self.tokenizer(premise, hypothesis, truncation="longest_first", max_length=self.max_length)
            rows.append(dict(row))
        return self.tokenizer.pad(rows, padding=True, return_tensors="pt")

    def entailment_probs(self, premises: Sequence[str], hypotheses: Sequence[str]) -> list[float]:
        """P(entailment | premise, hypothesis) for each pair, in input order."""
        import torch

        premises, hypotheses = [str(p) for p in premises], [str(h) for h in hypotheses]
        if len(premises) != len(hypotheses):
            raise ValueError(f"got {len(premises)} premises but {len(hypotheses)} hypotheses")
        # Batches of similar length waste less compute on padding; results go back in input order.
        order = sorted(range(len(premises)), key=lambda i: len(premises[i]) + len(hypotheses[i]))
        probabilities = [0.0] * len(premises)
        with self._lock, torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                rows = order[start : start + self.batch_size]
                encoded = self._encode([premises[i] for i in rows], [hypotheses[i] for i in rows])
                encoded = {key: value.to(self.device) for key, value in encoded.items()}
                logits = self.model(**encoded).logits.float()
                for row, value in zip(rows, torch.softmax(logits, dim=-1)[:, self.entailment_index].tolist()):
                    probabilities[row] = value
        return probabilities


class BatchingJudge:
    """Micro-batches concurrent ``entailment_probs`` calls into forward passes.

    The server's batcher (:class:`retrieval_server.batching.BacklogBatcher`), its
    batches counted in pairs: a call waits up to ``max_wait_ms`` for company unless
    ``max_batch_size`` pairs are already waiting, then every waiting call (up to
    that many pairs) is answered by one forward pass. The forward pass runs in a
    dedicated thread so the event loop keeps accepting requests meanwhile.
    """

    def __init__(self, judge: NLIJudge, max_batch_size: int | None = None, max_wait_ms: float = 5.0) -> None:
        from retrieval_server.batching import BacklogBatcher

        self.judge = judge
        self.max_batch_size = int(max_batch_size or judge.batch_size)
        self.max_wait_s = max(0.0, float(max_wait_ms)) / 1000.0
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="nli-judge")
        self._batcher = BacklogBatcher(
            self._forward, self.max_batch_size, self.max_wait_s, size_of=lambda call: len(call[0])
        )
        self.forward_batches = 0  # number of batched model calls, for tests and logs

    async def entailment_probs(self, premises: Sequence[str], hypotheses: Sequence[str]) -> list[float]:
        premises, hypotheses = list(premises), list(hypotheses)
        if len(premises) != len(hypotheses):
            raise ValueError(f"got {len(premises)} premises but {len(hypotheses)} hypotheses")
        if not premises:
            return []
        return await self._batcher.submit((premises, hypotheses))

    async def _forward(self, calls: list[tuple[list[str], list[str]]]) -> list[list[float]]:
        """One forward pass over every pair of ``calls``; each call's probabilities, in order."""
        premises = [p for call_premises, _ in calls for p in call_premises]
        hypotheses = [h for _, call_hypotheses in calls for h in call_hypotheses]
        loop = asyncio.get_running_loop()
        probabilities = await loop.run_in_executor(self._executor, self.judge.entailment_probs, premises, hypotheses)
        self.forward_batches += 1
        answers, offset = [], 0
        for call_premises, _ in calls:
            answers.append(probabilities[offset : offset + len(call_premises)])
            offset += len(call_premises)
        return answers

    def close(self) -> None:
        """Stop the batcher and the forward thread (pending callers get CancelledError)."""
        self._batcher.close()
        self._executor.shutdown(wait=False)


class NLIJudgeActor:
    """Ray actor body: one :class:`BatchingJudge` shared by all reward workers."""

    def __init__(self, config: JudgeConfig) -> None:
        self._judge = NLIJudge.from_config(config, torch_threads=config.actor_torch_threads)
        self._batcher = BatchingJudge(self._judge, config.batch_size, config.max_wait_ms)

    async def entailment_probs(self, premises: list[str], hypotheses: list[str]) -> list[float]:
        return await self._batcher.entailment_probs(premises, hypotheses)

    async def describe(self) -> dict[str, Any]:
        return {**self._judge.describe(), "forward_batches": self._batcher.forward_batches}


class JudgeClient(Protocol):
    async def entailment_probs(self, premises: Sequence[str], hypotheses: Sequence[str]) -> list[float]: ...


class InProcessJudgeClient:
    """Judge in the calling process (tests, demo, single-process runs)."""

    def __init__(self, config: JudgeConfig) -> None:
        self.config = config
        self.batcher = BatchingJudge(NLIJudge.from_config(config), config.batch_size, config.max_wait_ms)

    async def entailment_probs(self, premises: Sequence[str], hypotheses: Sequence[str]) -> list[float]:
        return await self.batcher.entailment_probs(premises, hypotheses)

    def describe(self) -> dict[str, Any]:
        return {**self.batcher.judge.describe(), "forward_batches": self.batcher.forward_batches}


class RayJudgeClient:
    """Handle on the job's shared :class:`NLIJudgeActor` (created by the first caller)."""

    def __init__(self, config: JudgeConfig, startup_timeout_s: float = 600.0) -> None:
        import ray

        if not ray.is_initialized():
            raise RuntimeError(
                "the shared NLI judge is a Ray actor but Ray is not initialised in this process; "
                "call ray.init() first or set +reward.reward_kwargs.nli_in_process=true"
            )
        self.config = config
        options: dict[str, Any] = {
            "name": config.resolved_actor_name,
            "get_if_exists": True,
            "num_gpus": config.num_gpus,
            "num_cpus": config.num_cpus,
            "max_concurrency": 1000,
        }
        if config.detached:
            options["lifetime"] = "detached"
        self.handle = ray.remote(NLIJudgeActor).options(**options).remote(config)
        try:
            self.info = ray.get(self.handle.describe.remote(), timeout=startup_timeout_s)
        except Exception as error:
            raise NLIJudgeLoadError(
                f"NLI judge actor {config.resolved_actor_name!r} for model {config.model!r} failed to start: {error}"
            ) from error
        logger.info("NLI judge actor ready: %s", self.info)

    async def entailment_probs(self, premises: Sequence[str], hypotheses: Sequence[str]) -> list[float]:
        return await self.handle.entailment_probs.remote(list(premises), list(hypotheses))

    def describe(self) -> dict[str, Any]:
        import ray

        return ray.get(self.handle.describe.remote())


_IN_PROCESS_CLIENTS: dict[JudgeConfig, InProcessJudgeClient] = {}
_CLIENTS_LOCK = threading.Lock()


def connect_judge(config: JudgeConfig) -> JudgeClient:
    """The judge for ``config``: one per process in-process, one per Ray job otherwise."""
    if config.in_process:
        with _CLIENTS_LOCK:
            client = _IN_PROCESS_CLIENTS.get(config)
            if client is None:
                client = _IN_PROCESS_CLIENTS[config] = InProcessJudgeClient(config)
            return client
    return RayJudgeClient(config)
