"""benchmarks/learning.py's pure parts: per-sample measures, windows, the table, the CSV, the direction verdicts,
the Search-R1 arm's composed reward, the runs' cost profile; and the smoke package's held-out split and neutral
warm-up.

The directions themselves are the benchmark's output (docs/learning-benchmark.md): never asserted here. The verdict
logic is checked on made-up numbers.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark
from recipe_commands import dry_run, overrides, trainer_argv

REPO = Path(__file__).resolve().parents[2]


learning = load_benchmark("learning")
Point = learning.Point


# --- per-sample measures -------------------------------------------------------------------------------------


def test_search_measures_read_the_training_dump_and_the_composite_keys_alike() -> None:
    evinote_train = [  # training dump: nested columns
        {"score": 1.4, "reward_extra_info": {"em": 1.0, "eqr": 0.4, "format_ok": 1.0}, "rollout": {"summary_count": 1}},
        {"score": 0.0, "reward_extra_info": {"em": 0.0, "eqr": 0.0, "format_ok": 0.0}, "rollout": {"summary_count": 0}},
    ]
    search_r1_validation = [  # validation dump of the composite manager: flat keys, EviNote's scored at weight 0
        {"score": 1.0, "search_r1.em": 1.0, "evinote.eqr": 0.8, "evinote.em": 1.0, "summary_count": 2.0},
        {"score": 0.0, "search_r1.em": 0.0, "evinote.eqr": 0.0, "evinote.em": 0.0, "summary_count": 0.0},
        {"score": 0.0, "search_r1.em": 0.0, "evinote.eqr": 0.2, "evinote.em": 0.0, "summary_count": 1.0},
    ]
    a = learning.aggregate(evinote_train, "search")
    assert a["note_rate"] == 0.5 and a["eqr"] == pytest.approx(0.2) and a["em"] == 0.5 and a["format"] == 0.5
    assert a["score"] == pytest.approx(0.7)
    b = learning.aggregate(search_r1_validation, "search")
    assert (
        b["note_rate"] == pytest.approx(2 / 3) and b["eqr"] == pytest.approx(1 / 3) and b["em"] == pytest.approx(1 / 3)
    )


def test_compression_ratio_is_the_mean_of_per_sample_ratios_skipping_samples_without_evidence() -> None:
    entries = [
        {"reward_extra_info": {"len_p": 900.0, "len_e": 30.0, "ans_f": 0.5, "format": 1.0}},
        {"reward_extra_info": {"len_p": 900.0, "len_e": 90.0, "ans_f": 0.0, "format": 1.0}},
        {"reward_extra_info": {"len_p": 900.0, "len_e": 0.0, "ans_f": 1.0, "format": 0.0}},
    ]
    measures = learning.aggregate(entries, "eviomni")
    assert measures["compression_ratio"] == pytest.approx((30 + 10) / 2)  # not 2700 / 120
    assert measures["f1"] == pytest.approx(0.5) and measures["format"] == pytest.approx(2 / 3)


def test_grace_balanced_accuracy_weighs_both_classes_equally_and_an_invalid_structure_is_wrong() -> None:
    def sample(answerable: bool, evidence: bool, fmt: float = 0.5) -> dict:
        return {"answerable": float(answerable), "chose_evidence": float(evidence), "format": fmt}

    entries = [
        sample(True, True),
        sample(True, True),
        sample(True, True, fmt=0.0),  # right path but no valid structure: wrong
        sample(False, False),
        sample(False, True),  # quoted evidence for an unanswerable context: wrong
    ]
    measures = learning.aggregate(entries, "grace")
    assert measures["answerable_accuracy"] == pytest.approx(2 / 3)
    assert measures["unanswerable_accuracy"] == pytest.approx(1 / 2)
    assert measures["balanced_accuracy"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert measures["path_accuracy"] == pytest.approx(3 / 5)
    only_answerable = learning.aggregate(entries[:3], "grace")
    assert "balanced_accuracy" not in only_answerable  # undefined without both classes, not 0


def test_an_unknown_arm_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown arm kind"):
        learning.aggregate([], "nope")


# --- windows, changes, table, CSV ----------------------------------------------------------------------------


def _curve(arm: str, seed: int, metric: str, values: dict[int, float], split: str = "train") -> list:
    return [Point(arm, seed, step, split, metric, value) for step, value in values.items()]


def test_windows_are_the_first_and_last_third_of_the_training_steps() -> None:
    assert learning.window([0, 1, 2, 3, 4, 5, 6]) == ([1, 2], [5, 6])
    assert learning.window([1, 2]) == ([1], [2])
    assert learning.window([0]) == ([], [])


def test_a_change_averages_windows_per_seed_and_held_out_compares_step_0_with_the_last_validation() -> None:
    points = _curve("evinote", 1, "note_rate", {1: 0.4, 2: 0.6, 3: 0.5, 4: 0.7, 5: 0.8, 6: 0.9})
    points += _curve("evinote", 2, "note_rate", {1: 0.5, 2: 0.5, 3: 0.5, 4: 0.5, 5: 0.4, 6: 0.4})
    points += _curve("evinote", 1, "note_rate", {0: 0.3, 6: 0.6}, split="heldout")
    train = learning.change(points, "evinote", "train", "note_rate")
    assert train.per_seed == {1: (pytest.approx(0.5), pytest.approx(0.85)), 2: (0.5, 0.4)}
    assert train.delta == pytest.approx(((0.85 - 0.5) + (0.4 - 0.5)) / 2)
    assert train.seed_deltas() == [pytest.approx(0.35), pytest.approx(-0.1)]
    held = learning.change(points, "evinote", "heldout", "note_rate")
    assert held.per_seed == {1: (0.3, 0.6)}
    assert learning.change(points, "search_r1", "train", "note_rate") is None


def test_the_table_has_a_row_per_arm_split_and_measure_found(tmp_path: Path) -> None:
    points = _curve("grace", 1, "balanced_accuracy", {1: 0.5, 2: 0.5, 3: 0.75})
    points += _curve("grace", 1, "format", {1: 1.0, 2: 1.0, 3: 1.0})
    rows = learning.summary_table(points, ["grace", "eviomni"])
    assert [(r["arm"], r["metric"]) for r in rows] == [("grace", "balanced_accuracy"), ("grace", "format")]
    assert rows[0]["change"] == pytest.approx(0.25)
    text = learning.format_table(rows)
    assert "balanced_accuracy" in text and "+0.250" in text
    learning.write_csv(points, tmp_path / "curves.csv")
    assert learning.read_csv(tmp_path / "curves.csv") == points


def test_run_points_reads_verls_file_logger_and_both_dumps(tmp_path: Path) -> None:
    import json

    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "data": {"reward/evinote/eqr/mean": 0.25, "rollout/note_rate": 0.5, "perf/x": 3}}) + "\n"
    )
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / "1.jsonl").write_text(
        json.dumps({"score": 1.0, "reward_extra_info": {"eqr": 0.5}, "rollout": {"summary_count": 1}}) + "\n"
    )
    (tmp_path / "validation").mkdir()
    (tmp_path / "validation" / "0.jsonl").write_text(json.dumps({"score": 0.0, "summary_count": 0}) + "\n")
    points = learning.run_points("evinote", 1, "search", tmp_path)
    found = {(p.split, p.step, p.metric): p.value for p in points}
    assert found[("train", 1, "reward/evinote/eqr/mean")] == 0.25
    assert ("train", 1, "perf/x") not in found  # only rewards, rollout behaviour, score and grad norm
    assert found[("train", 1, "note_rate")] == 1.0 and found[("train", 1, "eqr")] == 0.5
    assert found[("heldout", 0, "note_rate")] == 0.0


# --- direction verdicts (on made-up numbers) -----------------------------------------------------------------


def _verdict(found: list, start: str, split: str = "train"):
    return next(d for d in found if d.claim.startswith(start) and d.split == split)


def test_evinote_direction_compares_the_rise_under_each_reward() -> None:
    points = _curve("evinote", 1, "note_rate", {1: 0.5, 2: 0.5, 3: 0.7})
    points += _curve("search_r1", 1, "note_rate", {1: 0.5, 2: 0.5, 3: 0.6})
    found = learning.directions(points)
    note = _verdict(found, "EviNote vs Search-R1: note rate")
    assert note.holds is True and note.consistent is True and "+0.200" in note.evidence and "+0.100" in note.evidence
    assert _verdict(found, "EviNote vs Search-R1: EQR").holds is None  # not measured: not a failure
    points = _curve("evinote", 1, "eqr", {1: 0.5, 2: 0.5, 3: 0.5}) + _curve("search_r1", 1, "eqr", {1: 0.1, 3: 0.4})
    assert _verdict(learning.directions(points), "EviNote vs Search-R1: EQR").holds is False
    # both fall, EviNote's less: not a rise
    points = _curve("evinote", 1, "eqr", {1: 0.5, 2: 0.4}) + _curve("search_r1", 1, "eqr", {1: 0.5, 2: 0.1})
    assert _verdict(learning.directions(points), "EviNote vs Search-R1: EQR").holds is False


def test_a_rise_within_the_minimum_effect_is_no_rise() -> None:
    small = learning.MIN_EFFECT / 2
    points = _curve("evinote", 1, "eqr", {1: 0.0, 2: small}) + _curve("search_r1", 1, "eqr", {1: 0.0, 2: 0.0})
    assert _verdict(learning.directions(points), "EviNote vs Search-R1: EQR").holds is False
    points = _curve("grace", 1, "balanced_accuracy", {1: 0.5, 2: 0.5 + small})
    assert _verdict(learning.directions(points), "GRACE").holds is False


def test_eviomni_direction_needs_compression_up_and_f1_not_down() -> None:
    def verdict(cr: tuple[float, float], f1: tuple[float, float]):
        points = _curve("eviomni", 1, "compression_ratio", {1: cr[0], 2: cr[1]})
        points += _curve("eviomni", 1, "f1", {1: f1[0], 2: f1[1]})
        return _verdict(learning.directions(points), "EviOmni").holds

    assert verdict((10, 12), (0.30, 0.30)) is True
    assert verdict((10, 12), (0.30, 0.30 - learning.F1_TOLERANCE / 2)) is True  # within the tolerance
    assert verdict((10, 12), (0.30, 0.20)) is False  # compression bought with F1
    assert verdict((12, 10), (0.30, 0.40)) is False
    assert verdict((40, 40.2), (0.30, 0.30)) is False  # 0.5 % more compression: within the minimum effect


def test_the_branch_is_where_the_last_reply_turn_starts() -> None:
    # prompt, search turn (trained), observation (not), reply turn (trained)
    labels = [-100, -100, 5, 6, -100, -100, -100, 7, 8, 9]
    assert learning.branch_prefix(labels) == 7
    assert learning.branch_prefix([-100, 1, 2, -100]) == 1


def test_grace_direction_and_seed_agreement() -> None:
    points = _curve("grace", 1, "balanced_accuracy", {1: 0.5, 2: 0.7}) + _curve(
        "grace", 2, "balanced_accuracy", {1: 0.5, 2: 0.45}
    )
    grace = _verdict(learning.directions(points), "GRACE")
    assert grace.holds is True and grace.consistent is False  # the mean rises, one seed falls
    assert "seeds disagree" in learning.format_directions([grace])


# --- the Search-R1 arm's reward, as Hydra composes it --------------------------------------------------------


def test_the_search_r1_arm_scores_exact_match_and_logs_evinote_at_weight_zero() -> None:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from verl_evidence.reward_managers.scorers import load_function

    arm = learning.ARMS["search_r1"]
    assert arm.recipe == learning.ARMS["evinote"].recipe and arm.method == learning.ARMS["evinote"].method
    assert arm.warmup == learning.ARMS["evinote"].warmup == "search_neutral"
    with initialize_config_dir(config_dir=str(REPO / "recipes" / "presets"), version_base=None):
        cfg = compose(config_name="evinote_grpo", overrides=list(arm.overrides))
    assert cfg.reward.reward_manager.name == "composite"
    components = OmegaConf.to_container(cfg.reward.reward_kwargs.components)
    assert [(c["name"], c["reward"], c["weight"]) for c in components] == [
        ("search_r1", "verl_evidence.rewards.answer:compute_score", 1.0),
        ("evinote", "evinote", 0.0),
    ]
    scored = load_function(components[0]["reward"])(solution_str="<answer>Paris</answer>", ground_truth="Paris")
    assert set(components[0]["keys"]) <= set(scored) and scored["score"] == 1.0


# --- the fixed-batch check and its sign control --------------------------------------------------------------


def _reward_curve(label: str, seed: int, values: list[float]) -> list:
    return _curve(label, seed, learning.reward_metric(label), dict(enumerate(values, start=1)))


def test_a_trend_is_last_third_minus_first_third_against_the_step_to_step_spread() -> None:
    found = learning.trend({0: 9.0, 1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4, 5: 0.5, 6: 0.6})  # step 0 (a validation) left out
    assert found.margin == pytest.approx(0.4) and found.spread == pytest.approx(0.0) and found.steps == 6
    noisy = learning.trend({1: 0.0, 2: 1.0, 3: 0.0, 4: 1.0, 5: 0.0, 6: 1.0})
    assert noisy.margin == pytest.approx(0.0) and noisy.spread == pytest.approx(
        0.9798, abs=1e-4
    )  # std of the diffs 1,-1,1,-1,1
    assert "spread 0.980" in noisy.describe()


def test_sign_check_needs_a_rise_beyond_the_spread_in_enough_seeds_and_a_fall_in_every_negated_seed() -> None:
    rising, falling = [0.1, 0.1, 0.2, 0.2, 0.3, 0.3], [0.3, 0.3, 0.2, 0.2, 0.1, 0.1]
    points = _reward_curve("eviomni", 1, rising) + _reward_curve("eviomni", 2, rising)
    only_plain = learning.sign_checks(points, ["eviomni"])[0]
    assert only_plain.rises and not only_plain.falls
    assert only_plain.verdict == "rises: 2 of 2 seeds rise beyond their spread (2 needed) (no sign control run)"
    negated = "eviomni" + learning.NEGATED_SUFFIX
    shown = points + _reward_curve(negated, 1, falling) + _reward_curve(negated, 2, falling)
    check = learning.sign_checks(shown, ["eviomni"])[0]
    assert check.rises and check.falls
    assert check.verdict == "SHOWN: 2 of 2 seeds rise beyond their spread (2 needed), and falls in every negated seed"
    # one negated seed rises: the reward did not move the policy in both directions
    not_shown = points + _reward_curve(negated, 1, falling) + _reward_curve(negated, 2, rising)
    assert "not shown" in learning.sign_checks(not_shown, ["eviomni"])[0].verdict
    # one plain seed of two falls: 1 of 2 is short of the 2 needed
    mixed = _reward_curve("eviomni", 1, rising) + _reward_curve("eviomni", 2, falling)
    assert learning.sign_checks(mixed, ["eviomni"])[0].verdict == (
        "DOES NOT RISE: 1 of 2 seeds rise beyond their spread (2 needed)"
    )
    # a rise smaller than the step-to-step spread is no rise, whatever the negated run does
    jumpy = [0.0, 1.0, 0.0, 1.0, 0.1, 1.1]
    flagged = _reward_curve("grace", 1, jumpy) + _reward_curve("grace" + learning.NEGATED_SUFFIX, 1, jumpy[::-1])
    within = learning.sign_checks(flagged, ["grace"])[0]
    assert within.plain[1].margin > 0 and within.rising_seeds == [] and not within.rises
    assert within.verdict.startswith("DOES NOT RISE: 0 of 1 seeds")
    assert "negated  seed 1" in learning.format_sign_checks([within])
    # six steps and two seeds: the verdict is printed with what the runs lack of the protocol (15 steps, 5 seeds)
    assert check.short_of == "6 steps of the 15 asked; 2 plain and 2 negated seed(s) of the 5 asked"
    assert only_plain.short_of.endswith("2 plain and 0 negated seed(s) of the 5 asked")  # the comparison's runs
    assert "[short of the protocol: 6 steps" in learning.format_sign_checks([check])
    long = [0.1 * i for i in range(15)]
    full = [
        _reward_curve("grace", seed, long) + _reward_curve("grace" + learning.NEGATED_SUFFIX, seed, long[::-1])
        for seed in (4, 5, 6, 7, 8)
    ]
    assert learning.sign_checks([p for curve in full for p in curve], ["grace"])[0].short_of == ""


def test_the_seeds_a_verdict_needs_are_the_stated_share_of_any_seed_list_rounded_up() -> None:
    assert learning.RISE_SHARE == 0.8
    assert [learning.seeds_needed(n) for n in (1, 2, 3, 4, 5, 6, 10)] == [1, 2, 3, 4, 4, 5, 8]


def _five_seeds(plain: dict[int, list[float]], negated: dict[int, list[float]]) -> list:
    points = []
    for seed, values in plain.items():
        points += _reward_curve("grace", seed, values)
    for seed, values in negated.items():
        points += _reward_curve("grace" + learning.NEGATED_SUFFIX, seed, values)
    return points


def test_four_of_five_seeds_rising_beyond_their_spread_is_shown_three_is_not() -> None:
    """Made-up runs on seeds chosen at run time (4-8): 15 steps, a steady climb (spread ~0), a flat noisy run
    (rises, but within its spread) and a fall."""
    climb = [1.0 + 0.1 * i for i in range(15)]
    noisy = [2.0, 2.6, 1.9, 2.5, 2.0, 2.4, 1.9, 2.6, 2.0, 2.5, 2.1, 2.5, 2.0, 2.6, 2.2]  # +0.14, spread ~0.6
    drop = climb[::-1]
    down = dict.fromkeys((4, 5, 6, 7, 8), drop)
    four = learning.sign_checks(_five_seeds({4: noisy, 5: climb, 6: climb, 7: climb, 8: climb}, down), ["grace"])[0]
    assert learning.trend(dict(enumerate(noisy, start=1))).margin > 0  # the noisy seed rises, within its spread
    assert four.rising_seeds == [5, 6, 7, 8] and four.needed == 4 and four.rises and four.falls
    assert four.verdict.startswith("SHOWN: 4 of 5 seeds rise beyond their spread (4 needed)")
    assert four.short_of == ""
    # a fifth seed that falls outright is allowed as well: the share, not every seed
    fall = learning.sign_checks(_five_seeds({4: drop, 5: climb, 6: climb, 7: climb, 8: climb}, down), ["grace"])[0]
    assert fall.verdict.startswith("SHOWN: 4 of 5")
    three = learning.sign_checks(_five_seeds({4: noisy, 5: drop, 6: climb, 7: climb, 8: climb}, down), ["grace"])[0]
    assert not three.rises and three.verdict.startswith("DOES NOT RISE: 3 of 5 seeds rise beyond their spread")
    # every plain seed rises, but one negated seed of five does not fall: not shown
    up = dict.fromkeys((4, 5, 6, 7, 8), climb)
    one_up = learning.sign_checks(_five_seeds(up, {**down, 8: climb}), ["grace"])[0]
    assert one_up.rises and not one_up.falls and one_up.verdict.endswith("not shown")


def _headroom_points(label: str, seed: int, rewards: list[float], step_1_ceiling: float) -> list:
    return _reward_curve(label, seed, rewards) + _curve(label, seed, "ceiling", {1: step_1_ceiling})


def test_a_run_that_starts_at_its_ceiling_has_no_headroom_and_one_below_it_does_not_rise() -> None:
    flat_high = [3.8, 3.9, 3.7, 3.6, 3.8, 3.7]  # step 1 at 3.8 of 4.0: 95 %, margin < 0
    falling = [0.3, 0.3, 0.2, 0.2, 0.1, 0.1]
    negated = "grace" + learning.NEGATED_SUFFIX
    points = _headroom_points("grace", 1, flat_high, 4.0) + _reward_curve(negated, 1, falling)
    check = learning.sign_checks(points, ["grace"])[0]
    assert check.start_share == {1: pytest.approx(0.95)} and not check.rises
    assert check.verdict == (
        "no headroom: starts at 95% of the batch's ceiling (seed 1 does not rise); negated, falls in every seed"
    )
    assert "step 1 at 95% of the batch's ceiling" in learning.format_sign_checks([check])
    # the same curve with room above it (step 1 at 3.8 of 6.5: 58 %): its failure to rise stands
    roomy = learning.sign_checks(_headroom_points("grace", 1, flat_high, 6.5), ["grace"])[0]
    assert roomy.verdict == "DOES NOT RISE: 0 of 1 seeds rise beyond their spread (1 needed)"
    # one seed without headroom never hides another that falls with room to rise
    mixed = _headroom_points("grace", 1, flat_high, 4.0) + _headroom_points("grace", 2, flat_high, 6.5)
    assert learning.sign_checks(mixed, ["grace"])[0].verdict.startswith("DOES NOT RISE: 0 of 2 seeds")
    # an arm without a known ceiling keeps the plain verdict
    unknown = learning.sign_checks(_reward_curve("eviomni", 1, flat_high), ["eviomni"])[0]
    assert unknown.start_share == {} and unknown.verdict.startswith("DOES NOT RISE: 0 of 1 seeds")
    # a rising run is judged as before, with its start printed
    climb = [3.0, 3.1, 3.2, 3.3, 3.4, 3.5]
    rising = learning.sign_checks(_headroom_points("grace", 1, climb, 4.0), ["grace"])[0]
    assert rising.rises and rising.verdict.startswith("rises: 1 of 1 seeds") and rising.verdict.endswith("run)")


def test_graces_ceiling_is_its_rows_most_and_a_steps_ceiling_is_its_samples_mean() -> None:
    assert learning.grace_ceiling({"answerable": 1.0}) == pytest.approx(6.5)  # 0.5 + 1 + alpha 2 + beta 3
    assert learning.grace_ceiling({"answerable": 0.0}) == pytest.approx(1.5)  # the recall path's answer is unscored
    assert learning.grace_ceiling({}) is None
    entries = [{"score": 5.0, "reward_extra_info": {"answerable": True}}] * 3 + [
        {"score": 1.5, "reward_extra_info": {"answerable": False}}
    ]
    measures = learning.aggregate(entries, "grace", learning.ARMS["grace"].ceiling)
    assert measures["ceiling"] == pytest.approx((3 * 6.5 + 1.5) / 4)
    assert "ceiling" not in learning.aggregate(entries, "grace")


def test_a_fixed_batch_shares_its_questions_equally_between_the_classes_whatever_the_order() -> None:
    rows = [_row(f"a{i}?", True) for i in range(4)] + [_row(f"u{i}?", False) for i in range(4)]
    batch = learning.fixed_batch_rows(rows, 2, "answerable")
    assert sorted(r["reward_model"]["ground_truth"]["answerable"] for r in batch) == [False, True]
    assert learning.fixed_batch_rows(list(reversed(rows)), 2, "answerable") == batch  # the same for every run
    four = learning.fixed_batch_rows(rows, 4, "answerable")
    assert [r for r in batch if r in four] == batch  # a larger batch keeps the smaller one's questions
    with pytest.raises(ValueError, match="cannot be shared equally"):
        learning.fixed_batch_rows(rows, 3, "answerable")
    with pytest.raises(ValueError, match="10 questions asked, 8 found"):
        learning.fixed_batch_rows(rows, 10, "answerable")


def test_the_negated_reward_reads_its_own_logged_score_not_the_trained_total() -> None:
    assert learning.reward_metric("grace") == "critic/score/mean"
    assert learning.reward_metric("grace-negated") == "reward/composite/negated.score/mean"


@pytest.mark.parametrize("arm_name", list(learning.ARMS))
def test_every_arms_sign_control_is_its_own_reward_at_weight_minus_one(arm_name: str) -> None:
    """Composed by Hydra from the arm's recipe preset as the benchmark passes it, then built by the real composite."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from verl_evidence.reward_managers.scorers import build_composite

    arm = learning.ARMS[arm_name]
    config_name = arm.recipe.removesuffix(".sh")
    with initialize_config_dir(config_dir=str(REPO / "recipes" / "presets"), version_base=None):
        plain = compose(config_name=config_name, overrides=list(arm.overrides))
        negated = compose(config_name=config_name, overrides=list(learning.negated_overrides(arm_name)))
    assert negated.reward.reward_manager.name == "composite"
    components = OmegaConf.to_container(negated.reward.reward_kwargs.components)
    signed = [c for c in components if c["weight"] != 0]
    assert [(c["name"], c["weight"]) for c in signed] == [(learning.NEGATED_LABEL, -1.0)]
    # the same reward, with the options the plain run trains with
    if plain.reward.reward_manager.name == "composite":
        plain_signed = [c for c in OmegaConf.to_container(plain.reward.reward_kwargs.components) if c["weight"] != 0]
        assert [c["reward"] for c in plain_signed] == [signed[0]["reward"]] and plain_signed[0]["weight"] == 1.0
    elif plain.reward.reward_manager.name in {"dapo", "naive"}:
        function = plain.reward.custom_reward_function
        assert function.path.endswith("." + signed[0]["reward"])
        assert signed[0]["kwargs"] == OmegaConf.to_container(function.reward_kwargs)
    else:
        assert signed[0]["reward"] == plain.reward.reward_manager.name
        options = {
            k: v for k, v in OmegaConf.to_container(plain.reward.reward_kwargs).items() if not k.startswith("nli_")
        }
        assert signed[0]["kwargs"] == options
    if all(c["reward"] != "evinote" for c in components):  # EviNote's scorer needs its NLI judge: trainer only
        built = build_composite(components)
        assert [(label, weight) for label, weight, _ in built.components if weight] == [(learning.NEGATED_LABEL, -1.0)]


def test_hydra_values_keep_strings_and_markers_intact() -> None:
    assert (
        learning.hydra_value({"markers": ["*", "-"], "alpha": 2.0, "on": True})
        == "{markers:['*','-'],alpha:2.0,on:true}"
    )
    assert learning.hydra_value("it's") == "'it\\'s'"


def test_fire_rate_is_the_share_of_step_1_samples_the_reward_paid() -> None:
    entries = [{"score": 0.0}, {"score": 1.1}, {"score": -0.5}, {"score": 0.0}]
    assert learning.aggregate(entries, "search")["fired"] == 0.5
    points = _curve("evinote", 1, "fired", {1: 0.25, 2: 0.9}) + _curve("evinote", 2, "fired", {1: 0.75})
    assert learning.fire_rates(points, ["evinote", "grace"]) == {"evinote": 0.5}


def test_groups_with_a_spread_are_the_prompts_whose_samples_rewards_differ() -> None:
    # two prompts all paid alike (GRPO's advantage 0 for all four samples), one whose samples differ
    entries = [
        {"input": "q1", "score": 1.0},
        {"input": "q1", "score": 1.0},
        {"input": "q2", "score": 0.0},
        {"input": "q2", "score": 0.0},
        {"input": "q3", "score": 0.5},
        {"input": "q3", "score": 0.0},
    ]
    assert learning.groups_with_spread(entries) == pytest.approx(1 / 3)
    assert learning.aggregate(entries, "search")["groups_with_spread"] == pytest.approx(1 / 3)
    assert learning.groups_with_spread([{"score": 1.0}]) is None  # no prompt to group by: not measured
    points = _curve("evinote", 1, "groups_with_spread", {1: 0.0, 2: 1.0}) + _curve(
        "evinote", 2, "groups_with_spread", {1: 0.5}
    )
    assert learning.fire_rates(points, ["evinote"], "groups_with_spread") == {"evinote": 0.25}


def test_a_runs_cost_splits_its_wall_time_into_start_steps_and_validations() -> None:
    step = {"timing_s/step": 10.0, "timing_s/gen": 6.0, "timing_s/update_actor": 2.0, "timing_s/ref": 1.0}
    metrics = {0: {"val-core/x": 1.0}, 1: dict(step), 2: {**step, "timing_s/step": 12.0, "timing_s/testing": 3.0}}
    cost = learning.run_cost(metrics, wall_s=80.0)
    assert cost.steps == 2 and cost.per_step["step"] == 11.0 and cost.per_step["gen"] == 6.0
    assert cost.validation_s == 3.0 and cost.start_s == 80.0 - 22.0 - 3.0
    assert cost.per_step["old_log_prob"] == 0.0  # a timer a run did not log counts as no time
    assert learning.run_cost({0: {"val-core/x": 1.0}}, wall_s=30.0) is None  # no training step, nothing to split
    assert "evinote-seed1" in learning.format_costs({"evinote-seed1": cost})


def test_a_protocols_minutes_are_its_runs_start_and_steps_shared_between_parallel_runs() -> None:
    # 5 arms x 3 seeds x 2 signs = 30 runs of 60 s start + 20 steps of 6 s: 30 x 180 s = 90 min, 45 two at a time
    assert learning.protocol_minutes(5, 3, 2, 20, start_s=60, step_s=6) == 90.0
    assert learning.protocol_minutes(5, 3, 2, 20, start_s=60, step_s=6, parallel=2) == 45.0


def test_a_direction_counts_only_when_every_seed_agrees_beyond_their_spread() -> None:
    agree = _curve("grace", 1, "balanced_accuracy", {1: 0.5, 2: 0.7}) + _curve(
        "grace", 2, "balanced_accuracy", {1: 0.5, 2: 0.72}
    )
    grace = _verdict(learning.directions(agree), "GRACE")
    assert grace.holds and grace.consistent and grace.beyond_spread and grace.counts
    assert "COUNTS" in learning.format_directions([grace])
    # every seed rises, but by amounts so different that the mean is within their spread
    spread = _curve("grace", 1, "balanced_accuracy", {1: 0.5, 2: 0.52}) + _curve(
        "grace", 2, "balanced_accuracy", {1: 0.5, 2: 0.98}
    )
    wide = _verdict(learning.directions(spread), "GRACE")
    assert wide.holds and wide.consistent and not wide.beyond_spread and not wide.counts
    assert "within the seeds' spread" in learning.format_directions([wide])
    # one seed: no spread to compare with, so nothing counts
    one = _verdict(learning.directions(_curve("grace", 1, "balanced_accuracy", {1: 0.5, 2: 0.9})), "GRACE")
    assert one.holds and one.beyond_spread is None and not one.counts
    assert "one seed: no spread" in learning.format_directions([one])


# --- the smoke package: held-out split and the neutral warm-up -----------------------------------------------


def _row(question: str, answerable: bool | None = None) -> dict:
    truth = {"target": ["x"]} if answerable is None else {"target": ["x"], "answerable": answerable}
    return {"extra_info": {"question": question}, "reward_model": {"ground_truth": truth}}


def test_heldout_split_skips_every_question_a_warm_up_contains_and_is_fixed_by_hash() -> None:
    from verl_evidence.local.smoke.warmup_data import heldout_split, question_hash

    rows = [_row(f"question number {i}?") for i in range(30)] + [_row("question number 3?")]
    seen = ["user: question number 3?\nassistant: <answer>x</answer>", "question number 7? and question number 11?"]
    held = heldout_split(rows, seen, 10)
    questions = [r["extra_info"]["question"] for r in held]
    assert len(questions) == 10 == len(set(questions))  # one row per question
    assert not {"question number 3?", "question number 7?", "question number 11?"} & set(questions)
    assert questions == sorted(questions, key=question_hash)
    assert heldout_split(list(reversed(rows)), seen, 10) == held  # the order of the rows does not matter


def test_heldout_split_balances_answerable_and_unanswerable() -> None:
    from verl_evidence.local.smoke.warmup_data import heldout_split

    rows = [_row(f"a{i}?", True) for i in range(10)] + [_row(f"u{i}?", False) for i in range(3)]
    held = heldout_split(rows, [], 6, balance_key="answerable")
    flags = [r["reward_model"]["ground_truth"]["answerable"] for r in held]
    assert flags.count(True) == 3 and flags.count(False) == 3


@pytest.fixture(scope="module")
def smoke_cache(tmp_path_factory: pytest.TempPathFactory):
    """A fresh smoke cache with the random policy's tokenizer (the warm-up examples need no trained policy)."""
    import os

    from verl_evidence.local.smoke.models import random_policy

    root = tmp_path_factory.mktemp("smoke")
    previous = os.environ.get("VERL_EVIDENCE_SMOKE_DIR")
    os.environ["VERL_EVIDENCE_SMOKE_DIR"] = str(root)
    try:
        from verl_evidence.local.smoke.settings import smoke_dir

        yield random_policy(smoke_dir() / "random_policy")
    finally:
        if previous is None:
            os.environ.pop("VERL_EVIDENCE_SMOKE_DIR", None)
        else:
            os.environ["VERL_EVIDENCE_SMOKE_DIR"] = previous


def test_the_neutral_warm_up_notes_half_its_questions_quoting_the_retrieved_passage(smoke_cache: Path) -> None:
    from verl_evidence.local.smoke.warmup_data import warmup_examples
    from verl_evidence.rewards.evinote import format_ok, last_summary, notes_ok

    examples = warmup_examples("search_neutral", smoke_cache)
    noted = [e for e in examples if "<summary>" in e["messages"][-1]["content"]]
    questions = [e["question"] for e in examples]
    assert len(examples) == 8 == len(set(questions)) and len(noted) == 4  # half the questions, each one way only
    # the same questions the search family's warm-up (and so the held-out split) knows
    assert set(questions) <= {e["question"] for e in warmup_examples("search", smoke_cache)}
    for example in noted:
        reply = example["segments"][-1]["text"]
        observation = example["segments"][2]["text"]
        note = last_summary(reply)
        assert format_ok(reply) and notes_ok(note), reply  # EviNote's gate pays the reply the policy learns
        quoted = re.fullmatch(r"\*(.+)\*", note).group(1)
        assert re.search(r"\(Title: [^)]*\) " + re.escape(quoted), observation), (quoted, observation)
    for example in examples:  # the context the loop builds: the search, the passage, the final-turn notice
        assert [s["trained"] for s in example["segments"]] == [True, False, False, False, False, True]


def test_the_both_ways_search_warm_up_shows_every_question_with_a_note_and_without(smoke_cache: Path) -> None:
    from verl_evidence.local.smoke.warmup_data import warmup_examples
    from verl_evidence.rewards.evinote import format_ok, last_summary, notes_ok

    neutral = warmup_examples("search_neutral", smoke_cache)
    both = warmup_examples("search_both_ways", smoke_cache)
    questions = [e["question"] for e in neutral]
    assert sorted(e["question"] for e in both) == sorted(questions * 2)
    for question in questions:
        replies = [e["segments"][-1]["text"] for e in both if e["question"] == question]
        assert sorted("<summary>" in reply for reply in replies) == [False, True], replies
        noted = next(reply for reply in replies if "<summary>" in reply)
        assert format_ok(noted) and notes_ok(last_summary(noted))  # EviNote's gate pays the noted reply
        contexts = {tuple(s["text"] for s in e["segments"][:-1]) for e in both if e["question"] == question}
        assert len(contexts) == 1  # the same search and observation: the replies differ only in the note


def test_the_both_answers_search_warm_up_answers_every_question_right_and_wrong_with_a_note_and_without(
    smoke_cache: Path,
) -> None:
    from verl_evidence.local.smoke.data import method_data, read_rows
    from verl_evidence.local.smoke.warmup_data import warmup_examples
    from verl_evidence.rewards.answer import compute_score as exact_match

    both_ways = warmup_examples("search_both_ways", smoke_cache)
    both_answers = warmup_examples("search_both_answers", smoke_cache)
    assert both_answers[: len(both_ways)] == both_ways  # search_both_ways' examples, then each answered wrong
    gold = {
        r["extra_info"]["question"]: r["reward_model"]["ground_truth"]
        for r in read_rows(method_data("evinote", smoke_cache))
    }
    questions = {e["question"] for e in both_ways}
    assert len(questions) == 8 and sorted(e["question"] for e in both_answers) == sorted(list(questions) * 4)
    for question in questions:
        examples = [e for e in both_answers if e["question"] == question]
        replies = [e["segments"][-1]["text"] for e in examples]
        outcome = sorted(("<summary>" in r, exact_match(None, r, gold[question])["em"]) for r in replies)
        assert outcome == [(False, 0.0), (False, 1.0), (True, 0.0), (True, 1.0)], (question, replies)
        contexts = {tuple(s["text"] for s in e["segments"][:-1]) for e in examples}
        assert len(contexts) == 1  # the same search and observation: the replies differ in the note and the answer


def test_the_mostly_noted_search_warm_up_repeats_each_noted_example_and_nothing_else(smoke_cache: Path) -> None:
    from verl_evidence.local.smoke.data import method_data, read_rows
    from verl_evidence.local.smoke.warmup_data import warmup_examples
    from verl_evidence.rewards.answer import compute_score as exact_match
    from verl_evidence.rewards.evinote import format_ok, last_summary, notes_ok

    both_answers = warmup_examples("search_both_answers", smoke_cache)
    mostly_noted = warmup_examples("search_mostly_noted", smoke_cache)
    assert mostly_noted[: len(both_answers)] == both_answers
    repeated = mostly_noted[len(both_answers) :]
    noted = [e for e in both_answers if "<summary>" in e["segments"][-1]["text"]]
    assert repeated == noted and len(noted) * 2 == len(both_answers)  # two thirds of the examples noted
    gold = {
        r["extra_info"]["question"]: r["reward_model"]["ground_truth"]
        for r in read_rows(method_data("evinote", smoke_cache))
    }
    for question in {e["question"] for e in both_answers}:
        replies = [e["segments"][-1]["text"] for e in mostly_noted if e["question"] == question]
        outcome = sorted(("<summary>" in r, exact_match(None, r, gold[question])["em"]) for r in replies)
        # each question still right and wrong, noted and not: a spread for EviNote's gate and for exact match
        assert outcome == [(False, 0.0), (False, 1.0), (True, 0.0), (True, 0.0), (True, 1.0), (True, 1.0)], question
        for reply in replies:
            if "<summary>" in reply:
                assert format_ok(reply) and notes_ok(last_summary(reply))  # every noted reply passes the note check


def test_the_search_arms_warm_up_both_ways_on_the_corpus_tokenizer(monkeypatch) -> None:
    from verl_evidence.local.tiny_models import CORPUS_TOKENIZER_ENV

    monkeypatch.delenv(CORPUS_TOKENIZER_ENV, raising=False)
    assert [learning.warmup_of(learning.ARMS[a]) for a in ("evinote", "search_r1", "grace", "eviomni")] == [
        "search_neutral",
        "search_neutral",
        "grace_judged",
        None,
    ]
    monkeypatch.setenv(CORPUS_TOKENIZER_ENV, "4000")
    assert [learning.warmup_of(learning.ARMS[a]) for a in ("evinote", "search_r1", "grace", "eviomni")] == [
        "search_mostly_noted",
        "search_mostly_noted",
        "grace_judged",
        None,
    ]


def test_the_neutral_grace_warm_up_shows_each_reply_in_both_paths_tags(smoke_cache: Path) -> None:
    from verl_evidence.local.smoke.warmup_data import warmup_examples
    from verl_evidence.rewards.grace import structure_ok

    grace = warmup_examples("grace", smoke_cache)
    neutral = warmup_examples("grace_neutral", smoke_cache)
    # the recipes' warm-up: evidence on its 4 answerable questions, recall on its 4 unanswerable ones
    assert [e["messages"][-1]["content"].startswith("<evidence>") for e in grace] == [True] * 4 + [False] * 4
    assert [e["question"] for e in neutral] == [e["question"] for e in grace for _ in range(2)]
    for example, (right, other) in zip(grace, zip(neutral[::2], neutral[1::2])):
        reply = example["messages"][-1]["content"]
        assert right["messages"] == example["messages"]  # the right path's reply is the recipes' own
        swapped = other["messages"][-1]["content"]
        assert structure_ok(swapped) and swapped.startswith("<llm>" if reply.startswith("<evidence>") else "<evidence>")
        # the same text inside the other path's tags: the two replies differ in the path alone
        plain = re.sub(r"</?(evidence|llm)>", "", reply)
        assert re.sub(r"</?(evidence|llm)>", "", swapped) == plain


def test_the_judged_grace_warm_up_opens_each_reply_with_its_contexts_judgement(smoke_cache: Path) -> None:
    from verl_evidence.local.smoke.warmup_data import GRACE_JUDGEMENTS, warmup_examples
    from verl_evidence.rewards.grace import config_from_kwargs, score

    grace = warmup_examples("grace", smoke_cache)
    neutral = warmup_examples("grace_neutral", smoke_cache)
    judged = warmup_examples("grace_judged", smoke_cache)
    assert [e["question"] for e in judged] == [e["question"] for e in neutral]
    config = config_from_kwargs({})
    for example, plain in zip(judged, neutral, strict=True):
        reply = example["messages"][-1]["content"]
        answerable = any(
            e["question"] == example["question"] and "<evidence>" in e["messages"][-1]["content"] for e in grace
        )
        # the judgement is right for the context, whichever path follows it; after it, grace_neutral's reply
        assert reply == f"<think>{GRACE_JUDGEMENTS[answerable]}</think>\n" + plain["messages"][-1]["content"]
        assert learning.judged_relevant(reply) is answerable
        # GRACE's reward skips the think block: the same score as the reply without it
        truth = {"target": ["x"], "evidence": ["y"], "answerable": answerable}
        args = (truth["target"], truth["evidence"], truth["answerable"], config)
        assert score(reply, *args) == score(plain["messages"][-1]["content"], *args)
    # each question once on each path after the same judgement: the path is for the reward to tie to the judgement
    for question in {e["question"] for e in judged}:
        replies = [e["messages"][-1]["content"] for e in judged if e["question"] == question]
        assert sorted("<evidence>" in r for r in replies) == [False, True]
        assert len({learning.judged_relevant(r) for r in replies}) == 1


def test_a_judgement_is_read_only_from_a_think_block_holding_one_of_the_two() -> None:
    assert learning.judged_relevant("<think>The references are relevant.</think>\n<evidence>x</evidence>") is True
    assert learning.judged_relevant("<think>The references are not relevant.</think><llm>x</llm>") is False
    assert learning.judged_relevant("<think>The references are</think><llm>x</llm>") is None
    assert learning.judged_relevant("<llm>The references are relevant.</llm>") is None
    assert learning.judged_relevant("") is None


def test_a_warm_up_variant_is_cached_under_its_data_version_and_a_family_under_its_name() -> None:
    from verl_evidence.local.smoke.settings import FAMILIES, VARIANT_VERSIONS, WARMUP_VARIANTS, warmup_cache_name

    assert [warmup_cache_name(f) for f in FAMILIES] == list(FAMILIES)  # the suite's smoke caches keep their names
    for variant in WARMUP_VARIANTS:
        assert warmup_cache_name(variant) == f"{variant}-v{VARIANT_VERSIONS[variant]}"


def test_held_out_rows_share_no_question_with_any_warm_up_or_training_rows(smoke_cache: Path) -> None:
    from verl_evidence.local.smoke.data import read_rows
    from verl_evidence.local.smoke.settings import WARMUP_STEPS
    from verl_evidence.local.smoke.warmup_data import heldout_rows, warmed_up_rows, warmup_examples

    trained = {
        e["question"] for family in WARMUP_STEPS for e in warmup_examples(family, smoke_cache) if "question" in e
    }
    for method, warmup in (
        ("evinote", "search_neutral"),
        ("evinote", "search_both_ways"),
        ("evinote", "search_both_answers"),
        ("evinote", "search_mostly_noted"),
        ("eviomni", None),
        ("grace", None),
        ("grace", "grace_neutral"),
        ("grace", "grace_judged"),
    ):
        held = read_rows(heldout_rows(method, smoke_cache, 8))
        train = read_rows(warmed_up_rows(method, smoke_cache, warmup=warmup))
        held_questions = {r["extra_info"]["question"] for r in held}
        assert len(held) == 8 == len(held_questions), method
        assert not held_questions & {r["extra_info"]["question"] for r in train}, method
        assert not held_questions & trained, method
    grace = read_rows(heldout_rows("grace", smoke_cache, 8))
    assert sorted(r["reward_model"]["ground_truth"]["answerable"] for r in grace) == [False] * 4 + [True] * 4


def test_a_warm_up_variant_must_share_the_methods_format() -> None:
    from verl_evidence.local.smoke.settings import warmup_family

    assert warmup_family("evinote", "search_neutral") == "search_neutral"
    assert warmup_family("search_r1", None) == "search"
    assert warmup_family("grace", "grace_neutral") == "grace_neutral"
    with pytest.raises(ValueError, match="trains the 'search' family's format"):
        warmup_family("evinote", "grace_neutral")
    with pytest.raises(ValueError, match="trains the 'eviomni' family's format"):
        warmup_family("eviomni", "search_neutral")
    with pytest.raises(ValueError, match="unknown warm-up 'nope'"):
        warmup_family("evinote", "nope")


def test_search_runs_share_the_benchmarks_retrieval_server_and_other_runs_get_a_port_of_their_own() -> None:
    url = "http://127.0.0.1:8123"
    assert learning.retrieval_env(learning.ARMS["evinote"], url) == {"RETRIEVAL_URL": url}
    assert learning.retrieval_env(learning.ARMS["search_r1"], url) == {"RETRIEVAL_URL": url}
    for arm, shared in (("eviomni", url), ("grace", url), ("evinote", None)):
        env = learning.retrieval_env(learning.ARMS[arm], shared)
        assert list(env) == ["RETRIEVAL_PORT"] and int(env["RETRIEVAL_PORT"]) > 0


# A stand-in for `verl-evidence serve` that keeps its stop contract: SIGINT stops it even when the process that started
# it ignores SIGINT (a shell's background job, as CI runs the suite), as retrieval_server/cli.py sets its handler
# itself; a child inheriting the ignore would wait out _stop's 60 s twice.
HEALTH_SERVER = """
import http.server, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def test_the_shared_retrieval_server_is_up_only_while_a_search_run_uses_it(tmp_path: Path) -> None:
    """Started for the first user, shared by a second, stopped when the last leaves, started anew for the next one."""
    import httpx

    script = tmp_path / "health_server.py"
    script.write_text(HEALTH_SERVER)
    log = tmp_path / "server.log"
    server = learning.SharedRetrievalServer(log, command=[sys.executable, str(script)], ready_timeout_s=30)
    assert server.starts == 0 and not log.exists()  # nothing started before a search run asks
    with server.serving() as first_url:
        assert httpx.get(f"{first_url}/health").status_code == 200
        with server.serving() as second_url:
            assert second_url == first_url  # the second run shares the first one's server
        assert httpx.get(f"{first_url}/health").status_code == 200  # still up: the first run has not left
    server.close()  # waits for the background stop
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{first_url}/health", timeout=2)
    with server.serving() as third_url:
        assert httpx.get(f"{third_url}/health").status_code == 200
    server.close()
    assert server.starts == 2
    text = log.read_text()
    assert text.count("# start ") == 2 and text.count("serving") == 2  # both starts' output kept


def test_a_shared_retrieval_server_that_dies_at_start_stops_the_run_naming_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    server = learning.SharedRetrievalServer(log, command=[sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(RuntimeError, match=r"exited \(3\).*server.log"), server.serving():
        pass
    server.close()


def test_plain_runs_validate_before_and_after_training_and_sign_control_runs_do_not() -> None:
    assert learning.validation_env(20, negate=False) == {"VAL_BEFORE_TRAIN": "true", "TEST_FREQ": "20"}
    assert learning.validation_env(15, negate=True) == {"VAL_BEFORE_TRAIN": "false", "TEST_FREQ": "-1"}


# --- updates a step -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arm", sorted(learning.ARMS))
def test_each_arm_makes_its_recipes_number_of_updates_a_step(arm: str) -> None:
    """The arm's ``updates_per_step`` is what its recipe's own command makes: prompts a step / prompts an update."""
    result = dry_run(learning.ARMS[arm].recipe)
    assert result.returncode == 0, result.stderr
    values = overrides(trainer_argv(result.stdout))
    prompts = int(values["data.train_batch_size"])
    per_update = int(values["actor_rollout_ref.actor.ppo_mini_batch_size"])
    assert prompts % per_update == 0
    assert learning.ARMS[arm].updates_per_step == prompts // per_update


def test_mini_batch_splits_the_step_into_the_recipes_updates() -> None:
    assert learning.mini_batch_size(8, 4) == 2
    assert learning.mini_batch_size(8, 2) == 4
    assert learning.mini_batch_size(8, 1) == 8
    assert learning.mini_batch_size(2, 4) == 1  # a batch smaller than the updates: one question an update
    with pytest.raises(ValueError, match="does not split into 4 equal updates"):
        learning.mini_batch_size(6, 4)


def test_the_warm_ups_build_longest_first_one_process_each(monkeypatch) -> None:
    from verl_evidence.local.tiny_models import CORPUS_TOKENIZER_ENV

    monkeypatch.setenv(CORPUS_TOKENIZER_ENV, "4000")
    built = []

    def run(command, env, **kwargs):
        built.append((command[-1], env[learning.WARMUP_ENV]))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(learning.subprocess, "run", run)
    groups = learning.warmup_groups(list(learning.ARMS))
    # one group per distinct warm-up (LEAR shares EviOmni's, Search-R1 EviNote's), the 2400-step one first
    assert groups == [["evinote", "search_r1"], ["grace"], ["eviomni", "lear"]]
    for group in groups:
        learning.build_warmup(learning.ARMS[group[0]])
    assert built == [("evinote", "search_mostly_noted"), ("grace", "grace_judged"), ("eviomni", "")]


def test_a_run_starts_once_its_own_warm_up_is_prepared_not_all_of_them() -> None:
    events: list[str] = []
    search_released = threading.Event()

    def prepare_one(group):
        events.append(f"prepare {group[0]} started")
        if group[0] == "search":
            assert search_released.wait(30)
        events.append(f"prepare {group[0]} done")

    def run_one(run):
        events.append(f"run {run[0]}{run[1]}")
        if run[0] == "omni" and run[1] == 1:
            search_released.set()  # the search warm-up is still building while this run goes
        return {"arm": run[0], "seed": run[1]}, Path(f"{run[0]}{run[1]}")

    runs = [("omni", 1), ("search", 1), ("omni", 2)]
    results = list(learning.run_when_prepared([["search"], ["omni"]], runs, 2, prepare_one, run_one))
    assert [record["arm"] + str(record["seed"]) for record, _ in results] == ["omni1", "search1", "omni2"]
    assert events.index("run omni1") < events.index("prepare search done")  # it did not wait for the other group
    assert events.index("prepare search done") < events.index("run search1")  # a run waits for its own


def test_a_failed_warm_up_stops_the_runs_not_yet_started() -> None:
    ran: list[tuple] = []

    def prepare_one(group):
        if group[0] == "omni":
            raise RuntimeError("smoke prepare omni failed")

    def run_one(run):
        ran.append(run)
        time.sleep(0.5)  # the failure reaches the caller while this run goes; the next one must never start
        return {}, Path("x")

    runs = [("omni", 1), ("grace", 1), ("grace", 2)]
    with pytest.raises(RuntimeError, match="smoke prepare omni failed"):
        list(learning.run_when_prepared([["omni"], ["grace"]], runs, 1, prepare_one, run_one))
    assert ("omni", 1) not in ran and ("grace", 2) not in ran


def test_each_arm_trains_at_the_benchmarks_rate_scaled_by_its_own_share() -> None:
    """--lr is every arm's rate (GRACE's too, since 2026-11-29); an arm's lr_scale would scale it."""
    rates = {name: learning.arm_learning_rate(arm, "5e-4") for name, arm in learning.ARMS.items()}
    assert rates == dict.fromkeys(learning.ARMS, "0.0005")
    assert learning.arm_learning_rate(learning.ARMS["grace"], None) is None  # the recipe's own smoke rate
    halved = dataclasses.replace(learning.ARMS["grace"], lr_scale=0.5)
    assert learning.arm_learning_rate(halved, "5e-4") == "0.00025"


def test_a_groups_shared_warm_up_is_sampled_once_and_anew_in_a_reused_out_dir(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "warmup_note_rate.json").write_text('{"note_rate": 0.0}')  # left by an earlier run in this --out
    sampled = []
    monkeypatch.setattr(learning, "build_warmup", lambda arm: None)
    monkeypatch.setattr(learning, "prepare", lambda arm, heldout: {"MODEL_PATH": "/policy", "TRAIN_FILES": "x"})
    monkeypatch.setattr(learning, "training_questions", lambda variables: 8)
    monkeypatch.setattr(learning, "warmup_note_rate", lambda policy, family: sampled.append(family) or {"note_rate": 1})
    learning.prepare_group(["evinote", "search_r1"], 8, None, tmp_path)
    assert len(sampled) == 1  # the two search arms share one warm-up
    assert json.loads((tmp_path / "warmup_note_rate.json").read_text()) == {"note_rate": 1}


def test_the_grace_warm_up_summary_names_judgements_only_for_the_judged_warm_up() -> None:
    question = {"question": "Who?", "answerable": True, "path_right": 3, "valid": 8, "judged_right": 7}
    neutral = {
        "path_right": 0.375,
        "valid": 1.0,
        "judged_right": 0.0,
        "path_follows_judgement": None,
        "questions": 1,
        "questions_with_score_spread": 1,
        "questions_with_both_paths": 1,
        "share_of_ceiling": 0.5,
        "samples": 8,
        "per_question": [question],
    }
    text = learning.format_path_rate(neutral)
    assert "judge" not in text and "right path 3 of 8 valid  Who?" in text
    judged = {**neutral, "judged_right": 0.875, "path_follows_judgement": 0.25}
    text = learning.format_path_rate(judged)
    assert "judgement right 0.88, path follows the judgement 0.25" in text
    assert "right path 3 of 8 valid, judged right 7  Who?" in text


# --- an arm whose runs are another's ----------------------------------------------------------------------------


def _without(config: dict, *dotted: str) -> dict:
    for key in dotted:
        *path, last = key.split(".")
        node = config
        for part in path:
            node = node[part]
        node.pop(last)
    return config


@pytest.mark.parametrize("name", [n for n, arm in learning.ARMS.items() if arm.same_runs_as])
def test_an_arm_left_out_as_another_arms_twin_trains_exactly_what_that_arm_trains(name: str) -> None:
    """The protocol skips LEAR because its runs would be EviOmni's to the last digit: this fails as soon as the two
    differ in anything a run reads (the arm, the recipe's command, the composed preset, the reward's numbers, the
    prompt, the rows)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from verl_evidence.dataprep import rows, templates
    from verl_evidence.dataprep.records import QARecord
    from verl_evidence.local.smoke.settings import SMOKE_METHODS
    from verl_evidence.rewards.eviomni import EviOmniConfig

    twin_name = learning.ARMS[name].same_runs_as
    arm, twin = learning.ARMS[name], learning.ARMS[twin_name]
    assert name not in learning.DEFAULT_ARMS and twin_name in learning.DEFAULT_ARMS
    assert dataclasses.replace(arm, recipe=twin.recipe, method=twin.method, same_runs_as=None) == twin
    assert dataclasses.replace(SMOKE_METHODS[arm.method], data=twin.method) == SMOKE_METHODS[twin.method]
    assert rows.METHODS[arm.method] == rows.METHODS[twin.method]
    assert templates.DEFAULT_PROMPTS[arm.method] == templates.DEFAULT_PROMPTS[twin.method]
    assert EviOmniConfig.for_variant(arm.method) == EviOmniConfig.for_variant(twin.method)

    # the recipes' commands with the same choices made: only the preset's name and the reward's variant differ
    same = {"MODEL": "qwen2.5-1.5b", "GPUS_PER_NODE": "4", "TRAIN_FILES": "t.parquet", "VAL_FILES": "v.parquet"}
    commands = {}
    for arm_name in (name, twin_name):
        result = dry_run(learning.ARMS[arm_name].recipe, EXPERIMENT="e", **same)
        assert result.returncode == 0, result.stderr
        commands[arm_name] = trainer_argv(result.stdout)
    differ = [(a, b) for a, b in zip(commands[name], commands[twin_name]) if a != b]
    assert len(commands[name]) == len(commands[twin_name])
    assert sorted(differ) == sorted(
        [
            (f"--config-name={name}_grpo", f"--config-name={twin_name}_grpo"),
            (f"++reward.reward_kwargs.variant={name}", f"++reward.reward_kwargs.variant={twin_name}"),
        ]
    ), differ

    # the presets those names compose: equal but for the variant
    composed = {}
    with initialize_config_dir(config_dir=str(REPO / "recipes" / "presets"), version_base=None):
        for arm_name in (name, twin_name):
            config = OmegaConf.to_container(compose(config_name=f"{arm_name}_grpo"), resolve=False)
            assert config["reward"]["reward_kwargs"]["variant"] == arm_name
            composed[arm_name] = _without(config, "reward.reward_kwargs.variant")
    assert composed[name] == composed[twin_name]

    # the rows: the same prompt, passages and answers, only the method's name in extra_info
    record = QARecord(id="q1", question="Where is the Nile?", answers=("Africa",), data_source="nq")
    passages = [[{"id": "d1", "contents": "Nile\nThe Nile flows through Africa."}]]

    def method_rows(method: str) -> list[dict]:
        template = templates.load_template(method)
        written = rows.eviomni_rows([record], passages, template, "train", lambda text: len(text.split()), method)
        return [_without(row, "extra_info.method") for row in written]

    assert method_rows(name) == method_rows(twin_name)


def test_recipe_variables_are_name_value_pairs_and_a_malformed_one_is_refused() -> None:
    assert learning.recipe_variables(["CLIP_HIGH=0.2", "OVERLONG_LEN=0"]) == {"CLIP_HIGH": "0.2", "OVERLONG_LEN": "0"}
    assert learning.recipe_variables([]) == {}
    for bad in ("CLIP_HIGH", "clip_high=0.2", "=1", "A-B=1"):
        with pytest.raises(ValueError, match="expected NAME=VALUE"):
            learning.recipe_variables([bad])
