"""``verl-evidence evipath synthesize`` end to end against the local chat server."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
from typer.testing import CliRunner

from verl_evidence.cli import app

CORPUS = [
    {
        "id": "p1",
        "contents": (
            "The Collegian\n"
            "The Collegian is the student newspaper of Houston Baptist University. It appears every two weeks."
        ),
    },
    {
        "id": "p2",
        "contents": (
            "Houston Baptist University\n"
            "Houston Baptist University is a private university. Houston Baptist University was founded in 1960."
        ),
    },
    {"id": "p3", "contents": "Glamour (magazine)\nGlamour was founded in 1939."},
]
QA = [
    {
        "id": "collegian",
        "question": "When was the institute that owns The Collegian founded?",
        "golden_answers": ["1960"],
        "hops": 2,
        "gold_passage_ids": ["p1", "p2"],
        "gold_evidence": [
            "The Collegian is the student newspaper of Houston Baptist University.",
            "Houston Baptist University was founded in 1960.",
        ],
        "distractor_ids": ["p3"],
    }
]


def _write_bundled(directory):
    (directory / "corpus.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CORPUS))
    (directory / "qa.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QA))
    return directory / "qa.jsonl"


def test_synthesize_command(chat_server, scripted, tmp_path):
    chat_server.reset(scripted())
    qa = _write_bundled(tmp_path)
    out = tmp_path / "out"
    args = [
        "evipath",
        "synthesize",
        "--input",
        str(qa),
        "--format",
        "bundled",
        "--out",
        str(out),
        "--base-url",
        chat_server.base_url,
        "--model",
        "scripted",
        "--concurrency",
        "2",
        "--prompt-cost-per-1k",
        "1.0",
        "--planner-format",
        "search",
    ]
    result = CliRunner().invoke(app, args, env={"HF_HUB_OFFLINE": "1"})
    assert result.exit_code == 0, result.output
    assert "kept" in result.output and "cache hits" in result.output
    stats = json.loads((out / "stats.json").read_text())
    assert stats["kept"] == 1 and stats["teacher"]["requests"] == 7 and stats["teacher"]["cache_hits"] == 0
    assert stats["teacher"]["cost"] > 0
    planner = pq.read_table(out / "planner.parquet").to_pylist()
    assert planner[0]["messages"][1]["content"].startswith("<think>")
    assert (out / "teacher_cache.sqlite").exists()

    # Re-running resumes from the cache: no request reaches the server.
    chat_server.reset(scripted())
    result = CliRunner().invoke(app, args, env={"HF_HUB_OFFLINE": "1"})
    assert result.exit_code == 0, result.output
    assert chat_server.requests == 0
    assert json.loads((out / "stats.json").read_text())["teacher"]["cache_hits"] == 7


def test_synthesize_reports_bad_input(tmp_path):
    runner = CliRunner()
    result = runner.invoke(
        app, ["evipath", "synthesize", "--input", str(tmp_path / "nope.json"), "--format", "hotpotqa", "--model", "m"]
    )
    assert result.exit_code == 2 and "nope.json" in result.output
    result = runner.invoke(app, ["evipath", "synthesize", "--format", "squad", "--model", "m"])
    assert result.exit_code == 2 and "choose one of" in result.output
    (tmp_path / "empty.jsonl").write_text(
        json.dumps({"id": "x", "question": "", "answer": "a", "paragraphs": []}) + "\n"
    )
    result = runner.invoke(
        app, ["evipath", "synthesize", "--input", str(tmp_path / "empty.jsonl"), "--format", "musique", "--model", "m"]
    )
    assert result.exit_code == 2 and "no usable records" in result.output
