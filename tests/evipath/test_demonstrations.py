"""Few-shot demonstrations (EviPath Tables 8-9): the packaged ones are in the pipeline's own layout, and the
teacher sees system prompt -> demonstrations -> the record, as many as configured."""

from __future__ import annotations

import asyncio
import re

import pytest
from typer.testing import CliRunner

from verl_evidence.cli import app
from verl_evidence.evipath.demonstrations import DEFAULT_DEMONSTRATIONS, demonstration_messages, load_demonstrations
from verl_evidence.evipath.parsing import (
    parse_executor_step,
    parse_planner_turn,
    render_executor_step,
    render_planner_turn,
)
from verl_evidence.evipath.pipeline import Prompts, SynthesisConfig, Synthesizer, executor_synth_user
from verl_evidence.evipath.protocol import observation_text
from verl_evidence.evipath.teacher import Teacher, TeacherConfig


def _lines_after(text: str, header: str, prefix: str) -> list[str]:
    block = text.split(header + "\n", 1)[1]
    lines = []
    for line in block.splitlines():
        if not line.startswith(prefix):
            break
        lines.append(line)
    return lines


def test_packaged_planner_demonstrations_are_in_the_pipelines_layout() -> None:
    demonstrations = load_demonstrations("evipath_planner_synth_demos")
    assert len(demonstrations) == 3 and DEFAULT_DEMONSTRATIONS <= 3
    for dialogue in demonstrations:
        first = dialogue[0]["content"]
        assert re.fullmatch(r"Question: .+\nAnswer: .+\nSupporting evidence:\n(- .+\n?)+", first), first
        answer = re.search(r"^Answer: (.+)$", first, re.MULTILINE).group(1)
        turns = [parse_planner_turn(m["content"]) for m in dialogue[1::2]]
        for message, turn in zip(dialogue[1::2], turns):
            assert render_planner_turn(turn) == message["content"]  # the canonical layout the SFT rows use
        assert all(not t.is_final for t in turns[:-1]) and turns[-1].is_final and turns[-1].answer == answer
        for turn, observation in zip(turns[:-1], dialogue[2::2]):  # one observation sentence per search
            sentences = observation["content"].split("\n")[1:]
            assert observation["content"] == observation_text(sentences) and len(sentences) == len(turn.searches)
    assert (
        max(len(t.searches) for d in demonstrations for t in map(parse_planner_turn, [m["content"] for m in d[1::2]]))
        == 2
    )


def test_packaged_executor_demonstrations_are_in_the_pipelines_layout() -> None:
    demonstrations = load_demonstrations("evipath_executor_synth_demos")
    assert len(demonstrations) == 3
    for user, assistant in demonstrations:
        text = user["content"]
        question = re.search(r"^Question: (.+)$", text, re.MULTILINE).group(1)
        answer = re.search(r"^Answer: (.+)$", text, re.MULTILINE).group(1)
        pool = [line.split("] ", 1)[1] for line in _lines_after(text, "Supporting evidence:", "[")]
        golden = [int(line[1:].split("]")[0]) for line in _lines_after(text, "Golden evidence:", "[")]
        assert text == executor_synth_user(question, pool, answer, golden)
        step = parse_executor_step(assistant["content"], len(pool))
        assert render_executor_step(step) == assistant["content"]
        assert list(step.selected) == golden and step.answer == answer
    assert {len(parse_executor_step(a["content"], 4).selected) for _, a in demonstrations} == {1, 2}


def test_demonstration_files_are_checked(tmp_path) -> None:
    assert demonstration_messages("evipath_planner_synth_demos", 0) == []
    two = demonstration_messages("evipath_executor_synth_demos", 2)
    assert [m["role"] for m in two] == ["user", "assistant"] * 2
    with pytest.raises(ValueError, match="asked for 4 demonstrations"):
        demonstration_messages("evipath_executor_synth_demos", 4)
    with pytest.raises(ValueError, match=">= 0"):
        demonstration_messages("evipath_executor_synth_demos", -1)
    cases = {
        "preamble.txt": ("Some notes\n[[demonstration]]\n[[user]]\nq\n[[assistant]]\na\n", "before the first"),
        "order.txt": ("[[demonstration]]\n[[assistant]]\na\n[[user]]\nq\n", "alternate user/assistant"),
        "open.txt": ("[[demonstration]]\n[[user]]\nq\n[[assistant]]\na\n[[user]]\nq2\n", "ending with the assistant"),
        "roles.txt": ("[[demonstration]]\nplain text\n", "alternate"),
        "empty.txt": ("\n", "no \\[\\[demonstration\\]\\]"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            load_demonstrations(str(path))
    mine = tmp_path / "mine.txt"
    mine.write_text(
        "[[demonstration]]\n[[user]]\nQuestion: q\n[[assistant]]\n<think>\nt\n</think>\n<answer> a </answer>\n"
    )
    assert demonstration_messages(str(mine), 1)[1]["content"].endswith("<answer> a </answer>")


@pytest.mark.parametrize("count", [0, DEFAULT_DEMONSTRATIONS, 3])
def test_the_teacher_sees_system_then_demonstrations_then_the_record(
    chat_server, scripted, selector, hotpot_records, count
) -> None:
    teacher = scripted()
    seen: list[list[dict]] = []

    def recording(messages):
        seen.append(messages)
        return teacher(messages)

    chat_server.reset(recording)
    config = SynthesisConfig(demonstrations=count)

    async def go():
        client = Teacher(TeacherConfig(model="scripted", base_url=chat_server.base_url, api_key="t", max_retries=0))
        try:
            return await Synthesizer(client, selector, config).synthesize(hotpot_records[:1])
        finally:
            await client.close()

    (result,) = asyncio.run(go())
    assert result.final_answer == "1960"
    expected = {
        "evipath_planner_synth": demonstration_messages("evipath_planner_synth_demos", count),
        "evipath_executor_synth": demonstration_messages("evipath_executor_synth_demos", count),
        "evipath_executor_answer": [],  # step (i): zero-shot in the paper too
    }
    by_step = {name: [m for m in seen if m[0]["content"] == teacher.system[name]] for name in expected}
    assert all(by_step.values()), {k: len(v) for k, v in by_step.items()}
    for name, requests in by_step.items():
        demos = expected[name]
        for messages in requests:
            assert messages[0]["role"] == "system"
            assert messages[1 : 1 + len(demos)] == demos
            record_user = messages[1 + len(demos)]
            assert record_user["role"] == "user" and record_user["content"] not in teacher.demonstration_texts
    first_planner = by_step["evipath_planner_synth"][0]
    assert len(first_planner) == 2 + len(expected["evipath_planner_synth"])
    assert sum(m["role"] == "assistant" for m in first_planner) == sum(
        m["role"] == "assistant" for m in expected["evipath_planner_synth"]
    )


def test_synthesizer_fails_before_any_request_on_bad_demonstrations(tmp_path, selector) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("[[demonstration]]\n[[assistant]]\nhello\n")
    teacher = Teacher(TeacherConfig(model="x", base_url="http://127.0.0.1:9/v1", api_key="t"))
    with pytest.raises(ValueError, match="alternate"):
        Synthesizer(teacher, selector, SynthesisConfig(prompts=Prompts(planner_synth_demos=str(bad))))
    with pytest.raises(ValueError, match="asked for 7"):
        Synthesizer(teacher, selector, SynthesisConfig(demonstrations=7))


def test_cli_demonstration_options_fail_in_one_line(tmp_path) -> None:
    runner = CliRunner()
    base = ["evipath", "synthesize", "--model", "x", "--out", str(tmp_path / "out"), "--limit", "1"]
    result = runner.invoke(app, [*base, "--demonstrations", "9"])
    assert result.exit_code == 2 and "asked for 9 demonstrations" in result.output
    missing = tmp_path / "nope.txt"
    result = runner.invoke(app, [*base, "--executor-demos", str(missing)])
    assert result.exit_code == 2 and "nope.txt" in result.output
    result = runner.invoke(app, [*base, "--demonstrations", "-1"])
    assert result.exit_code == 2
    help_text = runner.invoke(app, ["evipath", "synthesize", "--help"], terminal_width=200).output
    assert "--demonstrations" in help_text and "--planner-demos" in help_text and "--executor-demos" in help_text
