"""Training curves from verl's console log: the ``training.png`` / ``training.md`` of ``verl-evidence demo --train``.

Pure core: verl's console output (or its parsed ``{step: {metric: value}}``) in,
a PNG and a Markdown page out. Running the trainer is the caller's business.

What verl 0.9's v1 trainer logs, and so what can be plotted:

- per training step, the total reward of the step's rollouts (``critic/score/mean``,
  ``/min``, ``/max``), the GRPO advantages (``critic/advantages/min``, ``/max``), the
  actor's ``actor/grad_norm`` and timings (``timing_s/step``, ``timing_s/testing``);
- reward *components* only through validation: the trainer stacks every key of the
  reward manager's ``reward_extra_info`` over the validation samples and logs
  ``val-core|val-aux/<data_source>/<key>/mean@<n>`` (``reward`` is the total). The
  training step's own ``reward_extra_info`` is not logged (``trainer_base.py``
  ``_compute_metrics``; its rollout dump keeps only the uid). So the components are
  those of a validation pass before training (step 0) and after every update.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: clusters and CI have no display
import matplotlib.pyplot as plt

from verl_evidence.eval.report import format_value, markdown_table

__all__ = [
    "EVIOMNI_COMPONENTS",
    "TRAINING_MD",
    "TRAINING_PNG",
    "TrainingCurves",
    "plot_training",
    "training_curves",
    "training_markdown",
    "write_training_report",
]

TRAINING_PNG = "training.png"
TRAINING_MD = "training.md"

SCORE_MEAN, SCORE_MIN, SCORE_MAX = "critic/score/mean", "critic/score/min", "critic/score/max"
ADV_MIN, ADV_MAX = "critic/advantages/min", "critic/advantages/max"
GRAD_NORM = "actor/grad_norm"
STEP_SECONDS, VALIDATION_SECONDS = "timing_s/step", "timing_s/testing"
TRAIN_METRICS = (SCORE_MEAN, SCORE_MIN, SCORE_MAX, ADV_MIN, ADV_MAX, GRAD_NORM, STEP_SECONDS, VALIDATION_SECONDS)

# The EviOmni reward (verl_evidence.rewards.eviomni): total = l1 * ans + l2 * len + l3 * format,
# ans = mean answer F1 of o_f, o_r, o_e. ``reward`` is verl's own name for the total.
EVIOMNI_COMPONENTS: dict[str, str] = {
    "reward": "total reward",
    "ans": "answer F1 (mean of o_f, o_r, o_e)",
    "ans_f": "answer F1 of o_f",
    "ans_r": "answer F1 of o_r (rationale only)",
    "ans_e": "answer F1 of o_e (evidence only)",
    "len": "length reward",
    "format": "format reward",
}

_VALIDATION_KEY = re.compile(r"^val-(?:core|aux)/(?P<source>.+)/(?P<key>[^/]+)/mean@(?P<n>\d+)$")


@dataclass
class TrainingCurves:
    """Per-step series: ``train[metric][step]`` and ``validation[source][component][step]``."""

    train: dict[str, dict[int, float]] = field(default_factory=dict)
    validation: dict[str, dict[str, dict[int, float]]] = field(default_factory=dict)
    samples_per_validation: int | None = None  # the n of mean@n

    @property
    def train_steps(self) -> list[int]:
        return sorted({step for series in self.train.values() for step in series if step >= 1})

    @property
    def validation_steps(self) -> list[int]:
        return sorted({s for comps in self.validation.values() for series in comps.values() for s in series})

    @property
    def all_steps(self) -> list[int]:
        return sorted(set(self.train_steps) | set(self.validation_steps))

    def components(self, wanted: Sequence[str] | None = None) -> list[str]:
        """Validation components present, in the order of ``wanted`` (all, sorted, when None)."""
        present = {key for comps in self.validation.values() for key in comps}
        if wanted is None:
            return sorted(present)
        return [key for key in wanted if key in present]


def training_curves(metrics: Mapping[int, Mapping[str, float]]) -> TrainingCurves:
    """Sort verl's per-step metrics (:func:`verl_evidence.local.smoke.logs.step_metrics`) into curves."""
    curves = TrainingCurves()
    best_n: dict[tuple[str, str], int] = {}
    for step, values in sorted(metrics.items()):
        for name, value in values.items():
            if name in TRAIN_METRICS:
                curves.train.setdefault(name, {})[step] = float(value)
                continue
            match = _VALIDATION_KEY.match(name)
            if match is None:
                continue
            source, key, n = match["source"], match["key"], int(match["n"])
            if n < best_n.get((source, key), 0):
                continue  # mean@1 next to mean@4: the mean over all n samples is the one to show
            best_n[(source, key)] = n
            curves.validation.setdefault(source, {}).setdefault(key, {})[step] = float(value)
    if best_n:
        curves.samples_per_validation = max(best_n.values())
    return curves


def _series(values: Mapping[int, float], steps: Sequence[int]) -> tuple[list[int], list[float]]:
    xs = [s for s in steps if s in values and math.isfinite(values[s])]
    return xs, [values[s] for s in xs]


def plot_training(
    curves: TrainingCurves, path: str | Path, components: Sequence[str] | None = tuple(EVIOMNI_COMPONENTS)
) -> Path:
    """Three panels over the training steps: the rollouts' reward, the validation reward components,
    and the gradient norm with the advantage range."""
    path = Path(path)
    steps = curves.all_steps
    fig, (ax_train, ax_val, ax_grad) = plt.subplots(3, 1, figsize=(9, 10), sharex=True)

    xs, mean = _series(curves.train.get(SCORE_MEAN, {}), steps)
    if xs:
        ax_train.plot(xs, mean, marker="o", color="C0", label="mean")
        low_x, low = _series(curves.train.get(SCORE_MIN, {}), xs)
        high_x, high = _series(curves.train.get(SCORE_MAX, {}), xs)
        if low_x == xs and high_x == xs:
            ax_train.fill_between(xs, low, high, color="C0", alpha=0.2, label="min–max")
        ax_train.legend(loc="best", fontsize=8)
    else:
        ax_train.text(0.5, 0.5, "no training step logged", ha="center", va="center", transform=ax_train.transAxes)
    ax_train.set_title("training rollouts: reward per step (critic/score)")
    ax_train.set_ylabel("reward")

    wanted = curves.components(components) or curves.components(None)
    several_sources = len(curves.validation) > 1
    plotted = 0
    for source, comps in sorted(curves.validation.items()):
        for index, key in enumerate(wanted):
            if key not in comps:
                continue
            xs, ys = _series(comps[key], steps)
            label = key if not several_sources else f"{source}: {key}"
            total = key == "reward"
            ax_val.plot(xs, ys, marker="o", linewidth=2.5 if total else 1.2, color="black" if total else f"C{index}",
                        linestyle="-" if total or not key.startswith("ans_") else "--", label=label)
            plotted += 1
    n = curves.samples_per_validation
    ax_val.set_title(f"validation: reward components (mean@{n}) before training (step 0) and after each step"
                     if n else "validation: reward components")
    ax_val.set_ylabel("component")
    if plotted:
        ax_val.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    else:
        ax_val.text(0.5, 0.5, "no validation metrics logged", ha="center", va="center", transform=ax_val.transAxes)

    xs, grad = _series(curves.train.get(GRAD_NORM, {}), steps)
    handles = []
    if xs:
        handles += ax_grad.plot(xs, grad, marker="o", color="C3", label="actor/grad_norm")
    ax_grad.set_ylabel("grad norm")
    ax_adv = ax_grad.twinx()
    for metric, style in ((ADV_MAX, "-"), (ADV_MIN, "--")):
        xs, ys = _series(curves.train.get(metric, {}), steps)
        if xs:
            handles += ax_adv.plot(xs, ys, marker=".", linestyle=style, color="C2", label=metric)
    ax_adv.set_ylabel("advantage")
    ax_grad.set_title("actor gradient norm and GRPO advantage range")
    if handles:
        ax_grad.legend(handles=handles, loc="best", fontsize=8)
    ax_grad.set_xlabel("training step")
    if steps:
        ax_grad.set_xticks(steps)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


_TABLE_TRAIN_METRICS = (SCORE_MEAN, SCORE_MIN, SCORE_MAX, ADV_MIN, ADV_MAX, GRAD_NORM, STEP_SECONDS)


def step_table(curves: TrainingCurves, components: Sequence[str] | None = tuple(EVIOMNI_COMPONENTS)) -> str:
    """One row per step: the rollouts' reward, advantages, gradient, time, then the validation components."""
    wanted = curves.components(components) or curves.components(None)
    sources = sorted(curves.validation)
    val_columns = [(s, k) for s in sources for k in wanted if k in curves.validation[s]]
    header = ["step", "train reward mean", "min", "max", "advantage min", "advantage max", "grad norm", "step s"]
    header += [f"val {k}" if len(sources) == 1 else f"val {s}: {k}" for s, k in val_columns]
    rows = []
    for step in curves.all_steps:
        train = [curves.train.get(m, {}).get(step) for m in _TABLE_TRAIN_METRICS]
        val = [curves.validation[s][k].get(step) for s, k in val_columns]
        rows.append([str(step), *(("-" if v is None else v) for v in train), *(("-" if v is None else v) for v in val)])
    return markdown_table(header, rows)


def training_markdown(
    curves: TrainingCurves,
    *,
    title: str = "Training",
    intro: Sequence[str] = (),
    png_name: str = TRAINING_PNG,
    components: Sequence[str] | None = tuple(EVIOMNI_COMPONENTS),
) -> str:
    wanted = curves.components(components) or curves.components(None)
    lines = [f"# {title}", ""]
    lines += [*intro, ""] if intro else []
    lines += [f"![reward components per step]({png_name})", "", "## Per step", "", step_table(curves, components), ""]
    lines += [
        "`train reward` is verl's `critic/score` over the step's GRPO rollouts (sampled before that step's "
        "update); `val …` are the validation pass after the step's update (step 0: before training), "
        "where verl logs every key of the reward manager's `reward_extra_info`; verl 0.9 does not log the "
        "components of the training rollouts themselves.",
    ]
    described = [k for k in wanted if k in EVIOMNI_COMPONENTS]
    if described:
        lines += ["", "| component | meaning |", "|---|---|"]
        lines += [f"| `{k}` | {EVIOMNI_COMPONENTS[k]} |" for k in described]
    return "\n".join(lines).rstrip() + "\n"


@dataclass
class TrainingReport:
    markdown: Path
    png: Path
    curves: TrainingCurves


def write_training_report(
    metrics: Mapping[int, Mapping[str, float]],
    out_dir: str | Path,
    *,
    title: str = "Training",
    intro: Sequence[str] = (),
    components: Sequence[str] | None = tuple(EVIOMNI_COMPONENTS),
) -> TrainingReport:
    """``training.png`` and ``training.md`` in ``out_dir`` from verl's per-step metrics."""
    out = Path(out_dir)
    curves = training_curves(metrics)
    png = plot_training(curves, out / TRAINING_PNG, components)
    markdown = out / TRAINING_MD
    markdown.write_text(training_markdown(curves, title=title, intro=intro, components=components), encoding="utf-8")
    return TrainingReport(markdown=markdown, png=png, curves=curves)


def format_step(step: int, values: Mapping[str, float], total_steps: int | None = None) -> str:
    """One progress line for a step's metrics (step 0: the validation before training), for the terminal."""
    parts = ["before training" if step == 0 else f"step {step}" + (f"/{total_steps}" if total_steps else "")]
    if SCORE_MEAN in values:
        spread = ""
        if SCORE_MIN in values and SCORE_MAX in values:
            spread = f" ({format_value(values[SCORE_MIN])}–{format_value(values[SCORE_MAX])})"
        parts.append(f"train reward {format_value(values[SCORE_MEAN])}{spread}")
    if GRAD_NORM in values:
        parts.append(f"grad norm {format_value(values[GRAD_NORM])}")
    for name, value in values.items():
        match = _VALIDATION_KEY.match(name)
        if match and match["key"] == "reward" and name.startswith("val-core/"):
            parts.append(f"val reward {format_value(value)}")
            break
    if STEP_SECONDS in values:
        parts.append(f"{values[STEP_SECONDS]:.0f}s")
    return ", ".join(parts)
