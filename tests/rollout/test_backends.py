"""Generation backends behind verl's LLMServerClient interface."""

from __future__ import annotations

import asyncio

import pytest
from http_servers import OpenAICompatibleServer
from rollout_helpers import make_row, run_worker, unpad, with_settings

from verl_evidence.local.backends import HFGenerationBackend, OpenAIBackend, ScriptedBackend


def generate(backend, prompt_ids, **params):
    return asyncio.run(backend.generate("r", prompt_ids=prompt_ids, sampling_params=params))


def test_scripted_backend_honours_stops_and_limits(tokenizer):
    text = "<think> a </think><search> q </search> tail"
    out = generate(ScriptedBackend(tokenizer, turns=[text]), [1, 2], stop=["</search>"])
    assert tokenizer.decode(out.token_ids) == "<think> a </think><search> q </search>"
    out = generate(ScriptedBackend(tokenizer, turns=[text]), [1, 2])
    assert out.token_ids[-1] == tokenizer.eos_token_id  # ran to the end: the model ends its turn
    out = generate(ScriptedBackend(tokenizer, turns=[text]), [1, 2], max_tokens=3)
    assert len(out.token_ids) == 3
    stop_id = tokenizer.encode(text, add_special_tokens=False)[2]
    out = generate(ScriptedBackend(tokenizer, turns=[text]), [1, 2], stop_token_ids=[stop_id])
    assert out.token_ids[-1] == stop_id and len(out.token_ids) == 3
    with pytest.raises(RuntimeError, match="ran out"):
        generate(ScriptedBackend(tokenizer, turns=[]), [1])


@pytest.fixture(scope="module")
def hf_backend(model_dir):
    return HFGenerationBackend.from_pretrained(model_dir, device="cpu", dtype="float32")


def chat_prompt(tokenizer, question: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_hf_backend_greedy_limits_logprobs_and_stop_strings(hf_backend, tokenizer):
    prompt = chat_prompt(tokenizer, "Who wrote the report?")
    free = generate(hf_backend, prompt, temperature=0, max_tokens=24, logprobs=True, ignore_eos=True)
    again = generate(hf_backend, prompt, temperature=0, max_tokens=24, logprobs=True, ignore_eos=True)
    assert free.token_ids == again.token_ids and len(free.token_ids) == 24
    assert len(free.log_probs) == 24 and all(lp <= 0.0 for lp in free.log_probs)
    # a stop string the model will produce: the text of its own tokens 5..7; output ends at token 7
    stop = tokenizer.decode(free.token_ids[5:8])
    first_hit = next(i for i in range(1, 25) if stop in tokenizer.decode(free.token_ids[:i]))
    cut = generate(hf_backend, prompt, temperature=0, max_tokens=24, stop=[stop], ignore_eos=True)
    assert cut.token_ids == free.token_ids[:first_hit]
    sampled = generate(hf_backend, prompt, temperature=1.0, top_p=0.9, top_k=20, max_tokens=8, ignore_eos=True)
    resampled = generate(hf_backend, prompt, temperature=1.0, top_p=0.9, top_k=20, max_tokens=8, ignore_eos=True)
    assert len(sampled.token_ids) == len(resampled.token_ids) == 8
    assert sampled.token_ids != resampled.token_ids  # a GRPO group of one prompt gets different samples


def test_hf_backend_generates_concurrent_requests_in_one_batch_as_it_would_one_by_one(hf_backend, tokenizer):
    """Prompts of different lengths, each with its own length limit and stop string: generated together (left-padded,
    one model.generate), every request gets the tokens and log-probs it gets alone."""
    prompts = [chat_prompt(tokenizer, q) for q in ("Who?", "Who wrote the report on the river?", "Where is it?")]
    limits = [24, 9, 17]
    alone = [
        generate(hf_backend, p, temperature=0, max_tokens=n, logprobs=True, ignore_eos=True)
        for p, n in zip(prompts, limits)
    ]
    # a stop string the second request's own output completes at its 5th token
    stop = tokenizer.decode(alone[1].token_ids[3:5])
    first_hit = next(i for i in range(1, 10) if stop in tokenizer.decode(alone[1].token_ids[:i]))
    expected_ids = [
        out.token_ids[
            : next((i for i in range(1, len(out.token_ids) + 1) if stop in tokenizer.decode(out.token_ids[:i])), None)
        ]
        for out in alone
    ]
    assert len(expected_ids[1]) == first_hit

    async def together():
        return await asyncio.gather(
            *(
                hf_backend.generate(
                    f"r{i}",
                    prompt_ids=p,
                    sampling_params={
                        "temperature": 0,
                        "max_tokens": n,
                        "logprobs": True,
                        "ignore_eos": True,
                        "stop": [stop],
                    },
                )
                for i, (p, n) in enumerate(zip(prompts, limits))
            )
        )

    hf_backend.batch_sizes.clear()
    batched = asyncio.run(together())
    # all three queued before the batcher ran: one generate
    assert hf_backend.batch_sizes == {3: 1}
    for out, ids, one in zip(batched, expected_ids, alone):
        assert out.token_ids == ids
        assert out.log_probs == pytest.approx(one.log_probs[: len(ids)], abs=1e-5)


def test_request_seeds_depend_on_the_seed_the_prompt_and_its_count_only():
    from verl_evidence.local.backends import RequestSeeds

    params = {"temperature": 1.0, "max_tokens": 8}
    first, again = RequestSeeds(7), RequestSeeds(7)
    group = [first.next([1, 2, 3], params) for _ in range(4)]
    assert len(set(group)) == 4  # a GRPO group's samples differ
    # another prompt in between, other length limits: the prompt's own sequence is unchanged
    assert again.next([9], params) not in group
    assert [again.next([1, 2, 3], {**params, "max_tokens": n}) for n in range(4)] == group
    assert RequestSeeds(8).next([1, 2, 3], params) != group[0]
    assert first.next([1, 2, 3], {**params, "temperature": 0.7}) not in group  # other settings, other draws
    assert first.next([1, 2, 3], {**params, "seed": 5}) == 5  # vLLM's per-request seed wins


def test_hf_backend_samples_the_same_replies_however_requests_arrive_and_are_batched(model_dir, tokenizer):
    """A run repeats with its seed: two backends of one seed, one asked one request at a time and the other asked all
    at once in the reverse order, sample the same replies for each prompt (its repeated requests, a GRPO group's
    samples, are interchangeable: which of them gets which reply follows the order they arrive in)."""
    prompts = [chat_prompt(tokenizer, q) for q in ("Who?", "Who wrote the report on the river?")]
    order = [0, 1, 0, 0, 1]
    params = {"temperature": 1.0, "max_tokens": 12, "logprobs": True, "ignore_eos": True}

    def replies(outputs):
        by_prompt = {0: [], 1: []}
        for index, out in zip(order, outputs):
            by_prompt[index].append(out.token_ids)
        return by_prompt

    one_by_one = HFGenerationBackend.from_pretrained(model_dir, device="cpu", dtype="float32", seed=3)
    alone = replies([generate(one_by_one, prompts[i], **params) for i in order])
    assert one_by_one.batch_sizes == {1: 5}
    assert len({tuple(ids) for ids in alone[0]}) == 3  # the group's samples differ

    together = HFGenerationBackend.from_pretrained(model_dir, device="cpu", dtype="float32", seed=3)

    async def all_at_once():
        calls = [
            together.generate(f"r{n}", prompt_ids=prompts[i], sampling_params=dict(params)) for n, i in enumerate(order)
        ]
        return await asyncio.gather(*reversed(calls))

    batched = replies(list(reversed(asyncio.run(all_at_once()))))
    assert together.batch_sizes[1] < 5  # batched, in the reverse order
    assert sorted(batched[0]) == sorted(alone[0]) and sorted(batched[1]) == sorted(alone[1])
    other_seed = HFGenerationBackend.from_pretrained(model_dir, device="cpu", dtype="float32", seed=4)
    assert generate(other_seed, prompts[1], **params).token_ids not in alone[1]


def test_cpu_sampling_drops_finished_rows_and_reports_the_policys_own_log_probs(model_dir):
    """A left-padded sampled batch whose rows end at different lengths: each ended row leaves the batch (the model
    is called on fewer rows), and every row's tokens are scored exactly as the model scores them in one full
    forward pass over its prompt and reply (so the cache rows kept, the mask and the positions stay right)."""
    import torch
    from transformers import AutoModelForCausalLM

    from verl_evidence.local.backends import sample_until_stopped, share_key_value_heads

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    share_key_value_heads(model)
    ids = torch.randint(10, 300, (4, 30), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    mask[3, :20] = 0
    limits = [3, 16, 0, 9]  # a row with nothing to generate never enters the batch
    batch_sizes = []
    hook = model.register_forward_pre_hook(
        lambda _, args, kwargs: batch_sizes.append(len(kwargs["input_ids"])), with_kwargs=True
    )
    torch.manual_seed(3)
    with torch.no_grad():
        generated, scores = sample_until_stopped(
            model, ids, mask, limits, temperature=1.0, stopped=lambda row: False, logprobs=True
        )
    hook.remove()
    assert [len(row) for row in generated] == limits
    assert batch_sizes == [3, 3, 3] + [2] * 6 + [1] * 7  # prefill, then rows 0 and 3 leave after 3 and 9 tokens
    for row in (0, 1, 3):
        prompt = ids[row][mask[row].bool()]
        full = torch.cat([prompt, torch.tensor(generated[row])])[None]
        with torch.no_grad():
            log_probs = torch.log_softmax(model(input_ids=full).logits[0].float(), dim=-1)
        expected = [log_probs[len(prompt) - 1 + i, token].item() for i, token in enumerate(generated[row])]
        assert scores[row] == pytest.approx(expected, abs=1e-4)
    assert generated[2] == [] and scores[2] == []


def test_cpu_generation_shares_key_value_heads_and_samples_exactly_as_transformers_sdpa(model_dir, monkeypatch):
    """The CPU backend's attention for grouped-query models (the smoke policy: 4 query, 2 key/value heads): a
    left-padded sampled batch gives bit-identical tokens and logits to transformers' own sdpa; MHA is left alone."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from verl_evidence.local.backends import SHARED_KV_SDPA, share_key_value_heads

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    ids = torch.randint(10, 300, (4, 40), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :7] = 0  # left padding, of two lengths: the mask must reach the shared-heads kernel
    mask[3, :25] = 0

    def sample():
        torch.manual_seed(1)
        with torch.no_grad():
            return model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=12,
                do_sample=True,
                pad_token_id=0,
                return_dict_in_generate=True,
                output_logits=True,
            )

    plain = sample()
    assert share_key_value_heads(model) and model.config._attn_implementation == SHARED_KV_SDPA

    def copies_heads(*args):
        raise AssertionError("transformers copied the key/value heads")

    monkeypatch.setattr("transformers.integrations.sdpa_attention.repeat_kv", copies_heads)
    shared = sample()
    assert torch.equal(plain.sequences, shared.sequences)
    assert torch.equal(torch.stack(plain.logits), torch.stack(shared.logits))
    # the padded rows really are masked: row 3 alone, unpadded, gets the logits it got in the batch
    with torch.no_grad():
        alone = model(input_ids=ids[3:4, 25:]).logits[0, -1]
    assert torch.allclose(alone, shared.logits[0][3], atol=1e-5)

    mha = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=4,
        )
    )
    mha.set_attn_implementation("sdpa")
    assert not share_key_value_heads(mha) and mha.config._attn_implementation == "sdpa"


def test_hf_backend_keeps_requests_with_other_sampling_settings_apart(hf_backend, tokenizer):
    prompt = chat_prompt(tokenizer, "Who wrote the report?")
    greedy = generate(hf_backend, prompt, temperature=0, max_tokens=12, ignore_eos=True).token_ids

    async def mixed():
        return await asyncio.gather(
            *(
                hf_backend.generate(f"r{i}", prompt_ids=prompt, sampling_params=params)
                for i, params in enumerate(
                    [
                        {"temperature": 0, "max_tokens": 12, "ignore_eos": True},
                        {"temperature": 1.0, "max_tokens": 12, "ignore_eos": True},
                        {"temperature": 0, "max_tokens": 12, "ignore_eos": True},
                    ]
                )
            )
        )

    hf_backend.batch_sizes.clear()
    first, sampled, third = asyncio.run(mixed())
    assert first.token_ids == third.token_ids == greedy and len(sampled.token_ids) == 12
    assert hf_backend.batch_sizes == {2: 1, 1: 1}  # one batch of two settings: a generate for each


def test_hf_backend_honours_ignore_eos_when_the_model_config_names_an_eos(tokenizer):
    """transformers fills an EOS left unset from the model's generation config; ignore_eos must still hold."""
    from verl_evidence.local.tiny_models import tiny_causal_lm

    model = tiny_causal_lm(seed=0)
    backend = HFGenerationBackend(model, tokenizer)
    prompt = chat_prompt(tokenizer, "Who wrote the report?")
    free = generate(backend, prompt, temperature=0, max_tokens=12, ignore_eos=True).token_ids
    model.generation_config.eos_token_id = free[2]  # a token this model does emit
    assert generate(backend, prompt, temperature=0, max_tokens=12, ignore_eos=True).token_ids == free
    first_stop = free.index(free[2]) + 1
    stopped = generate(backend, prompt, temperature=0, max_tokens=12, stop_token_ids=[free[2]])
    assert stopped.token_ids == free[:first_stop]


@pytest.mark.slow  # the session's Ray Serve retrieval server
def test_hf_backend_drives_a_full_search_rollout(base_config, search_url, hf_backend, tokenizer):
    config = with_settings(
        base_config,
        {
            "actor_rollout_ref.rollout.custom": {
                "evidence_search": {"retrieval_url": search_url, "max_turns": 2, "max_tokens_per_turn": 24}
            },
            "actor_rollout_ref.rollout.temperature": 0,  # greedy: the same two turns on every run
        },
    )
    hf_backend.calls.clear()
    hf_backend.record_calls = True
    out = unpad(run_worker(config, hf_backend, [make_row("Which river is the longest in Africa?", "evidence_search")]))
    hf_backend.record_calls = False
    calls = hf_backend.calls
    # A random model never answers in protocol: its first turn gets a correction (or a search result)
    # and the second, last turn ends the rollout.
    assert len(calls) == 2
    assert calls[0]["prompt_ids"] == out["prompt_ids"]
    assert calls[0]["sampling_params"]["max_tokens"] == 24
    assert calls[0]["sampling_params"]["temperature"] == 0
    first_turn = out["response_mask"].index(0)  # the policy's tokens, then the loop's context
    assert 1 <= first_turn <= 24
    # the second turn saw the whole first turn plus the loop's context (masked out of the loss) ...
    context = calls[1]["prompt_ids"][len(out["prompt_ids"]) :]
    assert len(context) > first_turn and out["response_ids"][: len(context)] == context
    assert set(out["response_mask"][first_turn : len(context)]) == {0}
    # ... and its own tokens close the response
    assert set(out["response_mask"][len(context) :]) == {1}
    assert out["extra"]["termination"] == "max_turns"


# -- OpenAI-compatible endpoint -------------------------------------------------------------


@pytest.fixture
def openai_server(tokenizer):
    server = OpenAICompatibleServer(tokenizer)
    yield server
    server.stop()


def test_openai_backend_token_ids_and_request_body(openai_server, tokenizer):
    backend = OpenAIBackend(openai_server.url, "policy", tokenizer=tokenizer)
    out = generate(backend, [5, 6, 7], stop=["</answer>"], max_tokens=32, temperature=0.0, top_k=-1)
    assert tokenizer.decode(out.token_ids) == "<answer> Nile </answer>"
    body = openai_server.requests[-1]
    assert body["prompt"] == [5, 6, 7] and body["max_tokens"] == 32 and body["stop"] == ["</answer>"]
    assert body["include_stop_str_in_output"] is True and body["return_token_ids"] is True
    assert "top_k" not in body


def test_openai_backend_reencodes_when_the_server_sends_no_token_ids(tokenizer):
    server = OpenAICompatibleServer(tokenizer, return_token_ids=False)
    try:
        out = generate(OpenAIBackend(server.url, "policy", tokenizer=tokenizer), [5], stop=["</answer>"])
        assert out.token_ids == tokenizer.encode("<answer> Nile </answer>", add_special_tokens=False)
        with pytest.raises(ValueError, match="did not return token ids"):
            generate(OpenAIBackend(server.url, "policy"), [5])
    finally:
        server.stop()


@pytest.mark.slow  # the session's Ray Serve retrieval server
def test_search_loop_with_external_openai_extractor(base_config, search_url, openai_server, tokenizer):
    config = with_settings(
        base_config,
        {
            "actor_rollout_ref.rollout.custom": {
                "evidence_search": {
                    "retrieval_url": search_url,
                    "extractor": "openai",
                    "extractor_url": openai_server.url,
                    "extractor_model": "extractor-7b",
                }
            }
        },
    )
    turns = ["<think> look it up </think><search> longest river in Africa </search>", "<answer> Nile </answer>"]
    out = unpad(
        run_worker(config, ScriptedBackend(tokenizer, turns=turns), [make_row("Longest river?", "evidence_search")])
    )
    context = tokenizer.decode([t for t, m in zip(out["response_ids"], out["response_mask"], strict=True) if m == 0])
    assert context == "\n\n<information><evidence>The Nile is the longest river.</evidence></information>\n\n"
    chat = openai_server.requests[-1]
    assert chat["model"] == "extractor-7b" and chat["stop"] == ["</extract>"]
    prompt = chat["messages"][0]["content"]
    assert (
        "Query: longest river in Africa" in prompt and "Latest thought: look it up" in prompt and "(Title: " in prompt
    )
    assert out["extra"]["raw_context_tokens"] > out["extra"]["context_tokens"]


@pytest.mark.slow  # the session's Ray Serve retrieval server
def test_search_loop_survives_a_dead_extractor_endpoint(base_config, search_url, tokenizer):
    from retrieval_server.haproxy_front import free_port

    config = with_settings(
        base_config,
        {
            "actor_rollout_ref.rollout.custom": {
                "evidence_search": {
                    "retrieval_url": search_url,
                    "extractor": "openai",
                    "extractor_url": f"http://127.0.0.1:{free_port()}",
                    "extractor_model": "m",
                }
            }
        },
    )
    turns = ["<search> longest river in Africa </search>", "<answer> Nile </answer>"]
    out = unpad(
        run_worker(config, ScriptedBackend(tokenizer, turns=turns), [make_row("Longest river?", "evidence_search")])
    )
    assert out["extra"]["extractor_failures"] == 1
    assert out["extra"]["termination"] == "answer"
    context = tokenizer.decode([t for t, m in zip(out["response_ids"], out["response_mask"], strict=True) if m == 0])
    assert "Doc 1 (Title: " in context  # raw passages kept


# --- what the engines return at a stop (issue 52, item 4) ---
# vLLM (v1 detokenizer) and SGLang append each sampled token and then look for the stop strings in the new text: the
# ids end with the token that completes one, whatever it carries past it; only the *text* is cut at the stop string
# (after it with include_stop_str_in_output / no_stop_trim). verl's vLLM server reports stop and length alike as
# "completed"; its SGLang server passes SGLang's finish reason ("stop" / "length") on.


def through_first_stop(tokenizer, ids: list[int], stop: str) -> list[int]:
    """``ids`` up to and including the first token at which the decoded text contains ``stop`` (all of ``ids`` if
    none): the engines' cut, stated without our stop helpers."""
    end = next((n for n in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:n])), len(ids))
    return ids[:end]


@pytest.mark.parametrize("engine, reasons", [("vllm", ("completed",) * 3), ("sglang", ("stop", "stop", "length"))])
def test_scripted_backend_returns_ids_and_stop_reasons_as_the_engines_do(vocab, engine, reasons):
    from verl.workers.rollout.replica import TokenOutput

    tokenizer = vocab.tokenizer
    text = "<think> look it up </think><search> longest river </search>\n\nThe results will tell."
    backend = ScriptedBackend(tokenizer, turns=[text, text, text], engine=engine)
    at_stop = generate(backend, [1, 2], stop=["</search>"], max_tokens=64)
    at_eos = generate(backend, [1, 2], max_tokens=64)
    at_length = generate(backend, [1, 2], stop=["</search>"], max_tokens=4)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert at_stop.token_ids == through_first_stop(tokenizer, ids, "</search>")
    if vocab.name != "test":  # Qwen: the completing token is '>\n\n', kept whole, as the engines keep it
        assert tokenizer.decode(at_stop.token_ids).endswith("</search>\n\n")
    assert at_eos.token_ids == ids + [tokenizer.eos_token_id]
    assert at_length.token_ids == ids[:4]
    outputs = (at_stop, at_eos, at_length)
    assert tuple(out.stop_reason for out in outputs) == reasons
    for out in outputs:  # verl's contract: the pydantic model it validates, round-tripped
        assert TokenOutput.model_validate(out.model_dump()) == out
    with pytest.raises(ValueError, match="engine must be one of"):
        ScriptedBackend(tokenizer, turns=[], engine="tgi")


@pytest.fixture(scope="module")
def qwen_vocab_backend(qwen_tokenizer):
    """A randomly initialised 1-layer Qwen2 over Qwen2.5's real vocabulary (its greedy output is multi-character
    tokens, as a real policy's is) in the CPU backend."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(qwen_tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        eos_token_id=qwen_tokenizer.eos_token_id,
    )
    return HFGenerationBackend(Qwen2ForCausalLM(config), qwen_tokenizer)


def test_hf_backend_keeps_the_token_that_completes_a_stop_string_with_what_it_carries(qwen_vocab_backend):
    hf_backend, tokenizer = qwen_vocab_backend, qwen_vocab_backend.tokenizer
    prompt = chat_prompt(tokenizer, "Who wrote the report?")
    free = generate(hf_backend, prompt, temperature=0, max_tokens=24, ignore_eos=True).token_ids
    # a stop string that ends inside one of the model's own tokens: that token's text less its last character
    index = next(i for i in range(3, 24) if len(tokenizer.decode(free[i : i + 1])) >= 2)
    stop = tokenizer.decode(free[index - 2 : index + 1])[:-1]
    cut = generate(hf_backend, prompt, temperature=0, max_tokens=24, stop=[stop], ignore_eos=True)
    assert cut.token_ids == through_first_stop(tokenizer, free, stop)
    assert not tokenizer.decode(cut.token_ids).endswith(stop)  # the completing token carries a character past it
    assert cut.stop_reason == "completed"  # as verl's vLLM server reports it
    sglang_like = HFGenerationBackend(hf_backend.model, tokenizer, engine="sglang")
    assert generate(sglang_like, prompt, temperature=0, max_tokens=24, stop=[stop], ignore_eos=True) == cut.model_copy(
        update={"stop_reason": "stop"}
    )
    assert generate(sglang_like, prompt, temperature=0, max_tokens=5, ignore_eos=True).stop_reason == "length"


@pytest.mark.parametrize(
    "choice, ok",
    [
        # vLLM cut the reply at max_tokens inside the block: unfinished evidence must not pass as complete
        ({"content": "<reason> r </reason><extract> The Nile is", "finish_reason": "length", "stop_reason": None}, 0),
        # ended at EOS without closing the block (vLLM's stop_reason None): no evidence either
        ({"content": "<reason> r </reason><extract> The Nile is", "finish_reason": "stop", "stop_reason": None}, 0),
        # ended at the stop string, trimmed by the server: put back
        ({"content": "<extract> The Nile is long.", "finish_reason": "stop", "stop_reason": "</extract>"}, 1),
        # SGLang names it matched_stop
        ({"content": "<extract> The Nile is long.", "finish_reason": "stop", "matched_stop": "</extract>"}, 1),
        # a server that says nothing about the stop: the opened block decides, as before
        ({"content": "<extract> The Nile is long.", "finish_reason": "stop"}, 1),
    ],
)
def test_a_remote_extractor_reply_ends_at_its_stop_only_when_the_server_says_so(choice, ok):
    from fastapi import FastAPI
    from http_servers import ThreadedUvicorn

    from verl_evidence.agent_loops.extractor import EvidenceExtractor
    from verl_evidence.agent_loops.openai_endpoint import OpenAIEndpoint

    app = FastAPI()
    content = choice["content"]

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        reply = {k: v for k, v in choice.items() if k != "content"}
        reply.update(index=0, message={"role": "assistant", "content": content})
        return {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"], "choices": [reply]}

    with ThreadedUvicorn(app) as server:
        extractor = EvidenceExtractor("openai", "evidence_extractor", 16, remote=OpenAIEndpoint(server.url, "m"))
        extraction = asyncio.run(extractor.extract("Longest river?", "think", "longest river", "PASSAGES"))
    assert extraction.ok == bool(ok)
    assert extraction.evidence == ("The Nile is long." if ok else "PASSAGES")
