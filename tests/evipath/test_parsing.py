"""Teacher-reply parsers: canonical output for good replies, a reason for bad ones, never an exception."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_evidence.evipath.parsing import (
    ExecutorStep,
    Malformed,
    PlannerTurn,
    parse_answer_sentence,
    parse_executor_step,
    parse_planner_turn,
    render_executor_step,
    render_planner_turn,
)


def test_planner_searches_in_every_accepted_spelling():
    text = (
        "<think>\nPlan: 1. director 2. birth date\n</think>\n<action>\n"
        'Search("Who directed Ek Paheli?")\n'
        "Search('Who directed Pather Panchali?')\n"
        'Search([1], "When was Emir Kusturica born?")\n'
        'Search("What is the \\"Walkman\\"?")\n'
        "</action>"
    )
    turn = parse_planner_turn(text)
    assert turn == PlannerTurn(
        think="Plan: 1. director 2. birth date",
        searches=(
            "Who directed Ek Paheli?",
            "Who directed Pather Panchali?",
            "When was Emir Kusturica born?",
            'What is the "Walkman"?',
        ),
    )


def test_planner_drops_observations_the_teacher_invented():
    text = (
        '<think>t</think>\n<action> Search("Q one?") </action>\n'
        'Observation: made up\n<action> Search("Q two?") </action>'
    )
    turn = parse_planner_turn(text)
    assert isinstance(turn, PlannerTurn) and turn.searches == ("Q one?",)


def test_planner_final_answer_and_unclosed_think():
    turn = parse_planner_turn("<think>\nSo it is 1960.\n</think\n<answer> 1960 </answer>")
    assert turn == PlannerTurn(think="So it is 1960.", answer="1960")
    assert turn.is_final


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "planner_empty"),
        ("   \n", "planner_empty"),
        ('Search("x?")', "planner_no_think"),
        ("<think></think><answer>a</answer>", "planner_no_think"),
        ("<think>t</think> nothing to do", "planner_no_action"),
        ("<think>t</think><action>look up the director</action>", "planner_bad_search_call"),
        ("<think>t</think><action>Search(who?)</action>", "planner_bad_search_call"),
        ('<think>t</think><action>Search("")</action>', "planner_empty_query"),
        ('<think>t</think><action>Search("q?")</action><answer>x</answer>', "planner_search_and_answer"),
        ("<think>t</think><answer>   </answer>", "planner_empty_answer"),
    ],
)
def test_malformed_planner_turns(text, reason):
    result = parse_planner_turn(text)
    assert isinstance(result, Malformed) and result.reason == reason


def test_planner_turn_renders_canonically_and_reparses():
    turn = PlannerTurn(think="plan", searches=('Who wrote "Dune"?', "When?"))
    text = render_planner_turn(turn)
    assert text == '<think>\nplan\n</think>\n<action>\nSearch("Who wrote \\"Dune\\"?")\nSearch("When?")\n</action>'
    assert parse_planner_turn(text) == turn
    final = PlannerTurn(think="done", answer="Dune")
    assert parse_planner_turn(render_planner_turn(final)) == final


def test_answer_sentence():
    assert parse_answer_sentence("<answer> Paris is  the capital. </answer>") == "Paris is the capital."
    assert parse_answer_sentence("<think>hm</think> Paris is the capital.") == "Paris is the capital."
    assert parse_answer_sentence("").reason == "executor_answer_empty"
    assert parse_answer_sentence("line one\nline two").reason == "executor_answer_untagged"
    assert parse_answer_sentence("<answer>No relevant information found.</answer>").reason == "executor_no_information"


def test_executor_step_and_its_failures():
    ok = parse_executor_step("<think> [2] says so </think>\n<select> [2, 0] </select>\n<answer> X is Y. </answer>", 3)
    assert ok == ExecutorStep(think="[2] says so", selected=(2, 0), answer="X is Y.")
    assert parse_executor_step(render_executor_step(ok), 3) == ok
    assert parse_executor_step("<think>t</think><select>1 2</select><answer>a.</answer>", 3).selected == (1, 2)
    cases = {
        "": "executor_empty",
        "<select>[0]</select><answer>a</answer>": "executor_no_think",
        "<think>t</think><answer>a</answer>": "executor_no_select",
        "<think>t</think><select>[zero]</select><answer>a</answer>": "executor_bad_select",
        "<think>t</think><select>[]</select><answer>a</answer>": "executor_bad_select",
        "<think>t</think><select>[3]</select><answer>a</answer>": "executor_select_out_of_range",
        "<think>t</think><select>[0]</select>": "executor_no_answer",
        "<think>t</think><select>[0]</select><answer>No relevant information found.</answer>": (
            "executor_no_information"
        ),
    }
    for text, reason in cases.items():
        result = parse_executor_step(text, 3)
        assert isinstance(result, Malformed) and result.reason == reason, (text, result)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("<>/[]()\"' ,\n0123abcSearchthinkactionselectanswer")), max_size=120))
def test_parsers_never_raise(text):
    for result in (parse_planner_turn(text), parse_answer_sentence(text), parse_executor_step(text, 4)):
        assert isinstance(result, (Malformed, PlannerTurn, ExecutorStep, str))
