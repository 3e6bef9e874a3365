"""``eviomni``: rational evidence extraction with knowledge-token masking (EviOmni / LEAR).

One trajectory:

1. The prompt holds the question and its passages P (``extra_info.passages`` of
   the row, or top-k from the retrieval server for the question).
2. The policy writes ``<reason>r</reason><extract>e</extract>`` (generation
   stops at ``</extract>``), then continues with the answer o_f. Both parts are
   the trained response (mask 1).
3. From freshly built prompts the same policy answers twice more:
   o_r from (question, P, r) with e replaced by a placeholder, and
   o_e from (question, e) with P and r replaced by the placeholder. This is
   hard masking on the input: the masked text is never rendered into those
   prompts. o_r and o_e are scored but not part of ``response_ids``.

``extra_fields``: ``eviomni_answer_r``, ``eviomni_answer_e`` (generated texts),
``eviomni_len_r``, ``eviomni_len_e``, ``eviomni_len_p`` (policy-tokenizer token
counts of r, e and the passages block), plus ``question`` and ``retrieved_ids``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.utils.profiler import simple_timer
from verl.utils.rollout_trace import rollout_trace_op

from retrieval_server.client import RetrievalError
from verl_evidence.agent_loops.base import SettingsAgentLoop
from verl_evidence.agent_loops.common import (
    EngineFields,
    encode,
    message_text,
    question_of,
    request_id,
    row_passages,
    seeded_by_trajectory,
    stop_sampling_params,
)
from verl_evidence.prompts import check_placeholders, load_prompt, render_prompt
from verl_evidence.text.stops import cut_at_stop
from verl_evidence.text.tags import extract_last, strip_thinking
from verl_evidence.tools.documents import document_ids, document_texts, format_documents
from verl_evidence.tools.search_service import SearchService
from verl_evidence.tools.search_settings import LoopSearchFields

logger = logging.getLogger(__name__)

LOOP_NAME = "eviomni"


def _extra_fields(question: str, **values: Any) -> dict[str, Any]:
    """The trajectory's ``extra_fields`` (the reward manager's inputs): every key, with ``values`` over defaults."""
    fields: dict[str, Any] = {
        "question": question,
        "retrieved_ids": [],
        "eviomni_answer_r": "",
        "eviomni_answer_e": "",
        "eviomni_len_r": 0,
        "eviomni_len_e": 0,
        "eviomni_len_p": 0,
        "retrieval_error": None,
        "retrieval_failed": 0.0,
        "termination": "",
        # response positions of o_r / o_e tokens: none, they are never part of the trained response
        # (the trainer's masking check, verl_evidence.trainer.step_metrics, reads this)
        "masked_answer_spans": [],
        "turn_scores": [],
        "tool_rewards": [],
    }
    unknown = set(values) - set(fields)
    if unknown:
        raise KeyError(f"unknown extra field(s): {sorted(unknown)}")
    return {**fields, **values}


@dataclass(frozen=True)
class EviOmniLoopSettings(LoopSearchFields):
    """Settings of ``eviomni``; search keys (the base class) fetch passages for rows without ``extra_info.passages``."""

    topk: int = 5
    prompt: str = "eviomni_reason_extract"
    answer_prompt: str = "eviomni_answer"
    placeholder: str = "[hidden]"
    masked_answer_max_tokens: int = 64
    # None: o_r / o_e use the rollout's sampling params; a number overrides the temperature
    masked_answer_temperature: float | None = None


class EviOmniAgentLoop(SettingsAgentLoop):
    """EviOmni policy rollout with the two masked-input answers; registered as ``eviomni``."""

    loop_name = LOOP_NAME
    settings_cls = EviOmniLoopSettings

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        s = self.settings
        self.prompt_template = load_prompt(s.prompt)
        check_placeholders(self.prompt_template, ["question", "passages"], name=f"eviomni prompt {s.prompt!r}")
        self.answer_template = load_prompt(s.answer_prompt)
        check_placeholders(
            self.answer_template,
            ["question", "passages", "rationale", "evidence"],
            name=f"eviomni answer prompt {s.answer_prompt!r}",
        )
        self._search: SearchService | None = None

    def _search_service(self) -> SearchService:
        if self._search is None:
            self._search = SearchService(settings=self.settings.search_settings(), retriever=self.retriever)
        return self._search

    async def _passages(self, kwargs: dict[str, Any], question: str) -> tuple[list[dict], str, bool]:
        """The passages, what went wrong fetching them ("" if nothing), and whether the server was asked."""
        passages = row_passages(kwargs)
        if passages is not None:
            return passages, "", False
        try:
            return (await self._search_service().search([question]))[0], "", True
        except (RetrievalError, ValueError) as err:
            logger.warning("eviomni: could not fetch passages for %r: %s", question, err)
            return [], f"{type(err).__name__}: {err}", True

    def _record_search(self, searched: bool, engine: EngineFields, failure: str) -> None:
        """Count the search for the broken-server check, once a generation told the training step."""
        if searched:
            self._search_service().record(engine.fields.get("global_steps"), failure or None)

    def _system_messages(self, kwargs: dict[str, Any]) -> list[dict]:
        return [dict(m) for m in kwargs.get("raw_prompt", []) if dict(m).get("role") == "system"]

    def _masked_system(self, system: list[dict], hidden: list[str]) -> list[dict]:
        """System messages for a masked-input answer: any copy of masked text in them is replaced too.

        Datasets sometimes put the context in the system message; hard masking must
        hold through every message the model receives, not only the user turn.
        """
        pieces = sorted({h.strip() for h in hidden if h and h.strip()}, key=len, reverse=True)
        masked = []
        for message in system:
            content = message_text(message.get("content", ""))
            for piece in pieces:
                content = content.replace(piece, self.settings.placeholder)
            masked.append({**message, "content": content})
        return masked

    async def _generate(
        self, prompt_ids: list[int], params: dict[str, Any], stop: str, priority: int, engine: EngineFields, part: str
    ) -> tuple[list[int], list[float] | None, bool]:
        """The kept ids, their log-probs, and whether generation ended at ``stop``.

        Decided on the ids (:func:`cut_at_stop`), not on the decoded text's last characters: the token that completes
        ``stop`` may carry what the model wrote next (Qwen's ``'><'``, ``'>The'``, ``'>\n\n'``), and the engine's own
        reason cannot tell (verl reports vLLM's stop and length both as ``"completed"``; SGLang's "stop" includes EOS).
        """
        output = await self.server_manager.generate(
            request_id=request_id(self.rollout_config, priority, part),
            prompt_ids=prompt_ids,
            sampling_params=params,
            priority=priority,
        )
        engine.add(output)
        token_ids = list(output.token_ids)[: params["max_tokens"]]
        kept, why = cut_at_stop(token_ids, self.tokenizer, [stop], set())
        return kept, (output.log_probs[: len(kept)] if output.log_probs else None), why == "stop"

    async def _masked_answer(
        self,
        system: list[dict],
        sampling_params: dict[str, Any],
        priority: int,
        engine: EngineFields,
        part: str,
        trajectory_ids: list[int],
        **fields: str,
    ) -> str:
        prompt_ids = await self.ct_build_initial_tokens(
            system + [{"role": "user", "content": render_prompt(self.answer_template, **fields)}]
        )
        params = stop_sampling_params(
            sampling_params, self.rollout_name, ["</answer>"], self.settings.masked_answer_max_tokens
        )
        if self.settings.masked_answer_temperature is not None:
            params["temperature"] = float(self.settings.masked_answer_temperature)
        # two samples can share this prompt (one rationale, different evidence): its reply must stay theirs
        params = seeded_by_trajectory(params, self.rollout_config, self.rollout_name, trajectory_ids, part)
        token_ids, _, _ = await self._generate(prompt_ids, params, "</answer>", priority, engine, part)
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    async def _without_passages(
        self,
        question: str,
        system: list[dict],
        engine: EngineFields,
        retrieval_error: str,
        searched: bool,
        priority: int,
    ) -> AgentLoopOutput:
        """A row with no passages (none in the row, none retrieved): nothing to extract evidence from.

        Generating from an empty passage block would train the policy on a prompt the
        method never poses. The trajectory is one token with loss mask 0 (never
        trained on); ``retrieval_failed`` = 1 makes the reward manager score it 0 with
        its reason and puts it in the step's metrics.
        """
        reason = retrieval_error or "no passages"
        logger.warning("eviomni: no passages for %r (%s): trajectory kept out of the loss", question, reason)
        prompt_ids = await self.ct_build_initial_tokens(
            system + [{"role": "user", "content": render_prompt(self.prompt_template, question=question, passages="")}]
        )
        # One token from the engine: the trajectory then carries the rollout's weight version like any other.
        output = await self.server_manager.generate(
            request_id=request_id(self.rollout_config, priority, "no-passages"),
            prompt_ids=prompt_ids,
            sampling_params={"temperature": 0.0, "max_tokens": 1},
        )
        engine.add(output)
        self._record_search(searched, engine, retrieval_error)  # an empty answer is not a failed search
        eos = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else self.tokenizer.pad_token_id
        response_ids = list(output.token_ids)[:1] or [eos]
        fields = engine.merged_with(
            _extra_fields(question, retrieval_error=reason, retrieval_failed=1.0, termination="no_passages")
        )
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=[0],
            response_logprobs=[0.0],
            num_turns=1,
            metrics={"generate_sequences": 0.0, "tool_calls": 0.0},
            extra_fields=fields,
        )

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs) -> AgentLoopOutput:
        s = self.settings
        priority = int(priority)
        timing: dict[str, float] = {}
        engine = EngineFields()  # weight versions etc. from every generation, as verl's trainer expects
        question = question_of(kwargs)
        with simple_timer("tool_calls", timing):
            passages, retrieval_error, searched = await self._passages(kwargs, question)
        passages_text = format_documents(passages)
        system = self._system_messages(kwargs)
        if not passages:
            return await self._without_passages(question, system, engine, retrieval_error, searched, priority)
        prompt_ids = await self.ct_build_initial_tokens(
            system
            + [
                {
                    "role": "user",
                    "content": render_prompt(self.prompt_template, question=question, passages=passages_text),
                }
            ]
        )

        # 1. <reason> r </reason> <extract> e </extract>
        params = stop_sampling_params(sampling_params, self.rollout_name, ["</extract>"], self.response_length)
        with simple_timer("generate_sequences", timing):
            first_ids, first_logprobs, extracted = await self._generate(
                prompt_ids, params, "</extract>", priority, engine, "extract"
            )
        self._record_search(searched, engine, retrieval_error)
        first_text = self.tokenizer.decode(first_ids, skip_special_tokens=True)
        body = strip_thinking(first_text)
        rationale = extract_last(body, "reason") or ""
        evidence = extract_last(body, "extract") or ""
        response_ids, logprobs = list(first_ids), first_logprobs

        # 2. o_f (trained continuation) and o_r / o_e (masked inputs) run concurrently
        remaining = self.response_length - len(response_ids)
        continue_answer = extracted and remaining > 0  # ended at </extract>, not at EOS or the length limit
        hidden = s.placeholder
        jobs = [
            self._masked_answer(  # o_r: the evidence is hidden
                self._masked_system(system, [evidence]),
                sampling_params,
                priority,
                engine,
                "answer-without-evidence",
                prompt_ids + response_ids,
                question=question,
                passages=passages_text,
                rationale=rationale,
                evidence=hidden,
            ),
            self._masked_answer(  # o_e: the passages and the rationale are hidden
                self._masked_system(system, [passages_text, rationale, *document_texts(passages)]),
                sampling_params,
                priority,
                engine,
                "answer-from-evidence-only",
                prompt_ids + response_ids,
                question=question,
                passages=hidden,
                rationale=hidden,
                evidence=evidence,
            ),
        ]
        if continue_answer:
            answer_params = stop_sampling_params(sampling_params, self.rollout_name, ["</answer>"], remaining)
            jobs.append(
                self._generate(prompt_ids + response_ids, answer_params, "</answer>", priority, engine, "answer")
            )
        with simple_timer("generate_sequences", timing):
            results = await asyncio.gather(*jobs)
        answer_r, answer_e = results[0], results[1]
        termination = "no_extract" if remaining > 0 else "response_length"
        if continue_answer:
            answer_ids, answer_logprobs, answered = results[2]
            termination = "answer" if answered else "response_length" if len(answer_ids) >= remaining else "eos"
            if logprobs is not None or answer_logprobs is not None:
                logprobs = (logprobs or [0.0] * len(response_ids)) + (answer_logprobs or [0.0] * len(answer_ids))
            response_ids += answer_ids

        response_ids = response_ids[: self.response_length]
        extra_fields = engine.merged_with(
            _extra_fields(
                question,
                retrieved_ids=document_ids(passages),
                eviomni_answer_r=answer_r,
                eviomni_answer_e=answer_e,
                eviomni_len_r=len(encode(self.tokenizer, rationale)) if rationale else 0,
                eviomni_len_e=len(encode(self.tokenizer, evidence)) if evidence else 0,
                eviomni_len_p=len(encode(self.tokenizer, passages_text)) if passages_text else 0,
                retrieval_error=retrieval_error,
                termination=termination,
            )
        )
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=[1] * len(response_ids),
            response_logprobs=logprobs[: len(response_ids)] if logprobs is not None else None,
            num_turns=2,
            metrics={
                "generate_sequences": timing.get("generate_sequences", 0.0),
                "tool_calls": timing.get("tool_calls", 0.0),
            },
            extra_fields=extra_fields,
        )
