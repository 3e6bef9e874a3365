"""Every trajectory carries the engine's weight-version fields, as verl's trainer requires.

verl's server client puts ``global_steps`` / ``min_global_steps`` / ``max_global_steps``
into each generation's ``extra_fields``; the v1 trainer casts the per-trajectory
min/max to int, so a loop that builds ``extra_fields`` from scratch ends the first
real run after step 1 (``int(None)``). The backend here reports a weight version
that changes between generations, as a rollout does when weights sync mid-step
under partial rollout.
"""

from __future__ import annotations

import pytest
from rollout_helpers import make_row, run_worker, unpad, with_settings
from test_eviomni_loop import PASSAGES, QUESTION, responder_for
from test_search_loop import ANSWER_TURN, SEARCH_TURN, search_config
from verl.workers.rollout.replica import TokenOutput

from verl_evidence.agent_loops.common import EngineFields
from verl_evidence.local.backends import ScriptedBackend

pytestmark = pytest.mark.slow


class SteppingBackend(ScriptedBackend):
    """A scripted engine whose weight version is ``first_step`` + the number of earlier generations."""

    def __init__(self, tokenizer, first_step: int, **kwargs) -> None:
        super().__init__(tokenizer, **kwargs)
        self.global_steps = first_step

    async def generate(self, request_id, **kwargs) -> TokenOutput:
        output = await super().generate(request_id, **kwargs)
        self.global_steps += 1
        return output


def _output(**fields) -> TokenOutput:
    return TokenOutput(token_ids=[1], extra_fields=fields)


def test_engine_fields_merge_like_verl_and_widen_the_version_range():
    engine = EngineFields()
    engine.add(
        _output(global_steps=4, min_global_steps=4, max_global_steps=4, num_cached_tokens=7, spec_num_draft_tokens=2)
    )
    engine.add(_output(global_steps=6, min_global_steps=6, max_global_steps=6, spec_num_draft_tokens=3))
    engine.add(
        _output(global_steps=3, min_global_steps=3, max_global_steps=3)
    )  # a concurrent call that started earlier
    merged = engine.merged_with({"question": "q", "num_cached_tokens": 0})
    assert merged["min_global_steps"] == 3 and merged["max_global_steps"] == 6 and merged["global_steps"] == 6
    assert merged["spec_num_draft_tokens"] == 5
    assert merged["question"] == "q" and merged["num_cached_tokens"] == 0  # the loop's own fields win


def test_engine_fields_from_an_engine_that_reports_nothing_stay_empty():
    engine = EngineFields()
    engine.add(TokenOutput(token_ids=[1]))
    engine.add(TokenOutput(token_ids=[2]))
    assert engine.merged_with({"a": 1}) == {"a": 1}


def _versions(output) -> list[tuple[int, int]]:
    # The trainer's own conversion (verl/trainer/ppo/v1/trainer_base.py): int() of each row's fields.
    extra = output.non_tensor_batch
    return [
        (int(low), int(high)) for low, high in zip(extra["min_global_steps"], extra["max_global_steps"], strict=True)
    ]


def test_eviomni_trajectory_carries_the_weight_versions_of_all_its_generations(base_config, tokenizer):
    backend = SteppingBackend(tokenizer, first_step=5, responder=responder_for({}))
    output = run_worker(base_config, backend, [make_row(QUESTION, "eviomni", passages=PASSAGES)])
    # four generations ((r, e), then o_f, o_r, o_e concurrently) at versions 5..8
    assert _versions(output) == [(5, 8)]
    assert len(backend.calls) == 4


def test_search_trajectory_carries_the_weight_versions_of_every_turn(base_config, search_url, tokenizer):
    backend = SteppingBackend(tokenizer, first_step=2, turns=[SEARCH_TURN, SEARCH_TURN, ANSWER_TURN])
    output = run_worker(search_config(base_config, search_url), backend, [make_row(QUESTION, "evidence_search")])
    assert _versions(output) == [(2, 4)]
    assert unpad(output)["extra"]["termination"] == "answer"


def test_single_weight_version_when_nothing_syncs(base_config, search_url, tokenizer):
    backend = ScriptedBackend(tokenizer, turns=[SEARCH_TURN, ANSWER_TURN])
    backend.global_steps = 9
    config = with_settings(search_config(base_config, search_url), {})
    output = run_worker(config, backend, [make_row(QUESTION, "evidence_search")])
    assert _versions(output) == [(9, 9)]
