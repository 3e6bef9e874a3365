"""`verl-evidence eval` from the command line, and a local HF model directory as the policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from http_servers import OpenAICompatibleServer
from typer.testing import CliRunner

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data"


def test_eval_command_writes_report_and_resumes_from_its_cache(retrieval_server_url, tmp_path) -> None:
    from verl_evidence.cli import app

    out = tmp_path / "eval"
    args = [
        "eval",
        "--trajectories",
        str(DATA / "trajectories.jsonl"),
        "--qa",
        str(DATA / "qa.jsonl"),
        "--rollouts",
        "search,grace",
        "--retrieval-url",
        retrieval_server_url,
        "--out",
        str(out),
    ]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "RANDOMLY INITIALISED" in first.output  # the random judge is announced
    report = (out / "report.md").read_text()
    assert "| search | qa_1hop |" in report and "| grace | all |" in report
    assert "### `evinote`" in report and "### `grace`" in report and "### `eviomni`" not in report
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 7  # 4 search + 3 GRACE trajectories
    assert {json.loads(line)["rollout"] for line in lines} == {"search", "grace"}

    # resume: nothing left to do, so nothing is appended
    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0, second.output
    assert (out / "results.jsonl").read_text().splitlines() == lines


def test_eval_command_rejects_two_policies(tmp_path) -> None:
    from verl_evidence.cli import app

    result = CliRunner().invoke(
        app,
        ["eval", "--trajectories", str(DATA / "trajectories.jsonl"), "--model", str(tmp_path), "--out", str(tmp_path)],
    )
    assert result.exit_code != 0
    assert "at most one policy" in result.output


def test_a_local_hf_model_directory_runs_as_the_policy(verl_event_loop, retrieval_server_url, tmp_path) -> None:
    """The real generation path on CPU: a tiny random Qwen2 generates, the loop searches, the managers score."""
    from verl_evidence.eval.datasets import bundled_rows, examples_from_rows
    from verl_evidence.eval.runner import PolicySpec
    from verl_evidence.eval.session import make_runner, open_session
    from verl_evidence.local.tiny_models import tiny_causal_lm

    model_dir = tmp_path / "tiny-model"
    tiny_causal_lm(seed=0, directory=model_dir)
    with open_session(
        tmp_path / "work",
        tokenizer_dir=model_dir,
        retrieval_url=retrieval_server_url,
        response_length=96,
        max_tokens_per_turn=32,
    ) as session:
        rows = bundled_rows(["search"], session.retrieval_url, session.tokenizer, limit=1)
        examples = examples_from_rows(rows)
        runner = make_runner(session, PolicySpec("hf", str(model_dir)))
        (record,) = verl_event_loop.run_until_complete(runner.run(examples))
    assert record.error is None
    assert record.policy == f"hf:{model_dir.resolve()}"
    assert record.data_source.startswith("bundled_")
    assert record.response  # the model generated something (random text)
    assert set(record.rewards) == {"evinote", "composite"}
    assert record.rewards["evinote"]["format_ok"] == 0.0  # random tokens are not the protocol


def test_eval_command_with_an_openai_compatible_endpoint(retrieval_server_url, tmp_path) -> None:
    from verl_evidence.cli import app
    from verl_evidence.local.tiny_models import save_tiny_tokenizer, tiny_tokenizer

    tokenizer_dir = save_tiny_tokenizer(tmp_path / "tok")
    server = OpenAICompatibleServer(
        tiny_tokenizer(), "<llm>I cannot find it in the context.</llm>\n<answer>unknown</answer>"
    )
    try:
        out = tmp_path / "eval"
        result = CliRunner().invoke(
            app,
            [
                "eval",
                "--endpoint",
                server.url,
                "--served-model",
                "policy-7b",
                "--tokenizer",
                str(tokenizer_dir),
                "--rollouts",
                "grace",
                "--limit",
                "1",
                "--retrieval-url",
                retrieval_server_url,
                "--out",
                str(out),
            ],
        )
    finally:
        server.stop()
    assert result.exit_code == 0, result.output
    assert server.requests and all(r["model"] == "policy-7b" for r in server.requests)
    assert isinstance(server.requests[0]["prompt"], list)  # token ids, as verl's server manager sends them
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert records and all(r["policy"] == f"endpoint:{server.url}#policy-7b" for r in records)
    assert all(r["refused"] is True and r["prediction"] == "unknown" for r in records)
    for r in records:  # the <llm> path is right exactly on the unanswerable contexts
        assert r["rewards"]["grace"]["score"] == (1.5 if r["answerable"] is False else 0.5)


def test_evipath_planner_evaluated_as_trained_through_an_endpoint(retrieval_server_url, tmp_path) -> None:
    """`--evipath paper`: the EviPath system prompt, Search("…") actions, executor calls and user-turn observations."""
    from verl_evidence.cli import app
    from verl_evidence.local.tiny_models import save_tiny_tokenizer, tiny_tokenizer
    from verl_evidence.prompts import load_prompt

    tokenizer = tiny_tokenizer()
    tokenizer_dir = save_tiny_tokenizer(tmp_path / "tok")
    # the same text for planner and executor calls: the planner always searches, the executor never answers
    server = OpenAICompatibleServer(
        tokenizer, '<think> t </think>\n<action>\nSearch("Who wrote the report?")\n</action>'
    )
    try:
        out = tmp_path / "eval"
        result = CliRunner().invoke(
            app,
            [
                "eval",
                "--endpoint",
                server.url,
                "--served-model",
                "planner",
                "--tokenizer",
                str(tokenizer_dir),
                "--rollouts",
                "search",
                "--limit",
                "1",
                "--retrieval-url",
                retrieval_server_url,
                "--out",
                str(out),
                "--evipath",
                "paper",
                "--search-setting",
                "max_turns=3",
                "--search-setting",
                "final_turn_notice=",
            ],
        )
        bad = CliRunner().invoke(app, ["eval", "--evipath", "paper", "--search-setting", "max_turn=3"])
    finally:
        server.stop()
    assert result.exit_code == 0, result.output
    prompts = [tokenizer.decode(r["prompt"]) for r in server.requests]
    planner = [p for p in prompts if p.startswith("<|im_start|>system\n" + load_prompt("evipath_planner").strip())]
    executor = [p for p in prompts if p.startswith("<|im_start|>system\n" + load_prompt("evipath_executor").strip())]
    assert len(planner) == 3 and len(executor) == 2  # max_turns 3: two searches, the last turn's is not run
    assert "<|im_start|>user\nQuestion: " in planner[0]
    assert "<|im_start|>user\nQuestion: Who wrote the report?\nSupporting evidence:\n[0] " in executor[0]
    # the executor wrote no <answer>: the passages are the observation, in a user turn after the closed turn
    assert "</action><|im_end|>\n<|im_start|>user\nObservation:\nDoc 1 (Title: " in planner[1]
    (record,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert record["policy"].startswith(f"endpoint:{server.url}#planner|evidence_search:")
    assert record["num_searches"] == 2
    assert bad.exit_code != 0 and "max_turn=3" in bad.output
