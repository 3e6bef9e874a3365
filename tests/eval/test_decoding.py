"""``eval --decoding``: each method decodes with its paper's inference settings (GRACE: temperature 0.6, top_p 0.9,
Table 2), greedily, or as the user says; the settings reach the policy backend through verl's agent loops on the
bundled data, in place of ``val_kwargs``, and are recorded with each result."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from verl_evidence.eval.decoding import PAPER_DECODING, DecodingError, parse_decoding


def test_the_choices_and_their_sources() -> None:
    paper = parse_decoding(None)
    assert paper == parse_decoding("paper")
    grace = paper.for_row({"extra_info": {"method": "grace"}}, "grace")
    assert (grace.temperature, grace.top_p, grace.top_k) == (0.6, 0.9, -1)
    assert grace.source == "[paper] GRACE Table 2 (inference)"
    for method in ("eviomni", "lear", "evinote", "evipath", "search_r1"):  # the papers state none: greedy, ours
        sampling = paper.for_row({"extra_info": {"method": method}}, "search")
        assert sampling.temperature == 0 and sampling.source.startswith("[ours]")
    assert paper.for_row({}, "grace") == PAPER_DECODING["grace"]  # no method: the rollout family's
    assert parse_decoding("greedy").for_row({"extra_info": {"method": "grace"}}, "grace").temperature == 0
    user = parse_decoding(" temperature=0.7, top_p=0.95,top_k=20 ")
    assert user.name == "temperature=0.7,top_p=0.95,top_k=20"
    sampling = user.for_row({"extra_info": {"method": "eviomni"}}, "eviomni")
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.7, 0.95, 20)
    assert "grace temperature 0.6, top_p 0.9 ([paper] GRACE Table 2" in paper.describe()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("beam", "expected paper, greedy or KEY=VALUE[,KEY=VALUE] with KEY one of temperature, top_p, top_k"),
        ("temp=0.6", "with KEY one of temperature, top_p, top_k"),
        ("temperature=hot", "temperature='hot' is not a number"),
        ("temperature=-1", "temperature must be a finite number >= 0"),
        ("temperature=0.6,top_p=1.5", "top_p must be in (0, 1]"),
        ("temperature=0.6,top_k=0", "top_k must be positive, or -1 for off"),
        ("top_p=0.9", "top_p / top_k need a temperature above 0"),
        ("temperature=0.6,temperature=0.7", "temperature is given twice"),
    ],
)
def test_bad_values_are_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(DecodingError) as caught:
        parse_decoding(text)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.fixture(scope="module")
def bundled_examples():
    """A GRACE row and an EviNote (search) row of the bundled set, as `data grace` / `data qa` write them."""
    from verl_evidence.dataprep import grace as grace_mod
    from verl_evidence.dataprep import rows as rows_mod
    from verl_evidence.dataprep.retrievers import build_retriever
    from verl_evidence.dataprep.templates import load_template
    from verl_evidence.eval.datasets import bundled_qa_records, examples_from_rows

    records, corpus = bundled_qa_records()
    records = records[:1]
    examples, _ = grace_mod.construct(
        [grace_mod.GraceInput(r) for r in records], [build_retriever("oracle", corpus)], corpus, k=3
    )
    rows = rows_mod.grace_rows(examples, corpus, load_template("grace"), "test")
    rows += rows_mod.search_rows(records, "evinote", load_template("evinote"), "test")
    return examples_from_rows(rows)


@pytest.fixture(scope="module")
def runner_parts(tmp_path_factory):
    import verl_evidence.plugin  # noqa: F401  (registers the agent loops)
    from verl_evidence.eval.scoring import compose_trainer_config
    from verl_evidence.eval.session import _set_loop_settings
    from verl_evidence.local.tiny_models import save_tiny_tokenizer, tiny_tokenizer

    tokenizer_dir = save_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    config = compose_trainer_config(tokenizer_dir)
    # the search loop answers at once below: the server address is never called
    _set_loop_settings(config, "http://127.0.0.1:9", 3, 2, 1024, 256)
    assert config.actor_rollout_ref.rollout.val_kwargs.temperature == 0  # verl's validation default: greedy
    return config, tiny_tokenizer()


def run(runner_parts, examples, decoding, cache=None):
    """Evaluate ``examples`` with a scripted policy; (records, sampling params of every generate call)."""
    from verl_evidence.eval.runner import EvalRunner
    from verl_evidence.local.backends import ScriptedBackend

    config, tokenizer = runner_parts
    backends = []

    def backend_for(example):
        reply = "<evidence>x</evidence><answer>Khartoum</answer>" if example.rollout == "grace" else None
        backend = ScriptedBackend(tokenizer, responder=lambda prompt: reply or "<answer>Khartoum</answer>")
        backends.append(backend)
        return backend

    runner = EvalRunner(config, tokenizer, "hf:/policy", backend_for, decoding=decoding, concurrency=1)
    records = asyncio.run(runner.run(examples, cache))
    calls = [call["sampling_params"] for backend in backends for call in backend.calls]
    return records, calls


def test_paper_settings_reach_the_backend_and_the_results(runner_parts, bundled_examples, tmp_path: Path) -> None:
    from verl_evidence.eval.cache import ResultsCache

    cache = ResultsCache(tmp_path / "results.jsonl")
    records, calls = run(runner_parts, bundled_examples, parse_decoding("paper"), cache)
    assert [r.rollout for r in records] == ["grace", "search"] and not any(r.error for r in records)
    grace_calls, search_calls = calls[:1], calls[1:]
    assert [(c["temperature"], c["top_p"], c["top_k"]) for c in grace_calls] == [(0.6, 0.9, -1)]
    assert search_calls and all((c["temperature"], c["top_p"]) == (0.0, 1.0) for c in search_calls)
    assert records[0].decoding == {**PAPER_DECODING["grace"].as_record(), "temperature": 0.6}
    assert records[1].decoding["source"].startswith("[ours] greedy")
    # the results file keeps the decoding; the same choice is served from it, another one runs again
    stored = ResultsCache(tmp_path / "results.jsonl").get("hf:/policy", records[0].example_id)
    assert stored.decoding == records[0].decoding
    again, calls = run(runner_parts, bundled_examples, parse_decoding("paper"), ResultsCache(cache.path))
    assert calls == [] and [r.decoding for r in again] == [r.decoding for r in records]
    user, calls = run(runner_parts, bundled_examples, parse_decoding("temperature=0.3"), ResultsCache(cache.path))
    assert {(c["temperature"], c["top_p"]) for c in calls} == {(0.3, 1.0)}
    assert {r.decoding["source"] for r in user} == {"[user] --decoding temperature=0.3"}


def test_without_a_choice_val_kwargs_decide(runner_parts, bundled_examples) -> None:
    """Replayed texts: no --decoding, verl's val_kwargs as they are (greedy), nothing recorded."""
    records, calls = run(runner_parts, bundled_examples, None)
    assert {c["temperature"] for c in calls} == {0} and all(r.decoding is None for r in records)


def test_the_command_refuses_bad_decodings_before_starting_anything() -> None:
    from typer.testing import CliRunner

    from verl_evidence.cli import app

    result = CliRunner().invoke(app, ["eval", "--decoding", "beam", "--model", "."])
    assert result.exit_code == 2 and "expected paper, greedy or KEY=VALUE" in " ".join(result.output.split())
    result = CliRunner().invoke(app, ["eval", "--decoding", "greedy"])  # the bundled replayed trajectories
    assert result.exit_code == 2
    assert "--decoding needs a live policy" in " ".join(result.output.split())
