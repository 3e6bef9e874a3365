"""``evidence_search``: the text-tag search agent loop (Search-R1 / EviNote-RAG protocol).

One trajectory, token by token::

    prompt | policy: ... <search> q </search> | context: <information> docs </information> |
           policy: <summary> note </summary> ... <answer> a </answer>

- Each turn the policy generates until ``</search>``, ``</answer>`` or EOS.
  The first complete action of the turn decides; tokens after it are dropped
  (engines that ignore stop strings cannot break the protocol).
- A search calls the retrieval server; the documents (or, with an evidence
  extractor, the extracted evidence) are appended inside
  ``<information>...</information>`` with ``response_mask`` 0, truncated to
  ``max_obs_tokens`` tokens.
- Anything else (no action, EOS without an answer) appends a short correction
  with mask 0 and the policy tries again.
- ``<summary>`` notes are the policy's own tokens (mask 1) and optional.
- Limits: ``max_turns`` generations, the rollout's ``response_length``,
  ``max_obs_tokens`` per observation; the last turn allows only an answer (a
  search there is not executed and the rollout ends).
- Retrieval failures never raise: the observation says the search failed and
  the count goes to ``extra_fields["search_errors"]``.

``extra_fields`` follow docs/data-contracts.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput
from verl.utils.profiler import simple_timer
from verl.utils.rollout_trace import rollout_trace_op

from retrieval_server.client import RetrievalError
from verl_evidence.agent_loops.common import (
    encode,
    encode_cached,
    loop_setup,
    question_of,
    stop_sampling_params,
)
from verl_evidence.agent_loops.extractor import EvidenceExtractor
from verl_evidence.backends import cut_at_stop
from verl_evidence.prompts import check_placeholders, load_prompt, render_prompt
from verl_evidence.rewards.text import find_blocks
from verl_evidence.tools.search_tool import SearchService, document_ids, format_documents

logger = logging.getLogger(__name__)

LOOP_NAME = "evidence_search"
ACTION_STOPS = ["</search>", "</answer>"]


@dataclass(frozen=True)
class SearchLoopSettings:
    """Settings of ``evidence_search`` (see docs/rollouts.md for where to set them)."""

    retrieval_url: str | None = None
    topk: int = 3
    max_turns: int = 6
    max_tokens_per_turn: int | None = None
    max_obs_tokens: int = 512
    # None: use the row's chat prompt as is; a prompt name/path: rebuild the user turn from it ({question})
    prompt: str | None = None
    invalid_action_feedback: str = (
        "\nThat was not a valid action. To search, write <search> query </search>. "
        "To finish, write <answer> final answer </answer>.\n"
    )
    final_turn_notice: str = "\nNo searches are left: give your final answer now inside <answer> and </answer>.\n"
    search_failed_text: str = "The search failed: the search engine is unavailable. Continue with what you know."
    search_timeout: float = 30.0
    search_max_retries: int = 3
    search_backoff: float = 0.5
    search_max_concurrency: int = 64
    search_requests_per_second: float | None = None
    # evidence extractor (EviOmni Algorithm 2): none | policy | openai
    extractor: str = "none"
    extractor_prompt: str = "evidence_extractor"
    extractor_max_tokens: int = 256
    extractor_url: str | None = None
    extractor_model: str | None = None
    extractor_api_key: str = "EMPTY"
    extractor_temperature: float = 0.0

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_obs_tokens < 1:
            raise ValueError(f"max_obs_tokens must be >= 1, got {self.max_obs_tokens}")
        if self.extractor not in ("none", "policy", "openai"):
            raise ValueError(f"extractor must be none, policy or openai, got {self.extractor!r}")


def first_action(text: str) -> tuple[str, str, int] | None:
    """``(kind, content, end offset)`` of the first complete ``<search>`` or ``<answer>`` block."""
    best = None
    for kind in ("search", "answer"):
        close = text.find(f"</{kind}>")
        if close < 0:
            continue
        opening = text.rfind(f"<{kind}>", 0, close)
        if opening < 0:
            continue
        end = close + len(kind) + 3
        if best is None or end < best[2]:
            best = (kind, text[opening + len(kind) + 2 : close].strip(), end)
    return best


def last_thought(turn_text: str) -> str:
    thoughts = find_blocks(turn_text, "think")
    if thoughts:
        return thoughts[-1]
    return turn_text.split("<search>")[0].strip()


class _Trajectory:
    """Token bookkeeping: response ids, mask and logprobs grow together."""

    def __init__(self, response_length: int) -> None:
        self.response_length = response_length
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.has_logprobs = False

    @property
    def remaining(self) -> int:
        return self.response_length - len(self.ids)

    def add_policy(self, ids: list[int], logprobs: list[float] | None) -> None:
        if logprobs is not None:
            if not self.has_logprobs and self.ids:
                self.logprobs = [0.0] * len(self.ids)
            self.has_logprobs = True
            self.logprobs.extend(logprobs[: len(ids)] + [0.0] * (len(ids) - len(logprobs)))
        elif self.has_logprobs:
            self.logprobs.extend([0.0] * len(ids))
        self.ids.extend(ids)
        self.mask.extend([1] * len(ids))

    def add_context(self, ids: list[int]) -> int:
        """Append tool/system tokens (mask 0) up to the budget; returns how many fit."""
        ids = ids[: max(0, self.remaining)]
        self.ids.extend(ids)
        self.mask.extend([0] * len(ids))
        if self.has_logprobs:
            self.logprobs.extend([0.0] * len(ids))
        return len(ids)


class EvidenceSearchAgentLoop(AgentLoopBase):
    """Search-R1 / EviNote text-tag search loop; registered as ``evidence_search``."""

    loop_name = LOOP_NAME

    def __init__(
        self,
        trainer_config,
        server_manager,
        tokenizer,
        processor,
        dataset_cls,
        data_config,
        tools=None,
        hf_model_type: str | None = None,
        retriever=None,
        remote_extractor=None,
        **settings: Any,
    ):
        # `tools` is what verl passes every loop (its tool list); this loop searches through its own service.
        # `retriever` / `remote_extractor` replace the HTTP clients when the loop is built by hand.
        super().__init__(
            trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config, hf_model_type=hf_model_type
        )
        self.settings, self.response_length, self.rollout_name = loop_setup(
            self.config, SearchLoopSettings, self.loop_name, settings
        )
        s = self.settings
        self.search = SearchService(
            retrieval_url=s.retrieval_url,
            topk=s.topk,
            timeout=s.search_timeout,
            max_retries=s.search_max_retries,
            backoff=s.search_backoff,
            max_concurrency=s.search_max_concurrency,
            requests_per_second=s.search_requests_per_second,
            retriever=retriever,
        )
        self.prompt_template = None
        if s.prompt:
            self.prompt_template = load_prompt(s.prompt)
            check_placeholders(self.prompt_template, ["question"], name=f"search prompt {s.prompt!r}")
        self.extractor = None
        if s.extractor != "none":
            if s.extractor == "openai" and remote_extractor is None and (s.extractor_url and s.extractor_model):
                from verl_evidence.backends import OpenAIBackend

                remote_extractor = OpenAIBackend(s.extractor_url, s.extractor_model, api_key=s.extractor_api_key)
            self.extractor = EvidenceExtractor(
                s.extractor,
                s.extractor_prompt,
                s.extractor_max_tokens,
                tokenizer=self.tokenizer,
                server_manager=self.server_manager,
                build_prompt_ids=self.ct_build_initial_tokens,
                remote=remote_extractor,
                sampling_params={"temperature": s.extractor_temperature},
                rollout_name=self.rollout_name,
            )

    # -- pieces -----------------------------------------------------------------

    def _messages(self, kwargs: dict[str, Any], question: str) -> list[dict]:
        messages = [dict(m) for m in kwargs["raw_prompt"]]
        if self.prompt_template is None:
            return messages
        user = {"role": "user", "content": render_prompt(self.prompt_template, question=question)}
        kept = [m for m in messages if m.get("role") == "system"]
        return kept + [user]

    def _policy_turn(self, token_ids: list[int]) -> tuple[list[int], str]:
        """Drop anything generated after the first complete action; return kept ids and their text."""
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        action = first_action(text)
        if action is not None and text[action[2] :].strip():
            token_ids, _ = cut_at_stop(token_ids, self.tokenizer, ACTION_STOPS, set())
            text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        return token_ids, text

    async def _observe(self, query: str, question: str, turn_text: str, stats: dict) -> tuple[str, int]:
        """The text inside <information> for one search, and the raw passages' token count."""
        try:
            with simple_timer("tool_calls", stats["timing"]):
                results = (await self.search.search([query]))[0]
        except RetrievalError as err:
            logger.warning("evidence_search: retrieval failed for %r: %s", query, err)
            stats["search_errors"] += 1
            stats["retrieved_ids"].append([])
            return self.settings.search_failed_text, 0
        stats["retrieved_ids"].append(document_ids(results))
        documents = format_documents(results)
        raw_tokens = len(encode(self.tokenizer, documents))
        if self.extractor is None:
            return documents, raw_tokens
        extraction = await self.extractor.extract(question, last_thought(turn_text), query, documents)
        if not extraction.ok:
            stats["extractor_failures"] += 1
            return documents, raw_tokens
        return f"<evidence>{extraction.evidence}</evidence>", raw_tokens

    def _notice(self, turn: int) -> list[int]:
        """Tokens of the final-turn notice when the next turn is the last one, else none."""
        if turn + 1 == self.settings.max_turns - 1 and self.settings.final_turn_notice:
            return encode_cached(self.tokenizer, self.settings.final_turn_notice)
        return []

    # -- the loop ---------------------------------------------------------------

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs) -> AgentLoopOutput:
        s = self.settings
        question = question_of(kwargs)
        prompt_ids = await self.ct_build_initial_tokens(self._messages(kwargs, question))
        request_id = uuid4().hex
        traj = _Trajectory(self.response_length)
        stats: dict[str, Any] = {
            "timing": {},
            "search_errors": 0,
            "extractor_failures": 0,
            "retrieved_ids": [],
        }
        searches: list[str] = []
        policy_texts: list[str] = []
        invalid_actions = 0
        context_tokens = raw_context_tokens = 0
        termination = "max_turns"
        turns = 0

        for turn in range(s.max_turns):
            if traj.remaining <= 0:
                termination = "response_length"
                break
            last_turn = turn == s.max_turns - 1
            budget = traj.remaining if s.max_tokens_per_turn is None else min(traj.remaining, s.max_tokens_per_turn)
            params = stop_sampling_params(sampling_params, self.rollout_name, ACTION_STOPS, budget)
            with simple_timer("generate_sequences", stats["timing"]):
                output = await self.server_manager.generate(
                    request_id=request_id,
                    prompt_ids=prompt_ids + traj.ids,
                    sampling_params=params,
                    priority=int(priority),
                )
            turns += 1
            token_ids, turn_text = self._policy_turn(list(output.token_ids)[:budget])
            traj.add_policy(token_ids, output.log_probs[: len(token_ids)] if output.log_probs else None)
            policy_texts.append(turn_text)
            action = first_action(turn_text)

            if action is not None and action[0] == "answer":
                termination = "answer"
                break
            if action is not None and action[0] == "search" and not action[1]:
                action = None  # an empty query is not a search: correct it like any invalid action
            if action is not None and action[0] == "search" and not last_turn:
                query = action[1]
                searches.append(query)
                observation, raw_tokens = await self._observe(query, question, turn_text, stats)
                body = encode(self.tokenizer, observation)[: s.max_obs_tokens]
                pieces = encode_cached(self.tokenizer, "\n\n<information>") + body
                pieces += encode_cached(self.tokenizer, "</information>\n\n") + self._notice(turn)
                context_tokens += len(body)
                raw_context_tokens += raw_tokens
                if traj.add_context(pieces) < len(pieces):
                    termination = "response_length"
                    break
                continue
            if last_turn:
                termination = "max_turns"
                break
            if traj.remaining <= 0:  # cut off mid-turn by the response budget
                termination = "response_length"
                break
            # no action: EOS without an answer, or the per-turn cap reached mid-thought
            invalid_actions += 1
            feedback = encode_cached(self.tokenizer, s.invalid_action_feedback) + self._notice(turn)
            if traj.add_context(feedback) < len(feedback):
                termination = "response_length"
                break

        policy_text = "".join(policy_texts)
        summaries = find_blocks(policy_text, "summary")
        extra_fields = {
            "question": question,
            "summary_count": len(summaries),
            "last_summary": summaries[-1] if summaries else "",
            "searches": searches,
            "retrieved_ids": stats["retrieved_ids"],
            "num_searches": len(searches),
            "context_tokens": context_tokens,
            "raw_context_tokens": raw_context_tokens,
            "compression_ratio": (raw_context_tokens / context_tokens) if context_tokens else 0.0,
            "invalid_actions": invalid_actions,
            "search_errors": stats["search_errors"],
            "extractor_failures": stats["extractor_failures"],
            "termination": termination,
            "turn_scores": [],
            "tool_rewards": [],
        }
        metrics = {
            "generate_sequences": stats["timing"].get("generate_sequences", 0.0),
            "tool_calls": stats["timing"].get("tool_calls", 0.0),
        }
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=traj.ids[: self.response_length],
            response_mask=traj.mask[: self.response_length],
            response_logprobs=traj.logprobs[: self.response_length] if traj.has_logprobs else None,
            num_turns=turns + len(searches) + invalid_actions + 1,
            metrics=metrics,
            extra_fields=extra_fields,
        )


__all__ = ["LOOP_NAME", "EvidenceSearchAgentLoop", "SearchLoopSettings", "first_action"]
