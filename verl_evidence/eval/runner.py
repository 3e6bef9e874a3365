"""Run a policy through the plugin's rollout hooks and score it with the reward managers.

The path of one example is the trainer's path, minus the GPUs:

    verl dataset row --(RLHFDataset.__getitem__ fields)--> agent loop (verl registry,
    instantiated like AgentLoopWorker does) --generate--> policy backend
    --search--> retrieval server --AgentLoopOutput--> DataProto --> verl RewardLoopWorker
    --> reward manager run_single --> EvalRecord

Policies (all behind verl's ``LLMServerClient`` interface, see
:mod:`verl_evidence.local.backends`): a local HF model directory, an
OpenAI-compatible endpoint, or recorded trajectories replayed turn by turn
(the texts are fixed, but retrieval runs live against the server).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from verl_evidence.eval.cache import ResultsCache
from verl_evidence.eval.decoding import DecodingChoice, Sampling
from verl_evidence.eval.records import EvalRecord
from verl_evidence.eval.scoring import RewardScorer, build_reward_dataproto
from verl_evidence.text.ground_truth import coerce_ground_truth
from verl_evidence.text.tags import extract_last, strip_thinking

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MANAGERS_BY_ROLLOUT",
    "EvalExample",
    "EvalRunner",
    "PolicySpec",
    "loop_kwargs_from_row",
    "rollout_kind",
]

# extra_info.method (dataprep) -> the rollout family the metrics and managers group by.
_METHOD_TO_ROLLOUT = {
    "search_r1": "search",
    "evinote": "search",
    "eviomni": "eviomni",
    "lear": "eviomni",
    "grace": "grace",
}
_AGENT_TO_ROLLOUT = {"evidence_search": "search", "eviomni": "eviomni", "single_turn_agent": "grace"}

# Which reward-manager labels score which rollout family (labels are RewardScorer keys).
DEFAULT_MANAGERS_BY_ROLLOUT: dict[str, tuple[str, ...]] = {
    "search": ("evinote", "composite"),
    "eviomni": ("eviomni",),
    "grace": ("grace",),
}


def rollout_kind(row: Mapping[str, Any]) -> str:
    """``search`` | ``eviomni`` | ``grace`` for a verl row (from ``extra_info.method`` or ``agent_name``)."""
    extra = row.get("extra_info") or {}
    method = extra.get("method") if isinstance(extra, Mapping) else None
    if method in _METHOD_TO_ROLLOUT:
        return _METHOD_TO_ROLLOUT[method]
    agent = row.get("agent_name") or (extra.get("agent_name") if isinstance(extra, Mapping) else None)
    if agent in _AGENT_TO_ROLLOUT:
        return _AGENT_TO_ROLLOUT[agent]
    raise ValueError(
        f"row {extra.get('id', '?') if isinstance(extra, Mapping) else '?'}: cannot tell its rollout "
        f"(extra_info.method={method!r}, agent_name={agent!r}); expected one of {sorted(_METHOD_TO_ROLLOUT)}"
    )


def validation_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row as the trainer's validation phase hands it on. Evaluation is validation, whatever split the file was
    built as: a reward that scores validation differently (GRACE: alpha = beta = 1) applies its validation weights."""
    from verl_evidence.reward_managers.phase import with_phase

    return {**row, "extra_info": with_phase(row.get("extra_info"), validate=True)}


def loop_kwargs_from_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments an agent loop's ``run`` receives for ``row`` (as ``RLHFDataset.__getitem__`` builds them)."""
    kwargs = dict(row)
    extra = dict(kwargs.get("extra_info") or {})
    kwargs["extra_info"] = extra
    kwargs["raw_prompt"] = list(kwargs.pop("prompt"))
    kwargs["index"] = extra.get("index", 0)
    kwargs["tools_kwargs"] = extra.get("tools_kwargs", {}) or {}
    kwargs["interaction_kwargs"] = extra.get("interaction_kwargs", {}) or {}
    return kwargs


@dataclass
class PolicySpec:
    """Which policy generates: ``replay`` (recorded texts), ``hf`` (model dir) or ``endpoint`` (URL + model)."""

    kind: str
    target: str
    model_name: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("replay", "hf", "endpoint"):
            raise ValueError(f"policy kind must be replay, hf or endpoint, got {self.kind!r}")
        if self.kind == "endpoint" and not self.model_name:
            raise ValueError("an endpoint policy needs the served model name (--served-model)")

    @property
    def policy_id(self) -> str:
        """The cache key's policy part: kind and what identifies the weights."""
        if self.kind == "endpoint":
            return f"endpoint:{self.target}#{self.model_name}"
        if self.kind == "hf":
            return f"hf:{Path(self.target).resolve()}"
        return f"replay:{Path(self.target).name}"


@dataclass
class EvalExample:
    """One row to roll out; ``script`` holds the replayed policy texts (one per generate call)."""

    example_id: str
    row: dict[str, Any]
    script: list[str] | None = None
    case: str | None = None

    @property
    def rollout(self) -> str:
        return rollout_kind(self.row)


BackendFactory = Callable[[EvalExample], Any]


@dataclass
class EvalRunner:
    """Rolls examples out with ``backend_for`` and scores them with ``scorer``.

    ``config`` is the composed verl trainer config the agent loops read
    (``actor_rollout_ref.rollout.*`` including ``custom.<loop>`` settings).
    ``decoding`` (``eval --decoding``) sets each example's temperature / top_p / top_k in place of
    ``val_kwargs``' and is recorded with its result; None (replayed texts): ``val_kwargs`` as they are.
    """

    config: DictConfig
    tokenizer: Any
    policy_id: str
    backend_for: BackendFactory
    scorer: RewardScorer | None = None
    managers_by_rollout: Mapping[str, Sequence[str]] = field(default_factory=lambda: dict(DEFAULT_MANAGERS_BY_ROLLOUT))
    concurrency: int = 4
    decoding: DecodingChoice | None = None

    def sampling(self, example: EvalExample | None) -> Sampling | None:
        """The ``--decoding`` settings of ``example`` (by its method), or None without a decoding choice."""
        if self.decoding is None or example is None:
            return None
        return self.decoding.for_row(example.row, example.rollout)

    def sampling_params(self, example: EvalExample | None = None) -> dict[str, Any]:
        """Validation sampling, as ``AgentLoopWorker.generate_sequences`` sets it when ``validate`` (temperature,
        top_p, top_k from ``val_kwargs``), with the example's ``--decoding`` settings in their place."""
        rollout = self.config.actor_rollout_ref.rollout
        params = {
            "temperature": rollout.val_kwargs.temperature,
            "top_p": rollout.val_kwargs.top_p,
            "top_k": rollout.val_kwargs.top_k,
            "repetition_penalty": 1.0,
            "logprobs": False,
        }
        sampling = self.sampling(example)
        if sampling is not None:
            params.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
        return params

    def recorded_decoding(self, example: EvalExample) -> dict[str, Any] | None:
        sampling = self.sampling(example)
        return None if sampling is None else sampling.as_record()

    def _make_loop(self, agent_name: str, backend: Any):
        import hydra
        from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
        from verl.utils.dataset.rl_dataset import RLHFDataset

        if agent_name not in _agent_loop_registry:
            raise ValueError(
                f"agent loop {agent_name!r} is not registered (known: {sorted(_agent_loop_registry)}); "
                "is the verl_evidence plugin installed?"
            )
        return hydra.utils.instantiate(
            config=_agent_loop_registry[agent_name],
            trainer_config=DictConfigWrap(config=self.config),
            server_manager=backend,
            tokenizer=self.tokenizer,
            processor=None,
            hf_model_type=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(self.config.data),
            tools=ToolListWrap([]),
        )

    async def rollout(self, example: EvalExample):
        """The agent loop's ``AgentLoopOutput`` for one example."""
        kwargs = loop_kwargs_from_row(validation_row(example.row))
        agent_name = kwargs.get("agent_name") or kwargs["extra_info"].get("agent_name")
        loop = self._make_loop(str(agent_name), self.backend_for(example))
        return await loop.run(self.sampling_params(example), **kwargs)

    async def evaluate(self, example: EvalExample) -> EvalRecord:
        """Roll out, score with every manager of the rollout family, and summarise as a record."""
        record = base_record(self.policy_id, example)
        record.decoding = self.recorded_decoding(example)
        try:
            output = await self.rollout(example)
        except Exception as err:  # one broken example must not end the run: record why, go on
            logger.warning("example %s failed during rollout: %s: %s", example.example_id, type(err).__name__, err)
            record.error = f"rollout failed: {type(err).__name__}: {err}"
            return record
        fill_from_output(record, output, self.tokenizer)
        if self.scorer is not None:
            data = build_reward_dataproto(
                output.prompt_ids,
                output.response_ids,
                validation_row(example.row),
                output.extra_fields,
                output.num_turns,
            )
            for label in self.managers_by_rollout.get(record.rollout, ()):
                if label in self.scorer.workers:
                    record.rewards[label] = await self.scorer.score(label, data)
            evinote = record.rewards.get("evinote")
            if evinote is not None and "eqr" in evinote:
                record.eqr = evinote["eqr"]
        return record

    async def run(
        self,
        examples: Sequence[EvalExample],
        cache: ResultsCache | None = None,
        on_done: Callable[[EvalRecord], None] | None = None,
    ) -> list[EvalRecord]:
        """Evaluate ``examples`` (skipping those cached for this policy), ``concurrency`` at a time."""
        done: dict[str, EvalRecord] = {}
        todo: list[EvalExample] = []
        for example in examples:
            cached = cache.get(self.policy_id, example.example_id) if cache is not None else None
            # a result decoded otherwise (another --decoding) is not this run's
            if cached is not None and cached.error is None and cached.decoding == self.recorded_decoding(example):
                done[example.example_id] = cached
                if on_done is not None:
                    on_done(cached)
            else:
                todo.append(example)
        if done:
            logger.info("%d of %d examples already in the results cache", len(done), len(examples))
        semaphore = asyncio.Semaphore(max(1, self.concurrency))

        async def one(example: EvalExample) -> None:
            async with semaphore:
                record = await self.evaluate(example)
            if cache is not None:
                cache.add(record)
            done[example.example_id] = record
            if on_done is not None:
                on_done(record)

        await asyncio.gather(*(one(e) for e in todo))
        return [done[e.example_id] for e in examples]


def base_record(policy_id: str, example: EvalExample) -> EvalRecord:
    row = example.row
    extra = row.get("extra_info") or {}
    truth = coerce_ground_truth((row.get("reward_model") or {}).get("ground_truth"))
    rollout = example.rollout
    answerable = truth["answerable"] if truth["answerable"] is not None else extra.get("answerable")
    if rollout == "grace" and answerable is None:
        answerable = bool(truth["evidence"])  # GRACE's own rule when the flag is absent
    return EvalRecord(
        policy=policy_id,
        example_id=example.example_id,
        data_source=str(row.get("data_source", "unknown")),
        rollout=rollout,
        question=str(extra.get("question", "")),
        golden_answers=list(truth["target"]),
        case=example.case,
        question_id=str(extra["id"]) if "id" in extra else None,
        answerable=answerable if rollout == "grace" else None,
    )


def fill_from_output(record: EvalRecord, output: Any, tokenizer: Any) -> None:
    """Copy the response, answer and the rollout's extra fields into ``record``."""
    text = tokenizer.decode(output.response_ids, skip_special_tokens=True)
    extra = dict(output.extra_fields or {})
    final = strip_thinking(text)
    record.response = text
    record.prediction = extract_last(final, "answer")
    if not record.question and isinstance(extra.get("question"), str):
        record.question = extra["question"]
    if record.rollout == "search":
        record.num_searches = int(extra.get("num_searches", len(extra.get("searches", []) or [])))
        record.summary_count = int(extra.get("summary_count", 0))
        last_note = extra.get("last_summary") or ""
        record.evidence = last_note if record.summary_count else None
        if "context_tokens" in extra:
            record.context_tokens = int(extra["context_tokens"])
        if "raw_context_tokens" in extra:
            record.raw_context_tokens = int(extra["raw_context_tokens"])
    elif record.rollout == "eviomni":
        record.evidence = extract_last(final, "extract") or ""
        if "eviomni_len_e" in extra:
            record.evidence_tokens = int(extra["eviomni_len_e"])
        if "eviomni_len_p" in extra:
            record.passage_tokens = int(extra["eviomni_len_p"])
            record.context_tokens = record.evidence_tokens  # what the answer step reads instead of P
    elif record.rollout == "grace":
        evidence = extract_last(final, "evidence")
        recall = extract_last(final, "llm")
        record.evidence = evidence
        record.refused = recall is not None and evidence is None
        record.context_tokens = len(output.prompt_ids)
