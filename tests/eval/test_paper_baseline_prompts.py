"""EviOmni's baselines' prompts (Tables 11-13): the closed-book reader is the papers' Zero baseline."""

from __future__ import annotations

import pytest
from http_servers import OpenAICompatibleServer

from verl_evidence.eval.paper_scoring import PaperScoringError, Reader, score_as_the_papers
from verl_evidence.eval.records import EvalRecord
from verl_evidence.prompts import load_prompt, render_prompt


def test_the_closed_book_reader_answers_from_the_question_alone(tmp_path) -> None:
    from verl_evidence.local.tiny_models import tiny_tokenizer

    server = OpenAICompatibleServer(tiny_tokenizer(), chat_reply="Answer: the committee")
    try:
        zero = Reader.create(server.url, "reader", "eviomni_closed_book")
        full = Reader.create(server.url, "reader")
        record = EvalRecord(
            policy="p",
            example_id="eviomni/0",
            data_source="nq",
            rollout="eviomni",
            question="Who wrote report 0?",
            golden_answers=["the committee"],
            evidence="The committee wrote report 0.",
        )
        assert score_as_the_papers([record], reader=zero) == (1, [])
        sent = server.requests[-1]["messages"][0]["content"]
        assert sent == render_prompt(load_prompt("eviomni_closed_book"), question="Who wrote report 0?")
        assert "The committee wrote" not in sent and record.reader_prediction == "the committee"
        assert zero.identity != full.identity  # a different reader: its answers are cached apart
        bad = tmp_path / "reader.txt"
        bad.write_text("Passages: {passages}\nQuestion: {question}", encoding="utf-8")
        with pytest.raises(PaperScoringError, match="cannot fill"):
            Reader.create(server.url, "reader", bad)
        no_question = tmp_path / "no_question.txt"  # (prompt files are read once per path)
        no_question.write_text("Document: {document}", encoding="utf-8")
        with pytest.raises(PaperScoringError, match="question"):
            Reader.create(server.url, "reader", no_question)
    finally:
        server.stop()
