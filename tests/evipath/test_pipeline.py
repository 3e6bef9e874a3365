"""End-to-end synthesis against the local OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json

import pyarrow.parquet as pq
import pytest

from verl_evidence.evipath.cli import run_synthesis
from verl_evidence.evipath.pipeline import Rejection, SynthesisConfig, Synthesizer, Trajectory
from verl_evidence.evipath.teacher import ReplyCache, Teacher, TeacherConfig


def _teacher_config(server, concurrency: int = 4) -> TeacherConfig:
    return TeacherConfig(
        model="scripted",
        base_url=server.base_url,
        api_key="test",
        concurrency=concurrency,
        max_retries=2,
        timeout=30,
        prompt_cost_per_1k=0.5,
        completion_cost_per_1k=1.5,
    )


def _synthesize(server, selector, records, cache=None, config=None):
    async def go():
        teacher = Teacher(_teacher_config(server), cache)
        try:
            results = await Synthesizer(teacher, selector, config).synthesize(records)
        finally:
            await teacher.close()
        return results, teacher

    return asyncio.run(go())


def test_scripted_teacher_keeps_good_and_rejects_wrong_answer(chat_server, scripted, selector, hotpot_records):
    chat_server.reset(scripted())
    results, teacher = _synthesize(chat_server, selector, hotpot_records)
    by_id = {r.record.id: r for r in results}

    collegian = by_id["collegian"]
    assert isinstance(collegian, Trajectory), collegian
    assert [t["searches"] for t in collegian.turns] == [
        ["Which institute owns The Collegian?"],
        ["When was Houston Baptist University founded?"],
        [],
    ]
    assert collegian.final_answer == "1960" and collegian.em == 1.0
    second = collegian.subquestions[1][0]
    # The answer sentence is the golden sentence itself: cosine ~1, no fallback, exactly that item.
    assert second.golden == ["Houston Baptist University: Houston Baptist University was founded in 1960."]
    assert not second.fallback
    assert second.pool[second.golden_positions[0]] == second.golden[0]
    assert sorted(second.pool) == sorted(collegian.record.facts)
    assert second.observation == "Houston Baptist University was founded in 1960."

    directors = by_id["directors"]  # two searches per step, and an unclosed "</think" in the last turn
    assert isinstance(directors, Trajectory), directors
    assert [len(s) for s in directors.subquestions] == [2, 2]
    assert directors.final_answer == "Ek Paheli"

    wrong = by_id["wrong"]
    assert isinstance(wrong, Rejection) and wrong.reason == "answer_mismatch"
    assert "Ruta Sepetys" in wrong.detail

    # (planner turns + 2 calls per sub-question): 3 + 2 x 2, 3 + 4 x 2, 2 + 1 x 2; every call fresh.
    assert teacher.usage.requests == chat_server.requests == 7 + 11 + 4
    assert teacher.usage.cache_hits == 0
    assert teacher.usage.prompt_tokens > 0 and teacher.usage.completion_tokens > 0
    expected_cost = teacher.usage.prompt_tokens / 1000 * 0.5 + teacher.usage.completion_tokens / 1000 * 1.5
    assert teacher.cost() == pytest.approx(expected_cost)


def test_selection_outside_the_pool_is_rejected(chat_server, scripted, selector, hotpot_records):
    chat_server.reset(scripted(select_override="[99]"))
    results, _ = _synthesize(chat_server, selector, hotpot_records[:1])
    assert isinstance(results[0], Rejection)
    assert results[0].reason == "executor_select_out_of_range"


def test_selection_of_a_distractor_is_rejected(chat_server, scripted, selector, hotpot_records):
    record = hotpot_records[0]
    teacher = scripted()
    distractor = "Glamour (magazine): Glamour was founded in 1939."

    def select_distractor(messages):
        reply = teacher(messages)
        if messages[0]["content"] == teacher.system["evipath_executor_synth"]:
            user = teacher.record_turns(messages)[0]["content"]
            line = next(row for row in user.splitlines() if row.endswith(distractor))
            index = line.split("]")[0].lstrip("[")
            reply = reply.split("<select>")[0] + f"<select>[{index}]</select>" + reply.split("</select>")[1]
        return reply

    chat_server.reset(select_distractor)
    results, _ = _synthesize(chat_server, selector, [record])
    assert isinstance(results[0], Rejection) and results[0].reason == "selection_no_golden"

    # The same replies pass when the check is switched off.
    chat_server.reset(select_distractor)
    results, _ = _synthesize(chat_server, selector, [record], config=SynthesisConfig(require_golden_selection=False))
    assert isinstance(results[0], Trajectory)


@pytest.mark.parametrize(
    ("turns", "reason"),
    [
        (["no tags at all, just prose"], "planner_no_think"),
        (["<think>plan</think> I will look it up."], "planner_no_action"),
        (["<think>plan</think><action> Search(Which institute?) </action>"], "planner_bad_search_call"),
        (['<think>plan</think><action>Search("a?")</action><answer>1960</answer>'], "planner_search_and_answer"),
        (["<think>I already know.</think><answer> 1960 </answer>"], "planner_no_search"),
        (
            ['<think>again</think><action>Search("Which institute owns The Collegian?")</action>'] * 9,
            "planner_max_steps",
        ),
    ],
)
def test_malformed_planner_output_is_rejected_with_reason(
    chat_server, scripted, selector, hotpot_records, turns, reason
):
    chat_server.reset(scripted(planner_overrides={"collegian": turns}))
    results, _ = _synthesize(chat_server, selector, hotpot_records[:1])
    assert isinstance(results[0], Rejection)
    assert results[0].reason == reason


def test_teacher_http_errors_become_rejections(chat_server, scripted, selector, hotpot_records):
    chat_server.reset(scripted())
    chat_server.fail_statuses = [400]  # not retried by the client
    results, teacher = _synthesize(chat_server, selector, hotpot_records[:1])
    assert isinstance(results[0], Rejection) and results[0].reason == "teacher_error"
    assert teacher.usage.failures == 1


def test_transient_errors_are_retried(chat_server, scripted, selector, hotpot_records):
    chat_server.reset(scripted())
    chat_server.fail_statuses = [503, 503]  # the client backs off and retries
    results, teacher = _synthesize(chat_server, selector, hotpot_records[:1])
    assert isinstance(results[0], Trajectory)
    assert teacher.usage.failures == 0 and chat_server.fail_statuses == []


def test_resume_after_interruption_asks_nothing_twice(chat_server, scripted, selector, hotpot_records, tmp_path):
    clean_cache = tmp_path / "clean.sqlite"
    chat_server.reset(scripted())
    clean, _ = _synthesize(chat_server, selector, hotpot_records, cache=ReplyCache(clean_cache))
    clean_total = chat_server.requests
    assert clean_total == 22

    cache_path = tmp_path / "interrupted.sqlite"
    chat_server.reset(scripted())
    chat_server.stall_after = 7

    async def interrupted_run():
        cache = ReplyCache(cache_path)
        teacher = Teacher(_teacher_config(chat_server, concurrency=2), cache)
        task = asyncio.create_task(Synthesizer(teacher, selector).synthesize(hotpot_records))
        while not chat_server.stalled.is_set():
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await teacher.close()
        cached = len(cache)
        cache.close()
        return cached

    cached = asyncio.run(interrupted_run())
    chat_server.release.set()
    assert 1 <= cached <= 7 < clean_total

    chat_server.reset(scripted())
    resumed, teacher = _synthesize(chat_server, selector, hotpot_records, cache=ReplyCache(cache_path))
    assert teacher.usage.cache_hits == cached
    assert chat_server.requests == teacher.usage.requests == clean_total - cached
    assert [type(r) for r in resumed] == [type(r) for r in clean]
    assert [r.final_answer for r in resumed if isinstance(r, Trajectory)] == [
        r.final_answer for r in clean if isinstance(r, Trajectory)
    ]

    # A third run is served from the cache alone.
    chat_server.reset(scripted())
    _, teacher = _synthesize(chat_server, selector, hotpot_records, cache=ReplyCache(cache_path))
    assert chat_server.requests == 0 and teacher.usage.cache_hits == clean_total


def test_run_synthesis_writes_outputs_and_stats(chat_server, scripted, selector, hotpot_records, tmp_path):
    chat_server.reset(scripted())
    summary = asyncio.run(
        run_synthesis(hotpot_records, _teacher_config(chat_server), tmp_path / "out", tmp_path / "c.sqlite", selector)
    )
    assert summary.stats.kept == 2 and dict(summary.stats.rejected) == {"answer_mismatch": 1}
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["kept"] == 2 and stats["rejected"] == {"answer_mismatch": 1}
    assert stats["teacher"]["requests"] == 22
    assert pq.read_table(summary.outputs["planner"]).num_rows == 2
    assert pq.read_table(summary.outputs["executor"]).num_rows == 2 + 4
    assert pq.read_table(summary.outputs["train"]).num_rows == 8
    rejections = [json.loads(row) for row in summary.outputs["rejections"].read_text().splitlines()]
    assert rejections == [{"id": "wrong", "reason": "answer_mismatch", "detail": rejections[0]["detail"]}]


@pytest.mark.parametrize("bound", [1, 3])
def test_concurrency_is_bounded_by_the_semaphore(chat_server, scripted, selector, hotpot_records, bound):
    chat_server.reset(scripted())
    chat_server.delay = 0.05  # replies overlap whenever the client lets them

    async def go():
        teacher = Teacher(
            TeacherConfig(model="scripted", base_url=chat_server.base_url, api_key="t", concurrency=bound)
        )
        try:
            return await Synthesizer(teacher, selector).synthesize(hotpot_records, max_in_flight=8)
        finally:
            await teacher.close()

    results = asyncio.run(go())
    assert sum(isinstance(r, Trajectory) for r in results) == 2
    assert chat_server.max_in_flight == bound
