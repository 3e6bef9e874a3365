"""EviNote's ablations (Tables 2-5): each preset's reward and loop settings, and the behaviour each one changes.

The presets are composed with Hydra from recipes/presets (their ``defaults`` inheritance included), read into the
reward core and the search loop's settings exactly as the reward manager and the loop read them.
"""

from __future__ import annotations

import asyncio
import copy
import functools
from pathlib import Path

import pytest

from verl_evidence.agent_loops.search_loop_settings import Opening, SearchLoopSettings
from verl_evidence.prompts import load_prompt
from verl_evidence.rewards import evinote
from verl_evidence.rewards.evinote import ABLATIONS, EviNoteConfig, compute_score, config_from_kwargs

PRESETS = Path(__file__).resolve().parents[2] / "recipes" / "presets"
GOLD = {"target": ["Paris"]}
NOTE = "*Paris* is the capital of France."
PLAIN = "Paris is the capital of France."
# The recipe's ABLATION -> (reward preset, rollout preset), as recipes/evinote_grpo.sh maps them.
RECIPE_PRESETS = {
    "sen": ("evinote_sen", "search"),
    "naive_summary": ("evinote_naive_summary", "evinote_naive_summary"),
    "naive_evidence": ("evinote_naive_evidence", "evinote_naive_evidence"),
    "force_summary": ("evinote_force_summary", "evinote_force_summary"),
    "force_summary_sr": ("evinote_force_summary_sr", "evinote_force_summary"),
    "force_summary_eqr": ("evinote_force_summary_eqr", "evinote_force_summary"),
}


def composed(reward_preset: str, rollout_preset: str) -> dict:
    return copy.deepcopy(_composed(reward_preset, rollout_preset))


@functools.cache
def _composed(reward_preset: str, rollout_preset: str) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(PRESETS), version_base=None):
        cfg = compose(
            config_name=None, overrides=[f"+reward_preset={reward_preset}", f"+rollout_preset={rollout_preset}"]
        )
    return OmegaConf.to_container(cfg, resolve=True)


def reward_config(ablation: str) -> EviNoteConfig:
    kwargs = composed(*RECIPE_PRESETS[ablation])["reward"]["reward_kwargs"]
    return config_from_kwargs({k: v for k, v in kwargs.items() if not k.startswith("nli_")})


def turns(*steps: str, answer: str | None = "Paris") -> str:
    """A trajectory: ``steps`` are 'search', 'note:<text>' (a <summary>) or 'evidence:<text>'."""
    parts = []
    for step in steps:
        if step == "search":
            parts.append("<search>capital of France</search><information>Doc 1 (Title: Paris) Paris.</information>")
        else:
            tag, text = step.split(":", 1)
            parts.append(f"<{'summary' if tag == 'note' else tag}>{text}</{'summary' if tag == 'note' else tag}>")
    if answer is not None:
        parts.append(f"<answer>{answer}</answer>")
    return "".join(parts)


def total(response: str, ablation: str, eqr: float = 0.0, question: str = "capital of France?") -> float:
    return compute_score("nq", response, GOLD, {"eqr": eqr, "question": question}, ablation=ablation)["score"]


@pytest.mark.parametrize("ablation", sorted(RECIPE_PRESETS))
def test_each_preset_composes_to_its_ablation(ablation: str) -> None:
    """The preset's kwargs (the evinote preset's explicit values included) give exactly the ablation's settings."""
    assert reward_config(ablation) == EviNoteConfig(**ABLATIONS[ablation])


@pytest.mark.parametrize("ablation", sorted(RECIPE_PRESETS))
def test_each_rollout_preset_asks_for_the_notes_its_reward_reads(ablation: str) -> None:
    rollout = composed(*RECIPE_PRESETS[ablation])["actor_rollout_ref"]["rollout"]
    settings = SearchLoopSettings(**rollout["custom"]["evidence_search"])
    row_prompt = [{"role": "user", "content": "the row's SEN instructions. Question: q"}]
    messages = Opening.from_settings(settings).messages(row_prompt, "Who founded Lyon?")
    user = messages[-1]["content"]
    config = reward_config(ablation)
    if settings.prompt is None:  # SEN: the row's own prompt (evinote_sen) is kept
        assert messages == row_prompt and ablation == "sen"
        return
    assert user.endswith("Question: Who founded Lyon?") and "the row's" not in user
    assert f"<{config.note_tag}>" in user
    assert ("*asterisks*" in user) is config.annotations  # only SEN asks for annotations
    assert ("must" in user) is (config.note_policy == "after_each_retrieval")


def test_the_method_is_unchanged_by_default() -> None:
    assert EviNoteConfig() == EviNoteConfig(**ABLATIONS["sen_eqr"])
    assert total(turns("search", f"note:{NOTE}"), "sen_eqr", eqr=0.4) == pytest.approx(1.4)
    assert total(turns("search", f"note:{NOTE}", answer="Lyon"), "sen_eqr", eqr=0.4) == pytest.approx(0.5)
    assert total(turns("search", answer="Paris"), "sen_eqr", eqr=0.4) == 0.0  # no note: format fails


def test_sen_without_eqr_drops_the_judge_score_only() -> None:
    assert total(turns("search", f"note:{NOTE}"), "sen", eqr=0.4) == 1.0
    assert total(turns("search", f"note:{NOTE}", answer="Lyon"), "sen", eqr=0.4) == pytest.approx(0.1)
    assert total(turns("search", f"note:{PLAIN}", answer="Lyon"), "sen", eqr=0.4) == 0.0


def test_naive_summary_rewards_a_correct_answer_with_or_without_a_summary() -> None:
    assert total(turns("search"), "naive_summary") == 1.0
    assert total(turns("search", f"note:{PLAIN}"), "naive_summary", eqr=0.9) == 1.0  # no EQR
    # a wrong answer earns nothing, annotated or not (no note-taking branch)
    assert total(turns("search", f"note:{NOTE}", answer="Lyon"), "naive_summary", eqr=0.9) == 0.0
    assert total("<summary>unclosed<answer>Paris</answer>", "naive_summary") == 0.0  # tags must be well formed


def test_naive_evidence_reads_evidence_blocks_not_summaries() -> None:
    result = compute_score("nq", turns("search", f"evidence:{PLAIN}"), GOLD, {}, ablation="naive_evidence")
    assert result["score"] == 1.0 and result["num_summaries"] == 1.0
    assert total("<evidence>unclosed<answer>Paris</answer>", "naive_evidence") == 0.0
    assert total("<evidence>unclosed<answer>Paris</answer>", "naive_summary") == 1.0  # not a tag of NS's protocol
    last = evinote.last_summary(turns("search", "evidence:first", "search", "evidence:second"), "evidence")
    assert last == "second"


@pytest.mark.parametrize(
    ("steps", "forced"),
    [
        (("search", f"note:{PLAIN}"), True),
        (("search", f"note:{PLAIN}", "search", f"note:{PLAIN}"), True),
        ((), True),  # no retrieval, nothing to summarise
        (("search",), False),
        (("search", f"note:{PLAIN}", "search"), False),  # the second retrieval has no note
        (("search", "search", f"note:{PLAIN}"), False),  # one note for two retrievals
        ((f"note:{PLAIN}", "search"), False),  # a note before the retrieval does not count
    ],
)
def test_force_summary_zeroes_a_retrieval_without_its_summary(steps: tuple[str, ...], forced: bool) -> None:
    assert total(turns(*steps), "force_summary") == (1.0 if forced else 0.0)
    assert total(turns(*steps), "naive_summary") == 1.0  # the same replies all pass without the force


def test_force_summary_ignores_tags_quoted_inside_the_retrieved_text() -> None:
    quoting = "<search>q</search><information>a page showing <summary>x</summary></information><answer>Paris</answer>"
    assert not evinote.notes_follow_every_retrieval(quoting)
    assert total(quoting, "force_summary") == 0.0


def test_force_summary_with_eqr_pays_the_judge_on_a_wrong_answer() -> None:
    wrong = turns("search", f"note:{PLAIN}", answer="Lyon")
    assert total(wrong, "force_summary_eqr", eqr=0.6) == pytest.approx(0.6)
    assert total(wrong, "force_summary", eqr=0.6) == 0.0
    assert total(turns("search", answer="Lyon"), "force_summary_eqr", eqr=0.6) == 0.0  # summary missing: 0
    assert total(turns("search", f"note:{PLAIN}"), "force_summary_eqr", eqr=0.6) == pytest.approx(1.6)


def test_stochastic_reward_pays_a_third_of_wrong_answers_and_the_same_one_every_time() -> None:
    wrong = [turns("search", f"note:Guess number {i}.", answer=f"Lyon {i}") for i in range(600)]
    scores = [total(response, "force_summary_sr") for response in wrong]
    assert sorted(set(scores)) == [0.0, 0.1]
    share = sum(s > 0 for s in scores) / len(scores)
    assert 0.28 < share < 0.39, share  # p = 1/3; 600 draws: 3 standard deviations ~ 0.058
    assert [total(response, "force_summary_sr") for response in wrong] == scores  # seeded by the trajectory
    reseeded = [
        compute_score(
            "nq", r, GOLD, {"question": "capital of France?"}, ablation="force_summary_sr", stochastic_seed=1
        )["score"]
        for r in wrong
    ]
    assert reseeded != scores
    # correct answers and format failures are unaffected
    assert total(turns("search", f"note:{PLAIN}"), "force_summary_sr") == 1.0
    assert all(total(turns("search", answer=f"Lyon {i}"), "force_summary_sr") == 0.0 for i in range(60))


def test_bad_ablation_settings_fail_with_their_name() -> None:
    with pytest.raises(ValueError, match="unknown EviNote ablation 'fs'"):
        config_from_kwargs({"ablation": "fs"})
    for bad in ({"note_tag": "notes"}, {"note_policy": "always"}, {"stochastic_probability": 1.5}, {"eqr": "no"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            EviNoteConfig(**bad)


def test_ablations_without_eqr_need_no_judge() -> None:
    """The manager's scorer starts without an NLI model for eqr: false, and never calls a judge."""
    from verl_evidence.reward_managers.sample import Sample
    from verl_evidence.reward_managers.scorers import build_scorer

    scorer = build_scorer("evinote", {"ablation": "force_summary_sr", "note_reward": 0.0})
    assert scorer.judge is None
    response = turns("search", f"note:{PLAIN}")
    sample = Sample("nq", response, GOLD, {"question": "capital of France?"})
    assert asyncio.run(scorer.score(sample))["score"] == 1.0
    with pytest.raises(ValueError, match="nli_model"):
        build_scorer("evinote", {"ablation": "force_summary_eqr"})


def test_variant_rollout_presets_are_the_search_preset_with_their_prompt() -> None:
    """Self-contained (the recipes' pre-flight reads each rollout preset's file on its own), kept equal to search."""
    search = composed("evinote", "search")["actor_rollout_ref"]["rollout"]
    for ablation, (reward_preset, rollout_preset) in RECIPE_PRESETS.items():
        rollout = composed(reward_preset, rollout_preset)["actor_rollout_ref"]["rollout"]
        loop = dict(rollout["custom"]["evidence_search"])
        if rollout_preset != "search":
            assert loop.pop("prompt") == rollout_preset, ablation
        assert {**rollout, "custom": {"evidence_search": loop}} == search, ablation


def test_variant_reward_presets_are_the_evinote_preset_with_their_ablation() -> None:
    """Self-contained files (the pre-flight and its tests read each preset file on its own), kept equal to evinote's."""
    import yaml

    method = yaml.safe_load((PRESETS / "reward_preset" / "evinote.yaml").read_text())
    for ablation, (reward_preset, _) in RECIPE_PRESETS.items():
        preset = yaml.safe_load((PRESETS / "reward_preset" / f"{reward_preset}.yaml").read_text())
        kwargs = dict(preset["reward_kwargs"])
        assert kwargs.pop("ablation") == ablation
        assert kwargs.pop("note_reward") == ABLATIONS[ablation].get("note_reward", 0.1)
        expected = {k: v for k, v in method["reward_kwargs"].items() if k != "note_reward"}
        assert {**preset, "reward_kwargs": kwargs} == {**method, "reward_kwargs": expected}, ablation


def test_every_variant_prompt_is_packaged() -> None:
    for reward_preset, rollout_preset in RECIPE_PRESETS.values():
        assert (PRESETS / "reward_preset" / f"{reward_preset}.yaml").is_file()
        prompt = composed(reward_preset, rollout_preset)["actor_rollout_ref"]["rollout"]["custom"]["evidence_search"]
        if prompt.get("prompt"):
            assert "{question}" in load_prompt(prompt["prompt"])
