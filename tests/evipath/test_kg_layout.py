"""EviPath's knowledge-graph planner form (Table 8): candidates, Search([i], "q"), its parser and demonstrations."""

from __future__ import annotations

import pytest

from verl_evidence.agent_loops.protocol import planner_action
from verl_evidence.evipath.demonstrations import load_demonstrations
from verl_evidence.evipath.kg import (
    Candidates,
    KGSearch,
    Triple,
    TripleStore,
    WikidataGraph,
    executor_evidence,
    kg_search_calls,
    listed_candidates,
    observation_message,
    parse_kg_planner_turn,
    question_message,
    render_kg_turn,
)
from verl_evidence.evipath.parsing import Malformed


def test_the_papers_worked_example_in_our_layout() -> None:
    """Table 8's dialogue: the question's candidates [0], [1]; each observation numbers its entities on."""
    candidates = Candidates()
    evidence = [Triple("Ek Paheli", "director", "Naresh Kumar"), Triple("Naresh Kumar", "date of birth", "1928")]
    question = "Which film has the director born earlier, Ek Paheli or When Father Was Away On Business?"
    message = question_message(
        question, candidates, ["Ek Paheli", "When Father Was Away On Business"], "Ek Paheli", evidence
    )
    assert message.splitlines()[4:] == [
        "(Naresh Kumar, date of birth, 1928)",
        f"Question: {question} Candidate: [0] Ek Paheli, [1] When Father Was Away On Business",
        "Answer: Ek Paheli",
    ]
    observed = observation_message(
        [
            ("The director of Ek Paheli is Naresh Kumar.", ["Naresh Kumar"]),
            ("The director of When Father Was Away On Business is Emir Kusturica.", ["Emir Kusturica"]),
        ],
        candidates,
    )
    assert observed == (
        "Observation:\nThe director of Ek Paheli is Naresh Kumar. Candidate: [2] Naresh Kumar\n"
        "The director of When Father Was Away On Business is Emir Kusturica. Candidate: [3] Emir Kusturica"
    )
    again = observation_message([("Naresh Kumar was born on 22 December 1928.", ["Naresh Kumar"])], candidates)
    assert again.endswith("Candidate: [2] Naresh Kumar")  # a known entity keeps its number
    assert listed_candidates(observed) == [(2, "Naresh Kumar"), (3, "Emir Kusturica")]
    assert listed_candidates(message) == [(0, "Ek Paheli"), (1, "When Father Was Away On Business")]


def test_a_turn_is_parsed_against_the_candidates_listed_so_far() -> None:
    candidates = Candidates(["Ek Paheli", "When Father Was Away On Business"])
    turn = parse_kg_planner_turn(
        '<think>Both directors first.</think>\n<action>\nSearch([0], "Who is the director of Ek Paheli?")\n'
        "Search( [1] , 'Who directed When Father Was Away On Business?')\n</action>",
        candidates,
    )
    assert turn.searches == (
        KGSearch(0, "Who is the director of Ek Paheli?"),
        KGSearch(1, "Who directed When Father Was Away On Business?"),
    )
    assert render_kg_turn(turn).splitlines()[-2] == 'Search([1], "Who directed When Father Was Away On Business?")'
    assert parse_kg_planner_turn("<think>done</think><answer> Ek Paheli </answer>", candidates).answer == "Ek Paheli"
    # the loop's paper layout reads the same calls' questions (the entity is the KG form's addition)
    assert planner_action('<action>Search([0], "Who directed Ek Paheli?")</action>', "paper")[1] == [
        "Who directed Ek Paheli?"
    ]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('<think>x</think><action>Search("Who directed Ek Paheli?")</action>', "search_without_entity"),
        ('<think>x</think><action>Search([5], "Who directed Ek Paheli?")</action>', "unknown_candidate"),
        ('<think>x</think><action>Search([0], "")</action>', "empty_search"),
        ("<think>x</think><action>nothing</action>", "no_search_in_action"),
        ("<think>only a thought</think>", "no_action"),
        (None, "not_text"),
    ],
)
def test_malformed_turns_name_their_fault(text, reason) -> None:
    result = parse_kg_planner_turn(text, Candidates(["Ek Paheli"]))
    assert isinstance(result, Malformed) and result.reason == reason


def test_the_packaged_demonstrations_are_well_formed_kg_dialogues() -> None:
    """Every assistant turn parses, and searches only candidates the user turns listed before it."""
    demonstrations = load_demonstrations("evipath_planner_kg_synth_demos")
    assert len(demonstrations) >= 2
    for dialogue in demonstrations:
        candidates = Candidates()
        for message in dialogue:
            if message["role"] == "user":
                for index, name in listed_candidates(message["content"]):
                    assert candidates.add([name]) == [index], (index, name)  # numbered on, never renumbered
                continue
            turn = parse_kg_planner_turn(message["content"], candidates)
            assert not isinstance(turn, Malformed), (turn, message["content"])
        assert turn.is_final  # each dialogue ends with the answer


def test_the_graph_is_an_interface_filled_offline() -> None:
    store = TripleStore(
        [
            ("Xawery Żuławski", "mother", "Małgorzata Braunek"),
            ("Xawery Żuławski", "place of birth", "Warsaw"),
            ("Małgorzata Braunek", "child", "Xawery Żuławski"),
        ]
    )
    facts = store.facts("xawery  żuławski")
    assert [t.relation for t in facts] == ["mother", "place of birth", "child"]  # own facts, then facts pointing at it
    assert executor_evidence("Who is the mother of Xawery Żuławski?", facts).splitlines()[1:3] == [
        "Supporting evidence:",
        "[0] (Xawery Żuławski, mother, Małgorzata Braunek)",
    ]
    with pytest.raises(ValueError, match="subject, a relation and an object"):
        TripleStore([("a", "", "b")])
    with pytest.raises(NotImplementedError, match="fill"):
        WikidataGraph().facts("Q42")


def test_search_calls_without_an_entity_are_counted_even_when_malformed() -> None:
    assert kg_search_calls('Search([0], "a?") Search([1], "b?")') == [KGSearch(0, "a?"), KGSearch(1, "b?")]
    assert isinstance(kg_search_calls('Search([0], "a?") Search(b?)'), Malformed)
