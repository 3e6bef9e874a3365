"""The EviPath planner rows (both layouts) speak the evidence_search loop's protocol; the bundled set reads cleanly.

A planner trained on these rows must meet, at rollout, the opening messages it was trained on and actions the
loop parses into the same searches and answer: the loop's own parser and message builder are checked against the
writer's rows here, and token by token in a real rollout by tests/rollout/test_evipath_loop.py.
"""

from __future__ import annotations

import asyncio

import pytest

from verl_evidence.agent_loops.protocol import planner_action
from verl_evidence.agent_loops.search_loop_settings import EVIPATH_SETTINGS, Opening, SearchLoopSettings
from verl_evidence.evipath.pipeline import Synthesizer, Trajectory
from verl_evidence.evipath.records import ReadReport, load_records
from verl_evidence.evipath.teacher import Teacher, TeacherConfig
from verl_evidence.evipath.writer import planner_messages
from verl_evidence.prompts import load_prompt

LAYOUTS = sorted(EVIPATH_SETTINGS)


@pytest.fixture(scope="module")
def trajectories(chat_server, selector, scripted, hotpot_records) -> list[Trajectory]:
    chat_server.reset(scripted())

    async def go():
        teacher = Teacher(TeacherConfig(model="scripted", base_url=chat_server.base_url, api_key="t"))
        try:
            return await Synthesizer(teacher, selector).synthesize(hotpot_records[:2])
        finally:
            await teacher.close()

    kept = [r for r in asyncio.run(go()) if isinstance(r, Trajectory)]
    assert len(kept) == 2
    return kept


def loop_opening(layout: str, question: str) -> list[dict]:
    """The messages the loop sends first under a layout's preset, for a data row holding only the question: the
    loop's own opening (``EvidenceSearchAgentLoop`` builds its ``opening`` exactly so from its settings)."""
    opening = Opening.from_settings(SearchLoopSettings(**EVIPATH_SETTINGS[layout]))
    return opening.messages([{"role": "user", "content": question}], question)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_loop_reads_our_planner_turns(trajectories, layout):
    action_format = EVIPATH_SETTINGS[layout]["action_format"]
    for trajectory in trajectories:
        messages = planner_messages(trajectory, layout)
        assistants = [m["content"] for m in messages if m["role"] == "assistant"]
        actions = [planner_action(text, action_format) for text in assistants]
        assert None not in actions, assistants  # every assistant turn holds one complete action
        # the searches in the synthesised order (one per turn in `search`, a step's searches per turn in `paper`),
        # then the answer
        searches = [query for kind, queries, _ in actions if kind == "search" for query in queries]
        assert searches == [s.question for step in trajectory.subquestions for s in step]
        assert [kind for kind, _, _ in actions].count("answer") == 1 and actions[-1][0] == "answer"
        assert actions[-1][1] == [trajectory.final_answer]
        # nothing after the action: the loop keeps every generated character of a turn the planner was trained on
        assert all(end == len(text.rstrip()) for (_, _, end), text in zip(actions, assistants))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_loop_opens_the_dialogue_as_the_sft_rows_do(trajectories, layout):
    for trajectory in trajectories:
        messages = planner_messages(trajectory, layout)
        first_assistant = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        opening = loop_opening(layout, trajectory.record.question)
        assert opening == messages[:first_assistant]
        assert trajectory.record.question in opening[-1]["content"]


def test_the_loop_refuses_a_planner_prompt_without_the_question():
    from verl_evidence.prompts import check_placeholders

    check_placeholders(load_prompt(EVIPATH_SETTINGS["search"]["prompt"]), ["question"])
    with pytest.raises(ValueError, match=r"lacks placeholder\(s\) \['\{question\}'\]"):
        check_placeholders("Answer the question.", ["question"])


def test_bundled_set_reads_without_skips():
    report = ReadReport()
    records = load_records(None, "bundled", report=report)
    assert records and report.read == len(records) and not report.skipped
    for record in records:
        assert set(record.golden) <= set(range(len(record.facts)))
        assert len(record.facts) > len(record.golden)  # distractors are present
