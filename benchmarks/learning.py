"""What each reward teaches in a few steps: every method's smoke recipe trained N steps from one warm-up, three seeds.

Arms (each ``bash recipes/<recipe>.sh --smoke``, verl's own trainer on CPU):

- ``eviomni``: the EviOmni-family warm-up, its rows and reward. ``lear`` (LEAR's recipe) is run only when named in
  ``--arms``: LEAR's prompt, rows, reward numbers and trainer settings are EviOmni's (a test checks each), so its
  runs sample EviOmni's replies and scores and EviOmni's verdict is its verdict (``Arm.same_runs_as``);
- ``grace``: the judged GRACE warm-up (``grace_judged``: each question's reply opens with a think block judging its
  references relevant or not, right for its context, then the answer in the right path's tags and again in the wrong
  path's, so each question's samples take either path after the judgement), GRACE's rows, verl's DAPO manager with
  the GRACE score;
- ``evinote`` and ``search_r1``: ONE policy, the neutral search warm-up (``search_neutral``: a ``<summary>`` note
  quoting the retrieved passage on half the warm-up questions, none on the others, so the policy notes about half
  the time), the SAME EviNote rows and prompt; only the reward differs. ``evinote`` is EviNote's reward;
  ``search_r1`` is Search-R1's exact-match reward (``verl_evidence.rewards.answer:compute_score``) through the
  composite manager, with EviNote's scorer beside it at weight 0 so its EQR and note flags are logged but do not
  count.

Each run trains on the questions its policy was warmed up on and validates (verl's validation,
``trainer.val_before_train`` and the last step) on held-out rows: questions no warm-up of any family contains,
chosen by a fixed hash (:func:`verl_evidence.local.smoke.warmup_data.heldout_rows`).

Read back: verl's file logger (every ``reward/...``, ``rollout/...``, ``critic/score/mean``), and the per-sample
rollout and validation dumps for what needs samples (compression ratio, GRACE's balanced accuracy, the note rate
and EQR on held-out questions). Written to ``--out``: ``curves.csv`` (arm, seed, step, split, metric, value),
``curves.png``, ``summary.json``; printed: the first-steps vs last-steps table and the papers' directions.

    nice -n 5 python benchmarks/learning.py --steps 20 --lr 5e-4 --group-size 4 --parallel 2 --out /tmp/learning
    python benchmarks/learning.py --analyse /tmp/learning     # re-read finished runs, train nothing

The comparison run trains every arm on ALL its family's warm-up questions in every step (``--questions all``), so the
first and the last steps see the same questions. ``--fixed-batch`` is the learning check instead: each arm on the
same ``--questions`` questions every step, and beside each run its sign control, the same run with the arm's reward
negated (the composite manager, one component at weight -1): the plain reward must rise by more than its
step-to-step spread in at least ``RISE_SHARE`` of the seeds given (4 of 5; ``--seeds`` takes any list, so the seeds
can be chosen at run time) and the negated one fall in every seed before "the reward moved the policy" is shown.
verl's seeded shuffle picks each run's questions, except GRACE's: its batch is half answerable, half unanswerable,
the same questions in every seed (:func:`fixed_batch_rows`: in each class the first by a fixed hash of the question).
Where a reward's most on a row is known (GRACE: 6.5 answerable, 1.5 unanswerable; Search-R1's exact match: 1), step
1's reward is printed as a share of the batch's ceiling, and a plain run that does not rise from 90 % of it or more is
reported as having no headroom rather than as not rising.

    nice -n 5 python benchmarks/learning.py --fixed-batch --questions all --steps 20 --seeds 1 2 3 --arms grace \
        --group-size 4 --lr 5e-4 --parallel 2 --out /tmp/fixed

The whole protocol in one command: the comparison's plain runs (every question in every step) are fixed batches, so
``--fixed-batch --questions all`` gives both the comparison and the sign control (24 runs: 4 arms, 3 seeds, 2 signs):

    python benchmarks/learning.py --fixed-batch --questions all --steps 20 --seeds 1 2 3 --group-size 4 --lr 5e-4 \
        --parallel 2 --out /tmp/learning

The policies use a tokenizer trained on the smoke texts (``--tokenizer-vocab``, 4000; 0: the recipes' own), so
prompts are about half as many tokens as in the recipes' smoke runs, with warm-ups of their own; on it the search arms
warm up on ``search_mostly_noted`` (:func:`warmup_of`). The search runs share one retrieval server, started by the
benchmark; the negated runs take ``--sign-control-steps`` (the check's 15) and skip the held-out validation. A step
makes as many optimizer updates as the arm's recipe makes from one batch (its BATCH / MINI_BATCH: GRACE 4, the others
2; ``Arm.updates_per_step``).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from retrieval_server.haproxy_front import free_port  # noqa: E402
from verl_evidence.local.smoke.logs import read_metrics  # noqa: E402
from verl_evidence.local.smoke.settings import WARMUP_ENV, WARMUP_SEED_ENV, WARMUP_VARIANTS  # noqa: E402
from verl_evidence.local.tiny_models import CORPUS_TOKENIZER_ENV  # noqa: E402

TRAIN, HELDOUT = "train", "heldout"


# Search-R1's reward (exact match) scores; EviNote's scorer runs beside it at weight 0: its EQR and note flags are
# logged (reward/composite/evinote.*) without counting.
def search_r1_components(weight: float = 1.0, label: str = "search_r1") -> str:
    return (
        f"[{{name:{label},reward:'verl_evidence.rewards.answer:compute_score',weight:{weight},keys:[em,has_answer]}},"
        "{name:evinote,reward:evinote,weight:0.0}]"
    )


SEARCH_R1_COMPONENTS = search_r1_components()
# A window of the first and last training steps (the table's "first" and "last"), as a share of N
WINDOW_SHARE = 1 / 3
# "F1 does not fall": the last window's F1 at most this far below the first's (a 16-sample step's F1 moves by
# more than this between steps from sampling alone, so a smaller drop is no drop)
F1_TOLERANCE = 0.02
# A rise smaller than this is no rise (rates, EQR, accuracies in [0, 1]; the compression ratio: this share of its
# first value), so a verdict never rests on a rounding-level difference
MIN_EFFECT = 0.01
# What the fixed-batch check asks for before its verdict stands: this many training steps and seeds per sign
CHECK_STEPS, CHECK_SEEDS = 15, 5
# The share of plain seeds whose reward must rise by more than its step-to-step spread (rounded up: 4 of 5) for a
# verdict of shown; every negated seed must fall. Not every seed: one seed of five may fail to learn, as a tiny
# policy's run sometimes does, without the reward being blamed; two may not.
RISE_SHARE = 0.8
# The sign control: the arm's reward through the composite manager at this weight, logged under this label
NEGATED_LABEL = "negated"
NEGATED_SUFFIX = "-negated"
# The reward preset each arm's recipe trains with (the sign control negates that reward with that preset's options)
ARM_PRESETS = {"eviomni": "eviomni", "lear": "lear", "grace": "grace_dapo", "evinote": "evinote"}


# The smoke runs' response budget (recipes/_common.sh RESPONSE_LEN): a GRACE reply sampled outside the trainer
GRACE_REPLY_TOKENS = 160
# A run whose reward starts at this share of its batch's ceiling or above has no room to show a rise
HEADROOM_SHARE = 0.9
# The benchmark's policies: a tokenizer of this many entries trained on the smoke texts (prompts 2.2-2.3x fewer tokens
# than the recipes' byte-like one, so every step and warm-up costs about half; --tokenizer-vocab 0: the recipes' own)
TOKENIZER_VOCAB = 4000
# Micro-batch packs for those shorter sequences (the recipes' 2048 is for theirs): without flash-attention's varlen
# kernels a pack's attention costs the square of its length (recipes/_common.sh); every smoke sequence here is < 1024
PACK_TOKENS = 1024


def reward_preset(arm_name: str) -> dict:
    import yaml

    return yaml.safe_load(
        (REPO / "recipes" / "presets" / "reward_preset" / f"{ARM_PRESETS[arm_name]}.yaml").read_text()
    )


@functools.cache
def grace_config():
    """GRACE's training settings as the arm's recipe preset gives them (alpha, beta)."""
    from verl_evidence.rewards.grace import config_from_kwargs

    return config_from_kwargs(dict(reward_preset("grace")["custom_reward_function"].get("reward_kwargs") or {}))


def grace_ceiling(values: Mapping[str, float], config=None) -> float | None:
    """The most GRACE's score pays on a sample's row, from its ground truth: format, path and both ROUGE-L terms at 1
    when the context answers the question (6.5), format and path when it does not (1.5: the recall path's answer is
    not scored)."""
    answerable = values.get("answerable")
    if answerable is None:
        return None
    config = config or grace_config()
    return config.max_score if answerable else config.format_reward + config.path_reward


def exact_match_ceiling(values: Mapping[str, float]) -> float:
    """Search-R1's exact match pays at most 1 a sample."""
    return 1.0


@dataclass(frozen=True)
class Arm:
    recipe: str
    method: str  # the smoke method whose data (and judge) it uses
    kind: str  # which measures apply: search | eviomni | grace
    warmup: str | None = None  # a warm-up variant (verl_evidence.local.smoke.settings.WARMUP_VARIANTS)
    overrides: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    # The most the arm's reward pays on one sample, from its dumped values (its row's ground truth); None where the
    # reward's maximum on a row is not exactly known (EviOmni's length term, EviNote's judged EQR)
    ceiling: Callable[[Mapping[str, float]], float | None] | None = None
    # A ground-truth field whose values share a fixed batch equally (:func:`fixed_batch_rows`); None: verl's shuffle
    balance_key: str | None = None
    # Optimizer updates a step makes: the recipe's own BATCH / MINI_BATCH (checked against the recipe by a test), so
    # a step learns as much as the method's recipe lets one step learn
    updates_per_step: int = 1
    # The arm's learning rate as a share of the benchmark's --lr (:func:`arm_learning_rate`)
    lr_scale: float = 1.0
    # Another arm whose runs this arm's would repeat exactly (same prompt, rows, reward numbers and trainer settings;
    # a test checks each of them): not run unless named in --arms, and that arm's verdict is its verdict
    same_runs_as: str | None = None


ARMS: dict[str, Arm] = {
    "eviomni": Arm("eviomni_grpo.sh", "eviomni", "eviomni", updates_per_step=2),
    # LEAR is the earlier paper of EviOmni's method, with the same reward numbers (docs/methods/eviomni.md): its runs
    # sampled EviOmni's replies and scores at every step of every seed and sign (2026-11-29; gradient norms equal to
    # 5 significant digits), so the protocol runs them once
    "lear": Arm("lear_grpo.sh", "lear", "eviomni", updates_per_step=2, same_runs_as="eviomni"),
    "grace": Arm(
        "grace_dapo.sh",
        "grace",
        "grace",
        warmup="grace_judged",
        ceiling=grace_ceiling,
        balance_key="answerable",
        updates_per_step=4,
        # The full rate, as every arm, though its recipe makes four updates a step against the others' two. Half of
        # it (2026-11-28 to 11-29, chosen for one collapse in fifteen seeds of the grace_neutral warm-up) failed on
        # both grace_judged warm-ups measured (2026-11-29: one seed never tied its path to its judgement, and on the
        # other warm-up one collapsed, format 0.98 -> 0.54); the full rate passed on both (docs/learning-benchmark.md).
    ),
    "evinote": Arm("evinote_grpo.sh", "evinote", "search", warmup="search_neutral", updates_per_step=2),
    "search_r1": Arm(
        "evinote_grpo.sh",
        "evinote",
        "search",
        warmup="search_neutral",
        ceiling=exact_match_ceiling,
        updates_per_step=2,
        # the pre-flight check reads these components' own needs: EviNote's rows and loop fit both
        overrides=("reward_preset=composite", f"++reward.reward_kwargs.components={SEARCH_R1_COMPONENTS}"),
    ),
}
# What the benchmark runs unless --arms says otherwise: every arm whose runs are not another arm's
DEFAULT_ARMS = [name for name, arm in ARMS.items() if arm.same_runs_as is None]
# The measures shown per kind of arm (table and plot), in order
KEY_MEASURES = {
    "search": ("note_rate", "eqr", "em", "score"),
    "eviomni": ("compression_ratio", "f1", "format", "score"),
    "grace": ("balanced_accuracy", "path_accuracy", "format", "score"),
}


# ---------------------------------------------------------------------------------------------------------------
# Per-sample measures (pure): a dumped trajectory in, numbers out


def sample_values(entry: Mapping) -> dict[str, float]:
    """Every numeric field of one dumped trajectory: the training dump's ``rollout`` and ``reward_extra_info``
    columns (verl_evidence.trainer.patches) and the validation dump's flat reward keys, one namespace."""
    values: dict[str, float] = {}
    nested = [entry.get("rollout"), entry.get("reward_extra_info")]
    for source in [entry, *[n for n in nested if isinstance(n, Mapping)]]:
        for key, value in source.items():
            if isinstance(value, (bool, int, float)) and math.isfinite(value):
                values[key] = float(value)
    return values


def _first_of(values: Mapping[str, float], *names: str) -> float | None:
    for name in names:
        if name in values:
            return values[name]
    return None


def _mean(numbers: Iterable[float | None]) -> float | None:
    kept = [n for n in numbers if n is not None]
    return fmean(kept) if kept else None


def note_taken(values: Mapping[str, float]) -> float | None:
    count = _first_of(values, "summary_count", "num_summaries", "evinote.num_summaries")
    if count is not None:
        return float(count > 0)
    flag = _first_of(values, "has_summary", "evinote.has_summary")
    return None if flag is None else float(flag > 0)


def compression_ratio(values: Mapping[str, float]) -> float | None:
    """EviOmni's ``L_P / L_e`` of one sample; None without evidence tokens (as verl_evidence.eval.metrics)."""
    passages, evidence = values.get("len_p"), values.get("len_e")
    if passages is None or not evidence:
        return None
    return passages / evidence


def grace_path_correct(values: Mapping[str, float]) -> tuple[bool, float] | None:
    """(answerable, 1.0 if the structure is valid and the path fits: evidence when answerable, recall when not)."""
    answerable, chose_evidence, fmt = (values.get(k) for k in ("answerable", "chose_evidence", "format"))
    if answerable is None or chose_evidence is None or fmt is None:
        return None
    right = fmt > 0 and bool(chose_evidence) == bool(answerable)
    return bool(answerable), float(right)


def groups_with_spread(entries: Sequence[Mapping]) -> float | None:
    """The share of a step's groups (the samples of one prompt) whose rewards differ. GRPO gives every sample of a
    group whose rewards are all equal an advantage of 0: a step where no group differs teaches nothing, whatever
    the reward's mean."""
    groups: dict[str, set[float]] = {}
    for entry in entries:
        if "input" in entry and isinstance(entry.get("score"), int | float):
            groups.setdefault(str(entry["input"]), set()).add(round(float(entry["score"]), 9))
    return sum(len(scores) > 1 for scores in groups.values()) / len(groups) if groups else None


def aggregate(
    entries: Sequence[Mapping], kind: str, ceiling: Callable[[Mapping[str, float]], float | None] | None = None
) -> dict[str, float]:
    """One step's (or one validation's) measures of an arm of ``kind`` from its dumped trajectories; with the arm's
    ``ceiling``, the mean of its samples' ceilings (the most the reward could have paid on these rows)."""
    samples = [sample_values(e) for e in entries]
    out: dict[str, float | None] = {"samples": float(len(samples)), "score": _mean(s.get("score") for s in samples)}
    if ceiling is not None:
        out["ceiling"] = _mean(ceiling(s) for s in samples)
    # how often the reward paid anything (a reward that never fires teaches nothing)
    out["fired"] = _mean(float(s["score"] != 0) if "score" in s else None for s in samples)
    out["groups_with_spread"] = groups_with_spread(entries)
    if kind == "search":
        out["note_rate"] = _mean(note_taken(s) for s in samples)
        out["eqr"] = _mean(_first_of(s, "eqr", "evinote.eqr") for s in samples)
        out["em"] = _mean(_first_of(s, "em", "search_r1.em", "evinote.em") for s in samples)
        out["format"] = _mean(_first_of(s, "format_ok", "evinote.format_ok") for s in samples)
        out["searches"] = _mean(s.get("num_searches") for s in samples)
    elif kind == "eviomni":
        out["compression_ratio"] = _mean(compression_ratio(s) for s in samples)
        out["f1"] = _mean(s.get("ans_f") for s in samples)
        out["answer_f1_mean"] = _mean(s.get("ans") for s in samples)
        out["format"] = _mean(s.get("format") for s in samples)
        out["evidence_tokens"] = _mean(s.get("len_e") for s in samples)
    elif kind == "grace":
        paths = [p for p in (grace_path_correct(s) for s in samples) if p is not None]
        answerable = _mean(right for ans, right in paths if ans)
        unanswerable = _mean(right for ans, right in paths if not ans)
        out["path_accuracy"] = _mean(right for _, right in paths)
        out["answerable_accuracy"] = answerable
        out["unanswerable_accuracy"] = unanswerable
        out["balanced_accuracy"] = (
            (answerable + unanswerable) / 2 if answerable is not None and unanswerable is not None else None
        )
        out["format"] = _mean(float(s["format"] > 0) if "format" in s else None for s in samples)
    else:
        raise ValueError(f"unknown arm kind {kind!r}")
    return {key: value for key, value in out.items() if value is not None}


def read_dump(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------------------------
# Curves, windows, table and directions (pure)


@dataclass(frozen=True)
class Point:
    arm: str
    seed: int
    step: int
    split: str
    metric: str
    value: float


def run_points(
    arm: str, seed: int, kind: str, run_dir: Path, ceiling: Callable[[Mapping[str, float]], float | None] | None = None
) -> list[Point]:
    """Every curve point of one finished run: verl's logged metrics (training steps) and the dumps' measures."""
    points: list[Point] = []
    metrics_file = run_dir / "metrics.jsonl"
    if metrics_file.exists():
        for step, metrics in sorted(read_metrics(metrics_file).items()):
            for key, value in sorted(metrics.items()):
                if key.startswith(("reward/", "rollout/", "critic/score/mean", "actor/grad_norm")):
                    points.append(Point(arm, seed, step, TRAIN, key, value))
    for split, directory in ((TRAIN, run_dir / "rollouts"), (HELDOUT, run_dir / "validation")):
        for dump in sorted(directory.glob("*.jsonl")) if directory.is_dir() else []:
            step = int(dump.stem)
            # the ceiling of the training reward (validation scores with its own settings: GRACE's alpha = beta = 1)
            measures = aggregate(read_dump(dump), kind, ceiling if split == TRAIN else None)
            for metric, value in sorted(measures.items()):
                points.append(Point(arm, seed, step, split, metric, value))
    return points


def write_csv(points: Sequence[Point], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["arm", "seed", "step", "split", "metric", "value"])
        for p in points:
            writer.writerow([p.arm, p.seed, p.step, p.split, p.metric, f"{p.value:.6g}"])


def read_csv(path: Path) -> list[Point]:
    with open(path, newline="") as handle:
        return [
            Point(r["arm"], int(r["seed"]), int(r["step"]), r["split"], r["metric"], float(r["value"]))
            for r in csv.DictReader(handle)
        ]


def series(points: Sequence[Point], arm: str, split: str, metric: str) -> dict[int, dict[int, float]]:
    """seed -> step -> value."""
    out: dict[int, dict[int, float]] = {}
    for p in points:
        if p.arm == arm and p.split == split and p.metric == metric:
            out.setdefault(p.seed, {})[p.step] = p.value
    return out


@dataclass(frozen=True)
class Change:
    """A measure's first and last value (train: mean of the first / last window of steps; held-out: step 0 and the
    last validation), per seed and averaged over seeds."""

    per_seed: dict[int, tuple[float, float]]

    @property
    def first(self) -> float:
        return fmean(f for f, _ in self.per_seed.values())

    @property
    def last(self) -> float:
        return fmean(last for _, last in self.per_seed.values())

    @property
    def delta(self) -> float:
        return self.last - self.first

    def seed_deltas(self) -> list[float]:
        return [last - first for _, (first, last) in sorted(self.per_seed.items())]

    @property
    def seed_spread(self) -> float:
        """The sample standard deviation of the seeds' changes (0 with one seed)."""
        deltas = self.seed_deltas()
        return float(np.std(deltas, ddof=1)) if len(deltas) > 1 else 0.0

    def beyond_spread(self, delta: float | None = None) -> bool | None:
        """Whether the change (or ``delta``, a difference built on it) exceeds the seeds' spread; None with one seed
        (no spread to compare with, so the direction cannot count)."""
        if len(self.per_seed) < 2:
            return None
        return abs(self.delta if delta is None else delta) > self.seed_spread


def window(steps: Sequence[int], share: float = WINDOW_SHARE) -> tuple[list[int], list[int]]:
    """The first and last ``max(1, round(share * len))`` training steps (step 0, a validation, excluded)."""
    ordered = sorted(s for s in steps if s > 0)
    if not ordered:
        return [], []
    size = max(1, round(share * len(ordered)))
    return ordered[:size], ordered[-size:]


def change(points: Sequence[Point], arm: str, split: str, metric: str) -> Change | None:
    per_seed = {}
    for seed, by_step in series(points, arm, split, metric).items():
        if split == HELDOUT:
            if 0 in by_step and len(by_step) > 1:
                per_seed[seed] = (by_step[0], by_step[max(by_step)])
            continue
        first, last = window(list(by_step))
        if first and last:
            per_seed[seed] = (fmean(by_step[s] for s in first), fmean(by_step[s] for s in last))
    return Change(per_seed) if per_seed else None


def summary_table(points: Sequence[Point], arms: Sequence[str]) -> list[dict]:
    """One row per arm, split and key measure: first, last, change (mean over seeds) and each seed's change."""
    rows = []
    for arm in arms:
        for split in (TRAIN, HELDOUT):
            for metric in KEY_MEASURES[ARMS[arm].kind]:
                found = change(points, arm, split, metric)
                if found is None:
                    continue
                rows.append(
                    {
                        "arm": arm,
                        "split": split,
                        "metric": metric,
                        "first": found.first,
                        "last": found.last,
                        "change": found.delta,
                        "seed_changes": found.seed_deltas(),
                    }
                )
    return rows


def format_table(rows: Sequence[dict]) -> str:
    lines = [
        f"{'arm':10} {'split':8} {'measure':19} {'first':>8} {'last':>8} {'change':>8}  per seed",
        "-" * 80,
    ]
    for r in rows:
        seeds = ", ".join(f"{d:+.3f}" for d in r["seed_changes"])
        lines.append(
            f"{r['arm']:10} {r['split']:8} {r['metric']:19} {r['first']:8.3f} {r['last']:8.3f} {r['change']:+8.3f}"
            f"  {seeds}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Direction:
    claim: str
    split: str
    holds: bool | None  # None: not measured in this run
    evidence: str
    consistent: bool | None = None  # every seed points the same way as the mean
    beyond_spread: bool | None = None  # the change exceeds the spread of the seeds' changes

    @property
    def counts(self) -> bool:
        """A direction the run shows: it holds, every seed agrees, and the change is larger than the seeds' spread."""
        return bool(self.holds and self.consistent and self.beyond_spread)


def _describe(name: str, found: Change) -> str:
    seeds = ", ".join(f"{d:+.3f}" for d in found.seed_deltas())
    return f"{name} {found.first:.3f} -> {found.last:.3f} ({found.delta:+.3f}; seeds {seeds})"


def directions(points: Sequence[Point]) -> list[Direction]:
    """For each direction the papers claim, whether this run shows it, with the numbers."""
    out = []
    for split in (TRAIN, HELDOUT):
        for metric, label in (("note_rate", "note rate"), ("eqr", "EQR")):
            claim = f"EviNote vs Search-R1: {label} rises more under EviNote's reward"
            note, base = change(points, "evinote", split, metric), change(points, "search_r1", split, metric)
            if note is None or base is None:
                out.append(Direction(claim, split, None, "not measured"))
                continue
            # "rises more": it rises under EviNote's reward, and by more than under Search-R1's (two falls of
            # different sizes are not a rise)
            holds = note.delta > MIN_EFFECT and note.delta - base.delta > MIN_EFFECT
            pairs = list(zip(note.seed_deltas(), base.seed_deltas()))
            consistent = all((a > MIN_EFFECT and a - b > MIN_EFFECT) == holds for a, b in pairs) if pairs else None
            evidence = f"{_describe('EviNote', note)}; {_describe('Search-R1', base)}"
            spread = note.beyond_spread(note.delta - base.delta) and note.beyond_spread()
            spread = None if len(note.per_seed) < 2 or len(base.per_seed) < 2 else bool(spread)
            out.append(Direction(claim, split, holds, evidence, consistent, spread))
        for arm, name in (("eviomni", "EviOmni"), ("lear", "LEAR")):
            claim = f"{name}: compression ratio rises while F1 does not fall (by more than {F1_TOLERANCE})"
            cr, f1 = change(points, arm, split, "compression_ratio"), change(points, arm, split, "f1")
            if cr is None or f1 is None:
                twin = ARMS[arm].same_runs_as
                out.append(Direction(claim, split, None, f"not run: its runs are {twin}'s" if twin else "not measured"))
                continue
            margin = MIN_EFFECT * abs(cr.first)
            holds = cr.delta > margin and f1.delta >= -F1_TOLERANCE
            per_seed = [c > margin and f >= -F1_TOLERANCE for c, f in zip(cr.seed_deltas(), f1.seed_deltas())]
            evidence = f"{_describe('CR', cr)}; {_describe('F1', f1)}"
            out.append(Direction(claim, split, holds, evidence, all(p == holds for p in per_seed), cr.beyond_spread()))
        claim = "GRACE: balanced accuracy (answerable -> evidence, unanswerable -> recall) rises"
        bacc = change(points, "grace", split, "balanced_accuracy")
        if bacc is None:
            out.append(Direction(claim, split, None, "not measured"))
        else:
            holds = bacc.delta > MIN_EFFECT
            consistent = all((d > MIN_EFFECT) == holds for d in bacc.seed_deltas())
            out.append(Direction(claim, split, holds, _describe("B.Acc", bacc), consistent, bacc.beyond_spread()))
    return out


def format_directions(found: Sequence[Direction]) -> str:
    lines = []
    for d in found:
        verdict = {True: "HOLDS", False: "does not hold", None: "not measured"}[d.holds]
        seeds = "" if d.consistent is None else (" (every seed agrees)" if d.consistent else " (seeds disagree)")
        if d.holds is None:
            spread = ""
        elif d.beyond_spread is None:
            spread = " (one seed: no spread)"
        else:
            spread = "" if d.beyond_spread else " (within the seeds' spread)"
        shown = " -> COUNTS" if d.counts else ""
        lines.append(f"[{d.split}] {d.claim}: {verdict}{seeds}{spread}{shown}\n    {d.evidence}")
    return "\n".join(lines)


def plot(points: Sequence[Point], arms: Sequence[str], path: Path) -> None:
    """Per-step curves: one row per kind of arm, one panel per key measure; training steps (solid, mean over seeds,
    thin per seed) and the held-out validations at step 0 and N (markers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in KEY_MEASURES if any(ARMS[a].kind == k for a in arms)]
    columns = max(len(KEY_MEASURES[k]) for k in kinds)
    figure, axes = plt.subplots(len(kinds), columns, figsize=(3.2 * columns, 2.6 * len(kinds)), squeeze=False)
    colours = dict(zip(ARMS, ("tab:blue", "tab:cyan", "tab:green", "tab:red", "tab:gray")))
    for row, kind in enumerate(kinds):
        for column, metric in enumerate(KEY_MEASURES[kind]):
            axis = axes[row][column]
            for arm in (a for a in arms if ARMS[a].kind == kind):
                for split, style in ((TRAIN, "-"), (HELDOUT, "o--")):
                    by_seed = series(points, arm, split, metric)
                    if not by_seed:
                        continue
                    steps = sorted({s for values in by_seed.values() for s in values})
                    means = [fmean(v[s] for v in by_seed.values() if s in v) for s in steps]
                    label = f"{arm} ({'held-out' if split == HELDOUT else 'train'})"
                    axis.plot(steps, means, style, color=colours[arm], label=label, linewidth=1.6, markersize=4)
                    if split == TRAIN:
                        for values in by_seed.values():
                            ordered = sorted(values)
                            axis.plot(ordered, [values[s] for s in ordered], "-", color=colours[arm], alpha=0.25)
            axis.set_title(f"{kind}: {metric}", fontsize=9)
            axis.set_xlabel("step", fontsize=8)
            axis.tick_params(labelsize=7)
            if column == 0:
                axis.legend(fontsize=6)
        for column in range(len(KEY_MEASURES[kind]), columns):
            axes[row][column].axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=72)
    plt.close(figure)


# ---------------------------------------------------------------------------------------------------------------
# The fixed-batch check and its sign control (pure)


def hydra_value(value: object) -> str:
    """A YAML value written in Hydra's override grammar (strings single-quoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, Sequence):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    raise TypeError(f"no Hydra form for {value!r}")


def negated_components(arm_name: str) -> str:
    """The composite manager's components that pay the arm's own reward times -1, its options from the arm's preset.

    The judge's ``nli_*`` settings stay at the manager level, where the recipe puts them (its local model on --smoke).
    """
    if arm_name == "search_r1":
        return search_r1_components(-1.0, NEGATED_LABEL)
    preset = reward_preset(arm_name)
    manager = preset["reward_manager"]["name"]
    if manager in {"dapo", "naive"}:  # verl's manager calling one of our scoring functions
        function = preset["custom_reward_function"]
        reward = function["path"].rsplit(".", 1)[-1]  # pkg://verl_evidence.rewards.grace -> grace
        kwargs = dict(function.get("reward_kwargs") or {})
    else:
        reward, kwargs = manager, dict(preset.get("reward_kwargs") or {})
    kwargs = {key: value for key, value in kwargs.items() if not key.startswith("nli_")}
    return hydra_value([{"name": NEGATED_LABEL, "reward": reward, "weight": -1.0, "kwargs": kwargs}])


def negated_overrides(arm_name: str) -> tuple[str, ...]:
    """The arm's overrides with its reward swapped for the negated one."""
    kept = [
        o
        for o in ARMS[arm_name].overrides
        if not o.startswith(("reward_preset=", "++reward.reward_kwargs.components="))
    ]
    return (*kept, "reward_preset=composite", f"++reward.reward_kwargs.components={negated_components(arm_name)}")


def reward_metric(run_label: str) -> str:
    """The logged per-step measure of the reward the run's arm pays (before the sign control's -1)."""
    if run_label.endswith(NEGATED_SUFFIX):
        return f"reward/composite/{NEGATED_LABEL}.score/mean"
    return "critic/score/mean"


@dataclass(frozen=True)
class Trend:
    """One run's reward: the last third of the steps' mean minus the first third's, and the step-to-step spread
    (the standard deviation of consecutive steps' differences: how far one step moves from sampling alone)."""

    margin: float
    spread: float
    steps: int

    def describe(self) -> str:
        ratio = f"{self.margin / self.spread:+.1f}x" if self.spread > 0 else "n/a"
        return f"{self.margin:+.3f} (spread {self.spread:.3f}, {ratio})"


def trend(by_step: Mapping[int, float]) -> Trend | None:
    first, last = window(list(by_step))
    if not first or not last:
        return None
    ordered = [by_step[s] for s in sorted(s for s in by_step if s > 0)]
    differences = [b - a for a, b in zip(ordered, ordered[1:])]
    spread = float(np.std(differences)) if len(differences) > 1 else 0.0
    margin = fmean(by_step[s] for s in last) - fmean(by_step[s] for s in first)
    return Trend(margin, spread, len(ordered))


@dataclass(frozen=True)
class SignCheck:
    """An arm's fixed-batch verdict over the seeds the run was given (any list, chosen at run time).

    **Shown** only when the plain reward rises by more than its own step-to-step spread in at least
    :data:`RISE_SHARE` of the seeds (:func:`seeds_needed`: 4 of 5, 3 of 3) and the negated reward falls in every seed.
    A rise within one step's noise is not a rise here: it is what a run that learnt nothing shows half the time.

    ``start_share``: per plain seed, step 1's reward as a share of the batch's ceiling (arms whose ceiling is known).
    A plain seed that does not rise beyond its spread while starting at :data:`HEADROOM_SHARE` of the ceiling or above
    had no room to rise; one below it did, and its failure stands."""

    arm: str
    plain: dict[int, Trend]
    negated: dict[int, Trend]
    start_share: dict[int, float] = field(default_factory=dict)

    @property
    def rising_seeds(self) -> list[int]:
        """The plain seeds whose reward rose by more than that run's step-to-step spread."""
        return [seed for seed, t in sorted(self.plain.items()) if t.margin > 0 and t.margin > t.spread]

    @property
    def needed(self) -> int:
        return seeds_needed(len(self.plain))

    @property
    def without_headroom(self) -> list[int]:
        """The plain seeds that do not rise beyond their spread and started at the ceiling's :data:`HEADROOM_SHARE`
        or above, when they alone keep the arm short of :attr:`needed`; empty otherwise (a seed short of it with
        headroom, or an unknown ceiling)."""
        short = [seed for seed in sorted(self.plain) if seed not in self.rising_seeds]
        if not short or any(self.start_share.get(seed, 0.0) < HEADROOM_SHARE for seed in short):
            return []
        return short

    @property
    def rises(self) -> bool:
        """Enough plain seeds rise beyond their spread (:attr:`needed` of them)."""
        return bool(self.plain) and len(self.rising_seeds) >= self.needed

    @property
    def falls(self) -> bool:
        return bool(self.negated) and all(t.margin < 0 for t in self.negated.values())

    @property
    def short_of(self) -> str:
        """What these runs lack of the check's protocol (:data:`CHECK_STEPS` steps, :data:`CHECK_SEEDS` seeds per
        sign); "" when nothing."""
        runs = [*self.plain.values(), *self.negated.values()]
        lacks = []
        if runs and min(t.steps for t in runs) < CHECK_STEPS:
            lacks.append(f"{min(t.steps for t in runs)} steps of the {CHECK_STEPS} asked")
        if min(len(self.plain), len(self.negated)) < CHECK_SEEDS:  # each sign named: "0 seeds" alone misleads
            lacks.append(f"{len(self.plain)} plain and {len(self.negated)} negated seed(s) of the {CHECK_SEEDS} asked")
        return "; ".join(lacks)

    @property
    def tally(self) -> str:
        """How many plain seeds rose beyond their spread, of how many, against how many the rule needs."""
        return f"{len(self.rising_seeds)} of {len(self.plain)} seeds rise beyond their spread ({self.needed} needed)"

    @property
    def verdict(self) -> str:
        if not self.plain:
            return "not measured"
        negated = {True: "; negated, falls in every seed", False: "; negated, does not fall in every seed"}
        fell = negated[self.falls] if self.negated else ""
        if not self.rises:
            flat = self.without_headroom
            if not flat:
                return f"DOES NOT RISE: {self.tally}{fell}"
            seeds = ", ".join(str(seed) for seed in flat)
            share = min(self.start_share[seed] for seed in flat)
            return f"no headroom: starts at {share:.0%} of the batch's ceiling (seed {seeds} does not rise){fell}"
        if not self.negated:
            return f"rises: {self.tally} (no sign control run)"
        if not self.falls:
            return f"rises: {self.tally}, but the negated reward does not fall in every seed: not shown"
        return f"SHOWN: {self.tally}, and falls in every negated seed"


def seeds_needed(seeds: int) -> int:
    """Plain seeds that must rise beyond their spread for a verdict of shown: :data:`RISE_SHARE` of ``seeds``,
    rounded up (4 of 5, 3 of 3, 8 of 10)."""
    return math.ceil(RISE_SHARE * seeds - 1e-9)


def sign_checks(points: Sequence[Point], arms: Sequence[str]) -> list[SignCheck]:
    checks = []
    for arm in arms:
        runs = {}
        for label in (arm, arm + NEGATED_SUFFIX):
            per_seed = {}
            for seed, by_step in series(points, label, TRAIN, reward_metric(label)).items():
                found = trend(by_step)
                if found is not None:
                    per_seed[seed] = found
            runs[label] = per_seed
        checks.append(SignCheck(arm, runs[arm], runs[arm + NEGATED_SUFFIX], start_shares(points, arm)))
    return checks


def start_shares(points: Sequence[Point], arm: str) -> dict[int, float]:
    """Per seed of the arm's plain runs: step 1's reward over step 1's batch ceiling (its samples' mean ceiling)."""
    rewards = series(points, arm, TRAIN, reward_metric(arm))
    ceilings = series(points, arm, TRAIN, "ceiling")
    shares = {}
    for seed, by_step in rewards.items():
        steps = [s for s in by_step if s > 0]
        first = min(steps) if steps else None
        ceiling = ceilings.get(seed, {}).get(first)
        if first is not None and ceiling:
            shares[seed] = by_step[first] / ceiling
    return shares


def format_sign_checks(checks: Sequence[SignCheck]) -> str:
    lines = []
    for check in checks:
        lines.append(
            f"{check.arm}: {check.verdict}" + (f" [short of the protocol: {check.short_of}]" if check.short_of else "")
        )
        for label, runs in (("reward", check.plain), ("negated", check.negated)):
            for seed, found in sorted(runs.items()):
                share = check.start_share.get(seed) if label == "reward" else None
                start = "" if share is None else f"; step 1 at {share:.0%} of the batch's ceiling"
                lines.append(f"    {label:8} seed {seed}: last third - first third {found.describe()}{start}")
    return "\n".join(lines)


def fire_rates(points: Sequence[Point], labels: Sequence[str], metric: str = "fired") -> dict[str, float]:
    """Per run label: the share of step-1 samples whose reward paid anything (``metric="groups_with_spread"``: of
    step-1 groups whose samples' rewards differ), averaged over seeds."""
    rates = {}
    for label in labels:
        by_seed = series(points, label, TRAIN, metric)
        first = [values[min(values)] for values in by_seed.values() if values]
        if first:
            rates[label] = fmean(first)
    return rates


# ---------------------------------------------------------------------------------------------------------------
# Where a run's seconds go, and what a protocol costs (pure)

# verl's per-step timers (timing_s/...): rollout (the reward loop runs inside it: EviOmni's masked-answer generations,
# EviNote's NLI judge), the actor's and the reference's log-probabilities, the update
STEP_PHASES = ("gen", "old_log_prob", "ref", "update_actor")


@dataclass(frozen=True)
class RunCost:
    """One run's wall time split: the trainer's start and stop (wall minus the steps), and per training step."""

    wall_s: float
    steps: int
    per_step: dict[str, float]  # phase -> mean seconds per training step ("step": the whole step)
    validation_s: float  # every validation (step 0 and step N) together

    @property
    def start_s(self) -> float:
        """Everything outside the steps: Ray and the workers' start, the retrieval server, validation at step 0."""
        return self.wall_s - self.steps * self.per_step.get("step", 0.0) - self.validation_s


def run_cost(metrics: Mapping[int, Mapping[str, float]], wall_s: float) -> RunCost | None:
    """A run's :class:`RunCost` from its logged metrics (verl's ``timing_s/...``) and its wall time."""
    steps = [values for step, values in metrics.items() if step > 0 and "timing_s/step" in values]
    if not steps:
        return None
    per_step = {
        phase: fmean(values.get(f"timing_s/{phase}", 0.0) for values in steps) for phase in ("step", *STEP_PHASES)
    }
    validation = sum(values.get("timing_s/testing", 0.0) for values in metrics.values())
    return RunCost(wall_s, len(steps), per_step, validation)


def protocol_minutes(
    arms: int, seeds: int, signs: int, steps: int, start_s: float, step_s: float, parallel: int = 1
) -> float:
    """Wall minutes of ``arms x seeds x signs`` runs of ``steps`` steps, ``parallel`` at a time (CPU-bound runs on a
    machine with at least that many idle cores; more runs than cores only share them)."""
    runs = arms * seeds * signs
    return runs * (start_s + steps * step_s) / max(1, parallel) / 60


def format_costs(costs: Mapping[str, RunCost]) -> str:
    phases = " ".join(f"{p:>12}" for p in STEP_PHASES)
    lines = [f"{'run':28} {'wall s':>7} {'start s':>7} {'step s':>7} {phases} {'validations s':>13}"]
    for label, cost in sorted(costs.items()):
        phases = " ".join(f"{cost.per_step[p]:12.2f}" for p in STEP_PHASES) + f" {cost.validation_s:13.1f}"
        lines.append(f"{label:28} {cost.wall_s:7.0f} {cost.start_s:7.0f} {cost.per_step['step']:7.2f} {phases}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Running the arms


def warmup_of(arm: Arm) -> str | None:
    """The arm's warm-up for the tokenizer in use: the neutral search world is ``search_neutral`` (half the questions
    always noted) on the recipes' byte-like tokenizer, whose policy mixes a question's two replies when shown both,
    and ``search_mostly_noted`` (every question with and without a note, answered right and wrong, the noted replies
    twice) on the corpus tokenizer, whose policy learns ``search_neutral``'s split by heart (each group all noted or
    none: nothing for a reward to move), and on ``search_both_ways`` each question's answer (right in every sample or
    in none: Search-R1's exact match had a spread in 0.08 of its groups). Noted twice because on
    ``search_both_answers`` (noted once) EviNote's reward paid in under a fifth of step 1's samples in 7 of 24 runs."""
    if arm.warmup == "search_neutral" and os.environ.get(CORPUS_TOKENIZER_ENV):
        return "search_mostly_noted"
    return arm.warmup


def warmup_groups(arms: Sequence[str]) -> list[list[str]]:
    """``arms`` grouped by the warm-up they train from, the longest warm-up first: on an empty cache 2400 (search),
    1600 (GRACE) and 500 (EviOmni) steps took ~120, 91 and 26 s, so the short ones fill the other core meanwhile."""
    from verl_evidence.local.smoke.settings import WARMUP_STEPS, warmup_family

    groups: dict[str, list[str]] = {}
    for name in arms:
        groups.setdefault(warmup_family(ARMS[name].method, warmup_of(ARMS[name])), []).append(name)
    return [groups[family] for family in sorted(groups, key=lambda family: -WARMUP_STEPS.get(family, 0))]


def build_warmup(arm: Arm) -> None:
    """The arm's warm-up built (or found cached) by a ``smoke prepare`` process of its own: a warm-up trains on one
    thread, and two processes build two warm-ups at once (the smoke cache locks each artifact on its own)."""
    env = {**os.environ, WARMUP_ENV: warmup_of(arm) or ""}
    command = [sys.executable, "-m", "verl_evidence.local.smoke", "prepare", arm.method]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")


def prepare_group(group: Sequence[str], heldout: int, questions: int | None, out: Path) -> None:
    """One warm-up and everything its arms' runs need: the warm-up, each arm's data and held-out rows, the check that
    a step's batch splits into the recipe's updates (a batch that does not stops the benchmark before its runs), and
    the sampling of the neutral warm-ups in their own context (what the step-1 fire rates are compared with)."""
    started = time.perf_counter()
    build_warmup(ARMS[group[0]])
    prepared = {name: prepare(ARMS[name], heldout) for name in group}
    for name, variables in prepared.items():
        batch = questions or training_questions(variables)
        updates = batch // mini_batch_size(batch, ARMS[name].updates_per_step)
        print(f"{name}: {batch} questions a step, {updates} update(s) a step", flush=True)
    print(f"{', '.join(group)}: warm-up and data prepared in {time.perf_counter() - started:.0f} s", flush=True)
    sampled_warmups = set()  # the group's arms share one warm-up: sampled once
    for name, variables in prepared.items():
        arm, policy = ARMS[name], Path(variables["MODEL_PATH"])
        if arm.warmup in sampled_warmups:
            continue
        sampled_warmups.add(arm.warmup)
        if arm.warmup == "search_neutral":
            sampled = warmup_note_rate(policy, family=warmup_of(arm))
            (out / "warmup_note_rate.json").write_text(json.dumps(sampled))
            print(
                f"neutral search warm-up ({warmup_of(arm)}), its final turn sampled in its own context: "
                f"{json.dumps(sampled)}",
                flush=True,
            )
        if WARMUP_VARIANTS.get(arm.warmup) == "grace":  # GRACE's variants: grace_neutral, grace_judged
            paths = warmup_path_rate(policy, family=arm.warmup)
            (out / "warmup_path_rate.json").write_text(json.dumps(paths, indent=1))
            print(f"GRACE warm-up ({arm.warmup}), sampled in its own context: {format_path_rate(paths)}", flush=True)


def run_when_prepared(
    groups: Sequence[Sequence[str]],
    runs: Sequence[tuple],
    parallel: int,
    prepare_one: Callable[[Sequence[str]], None],
    run_one: Callable[[tuple], tuple[dict, Path]],
) -> Iterator[tuple[dict, Path]]:
    """Every group prepared and every run (``run[0]`` its arm) run, ``parallel`` at a time in one pool, in order:
    the groups first, then the runs, each run as soon as its own arm's group is prepared, not once all are (a core
    that a finished warm-up leaves idle takes a run; on the protocol's empty cache the warm-ups kept both busy, so it
    saved nothing measurable there). Yields each run's result in ``runs``' order; the first failure stops every run
    not yet started."""
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        prepared = {}
        for group in groups:
            future = pool.submit(prepare_one, group)  # submitted first: a run never waits on a group not yet started
            prepared.update(dict.fromkeys(group, future))

        def run_prepared(run: tuple) -> tuple[dict, Path]:
            prepared[run[0]].result()
            return run_one(run)

        yield from pool.map(run_prepared, runs)  # a failure closes map's iterator, which cancels the runs not started


def prepare(arm: Arm, heldout: int) -> dict[str, str]:
    """The arm's smoke policy, rows and judge (cached), and its held-out rows."""
    from verl_evidence.local.smoke.cli import prepare as smoke_prepare
    from verl_evidence.local.smoke.warmup_data import heldout_rows

    variables = smoke_prepare(arm.method, warmup_of(arm))
    variables["VAL_FILES"] = str(heldout_rows(arm.method, Path(variables["MODEL_PATH"]), heldout))
    return variables


def branch_prefix(labels: Sequence[int]) -> int:
    """Where the last reply turn starts: the first position of the last run of trained labels (not -100)."""
    end = len(labels)
    while end and labels[end - 1] == -100:
        end -= 1
    start = end
    while start and labels[start - 1] != -100:
        start -= 1
    return start


SAMPLING_LOCK = threading.Lock()


def sample_warmup_replies(
    policy: Path, family: str, samples: int, seed: int, max_new_tokens: int
) -> list[tuple[dict, list[str]]]:
    """Each of ``family``'s warm-up questions (its first example of it) with ``samples`` continuations of the warmed-up
    ``policy`` at temperature 1, sampled where the example's last reply starts: the warm-up's own context, where the
    policy makes the choice it learnt."""
    import torch

    from verl_evidence.local.backends import share_key_value_heads
    from verl_evidence.local.smoke.training import example_ids
    from verl_evidence.local.smoke.warmup_data import warmup_examples

    # One warm-up at a time, from the import on: torch has one global generator (two warm-ups sampled at once would
    # draw each other's numbers), and transformers' lazy module is not thread-safe on a name's first import (two
    # groups whose warm-ups were cached reached this line together: "cannot import name 'AutoModelForCausalLM'").
    with SAMPLING_LOCK:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(policy)
        model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32, attn_implementation="sdpa").eval()
        share_key_value_heads(model)  # the CPU rollout's attention: the same samples, faster
        sampled = []
        first_examples = {}
        for example in warmup_examples(family, policy):
            first_examples.setdefault(example["question"], example)
        torch.manual_seed(seed)
        for example in first_examples.values():
            ids, labels = example_ids(tokenizer, example)
            prefix = torch.tensor([ids[: branch_prefix(labels)]])
            with torch.no_grad():
                out = model.generate(
                    prefix,
                    attention_mask=torch.ones_like(prefix),
                    do_sample=True,
                    temperature=1.0,
                    top_k=0,
                    max_new_tokens=max_new_tokens,
                    num_return_sequences=samples,
                    pad_token_id=tokenizer.pad_token_id,
                )
            texts = [tokenizer.decode(row, skip_special_tokens=True) for row in out[:, prefix.shape[1] :]]
            sampled.append((example, texts))
    return sampled


def warmup_note_rate(
    policy: Path, samples: int = 16, seed: int = 0, family: str = "search_neutral"
) -> dict[str, float]:
    """The neutral warm-up policy's note rate, sampled where it decides: after each warm-up question's search and
    observation (the warm-up's own context), the share of ``samples`` continuations at temperature 1 that open a
    ``<summary>`` rather than an ``<answer>``, the share EviNote's gate would pay (well formed, and a right answer or a
    well-formed note), and in how many questions' samples both happen (a note and none; paid and not): where a group
    is all one way, GRPO has no advantage to give."""
    from verl_evidence.rewards.answer import compute_score as exact_match
    from verl_evidence.rewards.evinote import compute_score

    notes = answers = paid = right = 0
    both_replies = paid_spread = right_spread = 0
    sampled = sample_warmup_replies(policy, family, samples, seed, max_new_tokens=64)
    golds = gold_truths([example for example, _ in sampled], policy, "evinote")
    for example, texts in sampled:
        noted = [text.startswith("<summary>") for text in texts]
        paying = [compute_score(None, text, golds[example["question"]])["score"] > 0 for text in texts]
        matching = [exact_match(None, text, golds[example["question"]])["em"] > 0 for text in texts]
        notes += sum(noted)
        answers += sum(text.startswith("<answer>") for text in texts)
        paid += sum(paying)
        right += sum(matching)
        both_replies += 0 < sum(noted) < len(texts)
        paid_spread += 0 < sum(paying) < len(texts)
        right_spread += 0 < sum(matching) < len(texts)
    total = samples * len(sampled)
    return {
        "note_rate": notes / total,
        "answer_rate": answers / total,
        "evinote_paid": paid / total,
        "exact_match": right / total,
        "samples": float(total),
        "questions": float(len(sampled)),
        "questions_noted_both_ways": float(both_replies),
        "questions_paid_both_ways": float(paid_spread),
        "questions_right_and_wrong": float(right_spread),
    }


def judged_relevant(text: str) -> bool | None:
    """The judgement a ``grace_judged`` reply opens with (its think block): True for relevant references, False for
    not relevant, None for a reply without one of the two."""
    from verl_evidence.local.smoke.warmup_data import GRACE_JUDGEMENTS
    from verl_evidence.text.tags import find_blocks

    thoughts = find_blocks(text, "think")
    return next((relevant for relevant, said in GRACE_JUDGEMENTS.items() if thoughts and thoughts[0] == said), None)


def warmup_path_rate(policy: Path, samples: int = 8, seed: int = 0, family: str = "grace_judged") -> dict[str, object]:
    """The GRACE warm-up policy, sampled in its own context (each warm-up question's prompt, ``samples`` replies at
    temperature 1): how often the path is right (a valid structure, evidence on an answerable context, recall on an
    unanswerable one), how many questions' groups have a spread in GRACE's score (a group whose samples all score
    alike has no advantage to learn from) and in the path, and the score's share of the ceiling; on ``grace_judged``
    also how often the opening judgement is right, and how often the path follows the judgement (evidence after
    "relevant": what GRACE's reward pays for where the judgement is right)."""
    from verl_evidence.rewards.grace import score

    config = grace_config()
    sampled = sample_warmup_replies(policy, family, samples, seed, max_new_tokens=GRACE_REPLY_TOKENS)
    golds = gold_truths([example for example, _ in sampled], policy, "grace")
    per_question = []
    scores, ceilings = [], []
    for example, texts in sampled:
        truth = golds[example["question"]]
        results = [score(text, truth["target"], truth["evidence"], truth["answerable"], config) for text in texts]
        judged = [judged_relevant(text) for text in texts]
        pairs = list(zip(judged, results, strict=True))
        valid = [r for r in results if r["format"] > 0]
        per_question.append(
            {
                "question": example["question"],
                "answerable": bool(truth["answerable"]),
                "path_right": sum(bool(r["chose_evidence"]) == bool(truth["answerable"]) for r in valid),
                "valid": len(valid),
                "judged_right": sum(j is not None and j == bool(truth["answerable"]) for j in judged),
                "path_follows_judgement": sum(
                    j is not None and r["format"] > 0 and bool(r["chose_evidence"]) == j for j, r in pairs
                ),
                "judged_and_valid": sum(j is not None and r["format"] > 0 for j, r in pairs),
                "score_spread": len({r["score"] for r in results}) > 1,
                "both_paths": len({r["chose_evidence"] for r in valid}) > 1,
            }
        )
        scores += [r["score"] for r in results]
        ceilings += [grace_ceiling({"answerable": float(truth["answerable"])}, config)] * len(results)
    total = samples * len(sampled)
    judged_and_valid = sum(q["judged_and_valid"] for q in per_question)
    return {
        "path_right": sum(q["path_right"] for q in per_question) / total,
        "valid": sum(q["valid"] for q in per_question) / total,
        "judged_right": sum(q["judged_right"] for q in per_question) / total,
        "path_follows_judgement": (
            sum(q["path_follows_judgement"] for q in per_question) / judged_and_valid if judged_and_valid else None
        ),
        "questions": len(per_question),
        "questions_with_score_spread": sum(q["score_spread"] for q in per_question),
        "questions_with_both_paths": sum(q["both_paths"] for q in per_question),
        "share_of_ceiling": sum(scores) / sum(ceilings),
        "samples": total,
        "per_question": per_question,
    }


def format_path_rate(paths: Mapping) -> str:
    """:func:`warmup_path_rate`'s summary and, per question, its right paths of the valid samples."""
    head = (
        f"path right {paths['path_right']:.2f}, valid {paths['valid']:.2f} of {paths['samples']} samples; "
        f"{paths['questions_with_score_spread']} of {paths['questions']} questions with a spread in the score, "
        f"{paths['questions_with_both_paths']} with both paths; score {paths['share_of_ceiling']:.0%} of the ceiling"
    )
    if paths.get("path_follows_judgement") is not None:
        head += (
            f"; judgement right {paths['judged_right']:.2f}, path follows the judgement "
            f"{paths['path_follows_judgement']:.2f} of the judged valid samples"
        )
    judged = paths.get("path_follows_judgement") is not None  # grace_judged: each question's judgements too
    rows = []
    for q in paths["per_question"]:
        kind = "answerable" if q["answerable"] else "unanswerable"
        judgements = f", judged right {q['judged_right']}" if judged else ""
        valid = f"right path {q['path_right']} of {q['valid']} valid{judgements}"
        rows.append(f"    {kind:12} {valid}  {q['question'][:60]}")
    return "\n".join([head, *rows])


def gold_truths(examples: Sequence[Mapping], policy: Path, data: str) -> dict[str, dict]:
    """The ground truth (the ``data`` preparation's rows) of each warm-up example's question."""
    from verl_evidence.local.smoke.data import method_data, read_rows

    questions = {e["question"] for e in examples}
    return {
        row["extra_info"]["question"]: row["reward_model"]["ground_truth"]
        for row in read_rows(method_data(data, policy))
        if row["extra_info"]["question"] in questions
    }


def fixed_batch_rows(rows: Sequence[dict], count: int, key: str) -> list[dict]:
    """A fixed batch of ``count`` training rows, the values of the ground-truth field ``key`` (GRACE's
    ``answerable``) sharing it equally: in each class the first questions by :func:`question_hash`, whatever the
    seed. verl's seeded shuffle drew GRACE's 2 questions from one class in two seeds of three (both unanswerable:
    a batch already at its ceiling)."""
    from verl_evidence.local.smoke.warmup_data import heldout_split

    classes = {str(row["reward_model"]["ground_truth"].get(key)) for row in rows}
    if count % max(1, len(classes)):
        raise ValueError(f"a batch of {count} questions cannot be shared equally between {key} {sorted(classes)}")
    chosen = heldout_split(list(rows), [], count, balance_key=key)  # nothing held out: the hash order, balanced
    if len(chosen) != count:
        raise ValueError(f"{count} questions asked, {len(chosen)} found balanced by {key} in the training rows")
    return chosen


def write_fixed_batch(train_files: str, count: int, key: str, run_dir: Path) -> Path:
    """:func:`fixed_batch_rows` of the arm's training rows, as the run's own training file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from verl_evidence.local.smoke.data import read_rows

    out = run_dir / "fixed_batch.parquet"
    pq.write_table(pa.Table.from_pylist(fixed_batch_rows(read_rows(Path(train_files)), count, key)), out)
    return out


def training_questions(variables: Mapping[str, str]) -> int:
    import pyarrow.parquet as pq

    return pq.read_metadata(variables["TRAIN_FILES"]).num_rows


def mini_batch_size(batch: int, updates_per_step: int) -> int:
    """Questions per optimizer update so that a step of ``batch`` questions makes ``updates_per_step`` updates (fewer
    when the batch is smaller: every update needs one question at least). verl asks for a batch the mini-batch
    divides; a batch that does not split evenly is an error here, before any run starts."""
    updates = max(1, min(updates_per_step, batch))
    if batch % updates:
        raise ValueError(
            f"a batch of {batch} questions does not split into {updates} equal updates; pick --questions "
            f"as a multiple of {updates}"
        )
    return batch // updates


def validation_env(steps: int, negate: bool) -> dict[str, str]:
    """Held-out validation before the first step and after the last for a plain run (the comparison's held-out
    measures); none for a sign-control run, whose verdict reads its training reward alone."""
    if negate:
        return {"VAL_BEFORE_TRAIN": "false", "TEST_FREQ": "-1"}
    return {"VAL_BEFORE_TRAIN": "true", "TEST_FREQ": str(steps)}


def retrieval_env(arm: Arm, retrieval_url: str | None) -> dict[str, str]:
    """Where a run's searches go: the benchmark's shared server for a search arm when there is one (the recipe uses
    a server that answers at ``RETRIEVAL_URL`` instead of starting its own), else a port no other run's server holds."""
    if retrieval_url and arm.kind == "search":
        return {"RETRIEVAL_URL": retrieval_url}
    return {"RETRIEVAL_PORT": str(free_port())}


# The shared server's Serve controller checks its deployments every second, not every 0.1 s (Ray's default): idle
# between search runs it used ~5 CPU-s a minute with the default and ~2 with this (measured), on a machine whose two
# cores the trainers keep busy. Its one deployment never scales, so a slower control loop changes nothing else.
SHARED_SERVER_ENV = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1"}


class SharedRetrievalServer:
    """One retrieval server for the search runs, as a cluster's jobs share one: the smoke recipes' own (``verl-evidence
    serve``, the bundled corpus and MiniLM), instead of one in each search run (~10 CPU-s and ~20 s of a run's start).

    It is up only while a search run uses it: :meth:`serving` starts it for the first of them and stops it when the last
    one ends. Idle, the server's Ray and Serve processes still use ~7 CPU-s a minute (measured: controller, proxy,
    replica, Ray's daemons), and the protocol's search runs (EviNote and Search-R1, seed by seed) take about a third of
    its wall time: up for the whole protocol it cost ~200 CPU-s more than three starts of ~10 CPU-s each."""

    def __init__(self, log: Path, command: Sequence[str] | None = None, ready_timeout_s: float = 600.0) -> None:
        self.log = log
        # the port is appended: a new one at each start, so a stopping server never holds the next one's
        self.command = list(command or [str(Path(sys.executable).with_name("verl-evidence")), "serve", "--port"])
        self.ready_timeout_s = ready_timeout_s
        self.starts = 0
        self._lock = threading.Lock()
        self._users = 0
        self._process: subprocess.Popen | None = None
        self._url: str | None = None
        self._stopping: list[threading.Thread] = []

    @contextlib.contextmanager
    def serving(self) -> Iterator[str]:
        """The server's URL for one run, the server started first if none is up; stopped after the last user leaves."""
        with self._lock:  # one start at a time; a second run waits for the first one's server
            if self._process is None:
                self._start()
            self._users += 1
            url = self._url
        try:
            yield url
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._stop_in_background()

    def close(self) -> None:
        """Stop the server if it is up and wait for every stop to finish."""
        with self._lock:
            if self._process is not None:
                self._stop_in_background()
        for thread in self._stopping:
            thread.join()

    def _start(self) -> None:
        import httpx

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        self.starts += 1
        with self.log.open("w" if self.starts == 1 else "a") as out:
            out.write(f"# start {self.starts}: {url}\n")
            out.flush()
            process = subprocess.Popen(
                [*self.command, str(port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **SHARED_SERVER_ENV},
            )
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the shared retrieval server exited ({process.returncode}): see {self.log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                _stop(process)
                raise RuntimeError(
                    f"the shared retrieval server did not answer at {url} within {self.ready_timeout_s:.0f} s: "
                    f"see {self.log}"
                )
            time.sleep(0.5)
        self._process, self._url = process, url

    def _stop_in_background(self) -> None:
        """Stopped in a thread of its own: the run that left does not wait for Ray's shutdown to start the next."""
        process, self._process, self._url = self._process, None, None
        thread = threading.Thread(target=_stop, args=(process,), name="stop-retrieval-server")
        thread.start()
        self._stopping.append(thread)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(2)  # SIGINT: `serve` shuts its Ray down itself
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(timeout=30)


def recipe_variables(pairs: Sequence[str]) -> dict[str, str]:
    """``--recipe-var NAME=VALUE`` pairs as a mapping; a pair without ``=`` or with a name that is not a shell
    variable's is refused."""
    found = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.isidentifier() or not name.isupper():
            raise ValueError(f"--recipe-var {pair!r}: expected NAME=VALUE with an upper-case variable name")
        found[name] = value
    return found


def arm_learning_rate(arm: Arm, lr: str | None) -> str | None:
    """The ``LR`` an arm's runs train at: the benchmark's ``--lr`` times the arm's ``lr_scale`` (None: the recipe's own
    smoke rate, unscaled)."""
    if lr is None:
        return None
    return f"{float(lr) * arm.lr_scale:g}"


def run_arm(
    name: str,
    seed: int,
    steps: int,
    heldout: int,
    val_n: int,
    run_dir: Path,
    lr: str | None = None,
    questions: int | None = None,
    negate: bool = False,
    group_size: int | None = None,
    extra_overrides: Sequence[str] = (),
    recipe_vars: Mapping[str, str] | None = None,
    retrieval_url: str | None = None,
) -> dict:
    """One training run of an arm. ``questions``: train on the first N training questions, all of them in every step
    (None: every training question of the arm in every step); ``negate``: the sign control (the reward times -1);
    ``extra_overrides`` and ``recipe_vars``: one setting changed in every run (``--override``, ``--recipe-var``: a
    cause checked by a run that changes only it), after the benchmark's own;
    ``retrieval_url``: a running server for a search arm's searches (None: the recipe starts its own)."""
    arm = ARMS[name]
    run_dir.mkdir(parents=True, exist_ok=True)
    variables = prepare(arm, heldout)
    if questions and arm.balance_key:
        variables["TRAIN_FILES"] = str(write_fixed_batch(variables["TRAIN_FILES"], questions, arm.balance_key, run_dir))
    batch = questions or training_questions(variables)
    mini_batch = mini_batch_size(batch, arm.updates_per_step)
    env = {
        **os.environ,
        **variables,
        **arm.env,
        "PYTHON": sys.executable,
        "VERL_FILE_LOGGER_PATH": str(run_dir / "metrics.jsonl"),
        "CHECKPOINT_DIR": str(run_dir / "checkpoints"),
        "SMOKE_STEPS": str(steps),
        # every step sees the same questions (one step an epoch) and makes the recipe's number of updates
        "BATCH": str(batch),
        "MINI_BATCH": str(mini_batch),
        "EPOCHS": str(steps),
        **validation_env(steps, negate),
        **retrieval_env(arm, retrieval_url),  # the shared server, or a port never another run's (or user's)
    }
    warmup = warmup_of(arm)
    if warmup:
        env[WARMUP_ENV] = warmup
    if env.get(CORPUS_TOKENIZER_ENV):
        env["MAX_TOKENS_PER_GPU"] = str(PACK_TOKENS)
    if lr:
        env["LR"] = arm_learning_rate(arm, lr)
    if group_size:
        env["GROUP_SIZE"] = str(group_size)
    env.update(recipe_vars or {})
    env.pop("RAY_ADDRESS", None)
    if "RETRIEVAL_PORT" in env:
        env.pop("RETRIEVAL_URL", None)  # the run's own server, on its own port
    overrides = [
        f"trainer.rollout_data_dir={run_dir / 'rollouts'}",
        f"trainer.validation_data_dir={run_dir / 'validation'}",
        f"actor_rollout_ref.rollout.seed={seed}",
        f"data.seed={seed}",
        # a run repeats with its seed: every sample's requests are named by its place in the batch (verl's switch),
        # and the CPU rollout seeds each request's draws by that name (verl_evidence.local.backends.RequestSeeds)
        "actor_rollout_ref.rollout.full_determinism=true",
        # held-out behaviour as sampled, as in training (verl validates greedily by default)
        f"actor_rollout_ref.rollout.val_kwargs.n={val_n}",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        "actor_rollout_ref.rollout.val_kwargs.top_p=1.0",
        f"data.train_max_samples={batch if questions else -1}",
        # A step's "old" policy is the one that sampled (verl computes it once a step, before the step's first
        # update; later mini-batches' ratios then move away from 1 and PPO clips them), so verl's bypass mode takes
        # the rollout's own log-probs instead of recomputing them (~2 s a step here), with the same PPO-clip loss.
        # Same fp32 weights: without bypass the two agreed to 6e-5 or better (training/rollout_probs_diff_max,
        # every run of the comparison).
        "algorithm.rollout_correction.bypass_mode=true",
        *(negated_overrides(name) if negate else arm.overrides),
        *extra_overrides,
    ]
    started = time.perf_counter()
    result = subprocess.run(
        ["bash", str(REPO / "recipes" / arm.recipe), "--smoke", *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.perf_counter() - started
    (run_dir / "training.log").write_text(result.stdout + result.stderr)
    label = name + (NEGATED_SUFFIX if negate else "")
    record = {
        "arm": label,
        "seed": seed,
        "questions": batch,
        "group_size": group_size,  # None: the recipe's own
        "overrides": list(extra_overrides),
        "recipe_vars": dict(recipe_vars or {}),
        "returncode": result.returncode,
        "wall_s": round(wall, 1),
    }
    (run_dir / "run.json").write_text(json.dumps(record))
    return record


def run_with_retry(run: tuple) -> tuple[dict, Path]:
    """:func:`run_arm` with ``run``'s arguments; a run that failed before its first step is started once more."""
    run_dir = run[5]
    record = run_arm(*run)
    if record["returncode"] and not trained_a_step(run_dir):
        # Ray's start-up timed out once on an overloaded machine ("The current node timed out during startup"):
        # a run that failed before its first step is started once more, from scratch.
        print(json.dumps({**record, "retried": True}), flush=True)
        shutil.rmtree(run_dir)
        record = run_arm(*run)
    return record, run_dir


def trained_a_step(run_dir: Path) -> bool:
    metrics = run_dir / "metrics.jsonl"
    return metrics.exists() and any(step > 0 for step in read_metrics(metrics))


def twins_not_run(arms: Sequence[str], checked: Sequence[str]) -> list[str]:
    """Arms left out of ``arms`` because their runs are those of an arm that was ``checked``."""
    return [name for name, arm in ARMS.items() if name not in arms and arm.same_runs_as and arm.same_runs_as in checked]


def analyse(
    out: Path, arms: Sequence[str]
) -> tuple[list[Point], list[dict], list[Direction], list[SignCheck], dict[str, RunCost]]:
    points: list[Point] = []
    costs: dict[str, RunCost] = {}
    for run_dir in sorted(out.glob("*-seed*")):
        label, _, seed = run_dir.name.rpartition("-seed")
        arm = label.removesuffix(NEGATED_SUFFIX)
        if arm in arms and (run_dir / "metrics.jsonl").exists():
            points += run_points(label, int(seed), ARMS[arm].kind, run_dir, ARMS[arm].ceiling)
            if (run_dir / "run.json").exists():
                wall = json.loads((run_dir / "run.json").read_text())["wall_s"]
                cost = run_cost(read_metrics(run_dir / "metrics.jsonl"), wall)
                if cost is not None:
                    costs[run_dir.name] = cost
    write_csv(points, out / "curves.csv")
    plot(points, [a for a in arms if any(p.arm == a for p in points)], out / "curves.png")
    rows = summary_table(points, arms)
    found = directions(points)
    checks = [c for c in sign_checks(points, arms) if c.plain or c.negated]
    labels = sorted({p.arm for p in points})
    (out / "summary.json").write_text(
        json.dumps(
            {
                "table": rows,
                "directions": [d.__dict__ for d in found],
                "sign_checks": [
                    {
                        "arm": c.arm,
                        "verdict": c.verdict,
                        "rises": c.rises,
                        "falls": c.falls,
                        "rising_seeds": c.rising_seeds,
                        "seeds_needed": c.needed,
                        "short_of": c.short_of,
                        "step_1_share_of_ceiling": c.start_share,
                    }
                    for c in checks
                ],
                "fired_at_step_1": fire_rates(points, labels),
                "groups_with_spread_at_step_1": fire_rates(points, labels, "groups_with_spread"),
                "costs": {name: {**cost.__dict__, "start_s": round(cost.start_s, 1)} for name, cost in costs.items()},
                "runs_are_another_arms": {
                    name: ARMS[name].same_runs_as for name in twins_not_run(arms, [c.arm for c in checks])
                },
            },
            indent=2,
            default=str,
        )
    )
    return points, rows, found, checks, costs


def train_all(args: argparse.Namespace, out: Path, questions: int | None, signs: list[bool], sign_steps: int) -> None:
    """Every run of the benchmark, into ``out``: each warm-up with its arms' data, then each arm x seed x sign as soon
    as its arm's warm-up is ready, ``args.parallel`` at a time (the search runs with the shared retrieval server, up
    while one of them runs)."""
    load = [round(x, 2) for x in os.getloadavg()]
    print(
        f"load average at start: {load}; N={args.steps}, seeds {args.seeds}, arms {args.arms}, lr {args.lr}, "
        f"questions {args.questions}, sign control {f'{sign_steps} steps' if len(signs) > 1 else False}, "
        f"tokenizer {args.tokenizer_vocab or 'recipes'}, warm-up seed {args.warmup_seed}, group size "
        f"{args.group_size or 'the recipe'}, overrides {args.override}, recipe variables {args.recipe_var}",
        flush=True,
    )
    started = time.perf_counter()
    server = SharedRetrievalServer(out / "retrieval_server.log")
    try:

        def run_one(run: tuple) -> tuple[dict, Path]:  # a search run uses the shared server, the others do not
            if ARMS[run[0]].kind != "search":
                return run_with_retry((*run, None))
            with server.serving() as url:
                return run_with_retry((*run, url))

        runs = [  # seed by seed: a stopped benchmark still has every arm of the first seed
            (
                arm,
                seed,
                sign_steps if n else args.steps,
                args.heldout,
                args.val_n,
                out / f"{arm}{NEGATED_SUFFIX if n else ''}-seed{seed}",
                args.lr,
                questions,
                n,
                args.group_size,
                tuple(args.override),
                recipe_variables(args.recipe_var),
            )
            for seed in args.seeds
            for arm in args.arms
            for n in signs
        ]
        results = run_when_prepared(
            warmup_groups(args.arms),
            runs,
            args.parallel,
            lambda group: prepare_group(group, args.heldout, questions, out),
            run_one,
        )
        for record, run_dir in results:
            print(json.dumps(record), flush=True)
            if record["returncode"]:
                print((run_dir / "training.log").read_text()[-3000:], file=sys.stderr)
    finally:
        server.close()
    if server.starts:
        print(f"the shared retrieval server was started {server.starts} time(s)", flush=True)
    wall = time.perf_counter() - started
    print(f"wall time {wall / 60:.1f} min; load average at end: {[round(x, 2) for x in os.getloadavg()]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (N)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument(
        "--arms",
        nargs="+",
        choices=list(ARMS),
        default=DEFAULT_ARMS,
        help=f"default: {' '.join(DEFAULT_ARMS)} (an arm whose runs repeat another arm's runs only when named)",
    )
    parser.add_argument(
        "--questions",
        default="all",
        help="training questions, all of them in every step: a number, or 'all' (every warm-up question of the arm)",
    )
    parser.add_argument(
        "--fixed-batch",
        action="store_true",
        help="the learning check: each arm's reward must rise on the same questions and fall when negated",
    )
    parser.add_argument("--no-sign-control", action="store_true", help="with --fixed-batch: skip the negated runs")
    parser.add_argument(
        "--sign-control-steps",
        type=int,
        help=f"training steps of each negated run (default: the check's {CHECK_STEPS}, or --steps if fewer); the plain "
        "runs take --steps, as they are the comparison's runs too",
    )
    parser.add_argument("--heldout", type=int, default=8, help="held-out questions per arm")
    parser.add_argument("--val-n", type=int, default=4, help="samples per held-out question per validation")
    parser.add_argument("--lr", help="the actor's learning rate in every arm (default: the smoke runs' 1e-4)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/verl-evidence-learning"))
    parser.add_argument("--group-size", type=int, help="samples per question per step (default: the recipes' 8)")
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="runs at a time, each its own trainer (worth it while one run leaves cores idle; measure first)",
    )
    parser.add_argument(
        "--tokenizer-vocab",
        type=int,
        default=TOKENIZER_VOCAB,
        help="the policies' tokenizer: a BPE of this many entries trained on the smoke texts (0: the recipes' own "
        "byte-like one, as the suite's smoke runs); each has its own warm-ups in the smoke cache",
    )
    parser.add_argument(
        "--warmup-seed",
        type=int,
        default=0,
        help="warm every policy up again with this seed (its examples' order and torch's seed; 0: the recipes' own "
        "warm-ups), cached apart: does a result hold over several warm-ups, not one?",
    )
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Hydra override added to every run after the benchmark's own (repeatable), e.g. "
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean: one setting changed, the rest as the protocol",
    )
    parser.add_argument(
        "--recipe-var",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a recipe variable set in every run (repeatable), e.g. CLIP_HIGH=0.2 or OVERLONG_LEN=0",
    )
    parser.add_argument("--analyse", type=Path, help="read the runs already in this directory; train nothing")
    args = parser.parse_args()
    try:
        recipe_variables(args.recipe_var)
    except ValueError as error:
        parser.error(str(error))
    if any("=" not in o for o in args.override):
        parser.error("--override takes KEY=VALUE (a Hydra override)")
    if args.warmup_seed < 0:
        parser.error("--warmup-seed is 0 or more")
    if args.warmup_seed:
        os.environ[WARMUP_SEED_ENV] = str(args.warmup_seed)  # this process's warm-ups and every run's
    else:
        os.environ.pop(WARMUP_SEED_ENV, None)
    if args.tokenizer_vocab:
        os.environ[CORPUS_TOKENIZER_ENV] = str(args.tokenizer_vocab)  # this process's warm-ups and every run's
    else:
        os.environ.pop(CORPUS_TOKENIZER_ENV, None)
    questions = None if args.questions == "all" else int(args.questions)
    signs = [False, True] if args.fixed_batch and not args.no_sign_control else [False]
    sign_steps = args.sign_control_steps or min(args.steps, CHECK_STEPS)

    out = args.analyse or args.out
    out.mkdir(parents=True, exist_ok=True)
    if not args.analyse:
        train_all(args, out, questions, signs, sign_steps)
    points, rows, found, checks, costs = analyse(out, args.arms)
    print("\nfirst vs last (train: mean of the first and last third of the steps; held-out: step 0 and step N)")
    print(format_table(rows))
    if checks:
        # the comparison's runs are fixed batches too (every question, every step): their plain half of the check
        half = "" if any(c.negated for c in checks) else "; no negated runs: the sign control runs with --fixed-batch"
        print(
            "\nfixed-batch check (the reward's last third minus its first third, against the step-to-step spread"
            f"{half}; shown: the plain reward rises beyond its spread in {RISE_SHARE:.0%} of the seeds or more, "
            "rounded up, and the negated one falls in every seed):"
        )
        print(format_sign_checks(checks))
        for name in twins_not_run(args.arms, [c.arm for c in checks]):
            print(
                f"{name}: not run; its runs are {ARMS[name].same_runs_as}'s (same prompt, rows, reward numbers and "
                f"trainer settings), so {ARMS[name].same_runs_as}'s verdict is its verdict (--arms {name} runs it)"
            )
    print("\nshare of step-1 samples the reward paid, and of step-1 groups whose rewards differ (mean over seeds):")
    labels = sorted({p.arm for p in points})
    spreads = fire_rates(points, labels, "groups_with_spread")
    for label, rate in fire_rates(points, labels).items():
        print(f"    {label:20} paid {rate:.2f}   groups with a spread {spreads.get(label, float('nan')):.2f}")
    print(
        "\ndirections the papers claim (counted only when every seed agrees and the change exceeds the seeds' spread):"
    )
    print(format_directions(found))
    if costs:
        print("\nwhere the seconds went (per run: start = wall - steps - validations; phases: seconds per step):")
        print(format_costs(costs))
        start, step = fmean(c.start_s for c in costs.values()), fmean(c.per_step["step"] for c in costs.values())
        steps = max(args.steps, CHECK_STEPS)
        whole = protocol_minutes(len(DEFAULT_ARMS), CHECK_SEEDS, 2, steps, start, step, args.parallel)
        print(
            f"at these runs' mean start ({start:.0f} s) and step ({step:.1f} s), every arm x {CHECK_SEEDS} seeds x "
            f"both signs x {steps} steps, {args.parallel} at a time: ~{whole:.0f} min"
        )
    print(f"\ncurves: {out / 'curves.csv'}, {out / 'curves.png'}")


if __name__ == "__main__":
    main()
