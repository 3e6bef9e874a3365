"""Agentic evidence extraction (EviOmni Algorithm 2).

After each retrieval the search loop can hand (question, last thought,
sub-query, passages) to an extractor and append only the evidence it returns.
The extractor is either the policy itself (the loop's own ``server_manager``,
policy tokenizer and chat template) or a separate model behind an
OpenAI-compatible endpoint (:class:`~verl_evidence.backends.OpenAIBackend.chat`).
A failed extraction (no ``<extract>`` block, endpoint down) falls back to the
raw passages, so the agent never loses what was retrieved.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from verl_evidence.agent_loops.common import stop_sampling_params
from verl_evidence.prompts import check_placeholders, load_prompt, render_prompt
from verl_evidence.rewards.text import extract_last, strip_thinking

logger = logging.getLogger(__name__)

EXTRACTOR_FIELDS = ("question", "thought", "query", "passages")


@dataclass
class Extraction:
    evidence: str
    ok: bool
    reason: str = ""


class EvidenceExtractor:
    """Turns retrieved passages into extracted evidence.

    ``build_prompt_ids`` renders chat messages to policy token ids (the loop's
    Continuous Token builder) and is used in policy mode only.
    """

    def __init__(
        self,
        mode: str,
        prompt: str,
        max_tokens: int,
        tokenizer=None,
        server_manager=None,
        build_prompt_ids: Callable[[list[dict]], Awaitable[list[int]]] | None = None,
        remote=None,
        sampling_params: dict[str, Any] | None = None,
        rollout_name: str | None = None,
    ) -> None:
        if mode not in ("policy", "openai"):
            raise ValueError(f"extractor must be 'none', 'policy' or 'openai', got {mode!r}")
        if mode == "policy" and (server_manager is None or tokenizer is None or build_prompt_ids is None):
            raise ValueError("policy extractor needs the loop's server_manager, tokenizer and prompt builder")
        if mode == "openai" and remote is None:
            raise ValueError("openai extractor needs `extractor_url` and `extractor_model`")
        self.mode = mode
        self.template = load_prompt(prompt)
        check_placeholders(self.template, EXTRACTOR_FIELDS, name=f"extractor prompt {prompt!r}")
        self.max_tokens = max_tokens
        self.tokenizer = tokenizer
        self.server_manager = server_manager
        self.build_prompt_ids = build_prompt_ids
        self.remote = remote
        self.sampling_params = dict(sampling_params or {"temperature": 0.0})
        self.rollout_name = rollout_name

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
            if self.mode == "policy":
                params = stop_sampling_params(self.sampling_params, self.rollout_name, ["</extract>"], self.max_tokens)
                prompt_ids = await self.build_prompt_ids(messages)
                output = await self.server_manager.generate(
                    request_id=uuid4().hex, prompt_ids=prompt_ids, sampling_params=params
                )
                text = self.tokenizer.decode(output.token_ids, skip_special_tokens=True)
            else:
                params = {**self.sampling_params, "stop": ["</extract>"], "max_tokens": self.max_tokens}
                text = await self.remote.chat(messages, params)
                if "<extract>" in text and "</extract>" not in text:
                    text += "</extract>"  # servers that trim the stop string
        except Exception as err:  # noqa: BLE001  (any failure: the rollout goes on with the raw passages)
            logger.warning("evidence extractor (%s) failed: %s", self.mode, err)
            return Extraction(passages, ok=False, reason=f"error: {type(err).__name__}")
        evidence = extract_last(strip_thinking(text), "extract")
        if not evidence:
            logger.info("evidence extractor wrote no <extract> block; keeping the raw passages")
            return Extraction(passages, ok=False, reason="no_extract_block")
        return Extraction(evidence, ok=True)
