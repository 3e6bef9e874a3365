"""The `search` planner layout speaks the evidence_search loop's protocol; the bundled set reads cleanly."""

from __future__ import annotations

import asyncio

from verl_evidence.agent_loops import search_loop
from verl_evidence.evipath.pipeline import Synthesizer, Trajectory
from verl_evidence.evipath.records import ReadReport, load_records
from verl_evidence.evipath.teacher import Teacher, TeacherConfig
from verl_evidence.evipath.writer import planner_messages
from verl_evidence.prompts import load_prompt


def test_the_loop_reads_our_planner_turns(chat_server, selector, scripted, hotpot_records):
    chat_server.reset(scripted())

    async def go():
        teacher = Teacher(TeacherConfig(model="scripted", base_url=chat_server.base_url, api_key="t"))
        try:
            return await Synthesizer(teacher, selector).synthesize(hotpot_records[:2])
        finally:
            await teacher.close()

    kept = [r for r in asyncio.run(go()) if isinstance(r, Trajectory)]
    assert len(kept) == 2
    for trajectory in kept:
        messages = planner_messages(trajectory, "search")
        assistants = [m["content"] for m in messages if m["role"] == "assistant"]
        queries = [s.question for step in trajectory.subquestions for s in step]
        actions = [search_loop.first_action(text) for text in assistants]
        # Every assistant turn is one action the loop recognises, in the synthesised order.
        assert [a[0] for a in actions] == ["search"] * len(queries) + ["answer"]
        assert [a[1] for a in actions[:-1]] == queries
        assert actions[-1][1] == trajectory.final_answer


def test_the_loop_accepts_the_planner_prompt():
    from verl_evidence.prompts import check_placeholders

    settings = search_loop.SearchLoopSettings(prompt="evipath_planner_search")
    check_placeholders(load_prompt(settings.prompt), ["question"])


def test_bundled_set_reads_without_skips():
    report = ReadReport()
    records = load_records(None, "bundled", report=report)
    assert records and report.read == len(records) and not report.skipped
    for record in records:
        assert set(record.golden) <= set(range(len(record.facts)))
        assert len(record.facts) > len(record.golden)  # distractors are present
