"""Replay evaluation end to end: recorded texts through the real agent loops, the real
retrieval server (session fixture), and verl's RewardLoopWorker with every reward manager."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_evidence.eval import metrics
from verl_evidence.eval.cache import ResultsCache
from verl_evidence.eval.replay import load_trajectories, replay_examples
from verl_evidence.eval.runner import EvalExample, PolicySpec
from verl_evidence.eval.session import RANDOM_JUDGE_NOTE, make_runner, open_session

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data"
TRAJECTORIES = DATA / "trajectories.jsonl"
QA = DATA / "qa.jsonl"
POLICY = PolicySpec("replay", str(TRAJECTORIES))


@pytest.fixture(scope="module")
def session(module_event_loop, retrieval_server_url, tmp_path_factory):
    # (the loop's teardown cancels the in-process judge's batcher task)
    with open_session(tmp_path_factory.mktemp("eval-work"), retrieval_url=retrieval_server_url) as s:
        yield s


@pytest.fixture(scope="module")
def examples(session) -> list[EvalExample]:
    return replay_examples(load_trajectories(TRAJECTORIES), session, qa_path=QA)


@pytest.fixture(scope="module")
def records(module_event_loop, session, examples, tmp_path_factory):
    cache = ResultsCache(tmp_path_factory.mktemp("eval-cache") / "results.jsonl")
    runner = make_runner(session, POLICY)
    out = module_event_loop.run_until_complete(runner.run(examples, cache=cache))
    return {r.example_id: r for r in out}, cache


def test_the_random_judge_is_announced(session) -> None:
    assert RANDOM_JUDGE_NOTE in session.notes


def test_search_rollouts_ran_live_against_the_server(records) -> None:
    by_id, _ = records
    two_hop = by_id["search/s-t2-good"]
    assert two_hop.error is None
    assert two_hop.num_searches == 2 and two_hop.summary_count == 2
    assert two_hop.response.count("<information>") == 2  # observations appended by the loop, from the server
    assert "Danube" in two_hop.response  # the server found the Budapest/Danube passages
    assert two_hop.prediction == "Black Sea"
    assert two_hop.context_tokens > 0 and two_hop.raw_context_tokens >= two_hop.context_tokens
    assert two_hop.data_source == "qa_2hop"
    no_search = by_id["search/s-t1-unsupported"]
    assert no_search.num_searches == 0 and no_search.prediction == "Red Sea"


def test_eviomni_rollout_has_passages_from_the_server_and_masked_answers(records) -> None:
    by_id, _ = records
    good = by_id["eviomni/e-t1-good"]
    assert good.error is None
    assert good.passage_tokens > good.evidence_tokens > 0
    assert metrics.example_compression_ratio(good) == pytest.approx(good.passage_tokens / good.evidence_tokens)
    components = good.rewards["eviomni"]
    assert components["ans_r"] == 1.0 and components["ans_e"] == 1.0 and components["format"] == 1.0
    bad = by_id["eviomni/e-t1-bad"]
    assert bad.rewards["eviomni"]["format"] == 0.0 and bad.rewards["eviomni"]["ans_e"] == 0.0


def test_grace_paths_and_labels(records) -> None:
    by_id, _ = records
    assert by_id["grace/g-t1-good"].refused is False and by_id["grace/g-t1-good"].answerable is True
    assert by_id["grace/g-t1-refuse"].refused is True
    refusal = by_id["grace/g-t2-correct-refusal"]
    assert refusal.answerable is False and refusal.refused is True
    assert refusal.rewards["grace"]["score"] == pytest.approx(1.5)  # format 0.5 + right <llm> path 1
    g = metrics.grace_metrics(list(by_id.values()))
    assert g["refusal_accuracy"] == 1.0
    assert g["overall_accuracy"] == pytest.approx(2 / 3)


def test_each_rollout_is_scored_by_its_managers_and_the_composite_adds_up(records) -> None:
    by_id, _ = records
    for record in by_id.values():
        expected = {"search": {"evinote", "composite"}, "eviomni": {"eviomni"}, "grace": {"grace"}}[record.rollout]
        assert set(record.rewards) == expected, record.example_id
    good = by_id["search/s-t1-good"]
    composite = good.rewards["composite"]
    assert composite["score"] == pytest.approx(good.rewards["evinote"]["score"] + 0.5 * composite["answer_f1.score"])
    assert good.eqr == good.rewards["evinote"]["eqr"]


def test_good_cases_score_higher_than_bad_cases_for_every_manager(records) -> None:
    from verl_evidence.eval.demo_report import separation

    rows = separation(list(records[0].values()))
    assert {r["manager"] for r in rows} == {"evinote", "composite", "eviomni", "grace"}
    for row in rows:
        assert row["separates"], row


def test_a_second_run_is_served_from_the_cache(module_event_loop, session, examples, records) -> None:
    by_id, cache = records
    runner = make_runner(session, POLICY)

    def no_generation(example):
        raise AssertionError(f"{example.example_id} should have come from the cache")

    runner.backend_for = no_generation
    again = module_event_loop.run_until_complete(runner.run(examples, cache=ResultsCache(cache.path)))
    assert [r.example_id for r in again] == [e.example_id for e in examples]
    assert all(r.rewards == by_id[r.example_id].rewards for r in again)


def test_a_failing_example_is_recorded_and_the_run_goes_on(module_event_loop, session, examples) -> None:
    broken = EvalExample("search/broken", dict(examples[0].row, agent_name="no_such_loop"), script=["x"])
    runner = make_runner(session, POLICY)
    out = module_event_loop.run_until_complete(runner.run([broken, examples[0]]))
    assert "no_such_loop" in out[0].error and out[0].rewards == {}
    assert out[1].error is None and out[1].rewards


def test_bad_trajectory_files_fail_naming_the_line(tmp_path, session) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        json.dumps({"question_id": "t1", "rollout": "search", "turns": ["<answer>x</answer>"]}) + "\n{oops\n"
    )
    with pytest.raises(ValueError, match=r"t.jsonl:2: not valid JSON"):
        load_trajectories(path)
    path.write_text(json.dumps({"question_id": "t1", "rollout": "planning", "turns": ["x"]}) + "\n")
    with pytest.raises(ValueError, match=r"t.jsonl:1: unknown rollout 'planning'"):
        load_trajectories(path)
    path.write_text(json.dumps({"question_id": "nope", "rollout": "search", "turns": ["x"]}) + "\n")
    with pytest.raises(ValueError, match="no search row for question 'nope'"):
        replay_examples(load_trajectories(path), session, qa_path=QA)
