"""EviOmni's Zero / CoT / Full baselines (Table 2's rows, prompts of Tables 12-13): ``eval --baseline``.

The reader is an OpenAI-compatible server on 127.0.0.1 (tests/http_servers.py) with a scripted reply; the rows are
the bundled QA set with each question's BM25 top 5 (no retrieval server to start).
"""

from __future__ import annotations

import pytest
from http_servers import OpenAICompatibleServer
from typer.testing import CliRunner

from verl_evidence.eval.paper_baselines import baseline_prompt, baseline_rows, parse_baseline_answer
from verl_evidence.prompts import load_prompt, render_prompt


@pytest.fixture(scope="module")
def reader_server():
    from verl_evidence.local.tiny_models import tiny_tokenizer

    server = OpenAICompatibleServer(tiny_tokenizer(), chat_reply="unused")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def rows():
    rows, note = baseline_rows(None, None, limit=3)
    assert "BM25" in note and len(rows) == 3
    return rows


def test_cot_answers_are_read_after_the_reasoning() -> None:
    assert parse_baseline_answer("The passage says X.\nSo the answer is Paris.", "cot") == "Paris"
    assert parse_baseline_answer("Step 1: ...\nStep 2: ...\nParis", "cot") == "Paris"
    assert parse_baseline_answer("thinking\n<answer> Paris </answer>", "cot") == "Paris"
    assert parse_baseline_answer("Answer: Paris\nbecause ...", "full") == "Paris"  # the reader's rule
    with pytest.raises(ValueError, match="needs \\{document\\}"):
        baseline_prompt("full", "eviomni_closed_book")  # Full reads passages: a closed-book prompt cannot
    with pytest.raises(ValueError, match="must be one of zero, full, cot"):
        baseline_prompt("few-shot")


@pytest.mark.parametrize("kind", ["zero", "full", "cot"])
def test_eval_baseline_answers_each_row_with_the_papers_prompt(kind, reader_server, rows, tmp_path) -> None:
    from verl_evidence.cli import app
    from verl_evidence.dataprep.templates import format_passages

    gold = rows[0]["reward_model"]["ground_truth"]["target"][0]
    reply = {"zero": gold, "full": f"Answer: {gold}", "cot": f"The first passage says so.\nSo the answer is {gold}."}
    reader_server.chat_reply = reply[kind]
    reader_server.requests.clear()
    out = tmp_path / kind
    args = ["eval", "--baseline", kind, "--reader", reader_server.url, "--reader-model", "qa-generator"]
    args += ["--limit", "3", "--out", str(out), "--paper", "eviomni"]
    result = CliRunner().invoke(app, args, env={"HF_HUB_OFFLINE": "1"})
    assert result.exit_code == 0, result.output

    prompts = [body["messages"][0]["content"] for body in reader_server.requests]
    assert len(prompts) == 3
    extra = rows[0]["extra_info"]
    passages = format_passages([p["contents"] for p in extra["passages"]])
    name = {"zero": "eviomni_closed_book", "full": "eviomni_reader", "cot": "eviomni_cot"}[kind]
    expected = render_prompt(load_prompt(name).strip(), question=extra["question"], document=passages)
    assert expected in prompts
    assert (passages[:40] in expected) == (kind != "zero")  # Zero sees the question only

    label = {"zero": "Zero", "full": "Full", "cot": "CoT"}[kind]
    assert f"Baseline {label}" in (out / "report.md").read_text()
    # the paper's table: its reported Zero/Full/CoT rows with ours beside them; ours got the first question right
    paper = (out / f"paper_eviomni_baseline_{kind}.csv").read_text()
    assert "Zero" in paper and "Full" in paper and "CoT" in paper
    table = (out / "table.csv").read_text()
    assert "0.333" in table or "33.3" in table, table


def test_a_baseline_without_a_reader_fails_in_one_line(tmp_path) -> None:
    from verl_evidence.cli import app

    result = CliRunner().invoke(app, ["eval", "--baseline", "full", "--limit", "1", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "give --reader" in result.output
    result = CliRunner().invoke(app, ["eval", "--baseline", "sft", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "zero, full, cot" in result.output
    result = CliRunner().invoke(app, ["eval", "--baseline", "zero", "--model", "/m", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "drop --model" in result.output
