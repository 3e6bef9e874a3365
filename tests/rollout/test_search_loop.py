"""``evidence_search`` driven by verl's AgentLoopWorker against the real retrieval server."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading

import pytest
from rollout_helpers import make_row, run_worker, unpad, with_settings

from retrieval_server.client import RetrievalClient
from verl_evidence.local.backends import ScriptedBackend
from verl_evidence.prompts import load_prompt

pytestmark = pytest.mark.slow

QUESTION = "Which river is the longest in Africa?"
SEARCH_TURN = "<think> I should look up the river. </think> <search> longest river in Africa </search>"
ANSWER_TURN = "<summary> *The Nile is the longest river* -exact length uncertain- </summary> <answer> Nile </answer>"


def search_config(base_config, url, **settings):
    custom = {"retrieval_url": url, **settings}
    return with_settings(base_config, {"actor_rollout_ref.rollout.custom": {"evidence_search": custom}})


def segments(ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """Runs of equal mask value: [(mask, ids), ...]."""
    runs: list[tuple[int, list[int]]] = []
    for token, m in zip(ids, mask, strict=True):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(token)
        else:
            runs.append((m, [token]))
    return runs


def test_masks_token_by_token_notes_and_contract_fields(base_config, search_url, tokenizer):
    backend = ScriptedBackend(tokenizer, turns=[SEARCH_TURN, ANSWER_TURN])
    config = search_config(base_config, search_url, max_obs_tokens=100_000)
    out = unpad(run_worker(config, backend, [make_row(QUESTION, "evidence_search")]))

    search_ids = tokenizer.encode(SEARCH_TURN, add_special_tokens=False)
    answer_ids = tokenizer.encode(ANSWER_TURN, add_special_tokens=False)  # stops at </answer>, before EOS
    runs = segments(out["response_ids"], out["response_mask"])
    assert [m for m, _ in runs] == [1, 0, 1]
    # policy tokens, exactly as generated, all mask 1
    assert runs[0][1] == search_ids
    assert runs[2][1] == answer_ids
    # every context token is mask 0 and is the <information> block, nothing else
    info_text = tokenizer.decode(runs[1][1])
    assert info_text.startswith("\n\n<information>") and info_text.endswith("</information>\n\n")
    assert "(Title: Nile)" in info_text

    # the second generation saw prompt + everything so far
    assert backend.calls[1]["prompt_ids"] == out["prompt_ids"] + search_ids + runs[1][1]
    assert backend.calls[0]["sampling_params"]["stop"] == ["</search>", "</answer>"]
    assert backend.calls[0]["sampling_params"]["include_stop_str_in_output"] is True

    # A row written with Search-R1's prompt reads its passages in Search-R1's layout (document_format: auto)
    backend = ScriptedBackend(tokenizer, turns=[SEARCH_TURN, ANSWER_TURN])
    row = make_row(QUESTION, "evidence_search", method="search_r1")
    search_r1_out = unpad(run_worker(config, backend, [row]))
    info_text = tokenizer.decode(segments(search_r1_out["response_ids"], search_r1_out["response_mask"])[1][1])
    assert info_text.startswith("\n\n<information>Doc 1(Title: ") and info_text.endswith("\n</information>\n\n")
    assert "(Title: Nile) The Nile" in info_text and " (Title: " not in info_text

    extra = out["extra"]
    direct = RetrievalClient(search_url).retrieve(["longest river in Africa"], topk=3)[0]
    assert extra["retrieved_ids"] == [[d["document"]["id"] for d in direct]]
    assert extra["question"] == QUESTION
    assert extra["searches"] == ["longest river in Africa"]
    assert extra["num_searches"] == 1
    assert extra["summary_count"] == 1
    assert extra["last_summary"] == "*The Nile is the longest river* -exact length uncertain-"
    assert extra["context_tokens"] == len(runs[1][1]) - len(tokenizer.encode("\n\n<information>")) - len(
        tokenizer.encode("</information>\n\n")
    )
    assert extra["raw_context_tokens"] == extra["context_tokens"]  # no extractor, no truncation
    assert extra["termination"] == "answer"
    assert out["num_turns"] == 4  # user, assistant, information, assistant


def test_observation_truncated_to_token_budget(base_config, search_url, tokenizer):
    backend = ScriptedBackend(tokenizer, turns=[SEARCH_TURN, "<answer> Nile </answer>"])
    config = search_config(base_config, search_url, max_obs_tokens=12)
    out = unpad(run_worker(config, backend, [make_row(QUESTION, "evidence_search")]))
    runs = segments(out["response_ids"], out["response_mask"])
    wrapper = len(tokenizer.encode("\n\n<information>")) + len(tokenizer.encode("</information>\n\n"))
    assert len(runs[1][1]) == 12 + wrapper
    assert out["extra"]["context_tokens"] == 12
    assert out["extra"]["raw_context_tokens"] > 12


@pytest.mark.parametrize(
    "action_format, after",
    [
        ("search", "\n\nI will read the results."),
        ("search", "\nThe results:"),
        ("search", "The results follow."),
        ("paper", "\n\nI will read the results."),
    ],
)
def test_the_observation_opens_with_the_newlines_the_turn_has_not_written(vocab, search_url, after, action_format):
    """The token that completes the stop string stays the policy's whole (mask 1), with what it carries past it
    (Qwen's ``'>\\n\\n'``, ``'>\\n'``, ``'>The'``); the inline observation then opens with only the newlines still
    missing, so the policy reads the action, one blank line and the observation, never four newlines."""
    tokenizer = vocab.tokenizer
    if action_format == "search":
        action, stop, opening = SEARCH_TURN, "</search>", "<information>"
    else:
        action, stop, opening = '<action> Search("longest river in Africa") </action>', "</action>", "Observation:"
    turn = action + after
    backend = ScriptedBackend(tokenizer, turns=[turn, "<answer> Nile </answer>"])
    config = search_config(vocab.config, search_url, action_format=action_format)
    out = unpad(run_worker(config, backend, [make_row(QUESTION, "evidence_search")]))
    runs = segments(out["response_ids"], out["response_mask"])
    assert [m for m, _ in runs] == [1, 0, 1]
    policy_text, observation = tokenizer.decode(runs[0][1]), tokenizer.decode(runs[1][1])
    # the turn as generated, through the token that completes the stop string
    assert runs[0][1] == tokenizer.encode(turn, add_special_tokens=False)[: len(runs[0][1])]
    assert stop in policy_text and stop not in tokenizer.decode(runs[0][1][:-1])
    carried = policy_text.split(stop, 1)[1]
    if vocab.name != "test" and after.startswith("\n"):
        assert carried.startswith("\n")  # the case under test: the stop's token carries the separator's start
    newlines = len(carried) - len(carried.rstrip("\n"))
    assert observation.startswith("\n\n"[newlines:] + opening)
    assert f"{stop}{carried.rstrip(chr(10))}\n\n{opening}" in policy_text + observation
    assert "\n\n\n" not in policy_text + observation


@pytest.mark.parametrize("invalid", ["I am not sure what to do.", "<search>  </search>"])
def test_invalid_action_gets_masked_correction(base_config, search_url, tokenizer, invalid):
    turns = [invalid, SEARCH_TURN, "<answer> Nile </answer>"]
    backend = ScriptedBackend(tokenizer, turns=turns)
    out = unpad(run_worker(search_config(base_config, search_url), backend, [make_row(QUESTION, "evidence_search")]))
    runs = segments(out["response_ids"], out["response_mask"])
    assert [m for m, _ in runs] == [1, 0, 1, 0, 1]
    ends_with_eos = "</search>" not in invalid  # a stop string ends the turn before EOS
    expected = tokenizer.encode(invalid, add_special_tokens=False) + ([tokenizer.eos_token_id] if ends_with_eos else [])
    assert runs[0][1] == expected
    assert "That was not a valid action" in tokenizer.decode(runs[1][1])
    assert "<information>" in tokenizer.decode(runs[3][1])
    assert out["extra"]["invalid_actions"] == 1
    assert out["extra"]["termination"] == "answer"


def test_max_turns_last_turn_only_answers(base_config, search_url, tokenizer):
    turns = [SEARCH_TURN, "<search> Nile length </search>", "<search> Nile source </search>"]
    backend = ScriptedBackend(tokenizer, turns=turns)
    config = search_config(base_config, search_url, max_turns=3)
    out = unpad(run_worker(config, backend, [make_row(QUESTION, "evidence_search")]))
    assert backend.remaining_turns == 0 and len(backend.calls) == 3
    assert out["extra"]["searches"] == ["longest river in Africa", "Nile length"]  # the last-turn search is not run
    assert out["extra"]["termination"] == "max_turns"
    runs = segments(out["response_ids"], out["response_mask"])
    assert [m for m, _ in runs] == [1, 0, 1, 0, 1]
    assert "No searches are left" not in tokenizer.decode(runs[1][1])
    assert tokenizer.decode(runs[3][1]).endswith(
        "No searches are left: give your final answer now inside <answer> and </answer>.\n"
    )


def test_response_length_caps_the_trajectory(base_config, search_url, tokenizer):
    backend = ScriptedBackend(tokenizer, turns=[SEARCH_TURN, "<answer> Nile </answer>"])
    config = search_config(base_config, search_url)
    config = with_settings(config, {"actor_rollout_ref.rollout.response_length": 48})
    out = unpad(run_worker(config, backend, [make_row(QUESTION, "evidence_search")]))
    assert len(out["response_ids"]) == 48
    assert out["extra"]["termination"] == "response_length"
    assert len(backend.calls) == 1


class _Proxy:
    """A TCP forwarder in front of the real server that can be cut off (the server 'going down')."""

    def __init__(self, upstream_url: str) -> None:
        host_port = upstream_url.split("//", 1)[1].split("/", 1)[0]
        host, port = host_port.rsplit(":", 1)
        upstream = (host, int(port))
        self.sockets: list[socket.socket] = []
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                remote = socket.create_connection(upstream)
                proxy.sockets += [self.request, remote]

                def pipe(src: socket.socket, dst: socket.socket) -> None:
                    try:
                        while data := src.recv(65536):
                            dst.sendall(data)
                    except OSError:
                        pass
                    finally:
                        for s in (src, dst):
                            with contextlib.suppress(OSError):
                                s.shutdown(socket.SHUT_RDWR)

                t = threading.Thread(target=pipe, args=(remote, self.request), daemon=True)
                t.start()
                pipe(self.request, remote)
                t.join()

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass


def test_server_going_down_mid_rollout_is_reported_not_raised(base_config, search_url, tokenizer):
    proxy = _Proxy(search_url)
    turns = iter([SEARCH_TURN, "<search> Nile length </search>", "<answer> Nile </answer>"])
    calls = []

    def responder(prompt: str) -> str:
        calls.append(prompt)
        if len(calls) == 2:
            proxy.stop()  # after the first search succeeded, before the second
        return next(turns)

    backend = ScriptedBackend(tokenizer, responder=responder)
    config = search_config(
        base_config,
        proxy.url,
        search_max_retries=1,
        search_backoff=0.01,
        search_timeout=5.0,
        search_retry_deadline_s=0,  # a server gone for good: not waited for
    )
    try:
        out = unpad(run_worker(config, backend, [make_row(QUESTION, "evidence_search")]))
    finally:
        proxy.stop()
    extra = out["extra"]
    assert extra["num_searches"] == 2
    assert extra["search_errors"] == 1
    assert len(extra["retrieved_ids"][0]) == 3 and extra["retrieved_ids"][1] == []
    assert extra["termination"] == "answer"
    runs = segments(out["response_ids"], out["response_mask"])
    assert [m for m, _ in runs] == [1, 0, 1, 0, 1]
    assert "The search failed" in tokenizer.decode(runs[3][1])


# How a scripted backend tells the extractor's prompt from the policy's: the packaged prompt's first line
EXTRACTOR_MARK = load_prompt("evidence_extractor").splitlines()[0]


def test_policy_evidence_extractor_replaces_passages(base_config, search_url, tokenizer):
    policy_turns = iter([SEARCH_TURN, "<answer> Nile </answer>"])
    extractor_prompts = []

    def responder(prompt: str) -> str:
        if EXTRACTOR_MARK in prompt:
            extractor_prompts.append(prompt)
            return (
                "<reason> the query asks for the longest river </reason>"
                "<extract> The Nile is the longest river. </extract> trailing"
            )
        return next(policy_turns)

    backend = ScriptedBackend(tokenizer, responder=responder)
    config = search_config(base_config, search_url, extractor="policy")
    out = unpad(run_worker(config, backend, [make_row(QUESTION, "evidence_search")]))
    runs = segments(out["response_ids"], out["response_mask"])
    info = tokenizer.decode(runs[1][1])
    assert info == "\n\n<information><evidence>The Nile is the longest river.</evidence></information>\n\n"
    assert len(extractor_prompts) == 1
    prompt = extractor_prompts[0]
    assert QUESTION in prompt and "Latest thought: I should look up the river." in prompt
    assert "Query: longest river in Africa" in prompt and "(Title: Nile)" in prompt
    extra = out["extra"]
    assert extra["raw_context_tokens"] > extra["context_tokens"] > 0
    assert extra["compression_ratio"] == pytest.approx(extra["raw_context_tokens"] / extra["context_tokens"])
    assert extra["extractor_failures"] == 0


def test_extractor_without_extract_block_keeps_raw_passages(base_config, search_url, tokenizer):
    policy_turns = iter([SEARCH_TURN, "<answer> Nile </answer>"])

    def responder(prompt: str) -> str:
        return "I cannot help." if EXTRACTOR_MARK in prompt else next(policy_turns)

    backend = ScriptedBackend(tokenizer, responder=responder)
    config = search_config(base_config, search_url, extractor="policy")
    out = unpad(run_worker(config, backend, [make_row(QUESTION, "evidence_search")]))
    runs = segments(out["response_ids"], out["response_mask"])
    assert "(Title: Nile)" in tokenizer.decode(runs[1][1])
    assert out["extra"]["extractor_failures"] == 1


def test_unknown_setting_fails_with_its_name(base_config, search_url, tokenizer):
    backend = ScriptedBackend(tokenizer, turns=["<answer> x </answer>"])
    config = search_config(base_config, search_url, max_turn=3)
    # hydra wraps the loop's TypeError in an InstantiationException; the message names the key
    with pytest.raises(Exception, match=r"unknown setting\(s\) \['max_turn'\]"):
        run_worker(config, backend, [make_row(QUESTION, "evidence_search")])


def test_packaged_agent_loop_config_variants_reach_the_loop(base_config, search_url, tokenizer):
    from pathlib import Path

    import verl_evidence

    path = Path(verl_evidence.__file__).parent / "configs" / "agent_loops.yaml"
    config = with_settings(
        search_config(base_config, search_url), {"actor_rollout_ref.rollout.agent.agent_loop_config_path": str(path)}
    )
    policy_turns = iter([SEARCH_TURN, "<answer> Nile </answer>"])

    def responder(prompt: str) -> str:
        if EXTRACTOR_MARK in prompt:
            return "<extract> The Nile is the longest river. </extract>"
        return next(policy_turns)

    backend = ScriptedBackend(tokenizer, responder=responder)
    try:
        out = unpad(run_worker(config, backend, [make_row(QUESTION, "evidence_search_extract")]))
    finally:
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

        from verl_evidence.registration import AGENT_LOOPS, register_all

        for name in ("evidence_search", "evidence_search_extract", "eviomni"):
            _agent_loop_registry.pop(name, None)
        register_all(AGENT_LOOPS)
    # extractor: policy (from the YAML) ran, topk: 5 (from the YAML) reached the search
    assert len(out["extra"]["retrieved_ids"][0]) == 5
    assert "<evidence>The Nile is the longest river.</evidence>" in tokenizer.decode(out["response_ids"])


class _LogprobBackend(ScriptedBackend):
    """Scripted texts with a recognisable log-probability on every generated token."""

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        output = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)
        return output.model_copy(update={"log_probs": [-0.5] * len(output.token_ids)})


def test_logprobs_follow_the_mask(base_config, search_url, tokenizer):
    backend = _LogprobBackend(tokenizer, turns=["no action here", SEARCH_TURN, ANSWER_TURN])
    output = run_worker(search_config(base_config, search_url), backend, [make_row(QUESTION, "evidence_search")])
    out = unpad(output)
    logprobs = output.batch["rollout_log_probs"][0, : len(out["response_ids"])].tolist()
    assert [lp == -0.5 for lp in logprobs] == [m == 1 for m in out["response_mask"]]
    assert all(lp == 0.0 for lp, m in zip(logprobs, out["response_mask"], strict=True) if m == 0)


def test_prompt_setting_rebuilds_the_user_turn(base_config, search_url, tokenizer):
    messages = [
        {"role": "system", "content": "You are careful."},
        {"role": "user", "content": "raw text that the template replaces"},
    ]
    backend = ScriptedBackend(tokenizer, turns=["<answer> Nile </answer>"])
    config = search_config(base_config, search_url, prompt="evinote_sen")
    out = unpad(run_worker(config, backend, [make_row(QUESTION, "evidence_search", messages=messages)]))
    prompt = tokenizer.decode(out["prompt_ids"])
    assert prompt.startswith("<|im_start|>system\nYou are careful.<|im_end|>\n<|im_start|>user\n")
    assert "supportive-evidence note" in prompt and f"Question: {QUESTION}" in prompt
    assert "raw text that the template replaces" not in prompt


def test_per_turn_cap_without_action_is_corrected_not_fatal(base_config, search_url, tokenizer):
    long_turn = "I keep thinking about rivers and deserts and many other things"
    backend = ScriptedBackend(tokenizer, turns=[long_turn, "<answer> Nile </answer>"])
    config = search_config(base_config, search_url, max_tokens_per_turn=12, max_turns=2)
    out = unpad(run_worker(config, backend, [make_row(QUESTION, "evidence_search")]))
    runs = segments(out["response_ids"], out["response_mask"])
    assert [m for m, _ in runs] == [1, 0, 1]
    assert len(runs[0][1]) == 12
    feedback = tokenizer.decode(runs[1][1])
    assert feedback.startswith("\nThat was not a valid action")
    assert feedback.endswith("No searches are left: give your final answer now inside <answer> and </answer>.\n")
    assert out["extra"]["invalid_actions"] == 1 and out["extra"]["termination"] == "answer"


def test_smoke_warm_up_lays_out_tokens_as_the_loop_does(
    base_config, search_url, tokenizer, model_dir, tmp_path, monkeypatch
):
    """The smoke policy's search warm-up (verl_evidence.local.smoke) is the token sequence this loop builds and
    continues."""
    from verl_evidence.agent_loops.search_loop_settings import SearchLoopSettings
    from verl_evidence.local.smoke import settings as smoke_settings
    from verl_evidence.local.smoke.training import example_ids
    from verl_evidence.local.smoke.warmup_data import warmup_examples

    monkeypatch.setenv("VERL_EVIDENCE_SMOKE_DIR", str(tmp_path))
    example = next(e for e in warmup_examples("search", model_dir) if "<summary>" in e["messages"][-1]["content"])
    policy = [tokenizer.encode(s["text"], add_special_tokens=False) for s in example["segments"] if s["trained"]]
    search_text, answer_text = (s["text"] for s in example["segments"] if s["trained"])
    backend = ScriptedBackend(tokenizer, turns=[search_text, answer_text])
    config = search_config(
        base_config, search_url, max_turns=2, topk=1, max_obs_tokens=smoke_settings.SMOKE_MAX_OBS_TOKENS
    )
    out = unpad(
        run_worker(
            config, backend, [make_row(example["question"], "evidence_search", messages=example["messages"][:-1])]
        )
    )

    ids, labels = example_ids(tokenizer, example)
    n_prompt = len(out["prompt_ids"])
    assert ids[:n_prompt] == out["prompt_ids"]
    runs = segments(out["response_ids"], out["response_mask"])
    assert [m for m, _ in runs] == [1, 0, 1]
    assert [runs[0][1], runs[2][1]] == policy  # the policy's turns, token for token
    # the context the loop inserts: same wrapper, document cut and final-turn notice as the warm-up's
    context = ids[n_prompt + len(policy[0]) :][: len(runs[1][1])]
    opening = tokenizer.encode("\n\n<information>", add_special_tokens=False)
    assert runs[1][1][: len(opening)] == context[: len(opening)] == opening
    closing = tokenizer.encode("</information>\n\n", add_special_tokens=False) + tokenizer.encode(
        SearchLoopSettings().final_turn_notice, add_special_tokens=False
    )
    assert runs[1][1][-len(closing) :] == closing
    assert len(runs[1][1]) == len(opening) + smoke_settings.SMOKE_MAX_OBS_TOKENS + len(closing)
    assert context[-len(closing) :] == closing
    assert ids[n_prompt + len(policy[0]) + len(runs[1][1]) :][: len(policy[1])] == policy[1]
    # loss only on what the policy writes (and the end of its turn)
    trained = [token for token, label in zip(ids, labels, strict=True) if label != -100]
    assert trained[: len(policy[0]) + len(policy[1])] == policy[0] + policy[1]


def test_a_trajectorys_turns_share_the_name_of_its_place_under_full_determinism(base_config, search_url, tokenizer):
    """verl's rollout.full_determinism: every policy turn of sample n is requested as ``det-n`` (as verl's
    ToolAgentLoop names them), so a deterministic engine seeds each sample's turns by its place in the batch."""
    backend = ScriptedBackend(tokenizer, responder=lambda p: ANSWER_TURN if "<information>" in p else SEARCH_TURN)
    config = with_settings(search_config(base_config, search_url), {"actor_rollout_ref.rollout.full_determinism": True})
    run_worker(config, backend, [make_row(QUESTION, "evidence_search")] * 2)
    assert sorted(call["request_id"] for call in backend.calls) == ["det-0", "det-0", "det-1", "det-1"]
