"""The shared NLI judge as a Ray actor on the session's real local Ray cluster (tests/conftest.py)."""

from __future__ import annotations

import asyncio

import pytest
from conftest import make_batch, score_with_worker

from verl_evidence.local.tiny_models import expected_overlap_entailment
from verl_evidence.reward_managers.judge import JudgeConfig, NLIJudgeLoadError, RayJudgeClient
from verl_evidence.rewards import evinote

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, pytest.mark.longest_first(1), pytest.mark.one_worker_group]

PAIRS = [
    ("*The committee wrote the report* -1998-", "the committee is the answer to the question: who wrote it?"),
    ("Paris is the capital of France.", "Paris is the answer to the question: capital of France?"),
    ("The quick brown fox jumps over the lazy dog. " * 20, "a fox is the answer to the question: what jumps?"),
]


@pytest.fixture(scope="module")
def actor_config(nli_dir, ray_cluster):
    return JudgeConfig(model=str(nli_dir), device="cpu", batch_size=16, max_wait_ms=20, num_cpus=1)


@pytest.fixture(scope="module")
def first_client(actor_config):
    """The creating client: a named non-detached actor lives while its creator holds the handle
    (in a job, the first reward worker, which lives as long as the job)."""
    client = RayJudgeClient(actor_config)
    yield client
    ray.kill(client.handle)


def test_actor_scores_like_the_in_process_judge_and_is_shared(actor_config, first_client, nli_dir):
    first = first_client
    second = RayJudgeClient(actor_config)  # another reward worker: same named actor, no second model
    assert first.handle._actor_id == second.handle._actor_id
    assert first.info["entailment_index"] == 1 and first.info["model"] == str(nli_dir)
    assert first.info["torch_threads"] == 1  # pinned to the actor's one reserved CPU

    # expected values from token overlap, not from a judge; the three pairs score differently
    reference = [expected_overlap_entailment(nli_dir, p, h) for p, h in PAIRS]
    assert max(reference) - min(reference) > 0.1

    async def many_callers():
        # 30 single-pair requests from two "workers" at once, as reward workers send them
        clients = [first, second]
        calls = [clients[i % 2].entailment_probs([PAIRS[i % 3][0]], [PAIRS[i % 3][1]]) for i in range(30)]
        return await asyncio.gather(*calls)

    before = first.describe()["forward_batches"]
    results = asyncio.run(many_callers())
    assert [r[0] for r in results] == pytest.approx([reference[i % 3] for i in range(30)], abs=1e-4)
    forward_passes = first.describe()["forward_batches"] - before
    assert 1 <= forward_passes < 30  # the actor merged concurrent requests


def test_actor_that_cannot_load_fails_start_up_naming_the_model(ray_cluster, tmp_path):
    config = JudgeConfig(model=str(tmp_path / "no-such-nli-model"), device="cpu", num_cpus=1)
    with pytest.raises(NLIJudgeLoadError, match="no-such-nli-model"):
        RayJudgeClient(config, startup_timeout_s=120)


def test_evinote_manager_uses_the_actor(actor_config, first_client, make_config, tokenizer, nli_dir):
    config = make_config(
        "reward.reward_manager.name=evinote",
        f"+reward.reward_kwargs.nli_model={nli_dir}",
        "+reward.reward_kwargs.nli_device=cpu",
        "+reward.reward_kwargs.nli_batch_size=16",
        "+reward.reward_kwargs.nli_max_wait_ms=20",
        "+reward.reward_kwargs.nli_num_cpus=1",
    )
    response = (
        "<search>who wrote it</search><information>Doc 1 The committee wrote it.</information>"
        f"<summary>{PAIRS[0][0]}</summary><answer>the committee</answer>"
    )
    gold = {"target": ["the committee"]}
    sample = {"response": response, "ground_truth": gold, "tool_extra_fields": {"question": "Who wrote it?"}}
    batches_before = first_client.describe()["forward_batches"]
    (output,) = score_with_worker(config, make_batch(tokenizer, [sample]))
    claim = evinote.build_claim("the committee", "Who wrote it?")
    eqr = expected_overlap_entailment(nli_dir, PAIRS[0][0], claim)
    expected = evinote.compute_score("nq", response, gold, {"eqr": eqr})
    assert output["reward_extra_info"]["eqr"] == pytest.approx(eqr, abs=1e-4)
    assert output["reward_score"] == pytest.approx(expected["score"], abs=1e-4)
    assert output["reward_score"] > 1.1  # correct answer, and a note that shares the claim's words
    # the manager reached the module's shared actor rather than starting its own
    assert first_client.describe()["forward_batches"] > batches_before


def test_reward_worker_actors_share_one_judge(actor_config, first_client, make_config, tokenizer, nli_dir):
    """The production path: verl's RewardLoopWorker as Ray actors; each fresh worker process registers
    the managers through the verl.plugins entry point and reaches the same judge actor by name."""
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    config = make_config(
        "reward.reward_manager.name=evinote",
        f"+reward.reward_kwargs.nli_model={nli_dir}",
        "+reward.reward_kwargs.nli_device=cpu",
        "+reward.reward_kwargs.nli_batch_size=16",
        "+reward.reward_kwargs.nli_max_wait_ms=20",
        "+reward.reward_kwargs.nli_num_cpus=1",
    )
    response = f"<search>q</search><information>d</information><summary>{PAIRS[1][0]}</summary><answer>Paris</answer>"
    gold = {"target": ["Paris"]}
    sample = {"response": response, "ground_truth": gold, "tool_extra_fields": {"question": "Capital?"}}
    batch = make_batch(tokenizer, [sample] * 3)
    worker_class = ray.remote(RewardLoopWorker)
    workers = [worker_class.options(num_cpus=0).remote(config) for _ in range(2)]
    try:
        batches_before = first_client.describe()["forward_batches"]
        outputs = ray.get([worker.compute_score_batch.remote(batch) for worker in workers], timeout=600)
        eqr = expected_overlap_entailment(nli_dir, PAIRS[1][0], evinote.build_claim("Paris", "Capital?"))
        expected = evinote.compute_score("nq", response, gold, {"eqr": eqr})["score"]
        assert [o["reward_score"] for worker_outputs in outputs for o in worker_outputs] == pytest.approx(
            [expected] * 6, abs=1e-4
        )
        assert first_client.describe()["forward_batches"] > batches_before
        judges = [a for a in ray.util.list_named_actors(all_namespaces=True) if "nli_judge" in str(a)]
        assert len(judges) == 1, judges
    finally:
        for worker in workers:
            ray.kill(worker)
