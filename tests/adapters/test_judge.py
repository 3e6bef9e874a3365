"""NLI judge in-process: id2label lookup, batching, premise-only truncation, load errors, micro-batching.

The judge under test loads ``overlap_nli_model``: a BERT classifier with the packaged MiniLM's pair
tokenizer whose entailment probability grows with premise/hypothesis token overlap. Expected values
come from ``expected_overlap_entailment`` (token counting, no model) or from transformers directly.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from verl_evidence.local.tiny_models import expected_overlap_entailment, overlap_nli_model, tiny_nli_model
from verl_evidence.reward_managers.judge import (
    BatchingJudge,
    JudgeConfig,
    NLIJudge,
    NLIJudgeLoadError,
    connect_judge,
    find_entailment_index,
)
from verl_evidence.rewards.evinote import build_claim

PREMISES = [
    "*The committee wrote the report* in -1998-.",
    "Paris is the capital of France.",
    "The quick brown fox jumps over the lazy dog. " * 12,
    "x",
    "Everest is the answer to the question: which mountain is highest?",
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
    return overlap_nli_model(tmp_path_factory.mktemp("nli4"), id2label=labels)


def direct_probabilities(model_dir, premises, hypotheses, max_length: int, truncation: str = "only_first"):
    """Softmax of the model loaded by transformers itself, one pair at a time, no padding."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    rows = []
    with torch.inference_mode():
        for premise, hypothesis in zip(premises, hypotheses):
            encoded = tokenizer(premise, hypothesis, truncation=truncation, max_length=max_length, return_tensors="pt")
            rows.append(torch.softmax(model(**encoded).logits.float(), dim=-1)[0])
    return torch.stack(rows)


def expected(model_dir, premises, hypotheses, max_length: int | None = None) -> list[float]:
    return [expected_overlap_entailment(model_dir, p, h, max_length) for p, h in zip(premises, hypotheses)]


def test_overlap_model_computes_what_it_documents(nli_dir):
    """The stand-in itself: transformers' forward pass equals the token-overlap formula, padded or not."""
    pairs = list(zip(PREMISES, HYPOTHESES)) + [("", HYPOTHESES[0]), ("Who wrote it? The committee.", "the committee")]
    reference = torch.tensor(expected(nli_dir, [p for p, _ in pairs], [h for _, h in pairs]))
    direct = direct_probabilities(nli_dir, [p for p, _ in pairs], [h for _, h in pairs], max_length=512)
    torch.testing.assert_close(direct[:, 1], reference, atol=1e-4, rtol=0)
    assert reference.max() > 0.95 and reference.min() < 0.02  # it really discriminates
    tokenizer = AutoTokenizer.from_pretrained(nli_dir)
    model = AutoModelForSequenceClassification.from_pretrained(nli_dir).eval()
    batch = tokenizer([p for p, _ in pairs], [h for _, h in pairs], padding=True, return_tensors="pt")
    with torch.inference_mode():
        padded = torch.softmax(model(**batch).logits, dim=-1)[:, 1]
    torch.testing.assert_close(padded, reference, atol=1e-4, rtol=0)
    # the segments matter: the same tokens all in one segment (no token_type_ids) give another answer
    del batch["token_type_ids"]
    with torch.inference_mode():
        assert not torch.allclose(torch.softmax(model(**batch).logits, dim=-1)[:, 1], reference, atol=1e-2)


def test_entailment_class_found_by_label_not_position(four_label_dir):
    judge = NLIJudge(str(four_label_dir), device="cpu", batch_size=2)
    assert judge.entailment_index == 3 and judge.entailment_label == "Entailment"
    probabilities = torch.tensor(judge.entailment_probs(PREMISES, HYPOTHESES))
    reference = torch.tensor(expected(four_label_dir, PREMISES, HYPOTHESES))
    torch.testing.assert_close(probabilities, reference, atol=1e-4, rtol=0)
    assert probabilities[4] > 0.9 and probabilities[3] < 0.05  # full overlap vs none
    # any other column would have given something else: it falls as entailment rises
    direct = direct_probabilities(four_label_dir, PREMISES, HYPOTHESES, max_length=judge.max_length)
    torch.testing.assert_close(direct[:, 3], reference, atol=1e-4, rtol=0)
    for wrong in (0, 1, 2):
        assert direct[4, wrong] < 0.05 and direct[3, wrong] > 0.3


def test_a_note_that_states_the_answer_scores_above_one_that_does_not(nli_dir):
    judge = NLIJudge(str(nli_dir), device="cpu")
    claim = build_claim(["the committee"], "Who wrote the report?")
    notes = ["*The committee wrote the report* -in 1998-", "*Paris* is the capital of France.", ""]
    states, does_not, empty = judge.entailment_probs(notes, [claim] * 3)
    assert [states, does_not, empty] == pytest.approx(expected(nli_dir, notes, [claim] * 3), abs=1e-4)
    assert states > does_not + 0.1 and does_not > empty


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
    # a path that does not exist is refused before torch and transformers are imported (an actor fails at once)
    with pytest.raises(NLIJudgeLoadError, match="missing-nli-model.*no such directory"):
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
    # in input order: each value is its own pair's, and the pairs really differ
    assert batched == pytest.approx(expected(nli_dir, [p for p, _ in pairs], [h for _, h in pairs]), abs=1e-4)
    assert max(batched) - min(batched) > 0.5


HYPOTHESIS = "the committee is the answer to the question: who wrote the report?"
FILLER = "Filler words about nothing else. " * 30


def test_truncation_cuts_the_premise_and_keeps_the_hypothesis(nli_dir):
    # 24 tokens: [CLS], 7 premise tokens, [SEP], the 14-token hypothesis, [SEP]; cutting both sides
    # (longest_first) would shorten the hypothesis too and change the overlap
    judge = NLIJudge(str(nli_dir), device="cpu", max_length=24)
    answer_first = "The committee wrote the report. " + FILLER
    answer_late = FILLER + "The committee wrote the report."
    encoded = judge._encode([answer_first, "short"], [HYPOTHESIS, HYPOTHESIS])
    hypothesis_ids = judge.tokenizer(HYPOTHESIS, add_special_tokens=False)["input_ids"]
    first = encoded["input_ids"][0][encoded["attention_mask"][0].bool()].tolist()
    sep, cls = judge.tokenizer.sep_token_id, judge.tokenizer.cls_token_id
    assert len(first) == 24 and first[0] == cls
    assert first[-len(hypothesis_ids) - 1 :] == hypothesis_ids + [sep]  # hypothesis intact at the end
    kept_ids = first[1 : 24 - len(hypothesis_ids) - 2]
    assert judge.tokenizer.decode(kept_ids).startswith("the committee wrote the report")

    first_p, late_p, short_p, empty_p = judge.entailment_probs(
        [answer_first, answer_late, "The committee wrote the report.", ""], [HYPOTHESIS] * 4
    )
    # the premise is cut by tokens from its end: an answer near the start survives, one past the cut does not
    assert first_p == pytest.approx(expected_overlap_entailment(nli_dir, answer_first, HYPOTHESIS, 24), abs=1e-4)
    assert late_p == pytest.approx(expected_overlap_entailment(nli_dir, answer_late, HYPOTHESIS, 24), abs=1e-4)
    assert first_p == pytest.approx(short_p, abs=1e-4)  # the kept start holds every overlapping token
    assert first_p > late_p + 0.1  # had it kept the end instead, these would swap
    assert first_p > empty_p + 0.1  # never scored as an empty premise
    # and the probability equals that of the premise cut by hand to the same tokens
    kept = judge.tokenizer.decode(kept_ids)
    assert judge.entailment_probs([answer_first], [HYPOTHESIS]) == pytest.approx(
        judge.entailment_probs([kept], [HYPOTHESIS]), abs=1e-5
    )


def test_overlong_hypothesis_still_scored(nli_dir):
    judge = NLIJudge(str(nli_dir), device="cpu", max_length=16)
    hypothesis = "a very long hypothesis " * 20
    premises = ["a very long hypothesis", "unrelated words here"]
    probabilities = judge.entailment_probs(premises, [hypothesis] * 2)
    # both sides cut (longest_first), as transformers does it for this pair on its own
    reference = direct_probabilities(nli_dir, premises, [hypothesis] * 2, max_length=16, truncation="longest_first")
    assert probabilities == pytest.approx(reference[:, judge.entailment_index].tolist(), abs=1e-4)
    assert probabilities[0] > 0.9 and probabilities[1] < 0.05  # still scored on its content


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


def test_the_judge_settings_are_one_list(nli_dir):
    """NLIJudge's keywords and defaults are JudgeConfig's fields; the in-process client passes the whole config."""
    judge = NLIJudge(str(nli_dir), device="cpu", batch_size=3)
    assert judge.config == JudgeConfig(model=str(nli_dir), device="cpu", batch_size=3)
    assert judge.batch_size == 3 and judge.device == "cpu"
    with pytest.raises(TypeError, match=r"unknown setting\(s\) \['bach_size'\]"):
        NLIJudge(str(nli_dir), bach_size=3)
    config = JudgeConfig(model=str(nli_dir), device="cpu", batch_size=5, max_length=40, in_process=True)
    client = connect_judge(config)
    assert client.batcher.judge.config.batch_size == 5 and client.batcher.judge.max_length == 40
    with pytest.raises(ValueError, match="nli_bach_size"):  # a typo in YAML is refused, naming the keys
        JudgeConfig.from_reward_kwargs({"nli_model": "m", "nli_bach_size": 8})
