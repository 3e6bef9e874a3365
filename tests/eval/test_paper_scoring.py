"""Scoring as the papers score: EviOmni/LEAR's separate reader, GRACE's BERTScore F1 and LLM judge.

Real parts, offline: a tiny random HF causal LM as the local reader, an OpenAI-compatible HTTP server on
127.0.0.1 (tests/http_servers.py) as the endpoint form, the ``bert-score`` package on a tiny local BERT.
"""

from __future__ import annotations

import sys

import pytest
from http_servers import OpenAICompatibleServer

from verl_evidence.eval import metrics
from verl_evidence.eval.paper_scoring import (
    BertScorer,
    Judge,
    PaperScoringError,
    Reader,
    parse_reader_answer,
    parse_verdict,
    score_as_the_papers,
)
from verl_evidence.eval.records import EvalRecord
from verl_evidence.prompts import load_prompt, render_prompt


def eviomni_record(i: int, evidence: str, prediction: str = "wrong") -> EvalRecord:
    return EvalRecord(
        policy="p",
        example_id=f"eviomni/{i}",
        data_source="nq",
        rollout="eviomni",
        question=f"Who wrote report {i}?",
        golden_answers=["the committee"],
        prediction=prediction,
        evidence=evidence,
    )


def grace_record(i: int, answerable: bool, prediction: str, response: str = "") -> EvalRecord:
    return EvalRecord(
        policy="p",
        example_id=f"grace/{i}",
        data_source="hotpotqa",
        rollout="grace",
        question=f"Where is tower {i}?",
        golden_answers=["Paris", "Paris, France"],
        prediction=prediction,
        response=response or f"<evidence>e</evidence><answer>{prediction}</answer>",
        answerable=answerable,
    )


@pytest.fixture
def chat_server():
    from verl_evidence.local.tiny_models import tiny_tokenizer

    server = OpenAICompatibleServer(tiny_tokenizer(), chat_reply="Answer: the committee\nbecause ...")
    yield server
    server.stop()


def test_the_endpoint_reader_answers_from_the_evidence_with_the_swappable_prompt(chat_server, tmp_path) -> None:
    reader = Reader.create(chat_server.url, "reader-1.5b")
    records = [eviomni_record(0, "The committee wrote report 0 in 1998."), eviomni_record(1, "")]
    updated = []
    changed, failures = score_as_the_papers(records, reader=reader, on_update=updated.append)
    assert changed == 2 and failures == [] and len(updated) == 2
    assert [r.reader_prediction for r in records] == ["the committee", "the committee"]
    assert records[0].prediction == "wrong"  # the policy's own answer is kept beside the reader's
    bodies = {b["messages"][0]["content"]: b for b in chat_server.requests}
    expected = render_prompt(
        load_prompt("eviomni_reader"), question="Who wrote report 0?", document="The committee wrote report 0 in 1998."
    )
    assert expected in bodies
    assert bodies[expected]["model"] == "reader-1.5b" and bodies[expected]["temperature"] == 0.0
    summary = metrics.summarize(records)
    assert summary["reader_em"] == 1.0 and summary["em"] == 0.0

    # the same reader again: nothing to ask; a swapped prompt file is a different reader: asked again
    asked = len(chat_server.requests)
    assert score_as_the_papers(records, reader=reader) == (0, [])
    prompt = tmp_path / "paper_table11.txt"
    prompt.write_text("Documents: {document}\nQuestion: {question}\nAnswer:", encoding="utf-8")
    swapped = Reader.create(chat_server.url, "reader-1.5b", prompt)
    assert swapped.identity != reader.identity
    assert score_as_the_papers(records, reader=swapped)[0] == 2
    assert chat_server.requests[-1]["messages"][0]["content"].startswith("Documents: ")
    assert len(chat_server.requests) == asked + 2


def test_a_local_hf_reader_gets_the_prompt_through_its_chat_template(tmp_path) -> None:
    from verl_evidence.local.tiny_models import tiny_causal_lm, tiny_tokenizer

    model_dir = tmp_path / "tiny-reader"
    tiny_causal_lm(seed=1, directory=model_dir)
    reader = Reader.create(str(model_dir))
    assert reader.identity.startswith(f"hf:{model_dir.resolve()}|prompt:")
    reader.model.backend.record_calls = True
    record = eviomni_record(0, "The committee wrote report 0.")
    assert score_as_the_papers([record], reader=reader) == (1, [])
    assert isinstance(record.reader_prediction, str) and record.reader == reader.identity
    (call,) = reader.model.backend.calls
    prompt = tiny_tokenizer().decode(call["prompt_ids"])
    assert prompt.startswith("<|im_start|>user\n[Instruction]") and prompt.endswith("<|im_start|>assistant\n")
    assert "Document: The committee wrote report 0." in prompt
    assert call["sampling_params"]["temperature"] == 0.0


def test_reader_answers_and_judge_verdicts_are_parsed_strictly() -> None:
    assert parse_reader_answer("Answer: Paris\nIt is in France.") == "Paris"
    assert parse_reader_answer("<think>hm</think>\n\n  Paris  ") == "Paris"
    assert parse_reader_answer("so <answer> the committee </answer>") == "the committee"
    assert parse_reader_answer("") == ""
    assert parse_verdict("CORRECT") is True and parse_verdict("The answer is INCORRECT.") is False
    assert parse_verdict("INCORRECT at first, then CORRECT") is True  # the last verdict counts
    assert parse_verdict("correct-ish") is None and parse_verdict("") is None


def test_the_llm_judge_grades_answers_and_refusals_as_grace_defines_them(chat_server) -> None:
    chat_server.chat_reply = "Verdict: CORRECT"
    judge = Judge.create(chat_server.url, "deepseek-v3.2")
    records = [
        grace_record(0, True, "Paris"),
        grace_record(1, False, "unknown", response="<llm>The passages do not say.</llm><answer>unknown</answer>"),
        dataclass_replace(grace_record(2, True, "x"), error="rollout failed"),  # not judged
    ]
    changed, failures = score_as_the_papers(records, judge=judge)
    assert (changed, failures) == (2, [])
    assert [r.judge_correct for r in records] == [True, True, None]
    prompts = [b["messages"][0]["content"] for b in chat_server.requests]
    assert any("held the evidence needed? yes" in p or "hold the evidence needed? yes" in p for p in prompts)
    refusal = next(p for p in prompts if "Where is tower 1?" in p)
    assert "hold the evidence needed? no" in refusal and "<llm>The passages do not say.</llm>" in refusal
    assert "Reference answer(s): Paris; Paris, France" in refusal
    judged = metrics.judged_grace_metrics(records[:2])
    assert judged["judge_answerable"] == 1.0 and judged["judge_unanswerable"] == 1.0
    assert judged["judge_accuracy"] == 1.0 and judged["judge_balanced_accuracy"] == 1.0

    chat_server.chat_reply = "I am not sure."  # malformed: no verdict, logged; the metric skips it
    unsure = Judge.create(chat_server.url, "deepseek-v3.2", prompt=None)
    unsure.identity += "|again"
    score_as_the_papers(records[:1], judge=unsure)
    assert records[0].judge_correct is None and records[0].judge == unsure.identity


def dataclass_replace(record: EvalRecord, **changes) -> EvalRecord:
    import dataclasses

    return dataclasses.replace(record, **changes)


def test_a_request_that_fails_is_reported_and_asked_again_next_time(tmp_path) -> None:
    from verl_evidence.local.tiny_models import tiny_tokenizer

    server = OpenAICompatibleServer(tiny_tokenizer(), chat_reply="Paris")
    reader = Reader.create(server.url, "reader")
    server.stop()  # the server goes away after the start-up check
    reader.model.max_retries = 0
    record = eviomni_record(0, "e")
    changed, failures = score_as_the_papers([record], reader=reader)
    assert changed == 0 and len(failures) == 1 and failures[0].startswith("reader on eviomni/0: ")
    assert record.reader_prediction is None and reader.wants(record)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A tiny random BERT saved like a hub model (config, weights, tokenizer): BERTScore's local-directory form."""
    from verl_evidence.local.tiny_models import tiny_nli_model

    return tiny_nli_model(tmp_path_factory.mktemp("tiny-bert"))


def test_bertscore_f1_of_answerable_grace_answers_with_a_local_model(tiny_bert) -> None:
    scorer = BertScorer(str(tiny_bert), num_layers=2)
    assert scorer.identity == f"{tiny_bert}@2"
    records = [
        grace_record(0, True, "Paris"),  # the same text as a gold answer: F1 1
        grace_record(1, True, "the tower of London"),
        grace_record(2, True, ""),  # no answer: 0, without asking bert-score
        grace_record(3, False, "Paris"),  # unanswerable: GRACE scores refusals there, not F1
    ]
    assert score_as_the_papers(records, bertscore=scorer) == (3, [])
    assert records[0].bertscore_f1 == pytest.approx(1.0, abs=1e-5)
    assert 0.0 < records[1].bertscore_f1 < 1.0
    assert records[2].bertscore_f1 == 0.0 and records[3].bertscore_f1 is None
    # the best over several gold answers: a second gold answer equal to the prediction lifts it to 1
    records[1].golden_answers = ["Paris", "the tower of London"]
    records[1].bertscore_model = None
    score_as_the_papers(records, bertscore=scorer)
    assert records[1].bertscore_f1 == pytest.approx(1.0, abs=1e-5)
    assert metrics.judged_grace_metrics(records)["bertscore_f1"] == pytest.approx((1 + 1 + 0) / 3, abs=1e-5)


def test_setup_problems_are_one_line_errors_before_anything_runs(tmp_path, monkeypatch, chat_server) -> None:
    def error(make) -> str:
        with pytest.raises(PaperScoringError) as info:
            make()
        message = str(info.value)
        assert "\n" not in message
        return message

    assert "no such directory" in error(lambda: BertScorer(str(tmp_path / "no-such-model"), num_layers=2))
    (tmp_path / "bert").mkdir()
    assert "cannot load it" in error(lambda: BertScorer(str(tmp_path / "bert"), num_layers=2))  # no model in it
    assert "--bertscore-layers" in error(lambda: BertScorer(str(tmp_path / "bert")))
    monkeypatch.setitem(sys.modules, "bert_score", None)  # the [eval] extra not installed
    assert "pip install 'verl-evidence[eval]'" in error(lambda: BertScorer())
    monkeypatch.undo()
    assert "no answer" in error(lambda: Reader.create("http://127.0.0.1:9", "reader"))
    assert "--reader-model" in error(lambda: Reader.create(chat_server.url))
    assert "no config.json" in error(lambda: Judge.create(str(tmp_path)))
    bad = tmp_path / "judge.txt"
    bad.write_text("Grade {response}.", encoding="utf-8")
    assert "{question}" in error(lambda: Judge.create(chat_server.url, "judge", bad))


def test_eval_stops_before_anything_runs_when_the_papers_scoring_cannot(tmp_path) -> None:
    """Exit code 2 and one line, before a retrieval server or a policy is started."""
    from typer.testing import CliRunner

    from verl_evidence.cli import app

    missing = CliRunner().invoke(
        app, ["eval", "--bertscore", "--bertscore-model", str(tmp_path / "none"), "--bertscore-layers", "2"]
    )
    assert missing.exit_code == 2
    (line,) = [x for x in missing.output.splitlines() if x.startswith("error:")]
    assert line == f"error: --bertscore-model {tmp_path / 'none'}: no such directory"
    unknown = CliRunner().invoke(app, ["eval", "--paper", "evipath", "--out", str(tmp_path)])
    assert unknown.exit_code == 2 and "--paper must be one of eviomni, lear, evinote, grace" in unknown.output
    assert not (tmp_path / "results.jsonl").exists()
