"""Every way an ``evidence_search`` trajectory ends, through verl's AgentLoopWorker.

The exits with a search are in test_search_loop.py (answer, a search on the last turn, an observation
past the response budget); these need no retrieval server: no search is run.
"""

from __future__ import annotations

import pytest
from rollout_helpers import make_row, run_worker, unpad, with_settings

from verl_evidence.agent_loops.search_loop_settings import SEARCH_INVALID_ACTION_FEEDBACK, SearchLoopSettings
from verl_evidence.local.backends import ScriptedBackend

pytestmark = pytest.mark.slow

QUESTION = "Which river is the longest in Africa?"
NO_ACTION = "I am not sure what to do."
UNUSED_URL = "http://127.0.0.1:9"  # never contacted: these trajectories do not search


def run(base_config, tokenizer, turns: list[str], response_length: int | None = None, **settings):
    custom = {"retrieval_url": UNUSED_URL, **settings}
    updates = {"actor_rollout_ref.rollout.custom": {"evidence_search": custom}}
    if response_length is not None:
        updates["actor_rollout_ref.rollout.response_length"] = response_length
    backend = ScriptedBackend(tokenizer, turns=turns)
    out = unpad(run_worker(with_settings(base_config, updates), backend, [make_row(QUESTION, "evidence_search")]))
    return out, backend


def no_action_ids(tokenizer) -> list[int]:
    return tokenizer.encode(NO_ACTION, add_special_tokens=False) + [tokenizer.eos_token_id]


def feedback_ids(tokenizer) -> list[int]:
    return tokenizer.encode(SEARCH_INVALID_ACTION_FEEDBACK, add_special_tokens=False)


def test_last_turn_without_an_answer_ends_at_max_turns(base_config, tokenizer):
    out, backend = run(base_config, tokenizer, [NO_ACTION, NO_ACTION], max_turns=2)
    notice = tokenizer.encode(SearchLoopSettings().final_turn_notice, add_special_tokens=False)
    expected = no_action_ids(tokenizer) + feedback_ids(tokenizer) + notice + no_action_ids(tokenizer)
    assert out["response_ids"] == expected
    assert out["extra"]["termination"] == "max_turns" and out["extra"]["invalid_actions"] == 1
    assert len(backend.calls) == 2 and out["num_turns"] == 4


def test_budget_spent_exactly_by_a_correction_ends_before_the_next_turn(base_config, tokenizer):
    length = len(no_action_ids(tokenizer)) + len(feedback_ids(tokenizer))
    out, backend = run(base_config, tokenizer, [NO_ACTION, "<answer> Nile </answer>"], response_length=length)
    assert out["response_ids"] == no_action_ids(tokenizer) + feedback_ids(tokenizer)
    assert out["extra"]["termination"] == "response_length" and out["extra"]["invalid_actions"] == 1
    assert len(backend.calls) == 1  # no generation with an empty budget


def test_turn_cut_by_the_budget_ends_without_a_correction(base_config, tokenizer):
    out, backend = run(base_config, tokenizer, [NO_ACTION], response_length=5)
    assert out["response_ids"] == no_action_ids(tokenizer)[:5] and out["response_mask"] == [1] * 5
    assert out["extra"]["termination"] == "response_length" and out["extra"]["invalid_actions"] == 0
    assert len(backend.calls) == 1


def test_correction_past_the_budget_is_cut_and_ends_the_trajectory(base_config, tokenizer):
    room = len(feedback_ids(tokenizer)) - 2
    length = len(no_action_ids(tokenizer)) + room
    out, backend = run(base_config, tokenizer, [NO_ACTION, "<answer> Nile </answer>"], response_length=length)
    assert out["response_ids"] == no_action_ids(tokenizer) + feedback_ids(tokenizer)[:room]
    assert out["response_mask"] == [1] * len(no_action_ids(tokenizer)) + [0] * room
    assert out["extra"]["termination"] == "response_length"
    assert len(backend.calls) == 1
