"""The masking check (verl_evidence.trainer.step_metrics) on trajectories from verl's AgentLoopWorker.

``evidence_search`` reports where its search observations sit in the response
(``retrieved_spans``) independently of the mask. A subclass that loses the mask on
purpose, registered for this test as its own loop, must be caught; the real loop
must pass with every retrieved token at loss mask 0.
"""

from __future__ import annotations

import numpy as np
import pytest
from rollout_helpers import make_row, run_worker, unpad, with_settings

from verl_evidence.agent_loops.search_loop import EvidenceSearchAgentLoop
from verl_evidence.local.backends import ScriptedBackend
from verl_evidence.trainer.step_metrics import MaskingError, Trajectory, step_metrics

pytestmark = pytest.mark.slow

QUESTION = "Which river is the longest in Africa?"
SEARCH_TURN = "<think> look it up </think> <search> longest river in Africa </search>"
ANSWER_TURN = "<summary> *The Nile is the longest river* </summary> <answer> Nile </answer>"
MIS_MASKING_LOOP = "mis_masking_search"


class MisMaskingSearchLoop(EvidenceSearchAgentLoop):
    """``evidence_search`` with a masking bug: every response token, observations included, is trained."""

    def _output(self, data):
        output = super()._output(data)
        output.response_mask = [1] * len(output.response_mask)
        return output


@pytest.fixture(scope="module", autouse=True)
def mis_masking_loop_registered():
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry, register

    register(MIS_MASKING_LOOP)(MisMaskingSearchLoop)
    yield
    _agent_loop_registry.pop(MIS_MASKING_LOOP, None)


def trajectories(base_config, search_url, tokenizer, loop: str) -> list[Trajectory]:
    config = with_settings(
        base_config,
        {"actor_rollout_ref.rollout.custom": {"evidence_search": {"retrieval_url": search_url, "max_turns": 3}}},
    )
    backend = ScriptedBackend(tokenizer, turns=[SEARCH_TURN, ANSWER_TURN])
    out = unpad(run_worker(config, backend, [make_row(QUESTION, loop)]))
    fields = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in out["extra"].items()}
    return [Trajectory(extra_fields=fields, response_mask=out["response_mask"], key=f"{loop}_0_0")]


def test_the_search_loop_reports_its_observation_and_never_trains_it(base_config, search_url, tokenizer):
    (trajectory,) = trajectories(base_config, search_url, tokenizer, "evidence_search")
    (span,) = trajectory.extra_fields["retrieved_spans"]
    mask = trajectory.response_mask
    assert set(mask[span[0] : span[1]]) == {0} and mask[span[0] - 1] == 1 and mask[span[1]] == 1
    assert span[1] - span[0] == mask.count(0)  # the observation is the whole context here
    metrics = step_metrics([trajectory], "evinote")
    assert metrics["masking/retrieved_token_share"] == pytest.approx((span[1] - span[0]) / len(mask))
    assert metrics["masking/retrieved_tokens_trained"] == 0
    assert metrics["rollout/searches/mean"] == 1 and metrics["rollout/answer_rate"] == 1


def test_a_loop_that_trains_its_observation_is_stopped(base_config, search_url, tokenizer):
    (trajectory,) = trajectories(base_config, search_url, tokenizer, MIS_MASKING_LOOP)
    (span,) = trajectory.extra_fields["retrieved_spans"]
    assert set(trajectory.response_mask) == {1}
    with pytest.raises(MaskingError, match=rf"{MIS_MASKING_LOOP}_0_0: {span[1] - span[0]} retrieved token"):
        step_metrics([trajectory], "evinote")
    metrics = step_metrics([trajectory], "evinote", mask_check=False)  # switched off: measured, not raised
    assert metrics["masking/retrieved_tokens_trained"] == span[1] - span[0]
