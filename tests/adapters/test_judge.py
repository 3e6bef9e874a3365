"""NLI judge in-process: id2label lookup, batching, premise-only truncation, load errors, micro-batching."""

from __future__ import annotations

import asyncio

import pytest
import torch

from verl_evidence.judge import (
    BatchingJudge,
    JudgeConfig,
    NLIJudge,
    NLIJudgeLoadError,
    connect_judge,
    find_entailment_index,
)
from verl_evidence.testing import tiny_nli_model

PREMISES = [
    "*The committee wrote the report* in -1998-.",
    "Paris is the capital of France.",
    "The quick brown fox jumps over the lazy dog. " * 12,
    "x",
    "Mount Everest is the highest mountain above sea level.",
]
HYPOTHESES = [
    "the committee is the answer to the question: who wrote the report?",
    "Paris is the answer to the question: what is the capital of France?",
    "a fox is the answer to the question: what jumps?",
    "y is the answer to the question: z",
    "Everest is the answer to the question: which mountain is highest?",
]


@pytest.fixture(scope="module")
def four_label_dir(tmp_path_factory):
    # entailment at index 3: neither MNLI convention (0 or 2) would find it
    labels = {0: "contradiction", 1: "neutral", 2: "other", 3: "Entailment"}
    return tiny_nli_model(tmp_path_factory.mktemp("nli4"), seed=1, id2label=labels)


def direct_probabilities(judge: NLIJudge, premises, hypotheses) -> torch.Tensor:
    """Softmax of the raw model, one pair at a time, no padding (the reference)."""
    rows = []
    with torch.inference_mode():
        for premise, hypothesis in zip(premises, hypotheses):
            encoded = judge.tokenizer(
                premise, hypothesis, truncation="only_first", max_length=judge.max_length, return_tensors="pt"
            )
            rows.append(torch.softmax(judge.model(**encoded).logits.float(), dim=-1)[0])
    return torch.stack(rows)


def test_entailment_class_found_by_label_not_position(four_label_dir):
    judge = NLIJudge(str(four_label_dir), device="cpu", batch_size=2)
    assert judge.entailment_index == 3 and judge.entailment_label == "Entailment"
    probabilities = torch.tensor(judge.entailment_probs(PREMISES, HYPOTHESES))
    reference = direct_probabilities(judge, PREMISES, HYPOTHESES)
    torch.testing.assert_close(probabilities, reference[:, 3], atol=1e-5, rtol=1e-5)
    # the other columns really differ, so a hard-coded index would have been caught
    for wrong in (0, 1, 2):
        assert not torch.allclose(probabilities, reference[:, wrong], atol=1e-4)


def test_find_entailment_index_variants():
    assert find_entailment_index({0: "ENTAILMENT", 1: "NEUTRAL", 2: "CONTRADICTION"}, "m") == 0
    assert find_entailment_index({"0": "not_entailment", "1": "entailment"}, "m") == 1
    with pytest.raises(NLIJudgeLoadError, match="sentiment-model"):
        find_entailment_index({0: "NEGATIVE", 1: "POSITIVE"}, "sentiment-model")


def test_model_without_entailment_label_fails_naming_it(tmp_path):
    directory = tiny_nli_model(tmp_path / "no_entail", id2label={0: "LABEL_0", 1: "LABEL_1"})
    with pytest.raises(NLIJudgeLoadError, match="no_entail"):
        NLIJudge(str(directory), device="cpu")


def test_unloadable_model_fails_at_construction_naming_it(tmp_path):
    missing = tmp_path / "missing-nli-model"
    with pytest.raises(NLIJudgeLoadError, match="missing-nli-model"):
        NLIJudge(str(missing), device="cpu")
    (tmp_path / "empty-nli").mkdir()
    with pytest.raises(NLIJudgeLoadError, match="empty-nli"):
        NLIJudge(str(tmp_path / "empty-nli"), device="cpu")


def test_batched_equals_one_by_one(nli_dir):
    judge = NLIJudge(str(nli_dir), device="cpu", batch_size=4)
    pairs = list(zip(PREMISES * 3, HYPOTHESES[1:] + HYPOTHESES[:1] + HYPOTHESES + HYPOTHESES))
    batched = judge.entailment_probs([p for p, _ in pairs], [h for _, h in pairs])
    single = [judge.entailment_probs([p], [h])[0] for p, h in pairs]
    assert len(batched) == len(pairs)
    assert batched == pytest.approx(single, abs=1e-5)
    assert all(0.0 <= value <= 1.0 for value in batched)


def test_truncation_cuts_the_premise_and_keeps_the_hypothesis(nli_dir):
    judge = NLIJudge(str(nli_dir), device="cpu", max_length=48)
    long_premise = "The report was written by the committee in 1998. " * 30
    hypothesis = "the committee is the answer to the question: who wrote the report?"
    encoded = judge._encode([long_premise, "short"], [hypothesis, hypothesis])
    hypothesis_ids = judge.tokenizer(hypothesis, add_special_tokens=False)["input_ids"]
    first = encoded["input_ids"][0][encoded["attention_mask"][0].bool()].tolist()
    assert len(first) == 48
    assert first[-len(hypothesis_ids) :] == hypothesis_ids  # hypothesis intact at the end
    assert judge.tokenizer.decode(first[: 48 - len(hypothesis_ids)]).startswith("The report was written")
    # and the probability equals that of the premise cut by hand to the same tokens
    kept = judge.tokenizer.decode(first[: 48 - len(hypothesis_ids)])
    assert judge.entailment_probs([long_premise], [hypothesis]) == pytest.approx(
        judge.entailment_probs([kept], [hypothesis]), abs=1e-5
    )


def test_overlong_hypothesis_still_scored(nli_dir):
    judge = NLIJudge(str(nli_dir), device="cpu", max_length=16)
    (probability,) = judge.entailment_probs(["a premise"], ["a very long hypothesis " * 20])
    assert 0.0 <= probability <= 1.0


def test_torch_threads_pinned_on_cpu_and_reported(nli_dir):
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        judge = NLIJudge(str(nli_dir), device="cpu", torch_threads=1)
        assert torch.get_num_threads() == 1
        assert judge.describe()["torch_threads"] == 1
        NLIJudge(str(nli_dir), device="cpu")  # None leaves the process setting alone
        assert torch.get_num_threads() == 1
        with pytest.raises(ValueError, match="torch_threads"):
            NLIJudge(str(nli_dir), device="cpu", torch_threads=0)
    finally:
        torch.set_num_threads(before)


def test_judge_config_reads_torch_threads_and_defaults_the_actor_to_its_cpus():
    config = JudgeConfig.from_reward_kwargs({"nli_model": "m", "nli_torch_threads": 3, "nli_num_cpus": 1})
    assert config.torch_threads == 3 and config.actor_torch_threads == 3
    assert JudgeConfig(model="m", num_cpus=2).actor_torch_threads == 2
    assert JudgeConfig(model="m", num_cpus=0.5).actor_torch_threads == 1


def test_length_mismatch_rejected(nli_dir):
    judge = NLIJudge(str(nli_dir), device="cpu")
    with pytest.raises(ValueError, match="premises"):
        judge.entailment_probs(["a", "b"], ["c"])


def test_batching_judge_merges_concurrent_requests(nli_dir):
    judge = NLIJudge(str(nli_dir), device="cpu", batch_size=64)
    batcher = BatchingJudge(judge, max_batch_size=64, max_wait_ms=20)
    pairs = [(PREMISES[i % 5], HYPOTHESES[(i * 3) % 5]) for i in range(40)]

    async def all_requests():
        return await asyncio.gather(*(batcher.entailment_probs([p], [h]) for p, h in pairs))

    results = asyncio.run(all_requests())
    expected = judge.entailment_probs([p for p, _ in pairs], [h for _, h in pairs])
    assert [r[0] for r in results] == pytest.approx(expected, abs=1e-5)
    assert 1 <= batcher.forward_batches < len(pairs)  # requests were merged into few forward passes
    # a second event loop (e.g. a restarted worker) gets a fresh queue and still works
    again = asyncio.run(batcher.entailment_probs([pairs[0][0]], [pairs[0][1]]))
    assert again == pytest.approx(expected[:1], abs=1e-5)


def test_judge_config_from_reward_kwargs(nli_dir):
    config = JudgeConfig.from_reward_kwargs(
        {"nli_model": str(nli_dir), "nli_batch_size": 8, "nli_in_process": True, "alpha": 1, "components": []}
    )
    assert config.batch_size == 8 and config.in_process and config.device == "auto"
    with pytest.raises(ValueError, match="nli_model"):
        JudgeConfig.from_reward_kwargs({"nli_batch_size": 8})
    with pytest.raises(ValueError, match="nli_bach_size"):
        JudgeConfig.from_reward_kwargs({"nli_model": "m", "nli_bach_size": 8})
    # one in-process judge per configuration, shared by every manager of the process
    assert connect_judge(config) is connect_judge(config)
