"""The agent loops' token invariants, stated once (issue 52, item 2) and checked by test_loop_invariants.py for each
loop and both vocabularies.

Each holds for any model output, in any vocabulary:

- the response's ids, loss mask and log-probs have one length;
- the mask-1 runs are, in order, exactly what the engine returned for each policy turn: the scripted text's tokens up
  to and including the one that completes the stop string (or EOS), within the turn's ``max_tokens``;
- the mask-0 runs are exactly the loop's context, token by token: a search's observation (one blank line after the
  action, counting the newlines the turn's last token already wrote, then ``<information>`` + the documents'
  ids + ``</information>``; with ``observation_role: user`` the chat template's end of the assistant message, the
  user message and the next assistant header) or the correction; the documents in the row's layout (ours or
  Search-R1's), their ids cut to ``max_obs_tokens`` between characters (decoding to a prefix of the documents);
  ``retrieved_spans`` are the observations' runs;
- EviOmni's masked-answer prompts are the ids of the answer template rendered with the hidden parts replaced by the
  placeholder (their text decodes to exactly that message and nothing of the hidden parts), and ``len_r`` / ``len_e``
  / ``len_p`` count r, e and the passages block in the policy's tokenizer.

Expected values are computed here from the scripted texts, without the loops' own stop helpers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verl_evidence.local.backends import ScriptedBackend


class RecordingBackend(ScriptedBackend):
    """The scripted engine, keeping what it returned for each call (ids) and the text it was asked to write."""

    def __init__(self, tokenizer, **kwargs: Any) -> None:
        super().__init__(tokenizer, **kwargs)
        self.outputs: list[list[int]] = []
        self.texts: list[str] = []
        responder = self._responder
        if responder is not None:

            def record_text(prompt: str) -> str:
                text = responder(prompt)
                self.texts.append(text)
                return text

            self._responder = record_text

    async def generate(self, request_id, **kwargs: Any):
        if self._turns is not None and self._turns:
            self.texts.append(self._turns[0])
        output = await super().generate(request_id, **kwargs)
        self.outputs.append(list(output.token_ids))
        return output


def engine_ids(tokenizer, text: str, stops: Sequence[str], max_tokens: int) -> list[int]:
    """What vLLM/SGLang return for a model that writes ``text`` then EOS: its tokens through the first that completes
    a stop string, or through EOS, at most ``max_tokens``."""
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    for end in range(1, len(ids) + 1):
        if ids[end - 1] == tokenizer.eos_token_id or any(s in tokenizer.decode(ids[:end]) for s in stops):
            return ids[: min(end, max_tokens)]
    return ids[:max_tokens]


def mask_runs(ids: Sequence[int], mask: Sequence[int]) -> list[tuple[int, int, int]]:
    """Runs of equal mask: ``(mask, start, end)``."""
    runs: list[tuple[int, int, int]] = []
    for position, value in enumerate(mask):
        if runs and runs[-1][0] == value:
            runs[-1] = (value, runs[-1][1], position + 1)
        else:
            runs.append((value, position, position + 1))
    return runs


def run_and_keep_loop_outputs(config, backend, rows) -> tuple[Any, list[Any]]:
    """verl's worker over ``rows``, and each loop's own ``AgentLoopOutput`` before verl pads it (verl pads ids, mask
    and log-probs each on its own: a length mismatch would not show in the batch)."""
    from rollout_helpers import loop_worker, run_worker

    worker = loop_worker(config, backend)
    kept: list[Any] = []
    postprocess = type(worker)._agent_loop_postprocess

    async def keep(output, validate, **kwargs):
        kept.append(output.model_copy(deep=True))
        return await postprocess(worker, output, validate, **kwargs)

    worker._agent_loop_postprocess = keep  # this worker object only
    try:
        return run_worker(config, backend, rows), kept
    finally:
        del worker._agent_loop_postprocess


def check_lengths(loop_output) -> None:
    """The loop's response ids, loss mask and (if any) log-probs have one length."""
    n = len(loop_output.response_ids)
    assert len(loop_output.response_mask) == n
    if loop_output.response_logprobs is not None:
        assert len(loop_output.response_logprobs) == n


def observation_cut(tokenizer, observation: str, max_obs_tokens: int) -> list[int]:
    """The ids of an observation's body: its tokens, at most ``max_obs_tokens``; a cut never splits a character (the
    kept ids decode to a prefix of the text), so it keeps the most ids, up to 3 fewer, that decode to one."""
    ids = tokenizer.encode(observation, add_special_tokens=False)
    if len(ids) <= max_obs_tokens:
        return ids
    end = max(
        n
        for n in range(max(0, max_obs_tokens - 3), max_obs_tokens + 1)
        if observation.startswith(tokenizer.decode(ids[:n]))
    )
    return ids[:end]


def user_turn_ids(tokenizer, policy_ids: Sequence[int], content: str) -> list[int]:
    """What follows a policy turn with ``observation_role: user``: the chat template's end of the assistant message
    (less what the policy generated of it), ``content`` as a user message and the next assistant header."""
    probe = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ZQXJ"}]
    before = tokenizer.apply_chat_template(probe, tokenize=False)
    after = tokenizer.apply_chat_template(
        [*probe, {"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    assert after.startswith(before)
    end_of_message = before[before.rindex("ZQXJ") + 4 :]
    close = tokenizer.encode(end_of_message, add_special_tokens=False)
    done = max(k for k in range(len(close) + 1) if k == 0 or list(policy_ids[-k:]) == close[:k])
    return close[done:] + tokenizer.encode(after[len(before) :], add_special_tokens=False)


def check_search_rollout(
    tokenizer,
    out: dict,
    backend: RecordingBackend,
    observations: dict[str, str],
    response_length: int,
    observation_role: str = "inline",
    max_obs_tokens: int = 100_000,
) -> None:
    """``evidence_search`` (``search`` layout): every policy run is the engine's reply, every context run the
    observation of the query just searched (cut to ``max_obs_tokens`` between characters) or the correction, inline
    or as a user chat turn; spans = observation runs."""
    from verl_evidence.agent_loops.search_loop_settings import (
        ACTION_STOPS,
        INFORMATION_CLOSE,
        SEARCH_INVALID_ACTION_FEEDBACK,
    )

    ids, mask = out["response_ids"], out["response_mask"]
    assert len(ids) == len(mask) <= response_length
    runs = mask_runs(ids, mask)
    policy_runs = [r for r in runs if r[0] == 1]
    assert len(policy_runs) <= len(backend.outputs)
    spans = []
    for k, (_, start, end) in enumerate(policy_runs):
        call = backend.calls[k]
        expected = engine_ids(tokenizer, backend.texts[k], ACTION_STOPS, call["sampling_params"]["max_tokens"])
        assert backend.outputs[k] == expected, f"turn {k}: the engine's reply is not the text through its stop"
        assert ids[start:end] == expected[: end - start]  # the policy's tokens, as generated, in order
        assert end - start == len(expected) or end == response_length  # cut only by the response budget
        assert call["prompt_ids"] == out["prompt_ids"] + ids[:start]  # each turn saw everything before it
        following = next((r for r in runs if r[1] == end), None)
        if following is None:
            continue
        context_ids = ids[following[1] : following[2]]
        turn_text, context = tokenizer.decode(expected), tokenizer.decode(context_ids)
        complete = following[2] < response_length
        if "</search>" in turn_text:
            query = turn_text.split("<search>")[-1].split("</search>")[0].strip()
            body = observation_cut(tokenizer, observations[query], max_obs_tokens)
            text = tokenizer.decode(body)
            assert observations[query].startswith(text), "the cut observation is not whole characters of the text"
            if observation_role == "user":
                full_ids = user_turn_ids(tokenizer, expected, f"<information> {text} </information>")
            else:
                carried = turn_text.split("</search>", 1)[1]
                newlines = min(2, len(carried) - len(carried.rstrip("\n")))
                opening = tokenizer.encode("\n\n"[newlines:] + "<information>", add_special_tokens=False)
                full_ids = opening + body + tokenizer.encode(INFORMATION_CLOSE, add_special_tokens=False)
                full = "\n\n"[newlines:] + "<information>" + text + INFORMATION_CLOSE
                assert context == full if complete else full.startswith(context), (turn_text, context)
                assert "\n\n\n" not in turn_text[-2:] + context[:3]
            assert context_ids == (full_ids if complete else full_ids[: len(context_ids)]), (turn_text, context)
            spans.append([following[1], following[2]])
        else:
            assert "</answer>" not in turn_text
            feedback = SEARCH_INVALID_ACTION_FEEDBACK
            if observation_role == "user":
                full_ids = user_turn_ids(tokenizer, expected, feedback.strip())
                assert context_ids == (full_ids if complete else full_ids[: len(context_ids)]), (turn_text, context)
            else:
                assert context == feedback if complete else feedback.startswith(context)
    assert [list(span) for span in out["extra"]["retrieved_spans"]] == spans


def check_eviomni_rollout(
    tokenizer,
    out: dict,
    backend: RecordingBackend,
    first: str,
    answer: str,
    question: str,
    passages_block: str,
    passage_texts: Sequence[str],
    response_length: int,
    placeholder: str = "[hidden]",
) -> None:
    """``eviomni``: the response is the first turn through ``</extract>`` and o_f through ``</answer>``, all mask 1;
    the masked prompts are the rendered answer template's ids; the lengths count in the policy's tokenizer."""
    from verl_evidence.prompts import load_prompt, render_prompt
    from verl_evidence.text.tags import extract_last, strip_thinking

    first_ids = engine_ids(tokenizer, first, ["</extract>"], response_length)
    first_text = tokenizer.decode(first_ids)
    remaining = response_length - len(first_ids)
    answered = "</extract>" in first_text and remaining > 0
    answer_ids = engine_ids(tokenizer, answer, ["</answer>"], remaining) if answered else []
    assert out["response_ids"] == first_ids + answer_ids
    assert out["response_mask"] == [1] * len(out["response_ids"])
    assert len(backend.calls) == 3 + answered

    body = strip_thinking(tokenizer.decode(first_ids, skip_special_tokens=True))
    rationale, evidence = extract_last(body, "reason") or "", extract_last(body, "extract") or ""
    extra = out["extra"]
    assert extra["eviomni_len_r"] == (len(tokenizer.encode(rationale, add_special_tokens=False)) if rationale else 0)
    assert extra["eviomni_len_e"] == (len(tokenizer.encode(evidence, add_special_tokens=False)) if evidence else 0)
    assert extra["eviomni_len_p"] == len(tokenizer.encode(passages_block, add_special_tokens=False))

    template = load_prompt("eviomni_answer")
    expected = {
        "r": render_prompt(
            template, question=question, passages=passages_block, rationale=rationale, evidence=placeholder
        ),
        "e": render_prompt(template, question=question, passages=placeholder, rationale=placeholder, evidence=evidence),
    }
    masked = {}
    for call in backend.calls:
        kind = call["request_id"]
        if "answer-without-evidence" in kind:
            masked["r"] = call["prompt_ids"]
        elif "answer-from-evidence-only" in kind:
            masked["e"] = call["prompt_ids"]
    assert set(masked) == {"r", "e"}
    for kind, message in expected.items():
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=True
        )
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        assert masked[kind] == ids, f"o_{kind}'s prompt is not the rendered template's ids"
        rendered = tokenizer.decode(ids, skip_special_tokens=False)
        assert tokenizer.decode(masked[kind], skip_special_tokens=False) == rendered
    e_text = tokenizer.decode(masked["e"])
    for passage in passage_texts:  # o_e: no passage, whatever the evidence quotes of it
        assert passage not in e_text
    if rationale and rationale not in expected["e"]:  # (the evidence or the question may quote it)
        assert rationale not in e_text
    if evidence and evidence not in expected["r"]:
        assert evidence not in tokenizer.decode(masked["r"])
