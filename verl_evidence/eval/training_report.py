"""Training curves from verl's per-step metrics: ``training.png`` / ``training.md`` of ``verl-evidence demo --train``.

Pure core: verl's per-step metrics (``{step: {metric: value}}``, as
:func:`verl_evidence.local.smoke.logs.read_metrics` reads them from verl's file
logger) in, a PNG and a Markdown page out. Running the trainer is the caller's business.

What is logged per training step, and so what can be plotted:

- by verl's v1 trainer: the total reward of the step's rollouts (``critic/score/mean``,
  ``/min``, ``/max``), the GRPO advantages (``critic/advantages/min``, ``/max``), the
  actor's ``actor/grad_norm`` and timings (``timing_s/step``, ``timing_s/testing``);
- by this project's sampler (:mod:`verl_evidence.trainer.step_sampler`): the reward manager's
  components over the step's training rollouts, ``reward/<reward>/<key>/mean``
  (``score`` is the total), with the rollout's behaviour (``rollout/...``) and the
  masking shares (``masking/...``);
- by verl's validation: every key of ``reward_extra_info`` over the validation samples,
  ``val-core|val-aux/<data_source>/<key>/mean@<n>`` (``reward`` is the total), before
  training (step 0) and after every update.
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
_ROLLOUT_COMPONENT_KEY = re.compile(r"^reward/(?P<reward>[^/]+)/(?P<key>[^/]+)/mean$")
# verl names the validation total ``reward``; the managers' own name for it, logged per training step, is ``score``
TRAIN_TOTAL = "score"


@dataclass
class TrainingCurves:
    """Per-step series: ``train[metric][step]`` and ``validation[source][component][step]``."""

    train: dict[str, dict[int, float]] = field(default_factory=dict)
    validation: dict[str, dict[str, dict[int, float]]] = field(default_factory=dict)
    samples_per_validation: int | None = None  # the n of mean@n
    # the training rollouts' reward components (``reward/<reward>/<key>/mean``): rollout[key][step]
    rollout: dict[str, dict[int, float]] = field(default_factory=dict)
    reward_name: str | None = None
    # rollout behaviour and masking shares (``rollout/...``, ``masking/...``): behaviour[metric][step]
    behaviour: dict[str, dict[int, float]] = field(default_factory=dict)

    @property
    def train_steps(self) -> list[int]:
        return sorted({step for series in self.train.values() for step in series if step >= 1})

    @property
    def validation_steps(self) -> list[int]:
        return sorted({s for comps in self.validation.values() for series in comps.values() for s in series})

    @property
    def all_steps(self) -> list[int]:
        return sorted(set(self.train_steps) | set(self.validation_steps))

    def rollout_components(self, wanted: Sequence[str] | None = None) -> list[str]:
        """Training-rollout components present (the total, ``score``, left out), in the order of ``wanted``."""
        present = [key for key in self.rollout if key != TRAIN_TOTAL]
        if wanted is None:
            return sorted(present)
        return [key for key in wanted if key in present] or sorted(present)

    def components(self, wanted: Sequence[str] | None = None) -> list[str]:
        """Validation components present, in the order of ``wanted`` (all, sorted, when None)."""
        present = {key for comps in self.validation.values() for key in comps}
        if wanted is None:
            return sorted(present)
        return [key for key in wanted if key in present]


def training_curves(metrics: Mapping[int, Mapping[str, float]]) -> TrainingCurves:
    """Sort verl's per-step metrics (:func:`verl_evidence.local.smoke.logs.read_metrics`) into curves."""
    curves = TrainingCurves()
    best_n: dict[tuple[str, str], int] = {}
    for step, values in sorted(metrics.items()):
        for name, value in values.items():
            if name in TRAIN_METRICS:
                curves.train.setdefault(name, {})[step] = float(value)
                continue
            component = _ROLLOUT_COMPONENT_KEY.match(name)
            if component is not None:
                curves.reward_name = component["reward"]
                curves.rollout.setdefault(component["key"], {})[step] = float(value)
                continue
            if name.startswith(("rollout/", "masking/")):
                curves.behaviour.setdefault(name, {})[step] = float(value)
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
    """Three panels over the training steps: the training rollouts' reward and its components, the validation
    reward components, and the gradient norm with the advantage range."""
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
    else:
        ax_train.text(0.5, 0.5, "no training step logged", ha="center", va="center", transform=ax_train.transAxes)
    for index, key in enumerate(curves.rollout_components(components)):
        cxs, ys = _series(curves.rollout[key], steps)
        if cxs:
            ax_train.plot(
                cxs,
                ys,
                marker=".",
                linewidth=1.2,
                color=f"C{index + 1}",
                linestyle="--" if key.startswith("ans_") else "-",
                label=key,
            )
    if ax_train.get_legend_handles_labels()[0]:
        ax_train.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    source = f"reward/{curves.reward_name}/…" if curves.reward_name else "critic/score"
    ax_train.set_title(f"training rollouts: reward and its components per step ({source})")
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
            ax_val.plot(
                xs,
                ys,
                marker="o",
                linewidth=2.5 if total else 1.2,
                color="black" if total else f"C{index}",
                linestyle="-" if total or not key.startswith("ans_") else "--",
                label=label,
            )
            plotted += 1
    n = curves.samples_per_validation
    ax_val.set_title(
        f"validation: reward components (mean@{n}) before training (step 0) and after each step"
        if n
        else "validation: reward components"
    )
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
    """One row per step: the rollouts' reward, advantages, gradient, time, the training rollouts' components,
    then the validation components."""
    wanted = curves.components(components) or curves.components(None)
    sources = sorted(curves.validation)
    val_columns = [(s, k) for s in sources for k in wanted if k in curves.validation[s]]
    train_columns = curves.rollout_components(components)
    header = ["step", "train reward mean", "min", "max", "advantage min", "advantage max", "grad norm", "step s"]
    header += [f"train {k}" for k in train_columns]
    header += [f"val {k}" if len(sources) == 1 else f"val {s}: {k}" for s, k in val_columns]
    rows = []
    for step in curves.all_steps:
        train = [curves.train.get(m, {}).get(step) for m in _TABLE_TRAIN_METRICS]
        train += [curves.rollout[k].get(step) for k in train_columns]
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
        "update); `train …` are the reward manager's components over the same rollouts "
        "(`reward/<reward>/<component>/mean`, logged by verl-evidence's sampler, docs/training-metrics.md); "
        "`val …` are the validation pass after the step's update (step 0: before training), where verl logs "
        "every key of the reward manager's `reward_extra_info`.",
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
