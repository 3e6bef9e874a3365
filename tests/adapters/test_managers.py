"""The four reward-loop managers driven through verl's RewardLoopWorker with real DataProto batches."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_batch, run, score_with_worker
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.trainer.ppo.reward import resolve_reward_manager_cls

import verl_evidence.reward_managers  # noqa: F401  (registration)
from verl_evidence.local.tiny_models import expected_overlap_entailment
from verl_evidence.rewards import evinote, eviomni, grace

GOLD = {
    "target": ["the committee", "committee"],
    "evidence": ["The report was written by the committee in 1998."],
    "answerable": True,
}
MALFORMED = ["", "<answer>unterminated", "<<<>>> \x00 </reason><reason>", "<summary>*a* </answer><answer>"]

EVIOMNI_FIELDS = {
    "eviomni_answer_r": "the committee",
    "eviomni_answer_e": "a committee of experts",
    "eviomni_len_r": 9,
    "eviomni_len_e": 5,
    "eviomni_len_p": 120,
}
EVIOMNI_RESPONSES = [
    "<reason>The passage names the author of the report.</reason><extract>written by the committee</extract>"
    "<answer>the committee</answer>",
    "<think>Let me look.</think><reason>It says who.</reason><extract>the committee</extract><answer>Paris</answer>",
    *MALFORMED,
]


def expected_scores(core, responses, ground_truth, extra_infos, **kwargs):
    return [
        core.compute_score(data_source="nq", solution_str=r, ground_truth=ground_truth, extra_info=e, **kwargs)
        for r, e in zip(responses, extra_infos)
    ]


def assert_same_keys(outputs):
    keys = [list(o["reward_extra_info"].keys()) for o in outputs]
    assert all(k == keys[0] for k in keys), keys
    assert keys[0][0] == "score" and keys[0][-1] == "reward_error"
    # verl stacks every key across samples into a numpy column: it must be numeric
    for key in keys[0]:
        column = np.array([o["reward_extra_info"][key] for o in outputs])
        assert column.dtype.kind == "f"


def test_eviomni_matches_core(make_config, tokenizer):
    config = make_config("reward.reward_manager.name=eviomni", "+reward.reward_kwargs.tau=0.2")
    samples = [{"response": r, "ground_truth": GOLD, "tool_extra_fields": EVIOMNI_FIELDS} for r in EVIOMNI_RESPONSES]
    outputs = score_with_worker(config, make_batch(tokenizer, samples))
    extra = {"index": 0, **EVIOMNI_FIELDS}
    expected = expected_scores(eviomni, EVIOMNI_RESPONSES, GOLD, [dict(extra, num_turns=2)] * len(samples), tau=0.2)
    assert [o["reward_score"] for o in outputs] == pytest.approx([e["score"] for e in expected])
    for output, reference in zip(outputs, expected):
        info = output["reward_extra_info"]
        assert {k: info[k] for k in reference} == pytest.approx(reference)
        assert info["reward_error"] == 0.0
    assert outputs[0]["reward_score"] > 0.5  # the well-formed, correct one really scored
    assert all(o["reward_extra_info"]["format"] == 0.0 for o in outputs[2:])  # malformed responses
    assert outputs[2]["reward_score"] < outputs[0]["reward_score"]
    assert_same_keys(outputs)
    # the trainer's batch path assembles our scores at the last valid token
    batch = make_batch(tokenizer, samples)
    rm_scores = resolve_reward_manager_cls(config).assemble_rm_scores(batch, [o["reward_score"] for o in outputs])
    assert rm_scores.sum(-1).tolist() == pytest.approx([o["reward_score"] for o in outputs])


GRACE_RESPONSES = [
    "<evidence>The report was written by the committee.</evidence><answer>the committee</answer>",
    "<think>No support here.</think><llm>I recall a committee.</llm><answer>a committee</answer>",
    "<evidence>x</evidence><llm>y</llm><answer>z</answer>",
    *MALFORMED,
]


def test_grace_matches_core_in_train_and_validation_modes(make_config, tokenizer):
    config = make_config("reward.reward_manager.name=grace")
    samples = [{"response": r, "ground_truth": GOLD} for r in GRACE_RESPONSES]
    samples += [{"response": GRACE_RESPONSES[0], "ground_truth": GOLD, "extra_info": {"split": "test"}}]
    outputs = score_with_worker(config, make_batch(tokenizer, samples))
    train = expected_scores(grace, GRACE_RESPONSES, GOLD, [{}] * len(GRACE_RESPONSES), mode="train")
    validation = grace.compute_score("nq", GRACE_RESPONSES[0], GOLD, {}, mode="validation")
    assert [o["reward_score"] for o in outputs] == pytest.approx([e["score"] for e in train] + [validation["score"]])
    assert outputs[0]["reward_score"] > 1.5 and outputs[-1]["reward_score"] < outputs[0]["reward_score"]
    assert_same_keys(outputs)


def test_grace_reward_kwargs_override_and_bad_mode(make_config, tokenizer):
    config = make_config(
        "reward.reward_manager.name=grace", "+reward.reward_kwargs.mode=validation", "+reward.reward_kwargs.beta=10"
    )
    batch = make_batch(tokenizer, [{"response": GRACE_RESPONSES[0], "ground_truth": GOLD}])
    (output,) = score_with_worker(config, batch)
    expected = grace.compute_score("nq", GRACE_RESPONSES[0], GOLD, {}, mode="validation", beta=10)
    assert output["reward_score"] == pytest.approx(expected["score"])
    with pytest.raises(ValueError, match="GRACE mode"):
        RewardLoopWorker(make_config("reward.reward_manager.name=grace", "+reward.reward_kwargs.mode=sometimes"))


EVINOTE_RESPONSES = [
    "<think>I should search.</think><search>author of the report</search>"
    "<information>Doc 1 (Title: Report) The report was written by the committee in 1998.</information>"
    "<summary>*The committee wrote the report* -year uncertain-</summary><answer>the committee</answer>",
    "<search>report</search><information>Doc 1 unrelated</information>"
    "<summary>first note</summary><summary>*Paris* is the capital</summary><answer>Paris</answer>",
    "<answer>the committee</answer>",  # no summary: format fails, EQR 0
    *MALFORMED,
]


def evinote_config(make_config, nli_dir, *extra):
    return make_config(
        "reward.reward_manager.name=evinote",
        f"+reward.reward_kwargs.nli_model={nli_dir}",
        "+reward.reward_kwargs.nli_in_process=true",
        "+reward.reward_kwargs.nli_device=cpu",
        *extra,
    )


def expected_evinote(nli_dir, response, question, **kwargs):
    """The core's score with EQR from token overlap (no NLI client: independent of the manager's judge)."""
    premise = evinote.last_summary(response)
    eqr = 0.0
    if premise.strip():
        eqr = expected_overlap_entailment(nli_dir, premise, evinote.build_claim("the committee", question))
    return evinote.compute_score("nq", response, GOLD, {"eqr": eqr}, **kwargs), eqr


def test_evinote_eqr_from_judge_matches_core(make_config, tokenizer, nli_dir):
    question = "Who wrote the report?"
    samples = [
        {"response": r, "ground_truth": GOLD, "tool_extra_fields": {"question": question}} for r in EVINOTE_RESPONSES
    ]
    outputs = score_with_worker(evinote_config(make_config, nli_dir), make_batch(tokenizer, samples))
    for output, response in zip(outputs, EVINOTE_RESPONSES):
        reference, eqr = expected_evinote(nli_dir, response, question)
        info = output["reward_extra_info"]
        assert output["reward_score"] == pytest.approx(reference["score"], abs=1e-4)
        assert info["eqr"] == pytest.approx(eqr, abs=1e-4)
        assert {k: info[k] for k in reference} == pytest.approx(reference, abs=1e-4)
    stated, not_stated = outputs[0]["reward_extra_info"]["eqr"], outputs[1]["reward_extra_info"]["eqr"]
    # the note that states the answer is entailed more than the one that does not
    assert stated > not_stated + 0.1
    assert outputs[0]["reward_score"] == pytest.approx(1.0 + stated, abs=1e-6)  # correct answer + EQR
    # wrong answer, a plain note beside an annotated one: note-taking holds, 0.1 + EQR
    assert outputs[1]["reward_score"] == pytest.approx(0.1 + not_stated, abs=1e-6) and not_stated > 0.05
    assert outputs[2]["reward_score"] == 0.0 and outputs[2]["reward_extra_info"]["eqr"] == 0.0
    assert_same_keys(outputs)


@pytest.mark.parametrize(
    "sample_fields, question",
    [
        ({"extra_info": {"question": "From extra_info?"}}, "From extra_info?"),
        (
            {
                "prompt": "Which body wrote it?",
                "raw_prompt": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Which body wrote it?"},
                ],
            },
            "Which body wrote it?",
        ),
    ],
)
def test_evinote_question_fallbacks(make_config, tokenizer, nli_dir, sample_fields, question):
    sample = {"response": EVINOTE_RESPONSES[0], "ground_truth": GOLD, **sample_fields}
    (output,) = score_with_worker(evinote_config(make_config, nli_dir), make_batch(tokenizer, [sample]))
    reference, eqr = expected_evinote(nli_dir, EVINOTE_RESPONSES[0], question)
    assert output["reward_extra_info"]["eqr"] == pytest.approx(eqr, abs=1e-4)
    # the claim's question changes the EQR, so a manager that used another question would fail here
    assert abs(eqr - expected_evinote(nli_dir, EVINOTE_RESPONSES[0], "Who wrote the report?")[1]) > 0.01


def test_evinote_requires_a_judge_and_valid_markers(make_config, nli_dir):
    with pytest.raises(ValueError, match="nli_model"):
        RewardLoopWorker(make_config("reward.reward_manager.name=evinote"))
    with pytest.raises(Exception, match="missing-judge"):
        RewardLoopWorker(
            make_config(
                "reward.reward_manager.name=evinote",
                "+reward.reward_kwargs.nli_model=/nonexistent/missing-judge",
                "+reward.reward_kwargs.nli_in_process=true",
            )
        )
    with pytest.raises(ValueError, match="markers"):
        RewardLoopWorker(evinote_config(make_config, nli_dir, "+reward.reward_kwargs.markers=[abc]"))


def test_unreadable_trajectory_scores_zero_with_the_same_keys(make_config, tokenizer):
    from verl import DataProto

    config = make_config("reward.reward_manager.name=eviomni")
    good = make_batch(tokenizer, [{"response": EVIOMNI_RESPONSES[0], "ground_truth": GOLD}])
    broken = DataProto.from_dict(
        tensors={"responses": good.batch["responses"], "prompts": good.batch["prompts"]},  # no attention_mask
        non_tensors=dict(good.non_tensor_batch),
    )
    worker = RewardLoopWorker(config)
    (good_output,) = run(worker.compute_score_batch(good))
    (broken_output,) = run(worker.compute_score_batch(broken))
    assert broken_output["reward_score"] == 0.0
    assert broken_output["reward_extra_info"]["reward_error"] == 1.0
    assert list(broken_output["reward_extra_info"]) == list(good_output["reward_extra_info"])


def test_strange_ground_truths_never_raise(make_config, tokenizer):
    config = make_config("reward.reward_manager.name=grace")
    truths = [None, "the committee", {"target": np.array(["the committee"])}, 42, {"evidence": None}, [["x"]]]
    samples = [{"response": GRACE_RESPONSES[0], "ground_truth": gt} for gt in truths]
    outputs = score_with_worker(config, make_batch(tokenizer, samples))
    assert all(np.isfinite(o["reward_score"]) for o in outputs)
    assert_same_keys(outputs)


FLAKY_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0, **kwargs):
    if "Paris" in solution_str:
        raise RuntimeError("this custom reward dislikes Paris")
    return {"score": 0.25 + bonus, "length": float(len(solution_str))}
"""


def test_composite_weighted_sum_and_prefixed_keys(make_config, tokenizer, tmp_path):
    module = tmp_path / "flaky_reward.py"
    module.write_text(FLAKY_REWARD)
    components = (
        "[{reward:eviomni,weight:0.5},"
        "{reward:grace,weight:2,kwargs:{alpha:1}},"
        "{reward:'pkg://verl_evidence.rewards.grace:compute_score',weight:-1,name:grace_pkg},"
        f"{{reward:'{module}:compute_score',weight:4,kwargs:{{bonus:0.5}},keys:[length]}}]"
    )
    config = make_config("reward.reward_manager.name=composite", f"+reward.reward_kwargs.components={components}")
    responses = [GRACE_RESPONSES[0], EVIOMNI_RESPONSES[0], EVIOMNI_RESPONSES[1], ""]
    samples = [{"response": r, "ground_truth": GOLD, "tool_extra_fields": EVIOMNI_FIELDS} for r in responses]
    outputs = score_with_worker(config, make_batch(tokenizer, samples))
    assert_same_keys(outputs)
    keys = list(outputs[0]["reward_extra_info"])
    assert "eviomni.ans_f" in keys and "grace.evidence_rouge" in keys and "grace_pkg.score" in keys
    assert "compute_score.length" in keys and "compute_score.reward_error" in keys
    for output, response in zip(outputs, responses):
        extra = {"index": 0, **EVIOMNI_FIELDS, "num_turns": 2}
        e = eviomni.compute_score("nq", response, GOLD, extra)["score"]
        g = grace.compute_score("nq", response, GOLD, extra, alpha=1)["score"]
        g_pkg = grace.compute_score("nq", response, GOLD, extra)["score"]
        custom_fails = "Paris" in response
        custom = 0.0 if custom_fails else 0.75
        info = output["reward_extra_info"]
        assert output["reward_score"] == pytest.approx(0.5 * e + 2 * g - g_pkg + 4 * custom)
        assert info["eviomni.score"] == pytest.approx(e) and info["grace.score"] == pytest.approx(g)
        assert (info["eviomni.weight"], info["grace.weight"], info["grace_pkg.weight"]) == (0.5, 2.0, -1.0)
        assert info["reward_error"] == info["compute_score.reward_error"] == float(custom_fails)
        if not custom_fails:
            assert info["compute_score.length"] == float(len(response))


def test_composite_custom_reward_function_and_judge(make_config, tokenizer, tmp_path, nli_dir):
    module = tmp_path / "my_reward.py"
    module.write_text(FLAKY_REWARD)
    config = make_config(
        "reward.reward_manager.name=composite",
        f"reward.custom_reward_function.path={module}",
        "+reward.reward_kwargs.components="
        "[{reward:custom,weight:1},{reward:evinote,weight:1},{reward:evinote,weight:1}]",
        f"+reward.reward_kwargs.nli_model={nli_dir}",
        "+reward.reward_kwargs.nli_in_process=true",
        "+reward.reward_kwargs.nli_device=cpu",
    )
    sample = {"response": EVINOTE_RESPONSES[0], "ground_truth": GOLD, "tool_extra_fields": {"question": "Who?"}}
    (output,) = score_with_worker(config, make_batch(tokenizer, [sample]))
    reference, _ = expected_evinote(nli_dir, EVINOTE_RESPONSES[0], "Who?")
    info = output["reward_extra_info"]
    assert "evinote_2.eqr" in info and info["custom.score"] == pytest.approx(0.25)
    assert output["reward_score"] == pytest.approx(0.25 + 2 * reference["score"], abs=1e-6)


@pytest.mark.parametrize(
    "components, message",
    [
        (None, "components"),
        ("[{weight:1}]", "'reward' key"),
        ("[{reward:grace,wieght:1}]", "unknown fields"),
        ("[{reward:grace,weight:abc}]", "weight"),
        ("[{reward:'no_such_module_xyz:fn'}]", "no_such_module_xyz"),
        ("[{reward:custom}]", "custom_reward_function"),
        ("[{reward:eviomni,kwargs:{variant:nonsense}}]", "variant"),
        ("[]", "at least one"),
    ],
)
def test_composite_config_errors_fail_at_start_up(make_config, components, message):
    overrides = ["reward.reward_manager.name=composite"]
    if components is not None:
        overrides.append(f"+reward.reward_kwargs.components={components}")
    with pytest.raises(ValueError, match=message):
        RewardLoopWorker(make_config(*overrides))


def test_function_spec_forms(tmp_path):
    from verl_evidence.reward_managers.scorers import load_function

    module = tmp_path / "spec_reward.py"
    module.write_text(FLAKY_REWARD)
    assert load_function("verl_evidence.rewards.grace:compute_score") is grace.compute_score
    assert load_function("pkg://verl_evidence.rewards.grace:compute_score") is grace.compute_score
    assert load_function("pkg://verl_evidence.rewards.eviomni") is eviomni.compute_score  # default name
    assert load_function(f"{module}:compute_score")("nq", "x", None) == {"score": 0.25, "length": 1.0}
    with pytest.raises(ValueError, match="no_such_function"):
        load_function("verl_evidence.rewards.grace:no_such_function")


SEARCH_STATS = {
    "question": "Who wrote the report?",
    "num_searches": 3,
    "summary_count": 2,
    "context_tokens": 40,
    "raw_context_tokens": 200,
    "compression_ratio": 5.0,
    "invalid_actions": 1,
    "search_errors": 0,
    "extractor_failures": 1,
    "retrieval_failed": 0,
    "searches": ["a", "b", "c"],  # not numeric: never logged
    "termination": "answer",
}


@pytest.mark.parametrize("manager", ["evinote", "eviomni", "composite"])
def test_rollout_statistics_reach_reward_extra_info(make_config, tokenizer, nli_dir, manager):
    from verl_evidence.trainer.step_metrics import ROLLOUT_STATS

    judge = [
        f"+reward.reward_kwargs.nli_model={nli_dir}",
        "+reward.reward_kwargs.nli_in_process=true",
        "+reward.reward_kwargs.nli_device=cpu",
    ]
    overrides = {
        "evinote": judge,
        "eviomni": [],
        "composite": ["+reward.reward_kwargs.components=[{reward:evinote,weight:1},{reward:eviomni,weight:1}]", *judge],
    }[manager]
    config = make_config(f"reward.reward_manager.name={manager}", *overrides)
    # stats present, stats absent (e.g. another loop's rows), odd values: the same keys for every sample
    samples = [
        {"response": EVINOTE_RESPONSES[0], "ground_truth": GOLD, "tool_extra_fields": SEARCH_STATS},
        {"response": EVIOMNI_RESPONSES[0], "ground_truth": GOLD, "tool_extra_fields": EVIOMNI_FIELDS},
        {"response": "", "ground_truth": GOLD, "tool_extra_fields": {"num_searches": "many", "context_tokens": None}},
    ]
    outputs = score_with_worker(config, make_batch(tokenizer, samples))
    assert_same_keys(outputs)
    infos = [o["reward_extra_info"] for o in outputs]
    for key in ROLLOUT_STATS:
        assert infos[0][key] == float(SEARCH_STATS[key])
        assert infos[1][key] == 0.0 and infos[2][key] == 0.0
    assert infos[0]["num_searches"] == 3.0 and infos[0]["compression_ratio"] == 5.0
    assert "searches" not in infos[0] and "termination" not in infos[0]
    # verl's validation aggregation (``val-aux/<data_source>/<key>``) stacks every key as a numeric column
    assert np.array([i["num_searches"] for i in infos]).mean() == pytest.approx(1.0)


def test_grace_does_not_log_search_statistics(make_config, tokenizer):
    config = make_config("reward.reward_manager.name=grace")
    sample = {"response": GRACE_RESPONSES[0], "ground_truth": GOLD, "tool_extra_fields": SEARCH_STATS}
    (output,) = score_with_worker(config, make_batch(tokenizer, [sample]))
    assert "num_searches" not in output["reward_extra_info"]
