"""EviPath SFT'd planners in ``evidence_search``: user-turn observations, the executor, both planner layouts.

The "as trained" proof: a planner dialogue written by EviPath's writer, replayed
through the loop (scripted policy, real retrieval server, the executor answering
each search through the same backend), yields exactly the token sequence verl's
``MultiTurnSFTDataset`` builds from that dialogue.
"""

from __future__ import annotations

import pytest
from http_servers import OpenAICompatibleServer
from omegaconf import OmegaConf
from rollout_helpers import make_row, run_worker, unpad, with_settings
from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

from retrieval_server.client import RetrievalClient
from verl_evidence.agent_loops.search_loop import (
    EVIPATH_SETTINGS,
    PAPER_INVALID_ACTION_FEEDBACK,
    assistant_turn_end_ids,
    planner_action,
)
from verl_evidence.evipath.parsing import ExecutorStep, PlannerTurn, render_planner_turn
from verl_evidence.evipath.pipeline import SubQuestion, Trajectory
from verl_evidence.evipath.protocol import pool_item
from verl_evidence.evipath.records import QARecord
from verl_evidence.evipath.writer import _row, planner_messages, write_parquet
from verl_evidence.local.backends import ScriptedBackend
from verl_evidence.prompts import load_prompt
from verl_evidence.tools.documents import format_documents

pytestmark = pytest.mark.slow

QUESTION = "How long is the longest river in Africa?"
EXECUTOR_MARK = load_prompt("evipath_executor").strip().splitlines()[0]
SUBS = {
    "Which river is the longest in Africa?": "The Nile is the longest river in Africa.",
    "How long is the Nile river?": "The Nile is about 6,650 kilometres long.",
}


def trajectory() -> Trajectory:
    """A kept EviPath trajectory: one step with two searches, then the answer."""
    record = QARecord("q1", QUESTION, ("6,650 km",), tuple(SUBS.values()), (0, 1), "bundled")
    step = PlannerTurn(think="I need the longest river, then its length.", searches=tuple(SUBS))
    final = PlannerTurn(think="The Nile is the longest and is about 6,650 km long.", answer="6,650 km")
    turns = [
        {"think": t.think, "searches": list(t.searches), "answer": t.answer, "text": render_planner_turn(t)}
        for t in (step, final)
    ]
    subs = [
        SubQuestion(q, a, [a], [1.0], False, [a], [0], ExecutorStep(think="It says so.", selected=(0,), answer=a))
        for q, a in SUBS.items()
    ]
    return Trajectory(record, turns, [subs], "6,650 km", 1.0, 1.0)


def executor_reply(prompt: str) -> str:
    for sub, sentence in SUBS.items():
        if f"Question: {sub}\n" in prompt:
            return f"<think> Item 0 answers it. </think>\n<select>[0]</select>\n<answer> {sentence} </answer>"
    return "I cannot tell."


def replaying_backend(tokenizer, assistant_turns: list[str], executor_prompts: list[str]) -> ScriptedBackend:
    planner = iter(assistant_turns)

    def respond(prompt: str) -> str:
        if EXECUTOR_MARK in prompt:
            executor_prompts.append(prompt)
            return executor_reply(prompt)
        return next(planner)

    return ScriptedBackend(tokenizer, responder=respond)


def loop_config(base_config, url: str, **settings):
    custom = {"retrieval_url": url, **settings}
    return with_settings(base_config, {"actor_rollout_ref.rollout.custom": {"evidence_search": custom}})


def sft_tokens(messages, tokenizer, tmp_path) -> tuple[list[int], list[int]]:
    path = write_parquet([_row(trajectory(), "planner", messages)], tmp_path / "planner.parquet")
    config = OmegaConf.create({"max_length": 8192, "truncation": "error", "pad_mode": "no_padding"})
    item = MultiTurnSFTDataset(str(path), tokenizer, config)[0]
    return item["input_ids"].tolist(), item["loss_mask"].tolist()


@pytest.mark.parametrize("layout", ["paper", "search"])
def test_replayed_evipath_dialogue_has_the_sft_token_sequence(base_config, search_url, tokenizer, tmp_path, layout):
    messages = planner_messages(trajectory(), layout)
    assistant_turns = [m["content"] for m in messages if m["role"] == "assistant"]
    executor_prompts: list[str] = []
    backend = replaying_backend(tokenizer, assistant_turns, executor_prompts)
    config = loop_config(base_config, search_url, **EVIPATH_SETTINGS[layout])
    out = unpad(run_worker(config, backend, [make_row(QUESTION, "evidence_search")]))

    sft_ids, sft_mask = sft_tokens(messages, tokenizer, tmp_path)
    end = assistant_turn_end_ids(tokenizer)
    assert tokenizer.decode(end) == "<|im_end|>\n"
    rollout = out["prompt_ids"] + out["response_ids"]
    # the same tokens; the SFT row additionally closes its final assistant turn
    assert rollout == sft_ids[: -len(end)] and sft_ids[-len(end) :] == end
    # the same loss mask, except the template's end of each non-final assistant turn: trained by SFT,
    # appended (not generated) by the loop
    loop_mask = [0] * len(out["prompt_ids"]) + out["response_mask"]
    differ = [i for i, (a, b) in enumerate(zip(loop_mask, sft_mask)) if a != b]
    assert all(sft_mask[i] == 1 and loop_mask[i] == 0 and rollout[i] in end for i in differ)
    assert len(differ) == len(end) * (len(assistant_turns) - 1)

    # the executor saw the retrieved passages, numbered; the planner saw only its sentences
    client = RetrievalClient(search_url)
    assert len(executor_prompts) == len(SUBS)
    for sub in SUBS:
        (prompt,) = [p for p in executor_prompts if f"Question: {sub}\n" in p]
        for i, hit in enumerate(client.retrieve([sub], topk=3)[0]):
            assert f"[{i}] {pool_item(hit['document']['contents'])}" in prompt
    planner_prompts = [
        tokenizer.decode(c["prompt_ids"])
        for c in backend.calls
        if EXECUTOR_MARK not in tokenizer.decode(c["prompt_ids"])
    ]
    assert len(planner_prompts) == len(assistant_turns)
    assert all(s in planner_prompts[-1] for s in SUBS.values())
    assert "(Title:" not in planner_prompts[-1] and "Supporting evidence" not in planner_prompts[-1]
    extra = out["extra"]
    assert extra["searches"] == list(SUBS) and extra["num_searches"] == 2
    assert extra["extractor_failures"] == 0 and extra["termination"] == "answer"
    assert extra["raw_context_tokens"] > extra["context_tokens"] > 0


def test_user_turn_observation_matches_the_chat_template(base_config, search_url, tokenizer):
    """observation_role=user with raw passages: the tokens are the chat template's, token by token, mask 0."""
    search_turn = "<think> look it up </think> <search> longest river in Africa </search>"
    answer_turn = "<answer> Nile </answer>"
    backend = ScriptedBackend(tokenizer, turns=[search_turn, answer_turn])
    config = loop_config(base_config, search_url, observation_role="user", max_obs_tokens=100_000)
    row = make_row(QUESTION, "evidence_search")
    out = unpad(run_worker(config, backend, [row]))

    documents = format_documents(RetrievalClient(search_url).retrieve(["longest river in Africa"], topk=3)[0])
    dialogue = [
        *row["raw_prompt"],
        {"role": "assistant", "content": search_turn},
        {"role": "user", "content": f"<information> {documents} </information>"},
    ]
    expected = tokenizer.apply_chat_template(dialogue, tokenize=True, add_generation_prompt=True, return_dict=False)
    search_ids = tokenizer.encode(search_turn, add_special_tokens=False)
    answer_ids = tokenizer.encode(answer_turn, add_special_tokens=False)
    context = expected[len(out["prompt_ids"]) + len(search_ids) :]
    assert out["prompt_ids"] + out["response_ids"] == expected + answer_ids
    assert out["response_mask"] == [1] * len(search_ids) + [0] * len(context) + [1] * len(answer_ids)
    assert tokenizer.decode(context).startswith("<|im_end|>\n<|im_start|>user\n<information> Doc 1 (Title: ")
    assert tokenizer.decode(context).endswith("</information><|im_end|>\n<|im_start|>assistant\n")
    assert out["num_turns"] == 4


def test_paper_layout_invalid_action_is_a_user_turn_correction(base_config, search_url, tokenizer):
    turns = [
        "<think> hmm </think>\n<action>\nlook up the Nile\n</action>",
        '<action> Search("How long is the Nile river?") </action>',
        "<answer> 6,650 km </answer>",
    ]
    backend = ScriptedBackend(tokenizer, responder=lambda p: executor_reply(p) if EXECUTOR_MARK in p else turns.pop(0))
    config = loop_config(base_config, search_url, **EVIPATH_SETTINGS["paper"])
    out = unpad(run_worker(config, backend, [make_row(QUESTION, "evidence_search")]))
    text = tokenizer.decode(out["response_ids"])
    assert f"<|im_start|>user\n{PAPER_INVALID_ACTION_FEEDBACK.strip()}<|im_end|>\n<|im_start|>assistant\n" in text
    assert f"<|im_start|>user\nObservation:\n{SUBS['How long is the Nile river?']}<|im_end|>" in text
    assert out["extra"]["invalid_actions"] == 1 and out["extra"]["num_searches"] == 1


def test_executor_without_an_answer_falls_back_to_the_passages(base_config, search_url, tokenizer):
    turns = ["<search> Which desert is the largest? </search>", "<answer> Sahara </answer>"]
    backend = ScriptedBackend(tokenizer, responder=lambda p: executor_reply(p) if EXECUTOR_MARK in p else turns.pop(0))
    config = loop_config(base_config, search_url, observation="executor")
    out = unpad(run_worker(config, backend, [make_row(QUESTION, "evidence_search")]))
    context = tokenizer.decode([t for t, m in zip(out["response_ids"], out["response_mask"], strict=True) if m == 0])
    assert context.startswith("\n\n<information>Doc 1 (Title: ")  # inline layout, raw passages kept
    assert out["extra"]["extractor_failures"] == 1


def test_executor_behind_an_openai_compatible_endpoint(base_config, search_url, tokenizer):
    server = OpenAICompatibleServer(tokenizer)
    server.chat_reply = (
        "<think> [0] says so </think>\n<select>[0]</select>\n"
        "<answer> The Nile is the longest river in Africa. </answer> extra"
    )
    try:
        config = loop_config(
            base_config,
            search_url,
            **EVIPATH_SETTINGS["search"],
            extractor="openai",
            extractor_url=server.url,
            extractor_model="executor-8b",
        )
        turns = ["<think> look </think>\n<search> longest river in Africa </search>", "<answer> Nile </answer>"]
        out = unpad(
            run_worker(config, ScriptedBackend(tokenizer, turns=turns), [make_row(QUESTION, "evidence_search")])
        )
    finally:
        server.stop()
    (chat,) = server.requests
    assert chat["model"] == "executor-8b" and chat["stop"] == ["</answer>"]
    assert chat["messages"][0] == {"role": "system", "content": load_prompt("evipath_executor").strip()}
    assert chat["messages"][1]["content"].startswith("Question: longest river in Africa\nSupporting evidence:\n[0] ")
    text = tokenizer.decode(out["response_ids"])
    assert "<|im_start|>user\n<information> The Nile is the longest river in Africa. </information><|im_end|>" in text
    assert "(Title:" not in text and out["extra"]["extractor_failures"] == 0


@pytest.mark.parametrize(
    "text, layout, expected",
    [
        ("<think> t </think> <search> q one </search> <answer> x </answer>", "search", ("search", ["q one"])),
        ("<search>  </search>", "search", ("search", [])),
        (
            "<think> t </think>\n<action>\nSearch(\"a b?\")\nSearch([0], 'c')\n</action>",
            "paper",
            ("search", ["a b?", "c"]),
        ),
        ("<action> look it up </action>", "paper", ("search", [])),
        ('<think> t </think> <answer> Nile </answer> <action>Search("x")</action>', "paper", ("answer", ["Nile"])),
        ("<search> q </search>", "paper", None),
    ],
)
def test_planner_action_parses_both_layouts(text, layout, expected):
    action = planner_action(text, layout)
    assert (action[:2] if action else None) == expected
