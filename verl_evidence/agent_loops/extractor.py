"""Models that turn retrieved passages into an observation: the evidence extractor and the EviPath executor.

Agentic evidence extraction (EviOmni Algorithm 2):

After each retrieval the search loop can hand (question, last thought,
sub-query, passages) to an extractor and append only the evidence it returns.
The extractor is either the policy itself (the loop's own ``server_manager``,
policy tokenizer and chat template) or a separate model behind an
OpenAI-compatible endpoint (:class:`~verl_evidence.agent_loops.openai_endpoint.OpenAIEndpoint`).
A failed extraction (no ``<extract>`` block, endpoint down) falls back to the
raw passages, so the agent never loses what was retrieved.

The EviPath executor (:class:`SubQuestionExecutor`) answers one planner
sub-question over the retrieved passages, numbered as in EviPath's executor
training rows, and only its one-sentence ``<answer>`` becomes the observation.
Both run through the same plumbing (:class:`ObservationModel`): the policy or
an OpenAI-compatible endpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from verl_evidence.agent_loops.common import stop_sampling_params
from verl_evidence.agent_loops.protocol import executor_user, pool_item
from verl_evidence.prompts import check_placeholders, load_prompt, render_prompt
from verl_evidence.text.tags import extract_last, strip_thinking

logger = logging.getLogger(__name__)

EXTRACTOR_FIELDS = ("question", "thought", "query", "passages")


@dataclass
class Extraction:
    evidence: str
    ok: bool
    reason: str = ""


class ObservationModel:
    """Generation plumbing shared by the extractor and the executor: the policy or a remote endpoint.

    ``build_prompt_ids`` renders chat messages to policy token ids (the loop's
    Continuous Token builder) and is used in policy mode only.
    """

    role = "observation model"

    def __init__(
        self,
        mode: str,
        max_tokens: int,
        tokenizer=None,
        server_manager=None,
        build_prompt_ids: Callable[[list[dict]], Awaitable[list[int]]] | None = None,
        remote=None,
        sampling_params: dict[str, Any] | None = None,
        rollout_name: str | None = None,
    ) -> None:
        if mode not in ("policy", "openai"):
            raise ValueError(f"{self.role} must be 'policy' or 'openai', got {mode!r}")
        if mode == "policy" and (server_manager is None or tokenizer is None or build_prompt_ids is None):
            raise ValueError(f"policy {self.role} needs the loop's server_manager, tokenizer and prompt builder")
        if mode == "openai" and remote is None:
            raise ValueError(f"openai {self.role} needs `extractor_url` and `extractor_model`")
        self.mode = mode
        self.max_tokens = max_tokens
        self.tokenizer = tokenizer
        self.server_manager = server_manager
        self.build_prompt_ids = build_prompt_ids
        self.remote = remote
        self.sampling_params = dict(sampling_params or {"temperature": 0.0})
        self.rollout_name = rollout_name

    async def complete(self, messages: list[dict], stop: str) -> str:
        """The model's reply to ``messages``, generated up to and including ``stop``. Raises on endpoint errors."""
        if self.mode == "policy":
            params = stop_sampling_params(self.sampling_params, self.rollout_name, [stop], self.max_tokens)
            prompt_ids = await self.build_prompt_ids(messages)
            output = await self.server_manager.generate(
                request_id=uuid4().hex, prompt_ids=prompt_ids, sampling_params=params
            )
            return self.tokenizer.decode(output.token_ids, skip_special_tokens=True)
        params = {**self.sampling_params, "stop": [stop], "max_tokens": self.max_tokens}
        reply = await self.remote.chat_reply(messages, params)
        # servers that trim the stop string: put it back only when generation ended at it, never after a length
        # cut (an unfinished block would pass as complete)
        return reply.text + stop if stop not in reply.text and reply.ended_at(stop) else reply.text


class EvidenceExtractor(ObservationModel):
    """Turns retrieved passages into extracted evidence."""

    role = "extractor"

    def __init__(self, mode: str, prompt: str, max_tokens: int, **plumbing: Any) -> None:
        super().__init__(mode, max_tokens, **plumbing)
        self.template = load_prompt(prompt)
        check_placeholders(self.template, EXTRACTOR_FIELDS, name=f"extractor prompt {prompt!r}")

    async def extract(self, question: str, thought: str, query: str, passages: str) -> Extraction:
        messages = [
            {
                "role": "user",
                "content": render_prompt(
                    self.template, question=question, thought=thought, query=query, passages=passages
                ),
            }
        ]
        try:
            text = await self.complete(messages, "</extract>")
        except Exception as err:
            logger.warning("evidence extractor (%s) failed: %s", self.mode, err)
            return Extraction(passages, ok=False, reason=f"error: {type(err).__name__}")
        evidence = extract_last(strip_thinking(text), "extract")
        if not evidence:
            logger.info("evidence extractor wrote no <extract> block; keeping the raw passages")
            return Extraction(passages, ok=False, reason="no_extract_block")
        return Extraction(evidence, ok=True)


NO_INFORMATION = "No relevant information found."


class SubQuestionExecutor(ObservationModel):
    """EviPath's executor: answers a planner sub-question over the retrieved passages in one sentence.

    Messages: system = the executor prompt, user = the sub-question and the passages
    as a numbered pool (``[i] Title: text``), exactly the layout of EviPath's executor
    SFT rows; generation stops at ``</answer>``. The observation is the answer sentence.
    An executor that selects nothing ("No relevant information found.") yields that
    sentence; anything else without an ``<answer>`` keeps the raw passages.
    """

    role = "executor"

    def __init__(self, mode: str, prompt: str, max_tokens: int, **plumbing: Any) -> None:
        super().__init__(mode, max_tokens, **plumbing)
        self.system_prompt = load_prompt(prompt).strip()

    def messages(self, query: str, contents: list[str]) -> list[dict]:
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": executor_user(query, [pool_item(c) for c in contents])},
        ]

    async def answer(self, query: str, contents: list[str], passages: str) -> Extraction:
        """The observation for ``query``: the executor's sentence, or ``passages`` (formatted) on failure."""
        try:
            text = await self.complete(self.messages(query, contents), "</answer>")
        except Exception as err:
            logger.warning("EviPath executor (%s) failed for %r: %s; observation = the passages", self.mode, query, err)
            return Extraction(passages, ok=False, reason=f"error: {type(err).__name__}")
        sentence = extract_last(strip_thinking(text), "answer")
        sentence = " ".join(sentence.split()) if sentence else ""
        if sentence:
            return Extraction(sentence, ok=True)
        if NO_INFORMATION.lower().rstrip(".") in text.lower():
            return Extraction(NO_INFORMATION, ok=True, reason="no_information")
        logger.warning("EviPath executor wrote no <answer> for %r; observation = the passages", query)
        return Extraction(passages, ok=False, reason="no_answer_block")
