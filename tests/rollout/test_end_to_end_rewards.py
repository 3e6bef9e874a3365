"""Each loop's output scored by the matching reward manager, on verl's streaming reward path.

``AgentLoopWorker`` gets real ``RewardLoopWorker`` Ray actors (as the trainer's
``RewardLoopManager`` creates them), so verl itself builds the per-trajectory
DataProto with ``tool_extra_fields`` and the reward manager (loaded in the actor
through the ``verl.plugins`` entry point) scores it.
"""

from __future__ import annotations

import pytest
from rollout_helpers import continues_a_reply, make_row, unpad, with_settings

from verl_evidence.local.backends import ScriptedBackend
from verl_evidence.local.tiny_models import expected_overlap_entailment
from verl_evidence.rewards import evinote, eviomni, grace

pytestmark = pytest.mark.slow

GOLD = {"target": ["Nile"], "evidence": ["The Nile flows north into the Mediterranean Sea."], "answerable": True}


@pytest.fixture(scope="module")
def ray_session():
    import ray

    started = False
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        started = True
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def nli_dir(tmp_path_factory):
    """A judge whose entailment grows with token overlap (see verl_evidence.local.tiny_models.overlap_nli_model)."""
    from verl_evidence.local.tiny_models import overlap_nli_model

    return overlap_nli_model(tmp_path_factory.mktemp("overlap_nli"))


def run_scored(config, backend, rows):
    import asyncio

    import numpy as np
    import ray
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    reward_worker = ray.remote(RewardLoopWorker).options(num_cpus=0).remote(config, None)
    worker = AgentLoopWorker(config, backend, reward_loop_worker_handles=[reward_worker])
    non_tensor = {}
    for key in rows[0]:
        column = np.empty(len(rows), dtype=object)
        column[:] = [row[key] for row in rows]
        non_tensor[key] = column
    non_tensor["index"] = np.arange(len(rows))
    batch = DataProto.from_dict(non_tensors=non_tensor, meta_info={"validate": False})
    try:
        output = asyncio.run(worker.generate_sequences(batch))
    finally:
        ray.kill(reward_worker)
    trajectory = unpad(output)
    score = float(output.batch["rm_scores"][0].sum())
    info = {key: output.non_tensor_batch[key][0] for key in output.meta_info["reward_extra_keys"]}
    return trajectory, score, info


def scored_row(question: str, agent_name: str, **extra_info):
    row = make_row(question, agent_name, **extra_info)
    row["reward_model"] = {"style": "rule", "ground_truth": GOLD}
    return row


def test_evidence_search_scored_by_evinote(base_config, search_url, tokenizer, nli_dir, ray_session):
    config = with_settings(
        base_config,
        {
            "actor_rollout_ref.rollout.custom": {"evidence_search": {"retrieval_url": search_url}},
            "reward.reward_manager.name": "evinote",
            "reward.reward_kwargs": {"nli_model": str(nli_dir), "nli_in_process": True, "nli_device": "cpu"},
        },
    )
    note = "*The Nile flows north into the Mediterranean*"
    question = "Which river flows into the Mediterranean?"
    turns = [
        "<think> I need the river. </think> <search> river flowing into the Mediterranean </search>",
        f"<summary> {note} </summary> <answer> Nile </answer>",
    ]
    backend = ScriptedBackend(tokenizer, turns=turns)
    out, score, info = run_scored(config, backend, [scored_row(question, "evidence_search")])
    assert out["extra"]["summary_count"] == 1
    # format ok (answer + note), EM correct: R = 1 + EQR, EQR the judge's entailment of the claim by the note
    # (expected from token overlap, without the judge); the note shares about half of the claim's words
    claim = evinote.build_claim("Nile", question)
    eqr = expected_overlap_entailment(nli_dir, note, claim)
    assert eqr > expected_overlap_entailment(nli_dir, "*The Amazon drains into the Atlantic*", claim) + 0.15
    assert info["eqr"] == pytest.approx(eqr, abs=1e-4)
    assert score == pytest.approx(1.0 + eqr, abs=1e-4)
    assert info["reward_error"] == 0.0


def test_eviomni_loop_scored_by_eviomni(vocab, ray_session):
    """On both vocabularies: in Qwen's, the token closing </extract> is '>\\n\\n' (it carries the model's next
    characters), and the answer o_f still follows, and is scored."""
    tokenizer = vocab.tokenizer
    config = with_settings(vocab.config, {"reward.reward_manager.name": "eviomni"})
    passages = [
        "Nile\nThe Nile flows north into the Mediterranean Sea.",
        "Amazon\nThe Amazon drains into the Atlantic.",
    ]

    def respond(prompt: str) -> str:
        if "Some parts may be hidden" in prompt:
            return "<answer> Nile </answer>"
        if continues_a_reply(prompt):
            return "<answer> Nile </answer>"
        return (
            "<reason> The first passage names the river. </reason>"
            "<extract> The Nile flows north into the Mediterranean Sea. </extract>\n\n<answer>"
        )

    backend = ScriptedBackend(tokenizer, responder=respond)
    out, score, info = run_scored(
        config, backend, [scored_row("Which river flows into the Mediterranean?", "eviomni", passages=passages)]
    )
    response = tokenizer.decode(out["response_ids"], skip_special_tokens=True)
    fields = {
        k: out["extra"][k]
        for k in ("eviomni_answer_r", "eviomni_answer_e", "eviomni_len_r", "eviomni_len_e", "eviomni_len_p")
    }
    expected = eviomni.compute_score("nq", response, GOLD, fields)
    assert score == pytest.approx(expected["score"], abs=1e-6)
    assert info["ans_r"] == info["ans_e"] == info["ans_f"] == 1.0
    assert info["format"] == 1.0
    assert info["len_e"] == out["extra"]["eviomni_len_e"] > 0
    assert out["extra"]["termination"] == "answer"


def test_grace_single_turn_strips_thinking(base_config, tokenizer, ray_session):
    config = with_settings(base_config, {"reward.reward_manager.name": "grace"})
    # tags inside the thinking must not count: only the text after the last </think> is judged
    text = (
        "<think> Maybe <llm> recall </llm> would do, but the context has it. </think>"
        "<evidence> The Nile flows north into the Mediterranean Sea. </evidence><answer> Nile </answer>"
    )
    backend = ScriptedBackend(tokenizer, turns=[text])
    out, score, _ = run_scored(
        config, backend, [scored_row("Which river flows into the Mediterranean?", "single_turn_agent")]
    )
    # verl's single-turn loop keeps the thinking in the trained response, all mask 1
    assert tokenizer.decode(out["response_ids"], skip_special_tokens=True) == text
    assert out["response_mask"] == [1] * len(out["response_ids"])
    expected = grace.compute_score("nq", text, GOLD, {})
    assert score == pytest.approx(expected["score"], abs=1e-6)
    assert score == pytest.approx(0.5 + 1.0 + 2.0 * 1.0 + 3.0 * 1.0, abs=1e-6)  # format, path, alpha*R_e + beta*R_a


def test_eviomni_row_without_passages_or_server_scores_zero_and_is_counted(base_config, tokenizer, ray_session):
    from retrieval_server.haproxy_front import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    config = with_settings(
        base_config,
        {
            "reward.reward_manager.name": "eviomni",
            "actor_rollout_ref.rollout.custom": {"eviomni": {"retrieval_url": dead, "search_max_retries": 0}},
        },
    )
    backend = ScriptedBackend(tokenizer, responder=lambda prompt: "<answer> Nile </answer>")
    out, score, info = run_scored(config, backend, [scored_row("Which river flows into the Mediterranean?", "eviomni")])
    assert out["response_mask"] == [0]
    assert score == 0.0
    assert info["retrieval_failed"] == 1.0 and info["reward_error"] == 1.0
