"""`verl-evidence eval` from the command line, and a local HF model directory as the policy."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from http_servers import OpenAICompatibleServer
from typer.testing import CliRunner

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data"


def test_eval_command_writes_report_and_resumes_from_its_cache(retrieval_server_url, tmp_path) -> None:
    """One evaluation, resumed with the papers' scoring: nothing is rolled out again.

    The resumed run asks a separate reader (a tiny local HF model) for the EviOmni examples, BERTScore (a
    tiny local BERT) and an LLM judge (an OpenAI-compatible server on 127.0.0.1) for the GRACE ones, and
    prints GRACE's Table 1 with this run as a row. (The scoring's own cache and the other papers' tables
    are tested without a CLI run: tests/eval/test_paper_scoring.py, test_paper_table.py.)
    """
    from verl_evidence.cli import app
    from verl_evidence.eval.cli import console
    from verl_evidence.local.tiny_models import tiny_causal_lm, tiny_nli_model, tiny_tokenizer

    out = tmp_path / "eval"
    args = [
        "eval",
        "--trajectories",
        str(DATA / "trajectories.jsonl"),
        "--qa",
        str(DATA / "qa.jsonl"),
        "--rollouts",
        "search,eviomni,grace",
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
    assert "### `evinote`" in report and "### `grace`" in report and "### `eviomni`" in report
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 9  # 4 search + 2 EviOmni + 3 GRACE trajectories
    assert {json.loads(line)["rollout"] for line in lines} == {"search", "eviomni", "grace"}

    reader_dir = tmp_path / "reader"
    tiny_causal_lm(seed=3, directory=reader_dir)
    bert_dir = tiny_nli_model(tmp_path / "bert")
    judge = OpenAICompatibleServer(tiny_tokenizer(), chat_reply="CORRECT")
    scoring = ["--reader", str(reader_dir), "--bertscore", "--bertscore-model", str(bert_dir)]
    scoring += ["--bertscore-layers", "2", "--judge", judge.url, "--judge-model", "judge-v3"]
    try:
        second = CliRunner().invoke(app, [*args, *scoring, "--paper", "grace"])
    finally:
        judge.stop()
    assert second.exit_code == 0, second.output
    records = {}
    after = (out / "results.jsonl").read_text().splitlines()
    for line in after:
        record = json.loads(line)
        records[record["example_id"]] = record  # later lines win, as in the cache
    # nothing was rolled out again: the rollouts' fields are those of the first run
    for line in lines:
        before = json.loads(line)
        assert records[before["example_id"]]["response"] == before["response"]
    eviomni = [r for r in records.values() if r["rollout"] == "eviomni"]
    grace = [r for r in records.values() if r["rollout"] == "grace"]
    assert eviomni and all(isinstance(r["reader_prediction"], str) for r in eviomni)
    assert all(r["reader"].startswith(f"hf:{reader_dir.resolve()}|prompt:") for r in eviomni)
    assert len(judge.requests) == len(grace) and all(r["judge_correct"] is True for r in grace)
    assert all(r["bertscore_f1"] is not None for r in grace if r["answerable"])
    assert all(r["bertscore_f1"] is None for r in grace if not r["answerable"])
    # appended: one line per scoring result (reader, judge, BERTScore), no rollout was redone
    assert len(after) == len(lines) + len(eviomni) + len(grace) + sum(1 for r in grace if r["answerable"])

    # the paper's table: its reported rows, then this run's, in Markdown and CSV, and printed
    paper_md = (out / "paper_grace.md").read_text()
    assert "| [Table 1] GRACE-Qwen3-4B | 27.08 | 73.09 | 74.25 |" in paper_md
    with (out / "paper_grace.csv").open() as fh:
        rows = {row["policy"]: row for row in csv.DictReader(fh)}
    ours = rows["trajectories.jsonl"]
    assert ours["group"] == "This evaluation" and ours["HotpotQA/Acc"] == ""  # no HotpotQA rows here
    judged = [r for r in grace if r["data_source"] == "qa_1hop"]
    assert float(ours["qa_1hop/Ans LJ"]) == 100.0 and int(ours["qa_1hop/n"]) == len(judged)
    assert "as in the grace paper" in second.output and "paper scoring: " in second.output
    assert "## As in the grace paper" in (out / "report.md").read_text()
    table_lines = [line for line in second.output.splitlines() if "[Table 1]" in line]
    assert table_lines and max(len(line) for line in table_lines) <= console.width  # fitted to the console
    assert "…" not in second.output


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
