"""``eviomni`` driven by verl's AgentLoopWorker: trained response, masked-input answers, lengths."""

from __future__ import annotations

import pytest
from rollout_helpers import continues_a_reply, ids_through_stop, make_row, run_worker, unpad, with_settings

from retrieval_server.client import RetrievalClient
from verl_evidence.local.backends import RequestSeeds, ScriptedBackend
from verl_evidence.prompts import load_prompt, render_prompt
from verl_evidence.tools.documents import format_documents

pytestmark = pytest.mark.slow

QUESTION = "Which river flows north into the Mediterranean?"
PASSAGES = [
    "Nile\nThe Nile flows north through eleven countries and ends in a delta on the Mediterranean coast.",
    "Amazon\nThe Amazon carries more water than any other river and drains into the Atlantic Ocean.",
]
RATIONALE = "Only the first passage speaks of a river reaching the Mediterranean, so that passage holds the answer."
EVIDENCE = "Nile ends in a delta on the Mediterranean coast"
FIRST = f"<reason> {RATIONALE} </reason><extract> {EVIDENCE} </extract><answer> Nile </answer> extra"
ANSWER_F = " <answer> Nile </answer>"


def responder_for(script: dict):
    def respond(prompt: str) -> str:
        if "Some parts may be hidden" in prompt:
            kind = "e" if "Reasoning: [hidden]" in prompt else "r"
            script.setdefault("masked", {})[kind] = prompt
            return "<answer> Nile </answer>" if kind == "r" else "<answer> the Nile river </answer>"
        if continues_a_reply(prompt):
            return script.get("answer", ANSWER_F)
        return script.get("first", FIRST)

    return respond


def expected_prompt(tokenizer, passages: str, rationale: str, evidence: str) -> list[int]:
    text = render_prompt(
        load_prompt("eviomni_answer"), question=QUESTION, passages=passages, rationale=rationale, evidence=evidence
    )
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_trained_response_and_hard_masked_answer_prompts(vocab):
    tokenizer = vocab.tokenizer
    script: dict = {}
    backend = ScriptedBackend(tokenizer, responder=responder_for(script))
    out = unpad(run_worker(vocab.config, backend, [make_row(QUESTION, "eviomni", passages=PASSAGES)]))

    # with Qwen's vocabulary the token closing </extract> is '><': it carries the '<' of '<answer>'
    first_ids = ids_through_stop(tokenizer, FIRST, "</extract>")
    answer_ids = tokenizer.encode(ANSWER_F, add_special_tokens=False)
    # y~ = (r, e, o_f): everything trained, nothing else in the response
    assert out["response_ids"] == first_ids + answer_ids
    assert out["response_mask"] == [1] * len(out["response_ids"])
    assert len(backend.calls) == 4  # (r, e), o_f, o_r, o_e

    extra = out["extra"]
    assert extra["eviomni_answer_r"] == "<answer> Nile </answer>"
    assert extra["eviomni_answer_e"] == "<answer> the Nile river </answer>"
    assert extra["eviomni_len_r"] == len(tokenizer.encode(RATIONALE, add_special_tokens=False))
    assert extra["eviomni_len_e"] == len(tokenizer.encode(EVIDENCE, add_special_tokens=False))
    passages_block = format_documents([{"document": {"id": str(i), "contents": p}} for i, p in enumerate(PASSAGES)])
    assert extra["eviomni_len_p"] == len(tokenizer.encode(passages_block, add_special_tokens=False))
    assert extra["question"] == QUESTION

    # hard masking on the input, checked on the token ids the model actually received: each prompt is exactly the
    # ids of the answer template rendered with the masked parts replaced by the placeholder. (Not "no run of the
    # evidence's own ids": text tokenizes differently in context, so such runs prove nothing on a real vocabulary.)
    prompts = {}
    for call in backend.calls:
        text = tokenizer.decode(call["prompt_ids"])
        if "Some parts may be hidden" in text:
            prompts["e" if "Reasoning: [hidden]" in text else "r"] = call["prompt_ids"]
    assert set(prompts) == {"r", "e"}
    o_r, o_e = prompts["r"], prompts["e"]
    assert o_r == expected_prompt(tokenizer, passages_block, RATIONALE, "[hidden]")
    assert o_e == expected_prompt(tokenizer, "[hidden]", "[hidden]", EVIDENCE)
    # ... and the text they decode to (lossless) holds what each may see and none of what it may not
    r_text, e_text = tokenizer.decode(o_r), tokenizer.decode(o_e)
    assert RATIONALE in r_text and passages_block in r_text and "Evidence: [hidden]" in r_text
    assert EVIDENCE not in r_text
    masked_pieces = [
        "The Nile flows north through eleven countries",
        "The Amazon carries more water than any other river",
    ]
    for piece in masked_pieces + [RATIONALE]:
        assert piece not in e_text
    assert EVIDENCE in e_text
    # neither masked-answer prompt is part of the trained trajectory
    assert "Some parts may be hidden" not in tokenizer.decode(out["prompt_ids"] + out["response_ids"])


@pytest.mark.parametrize("after", ["<answer> Nile </answer>", "The answer is Nile.", "\n\n<answer> Nile </answer>"])
def test_the_answer_follows_when_the_token_closing_a_tag_carries_the_next_text(vocab, after):
    """Whether generation ended at ``</extract>`` (and at ``</answer>``) is decided from why it ended, not from the
    decoded text's last characters: Qwen's tokens ``'><'``, ``'>The'``, ``'>\n\n'`` and ``'>.'`` complete the tag and
    carry more. Decided on the text, such a first turn ended as ``no_extract`` with no answer o_f."""
    tokenizer = vocab.tokenizer
    first = f"<reason> {RATIONALE} </reason><extract> {EVIDENCE} </extract>{after}"
    script = {"first": first, "answer": " <answer> Nile </answer>."}
    backend = ScriptedBackend(tokenizer, responder=responder_for(script))
    out = unpad(run_worker(vocab.config, backend, [make_row(QUESTION, "eviomni", passages=PASSAGES)]))
    first_ids = ids_through_stop(tokenizer, first, "</extract>")
    answer_ids = ids_through_stop(tokenizer, script["answer"], "</answer>")
    if vocab.name != "test":  # the case under test: the closing tokens carry text past the tags
        assert not tokenizer.decode(first_ids).endswith("</extract>")
        assert not tokenizer.decode(answer_ids).endswith("</answer>")
    assert len(backend.calls) == 4  # (r, e), o_f, o_r, o_e
    assert out["response_ids"] == first_ids + answer_ids
    assert out["extra"]["termination"] == "answer"
    assert out["extra"]["eviomni_len_e"] == len(tokenizer.encode(EVIDENCE, add_special_tokens=False))


def test_passages_fetched_from_the_server_when_the_row_has_none(vocab, search_url):
    tokenizer = vocab.tokenizer
    config = with_settings(
        vocab.config, {"actor_rollout_ref.rollout.custom": {"eviomni": {"retrieval_url": search_url, "topk": 4}}}
    )
    backend = ScriptedBackend(tokenizer, responder=responder_for({}))
    out = unpad(run_worker(config, backend, [make_row(QUESTION, "eviomni")]))
    direct = RetrievalClient(search_url).retrieve([QUESTION], topk=4)[0]
    assert out["extra"]["retrieved_ids"] == [d["document"]["id"] for d in direct]
    block = format_documents(direct)
    assert out["extra"]["eviomni_len_p"] == len(tokenizer.encode(block, add_special_tokens=False))
    assert block in tokenizer.decode(backend.calls[0]["prompt_ids"])


def test_no_extract_block_means_no_continuation_and_zero_lengths(vocab):
    tokenizer = vocab.tokenizer
    script = {"first": "I do not know the format."}
    backend = ScriptedBackend(tokenizer, responder=responder_for(script))
    out = unpad(run_worker(vocab.config, backend, [make_row(QUESTION, "eviomni", passages=PASSAGES)]))
    assert out["response_ids"] == tokenizer.encode(script["first"], add_special_tokens=False) + [tokenizer.eos_token_id]
    assert len(backend.calls) == 3  # first part, o_r, o_e: no o_f after EOS
    assert out["extra"]["eviomni_len_r"] == 0 and out["extra"]["eviomni_len_e"] == 0
    assert out["extra"]["eviomni_answer_r"] == "<answer> Nile </answer>"


# --- failure paths (issue 12, item 4) ---


@pytest.mark.parametrize("vocab", ["test"], indirect=True)  # nothing here depends on the vocabulary
def test_no_passages_and_no_server_is_kept_out_of_the_loss(vocab):
    from retrieval_server.haproxy_front import free_port

    tokenizer = vocab.tokenizer
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    config = with_settings(
        vocab.config,
        {
            "actor_rollout_ref.rollout.custom": {
                "eviomni": {"retrieval_url": dead, "search_max_retries": 0, "search_timeout": 2}
            }
        },
    )
    backend = ScriptedBackend(tokenizer, responder=responder_for({}))
    output = run_worker(config, backend, [make_row(QUESTION, "eviomni")])
    out = unpad(output)
    assert out["response_mask"] == [0] * len(out["response_ids"]) and len(out["response_ids"]) == 1
    assert out["extra"]["retrieval_failed"] == 1.0 and out["extra"]["retrieval_error"]
    assert int(out["extra"]["min_global_steps"]) == 0  # the trajectory still carries the weight version
    assert len(backend.calls) == 1  # no reason/extract/answer generations from an empty passage block
    assert "Doc 1" not in tokenizer.decode(backend.calls[0]["prompt_ids"])
    # scored 0 by the manager: tests/rollout/test_end_to_end_rewards.py


def test_masked_text_cannot_reach_the_masked_prompts_through_a_system_message(vocab):
    tokenizer = vocab.tokenizer
    script: dict = {}
    system = (
        f"Context for the assistant. Passages: {PASSAGES[0].split(chr(10))[1]} {PASSAGES[1].split(chr(10))[1]} "
        f"Known evidence: {EVIDENCE}. Earlier reasoning: {RATIONALE}"
    )
    messages = [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}]
    backend = ScriptedBackend(tokenizer, responder=responder_for(script))
    run_worker(vocab.config, backend, [make_row(QUESTION, "eviomni", messages=messages, passages=PASSAGES)])
    prompts = {}
    for call in backend.calls:
        text = tokenizer.decode(call["prompt_ids"])
        if "Some parts may be hidden" in text:
            prompts["e" if "Reasoning: [hidden]" in text else "r"] = text
    assert set(prompts) == {"r", "e"}
    system_part = {kind: text.split("<|im_start|>user")[0] for kind, text in prompts.items()}
    assert "Context for the assistant" in system_part["r"] and "Context for the assistant" in system_part["e"]
    # o_r: the evidence is hidden everywhere, the rest of the system message stays
    assert EVIDENCE not in prompts["r"] and RATIONALE in system_part["r"]
    # o_e: passages and rationale hidden everywhere; only the evidence (its own input) may appear
    for piece in (PASSAGES[1].split("\n")[1], RATIONALE, "The Nile flows north through eleven countries"):
        assert piece not in prompts["e"], piece
    assert EVIDENCE in prompts["e"]


class NumberedLogprobBackend(ScriptedBackend):
    """Scripted engine whose log-prob for the i-th token of call k is -(k + i / 1000): concatenation is checkable."""

    async def generate(self, request_id, **kwargs):
        output = await super().generate(request_id, **kwargs)
        call = len(self.calls)
        output.log_probs = [-(call + i / 1000) for i in range(len(output.token_ids))]
        return output


def test_response_running_out_of_budget_is_cut_with_matching_logprobs(vocab):
    from rollout_helpers import RESPONSE_LENGTH  # not `from conftest`: another directory's conftest may own that name

    tokenizer = vocab.tokenizer
    long_answer = " <answer> " + "Nile " * RESPONSE_LENGTH + "</answer>"
    script = {"first": FIRST}

    def respond(prompt: str) -> str:
        if continues_a_reply(prompt):
            return long_answer
        return responder_for(script)(prompt)

    config = with_settings(vocab.config, {"actor_rollout_ref.rollout.calculate_log_probs": True})
    backend = NumberedLogprobBackend(tokenizer, responder=respond)
    output = run_worker(config, backend, [make_row(QUESTION, "eviomni", passages=PASSAGES)])
    out = unpad(output)
    first_ids = ids_through_stop(tokenizer, FIRST, "</extract>")
    assert len(out["response_ids"]) == RESPONSE_LENGTH  # o_f ran out of the budget: cut, not overflowing
    assert out["response_mask"] == [1] * RESPONSE_LENGTH
    logprobs = output.batch["rollout_log_probs"][0, :RESPONSE_LENGTH].tolist()
    # (r, e) from the first call, then o_f from the continuation call, token for token
    assert logprobs[: len(first_ids)] == pytest.approx([-(1 + i / 1000) for i in range(len(first_ids))])
    continuation = logprobs[len(first_ids) :]
    assert continuation[0] <= -2  # from a later call than the first (o_f runs beside o_r and o_e)
    assert continuation == pytest.approx([continuation[0] - i / 1000 for i in range(len(continuation))])


@pytest.mark.parametrize("vocab", ["test"], indirect=True)  # nothing here depends on the vocabulary
def test_requests_are_named_by_the_samples_place_under_full_determinism(vocab):
    """verl's rollout.full_determinism names a sample's requests by its place in the batch (a deterministic engine
    seeds by the name); each of this loop's concurrent requests gets a name of its own. Otherwise: fresh uuids."""
    tokenizer, base_config = vocab.tokenizer, vocab.config
    rows = [make_row(QUESTION, "eviomni", passages=PASSAGES)] * 2
    backend = ScriptedBackend(tokenizer, responder=responder_for({}))
    run_worker(with_settings(base_config, {"actor_rollout_ref.rollout.full_determinism": True}), backend, rows)
    parts = ("extract", "answer", "answer-without-evidence", "answer-from-evidence-only")
    assert sorted(call["request_id"] for call in backend.calls) == sorted(f"det-{n}-{p}" for n in (0, 1) for p in parts)

    backend = ScriptedBackend(tokenizer, responder=responder_for({}))
    run_worker(base_config, backend, rows)
    names = [call["request_id"] for call in backend.calls]
    assert len(set(names)) == 8 and not any(name.startswith("det-") for name in names)


class SeedReplyBackend(ScriptedBackend):
    """Answers a masked-input prompt with the seed the CPU engine samples it with (``RequestSeeds``: the request's
    own seed, else its prompt and how many requests of that prompt came before), so a reply shows which draw it is."""

    def __init__(self, tokenizer, firsts: list[str]):
        super().__init__(tokenizer, responder=self._respond)
        self.firsts = list(firsts)  # the (r, e) parts, handed out in arrival order
        self.seeds = RequestSeeds(7)
        self._seed = 0

    def _record(self, request_id, prompt_ids, sampling_params):
        super()._record(request_id, prompt_ids, sampling_params)
        self._seed = self.seeds.next(prompt_ids, sampling_params)  # read by _respond: no await in between

    def _respond(self, prompt: str) -> str:
        if "Some parts may be hidden" in prompt:
            return f"<answer> draw {self._seed} </answer>"
        if continues_a_reply(prompt):
            return ANSWER_F
        return self.firsts.pop(0)


@pytest.mark.parametrize("vocab", ["test"], indirect=True)  # nothing here depends on the vocabulary
def test_a_masked_answer_stays_with_its_sample_whatever_order_the_samples_arrive_in(vocab):
    """Two samples with one rationale and different evidence ask the same answer-without-evidence prompt. Under
    full determinism each gets the draw of its own trajectory, in every run and whichever sample's request comes
    first: seeded by prompt and arrival, they traded draws (and rewards) from run to run."""
    tokenizer, base_config = vocab.tokenizer, vocab.config
    first_a = f"<reason> {RATIONALE} </reason><extract> {EVIDENCE} </extract>"
    first_b = f"<reason> {RATIONALE} </reason><extract> Amazon drains into the Atlantic Ocean </extract>"
    rows = [make_row(QUESTION, "eviomni", passages=PASSAGES)] * 2
    config = with_settings(base_config, {"actor_rollout_ref.rollout.full_determinism": True})

    def answers_by_evidence(firsts: list[str]) -> dict[str, str]:
        backend = SeedReplyBackend(tokenizer, firsts)
        output = run_worker(config, backend, rows)
        masked = [c for c in backend.calls if "answer-without-evidence" in c["request_id"]]
        assert len(masked) == 2 and masked[0]["prompt_ids"] == masked[1]["prompt_ids"]  # one prompt for both
        out = [unpad(output, row) for row in range(2)]
        return {
            tokenizer.decode(o["response_ids"]).split("<extract>")[1][:12]: o["extra"]["eviomni_answer_r"] for o in out
        }

    one_way, other_way = answers_by_evidence([first_a, first_b]), answers_by_evidence([first_b, first_a])
    assert len(set(one_way.values())) == 2  # different trajectories, different draws
    assert one_way == other_way

    # outside full determinism nothing is seeded: the engine samples as it would
    backend = SeedReplyBackend(tokenizer, [first_a, first_b])
    run_worker(base_config, backend, rows)
    assert not any("seed" in call["sampling_params"] for call in backend.calls)


def test_a_side_generations_seed_is_its_trajectorys_and_only_under_full_determinism():
    from types import SimpleNamespace

    from verl_evidence.agent_loops.common import seeded_by_trajectory

    config = SimpleNamespace(full_determinism=True, seed=42)
    params = {"temperature": 1.0}
    seeded = seeded_by_trajectory(params, config, "vllm", [1, 2, 3], "o_r")
    assert 0 <= seeded["seed"] < 2**31 and seeded["temperature"] == 1.0 and "seed" not in params
    assert seeded == seeded_by_trajectory(params, config, None, [1, 2, 3], "o_r")  # vLLM and the CPU engine alike
    others = [
        seeded_by_trajectory(params, config, "vllm", [1, 2, 4], "o_r"),  # another trajectory
        seeded_by_trajectory(params, config, "vllm", [1, 2, 3], "o_e"),  # another side generation
        seeded_by_trajectory(params, SimpleNamespace(full_determinism=True, seed=43), "vllm", [1, 2, 3], "o_r"),
    ]
    assert len({seeded["seed"], *(other["seed"] for other in others)}) == 4
    assert seeded_by_trajectory(params, config, "sglang", [1, 2, 3], "o_r") == params  # SGLang: another key
    assert seeded_by_trajectory(params, SimpleNamespace(full_determinism=False, seed=42), "vllm", [1], "o_r") == params


def test_an_eval_replay_gives_the_answer_to_the_continuation_when_the_closing_token_carries_text(vocab):
    """``verl-evidence eval``'s replay of an EviOmni script routes each call by its prompt: the continuation of the
    first turn gets o_f. Routed by "the prompt ends in </extract>", a first turn closed by Qwen's ``'>The'`` sent
    o_f's call the answer without evidence (its prompt shows the rationale too)."""
    from verl_evidence.eval.runner import EvalExample
    from verl_evidence.eval.session import replay_backend

    tokenizer = vocab.tokenizer
    row = make_row(QUESTION, "eviomni", passages=PASSAGES)
    first = f"<reason> {RATIONALE} </reason><extract> {EVIDENCE} </extract>The"
    script = [first, " answer is <answer> Nile </answer>", "<answer> o_r </answer>", "<answer> o_e </answer>"]
    backend = replay_backend(EvalExample("e1", row, script=script), tokenizer)
    out = unpad(run_worker(vocab.config, backend, [row]))
    expected = ids_through_stop(tokenizer, first, "</extract>") + ids_through_stop(tokenizer, script[1], "</answer>")
    assert out["response_ids"] == expected
    assert (out["extra"]["eviomni_answer_r"], out["extra"]["eviomni_answer_e"]) == (script[2], script[3])
