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
- A retrieval failure becomes the observation "the search failed" and is
  counted in ``extra_fields["search_errors"]``; but when most searches of a
  training step in this worker fail (``search_failure_threshold`` after
  ``search_failure_min_searches``), the rollout raises
  :class:`~verl_evidence.tools.search_service.RetrievalBrokenError` naming the
  server and the last failure instead of training on failed searches.

EviPath planners (``action_format: paper``, ``observation_role: user``,
``observation: executor``; presets in :data:`EVIPATH_SETTINGS`) run in the
token layout of their SFT data: each observation is a user chat turn rendered
through the chat template (mask 0) followed by a fresh assistant header, and
each ``Search("sub-question")`` is answered by the EviPath executor over the
retrieved passages (its one-sentence ``<answer>`` is the observation).

``extra_fields`` follow docs/data-contracts.md.
"""

from __future__ import annotations

import asyncio
import logging
from enum import Enum
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.utils.profiler import simple_timer
from verl.utils.rollout_trace import rollout_trace_op

from retrieval_server.client import RetrievalError
from verl_evidence.agent_loops.base import SettingsAgentLoop
from verl_evidence.agent_loops.common import (
    EngineFields,
    encode,
    encode_cached,
    question_of,
    request_id,
    stop_sampling_params,
)
from verl_evidence.agent_loops.extractor import EvidenceExtractor, SubQuestionExecutor
from verl_evidence.agent_loops.protocol import (
    first_action,
    information_text,
    last_thought,
    observation_text,
    planner_action,
)
from verl_evidence.agent_loops.search_loop_settings import (
    EVIPATH_SETTINGS,
    INFORMATION_CLOSE,
    INFORMATION_OPEN,
    Opening,
    SearchLoopSettings,
)
from verl_evidence.agent_loops.trajectory import Trajectory, assistant_turn_end_ids
from verl_evidence.dataprep.templates import DEFAULT_PROMPTS
from verl_evidence.text.stops import cut_at_stop
from verl_evidence.text.tags import find_blocks
from verl_evidence.tools.documents import (
    document_format_for_prompt,
    document_ids,
    format_documents,
)
from verl_evidence.tools.search_service import SearchService

logger = logging.getLogger(__name__)

LOOP_NAME = "evidence_search"


OBSERVATION_SEPARATOR = "\n\n"  # between a turn's action and an inline observation (INFORMATION_OPEN starts with it)


def carried_newlines(turn_text: str) -> int:
    """How much of :data:`OBSERVATION_SEPARATOR` a turn already ends with.

    An engine returns the token that completes a stop string whole, and in a real vocabulary that token often carries
    the model's next characters (Qwen's ``'>\\n\\n'`` after ``</search>``). Those stay the policy's (mask 1, as
    generated); the observation then opens with only the newlines still missing, so the text the policy reads next is
    ``</search>\\n\\n<information>`` whichever way the separator was tokenized, never four newlines.
    """
    tail = len(turn_text) - len(turn_text.rstrip("\n"))
    return min(tail, len(OBSERVATION_SEPARATOR))


def cut_between_characters(tokenizer, ids: list[int], text: str, limit: int) -> list[int]:
    """The first ``limit`` of ``text``'s ``ids``, or up to 3 fewer: as many as decode to a prefix of ``text``.

    In a byte-level vocabulary one character may span several tokens (Qwen's 'Ó' is two); a cut between them would
    end the observation in half a character, decoded as U+FFFD, which the documents do not contain. A UTF-8
    character has at most 4 bytes, so at most 3 tokens go. A tokenizer whose decoding does not give back the text
    (a normalizer) is cut at ``limit`` as before.
    """
    for end in range(limit, max(0, limit - 3) - 1, -1):
        if text.startswith(tokenizer.decode(ids[:end])):
            return ids[:end]
    return ids[:limit]


class TurnState(Enum):
    """Where a trajectory is: the states of :meth:`EvidenceSearchAgentLoop.run`."""

    GENERATING = "generating"  # the policy writes a turn
    SEARCHING = "searching"  # the turn searched: run it, append the observation
    CORRECTING = "correcting"  # the turn had no valid action: append the correction
    TERMINATED = "terminated"


class SearchAgentData:
    """One trajectory's state, handed from handler to handler (verl's ``AgentData`` for the text-tag protocol)."""

    def __init__(self, question: str, prompt_ids: list[int], response_length: int, request_id: str) -> None:
        self.question = question
        self.prompt_ids = prompt_ids
        self.request_id = request_id  # every policy turn's: one trajectory, one name (verl's ToolAgentLoop's)
        self.traj = Trajectory(response_length)
        self.engine = EngineFields()  # weight versions etc. from every policy turn, as verl's trainer expects
        self.timing: dict[str, float] = {}
        self.turn = 0  # index of the policy turn being written (or last written)
        self.turn_ids: list[int] = []  # that turn's kept tokens and text
        self.turn_text = ""
        self.queries: list[str] = []  # that turn's searches
        self.generations = 0
        self.policy_texts: list[str] = []
        self.searches: list[str] = []
        self.retrieved_ids: list[list[str]] = []
        self.context_tokens = 0
        self.raw_context_tokens = 0
        self.observation_messages = 0
        self.invalid_actions = 0
        self.search_errors = 0
        self.extractor_failures = 0
        self.termination = "max_turns"
        self.document_format = "ours"

    def end(self, termination: str) -> TurnState:
        self.termination = termination
        return TurnState.TERMINATED


class EvidenceSearchAgentLoop(SettingsAgentLoop):
    """Search-R1 / EviNote text-tag search loop; registered as ``evidence_search``."""

    loop_name = LOOP_NAME
    settings_cls = SearchLoopSettings

    def __init__(self, *args: Any, remote_extractor=None, **kwargs: Any):
        # `remote_extractor` replaces the extractor's HTTP client when the loop is built by hand.
        super().__init__(*args, **kwargs)
        s = self.settings
        self.search = SearchService(settings=s.search_settings(), retriever=self.retriever)
        self.opening = Opening.from_settings(s)
        self.turn_end_ids = (
            assistant_turn_end_ids(self.tokenizer, self.apply_chat_template_kwargs)
            if s.observation_role == "user"
            else []
        )
        self.extractor: EvidenceExtractor | None = None
        self.executor: SubQuestionExecutor | None = None
        if s.observation_mode != "passages":
            if s.observation_model == "openai" and remote_extractor is None and (s.extractor_url and s.extractor_model):
                from verl_evidence.agent_loops.openai_endpoint import OpenAIEndpoint

                remote_extractor = OpenAIEndpoint(s.extractor_url, s.extractor_model, api_key=s.extractor_api_key)
            plumbing = {
                "tokenizer": self.tokenizer,
                "server_manager": self.server_manager,
                "build_prompt_ids": self.ct_build_initial_tokens,
                "remote": remote_extractor,
                "sampling_params": {"temperature": s.extractor_temperature},
                "rollout_name": self.rollout_name,
            }
            if s.observation_mode == "extract":
                self.extractor = EvidenceExtractor(
                    s.observation_model, s.extractor_prompt, s.extractor_max_tokens, **plumbing
                )
            else:
                self.executor = SubQuestionExecutor(
                    s.observation_model, s.executor_prompt, s.executor_max_tokens, **plumbing
                )

    # -- pieces -----------------------------------------------------------------

    def _messages(self, kwargs: dict[str, Any], question: str) -> list[dict]:
        return self.opening.messages(kwargs["raw_prompt"], question)

    def _document_format(self, kwargs: dict[str, Any]) -> str:
        """The setting, or (auto) the layout of the prompt the policy reads: Search-R1's rows see Search-R1's."""
        if self.settings.document_format != "auto":
            return self.settings.document_format
        extra_info = kwargs.get("extra_info") or {}
        method = extra_info.get("method") if isinstance(extra_info, dict) else None
        return document_format_for_prompt(self.settings.prompt or DEFAULT_PROMPTS.get(str(method)))

    def _policy_turn(self, token_ids: list[int]) -> tuple[list[int], str]:
        """Drop anything generated after the first complete action; return kept ids and their text."""
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        action = planner_action(text, self.settings.action_format)
        if action is not None and text[action[2] :].strip():
            token_ids, _ = cut_at_stop(token_ids, self.tokenizer, self.settings.stops, set())
            text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        return token_ids, text

    def _user_turn(self, content: str, runtime_ids: list[int], turn_ids: list[int], traj: Trajectory) -> list[int]:
        """Context tokens (mask 0) that close the assistant turn and add ``content`` as a user turn.

        The layout of verl's multi-turn SFT data and of its ToolAgentLoop: the template's
        end of the assistant message (what the policy did not generate of it), the user
        message rendered by the chat template through verl's Continuous Token builder,
        and the next assistant header. Builders that rewrite the boundary (drop tokens
        before appending) are honoured by dropping those tokens from the trajectory.
        """
        closing = self.turn_end_ids
        done = next((k for k in range(len(closing), 0, -1) if turn_ids[-k:] == closing[:k]), 0)
        close = closing[done:]
        base = runtime_ids + close
        merge = self.continuous_token_builder.merge_context_tokens([], [{"role": "user", "content": content}], base)
        keep = len(base) - merge.removed_prefix_token_count
        traj.drop_last(max(0, len(runtime_ids) - keep))
        return close[: max(0, keep - len(runtime_ids))] + merge.token_ids[keep:]

    def _notice_text(self, turn: int) -> str:
        """The final-turn notice when the next turn is the last one, else ""."""
        if turn + 1 == self.settings.max_turns - 1 and self.settings.final_turn_notice:
            return self.settings.final_turn_notice
        return ""

    def _notice(self, turn: int) -> list[int]:
        notice = self._notice_text(turn)
        return encode_cached(self.tokenizer, notice) if notice else []

    def _context(self, user_content: str, inline_ids: list[int], turn: int, runtime_ids, turn_ids, traj) -> list[int]:
        """What follows a turn: inline tokens (+ notice), or a user chat turn (+ notice inside it)."""
        if self.settings.observation_role == "inline":
            return inline_ids + self._notice(turn)
        notice = self._notice_text(turn).strip()
        content = f"{user_content}\n{notice}" if notice else user_content
        return self._user_turn(content, runtime_ids, turn_ids, traj)

    # -- the loop: a state machine as verl's ToolAgentLoop (one handler per state) ------------------------

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs) -> AgentLoopOutput:
        question = question_of(kwargs)
        prompt_ids = await self.ct_build_initial_tokens(self._messages(kwargs, question))
        data = SearchAgentData(question, prompt_ids, self.response_length, request_id(self.rollout_config, priority))
        data.document_format = self._document_format(kwargs)
        state = TurnState.GENERATING
        while state is not TurnState.TERMINATED:
            if state is TurnState.GENERATING:
                state = await self._handle_generating(data, sampling_params, int(priority))
            elif state is TurnState.SEARCHING:
                state = await self._handle_searching(data)
            elif state is TurnState.CORRECTING:
                state = self._handle_correcting(data)
            else:
                raise AssertionError(f"no handler for {state}")
        return self._output(data)

    async def _handle_generating(
        self, data: SearchAgentData, sampling_params: dict[str, Any], priority: int
    ) -> TurnState:
        """One policy turn; its first complete action decides what comes next."""
        s, traj = self.settings, data.traj
        if traj.remaining <= 0:
            return data.end("response_length")
        budget = traj.remaining if s.max_tokens_per_turn is None else min(traj.remaining, s.max_tokens_per_turn)
        params = stop_sampling_params(sampling_params, self.rollout_name, s.stops, budget)
        with simple_timer("generate_sequences", data.timing):
            output = await self.server_manager.generate(
                request_id=data.request_id,
                prompt_ids=data.prompt_ids + traj.ids,
                sampling_params=params,
                priority=priority,
            )
        data.engine.add(output)
        data.generations += 1
        data.turn_ids, data.turn_text = self._policy_turn(list(output.token_ids)[:budget])
        traj.add_policy(data.turn_ids, output.log_probs[: len(data.turn_ids)] if output.log_probs else None)
        data.policy_texts.append(data.turn_text)
        action = planner_action(data.turn_text, s.action_format)
        if action is not None and action[0] == "answer":
            return data.end("answer")
        last_turn = data.turn == s.max_turns - 1
        if action is not None and action[1] and not last_turn:  # a search without a query is an invalid action
            data.queries = action[1]
            return TurnState.SEARCHING
        if last_turn:  # the last turn may only answer: a search there is not run
            return data.end("max_turns")
        if traj.remaining <= 0:  # cut off mid-turn by the response budget
            return data.end("response_length")
        return TurnState.CORRECTING  # EOS without an answer, or the per-turn cap reached mid-thought

    async def _handle_searching(self, data: SearchAgentData) -> TurnState:
        """Run the turn's searches and append their observation (mask 0)."""
        s = self.settings
        data.searches.extend(data.queries)
        step = data.engine.fields.get("global_steps")  # the weight version of the turn that searched
        observed = await asyncio.gather(*(self._observe(query, data, step) for query in data.queries))
        texts = []
        inline_ids: list[int] = []
        for text, raw_tokens, ids in observed:
            data.retrieved_ids.append(ids)
            body = encode(self.tokenizer, text)
            if len(body) > s.max_obs_tokens:
                body = cut_between_characters(self.tokenizer, body, text, s.max_obs_tokens)
                text = self.tokenizer.decode(body)
            texts.append(text)
            data.context_tokens += len(body)
            data.raw_context_tokens += raw_tokens
            inline_ids = body
        # the blank line before an inline observation counts what the turn's last token already wrote of it
        carried = carried_newlines(data.turn_text)
        if s.action_format == "search":
            user_content = information_text(texts[0])
            opening = INFORMATION_OPEN[carried:]
            opening, closing = (encode_cached(self.tokenizer, t) for t in (opening, INFORMATION_CLOSE))
            inline_ids = opening + inline_ids + closing
        else:
            user_content = observation_text(texts)
            inline_ids = encode(self.tokenizer, f"{OBSERVATION_SEPARATOR[carried:]}{user_content}\n\n")
        data.observation_messages += 1
        return self._append_context(data, user_content, inline_ids, retrieved=True)

    def _handle_correcting(self, data: SearchAgentData) -> TurnState:
        """A turn without a valid action: append the correction (mask 0) and let the policy try again."""
        data.invalid_actions += 1
        feedback = self.settings.feedback
        return self._append_context(data, feedback.strip(), encode_cached(self.tokenizer, feedback))

    def _append_context(
        self, data: SearchAgentData, user_content: str, inline_ids: list[int], retrieved: bool = False
    ) -> TurnState:
        """Append what follows the turn (mask 0); a trajectory out of budget ends here.

        ``retrieved``: it is a search's observation (with its wrapping and any notice: all of it from the system).
        """
        pieces = self._context(
            user_content, inline_ids, data.turn, data.prompt_ids + data.traj.ids, data.turn_ids, data.traj
        )
        if data.traj.add_context(pieces, retrieved=retrieved) < len(pieces):
            return data.end("response_length")
        data.turn += 1
        return TurnState.GENERATING

    async def _observe(self, query: str, data: SearchAgentData, step: Any) -> tuple[str, int, list[str]]:
        """The observation text for one search, the raw passages' token count and the document ids.

        A failed search becomes an observation, unless most of training ``step``'s searches failed:
        then :class:`RetrievalBrokenError` ends the rollout.
        """
        try:
            with simple_timer("tool_calls", data.timing):
                results = (await self.search.search([query]))[0]
        except RetrievalError as err:
            logger.warning("evidence_search: retrieval failed for %r: %s", query, err)
            data.search_errors += 1
            self.search.record(step, f"{type(err).__name__}: {err}")
            return self.settings.search_failed_text, 0, []
        self.search.record(step, None)
        ids = document_ids(results)
        documents = format_documents(results, data.document_format)
        raw_tokens = len(encode(self.tokenizer, documents))
        if self.executor is not None:
            contents = [r["document"]["contents"] for r in results]
            answer = await self.executor.answer(query, contents, documents)
            if not answer.ok:
                data.extractor_failures += 1
            return answer.evidence, raw_tokens, ids
        if self.extractor is None:
            return documents, raw_tokens, ids
        extraction = await self.extractor.extract(data.question, last_thought(data.turn_text), query, documents)
        if not extraction.ok:
            data.extractor_failures += 1
            return documents, raw_tokens, ids
        return f"<evidence>{extraction.evidence}</evidence>", raw_tokens, ids

    def _output(self, data: SearchAgentData) -> AgentLoopOutput:
        summaries = find_blocks("".join(data.policy_texts), "summary")
        context_tokens, raw_context_tokens = data.context_tokens, data.raw_context_tokens
        extra_fields = data.engine.merged_with(
            {
                "question": data.question,
                "summary_count": len(summaries),
                "last_summary": summaries[-1] if summaries else "",
                "searches": data.searches,
                "retrieved_ids": data.retrieved_ids,
                "num_searches": len(data.searches),
                "context_tokens": context_tokens,
                "raw_context_tokens": raw_context_tokens,
                "compression_ratio": (raw_context_tokens / context_tokens) if context_tokens else 0.0,
                "invalid_actions": data.invalid_actions,
                "search_errors": data.search_errors,
                "extractor_failures": data.extractor_failures,
                "termination": data.termination,
                "retrieved_spans": [
                    [a, min(b, self.response_length)] for a, b in data.traj.retrieved_spans if a < self.response_length
                ],
                "turn_scores": [],
                "tool_rewards": [],
            }
        )
        metrics = {
            "generate_sequences": data.timing.get("generate_sequences", 0.0),
            "tool_calls": data.timing.get("tool_calls", 0.0),
        }
        traj, n = data.traj, self.response_length
        return AgentLoopOutput(
            prompt_ids=data.prompt_ids,
            response_ids=traj.ids[:n],
            response_mask=traj.mask[:n],
            response_logprobs=traj.logprobs[:n] if traj.has_logprobs else None,
            num_turns=data.generations + data.observation_messages + data.invalid_actions + 1,
            metrics=metrics,
            extra_fields=extra_fields,
        )


__all__ = [
    "EVIPATH_SETTINGS",
    "LOOP_NAME",
    "EvidenceSearchAgentLoop",
    "SearchAgentData",
    "SearchLoopSettings",
    "TurnState",
    "assistant_turn_end_ids",
    "first_action",
    "planner_action",
]
