"""Pure-reward throughput, and GRACE against a rouge-score baseline measured in the same run.

    python benchmarks/rewards.py [--n 4096] [--seed 0]

Prints responses/s of each method's compute_score on N synthetic responses
(grouped 8 per prompt, as GRPO/DAPO rollouts are), then the GRACE reward with
its ROUGE-L from ``text.rouge_l`` against the same gated reward computed with
``rouge_score.rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)`` per
response. Scores must be identical (|diff| <= 1e-9) or the script fails. The
"cold" run clears the stem/token caches first (what the first training step
sees); "warm" repeats the run with the caches filled (every later step).
Target: cold speed-up >= 5x.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table
from rouge_score import rouge_scorer

from verl_evidence.rewards import evinote, eviomni, grace, text

GROUP_SIZE = 8
TARGET_RATIO = 5.0

# Word lists kept dense: the formatter's one word a line would run to 100 lines.
# fmt: off
_STEMS = [
    "capital", "govern", "popul", "river", "mountain", "elect", "presid", "nation", "histor", "scien", "discover",
    "invent", "compos", "writ", "paint", "build", "found", "establish", "announc", "develop", "region", "provinc",
    "territor", "contin", "ocean", "island", "languag", "religi", "cultur", "econom", "industr", "agricult",
    "manufactur", "educ", "universit", "colleg", "hospit", "medic", "physic", "chemi", "biolog", "astronom", "planet",
    "satellit", "launch", "mission", "station", "journal", "publish", "record", "perform", "concert", "album",
    "singl", "champion", "tournament", "season", "leagu", "club", "stadium"
]
_SUFFIXES = ["", "s", "ed", "ing", "ation", "ations", "al", "ally", "ity", "ist", "ists", "er", "ers", "ness"]
_FUNCTION_WORDS = ["the", "of", "and", "in", "to", "a", "was", "is", "by", "for", "on", "with", "as", "at", "from"]
_NAMES = [
    "Paris", "Lyon", "Amazon", "Everest", "Curie", "Einstein", "Apollo", "Tokyo", "Nile", "Mozart", "1969", "1889"
]
# fmt: on


def _sentence(rng: random.Random, n_words: int) -> str:
    words = []
    for _ in range(n_words):
        r = rng.random()
        if r < 0.4:
            words.append(rng.choice(_FUNCTION_WORDS))
        elif r < 0.75:
            words.append(rng.choice(_STEMS) + rng.choice(_SUFFIXES))
        elif r < 0.9:  # rare words: keep the stem cache honest (mostly misses)
            words.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(4, 10))))
        else:
            words.append(rng.choice(_NAMES))
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", ".", ",", ";"])


def make_samples(n: int, seed: int) -> list[dict[str, Any]]:
    """Synthetic rollouts: 8 responses per prompt sharing one ground truth and one passage set."""
    rng = random.Random(seed)
    samples: list[dict[str, Any]] = []
    while len(samples) < n:
        passages = [" ".join(_sentence(rng, rng.randint(12, 30)) for _ in range(5)) for _ in range(5)]
        sentences = [s for p in passages for s in p.split(". ") if s]
        gold_evidence = rng.sample(sentences, k=min(len(sentences), rng.randint(1, 3)))
        answer = rng.choice(_NAMES)
        answerable = rng.random() < 0.6
        gt = {
            "target": [answer, answer.lower()],
            "evidence": gold_evidence if answerable else [],
            "answerable": answerable,
        }
        question = "What " + _sentence(rng, 10).rstrip(".,;").lower() + "?"
        for _ in range(GROUP_SIZE):
            quoted = " ".join(rng.sample(sentences, k=rng.randint(1, 4)))
            given = rng.choice([answer, rng.choice(_NAMES), f"{answer} {rng.choice(_STEMS)}"])
            reason = " ".join(_sentence(rng, rng.randint(10, 25)) for _ in range(rng.randint(2, 6)))
            kind = rng.random()
            if kind < 0.65:
                grace_resp = f"<think>{reason}</think><evidence>{quoted}</evidence><answer>{given}</answer>"
            elif kind < 0.9:
                grace_resp = f"<think>{reason}</think><llm>{_sentence(rng, 15)}</llm><answer>{given}</answer>"
            else:
                grace_resp = f"<think>{reason}</think><evidence>{quoted}<answer>{given}</answer>"  # malformed
            note = (
                f"*{given}* {_sentence(rng, 12)} -{rng.choice(_STEMS)}-" if rng.random() < 0.7 else _sentence(rng, 12)
            )
            evinote_resp = (
                f"<think>{_sentence(rng, 12)}</think><search>{question}</search>"
                f"<information>{passages[0]}</information><summary>{note}</summary>"
                f"<think>{_sentence(rng, 8)}</think><answer>{given}</answer>"
            )
            eviomni_resp = f"<reason>{reason}</reason><extract>{quoted}</extract><answer>{given}</answer>"
            samples.append(
                {
                    "gt": gt,
                    "grace": grace_resp,
                    "evinote": evinote_resp,
                    "eviomni": eviomni_resp,
                    "evinote_extra": {"eqr": rng.random(), "question": question},
                    "eviomni_extra": {
                        "eviomni_answer_r": f"<answer>{rng.choice([answer, given])}</answer>",
                        "eviomni_answer_e": rng.choice([answer, given]),
                        "eviomni_len_r": len(reason.split()) * 4 // 3,
                        "eviomni_len_e": len(quoted.split()) * 4 // 3,
                        "eviomni_len_p": sum(len(p.split()) for p in passages) * 4 // 3,
                    },
                }
            )
    return samples[:n]


class BaselineGrace:
    """The GRACE gated reward with ROUGE-L from rouge-score's RougeScorer, called per response.

    Gate logic is the project's (grace.structure_ok and the same branches), so
    the only difference measured is the ROUGE-L computation.
    """

    def __init__(self, config: grace.GraceConfig = grace.GRACE_TRAIN) -> None:
        self.config = config
        self.scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)

    def rouge(self, prediction: str, references: list[str]) -> float:
        if not references:
            return 0.0
        return max(self.scorer.score(ref, prediction)["rougeL"].fmeasure for ref in references)

    def __call__(self, solution_str: str, ground_truth: dict) -> float:
        gt = text.coerce_ground_truth(ground_truth)
        answerable = gt["answerable"] if gt["answerable"] is not None else bool(gt["evidence"])
        body = text.strip_thinking(solution_str)
        if not grace.structure_ok(body):
            return 0.0
        evidence = text.extract_last(body, "evidence")
        if (evidence is not None) != answerable:
            return self.config.format_reward
        total = self.config.format_reward + self.config.path_reward
        if evidence is not None:
            answer = text.extract_last(body, "answer") or ""
            total += self.config.alpha * self.rouge(evidence, gt["evidence"])
            total += self.config.beta * self.rouge(answer, gt["target"])
        return total


def clear_caches() -> None:
    text.rouge_tokens.cache_clear()
    text._rouge_stem.cache_clear()


def timed(fn: Callable[[], list[float]]) -> tuple[list[float], float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096, help="synthetic responses per method")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    samples = make_samples(args.n, args.seed)
    n = len(samples)
    console = Console()

    def run_method(name: str) -> list[float]:
        if name == "eviomni":
            return [eviomni.compute_score("nq", s["eviomni"], s["gt"], s["eviomni_extra"])["score"] for s in samples]
        if name == "evinote":
            return [evinote.compute_score("nq", s["evinote"], s["gt"], s["evinote_extra"])["score"] for s in samples]
        return [grace.compute_score("grace", s["grace"], s["gt"])["score"] for s in samples]

    baseline = BaselineGrace()
    baseline_scores, baseline_s = timed(lambda: [baseline(s["grace"], s["gt"]) for s in samples])
    clear_caches()
    grace_cold, grace_cold_s = timed(lambda: run_method("grace"))
    grace_warm, grace_warm_s = timed(lambda: run_method("grace"))

    mismatches = [i for i, (a, b) in enumerate(zip(grace_cold, baseline_scores)) if abs(a - b) > 1e-9]
    mismatches += [i for i, (a, b) in enumerate(zip(grace_warm, baseline_scores)) if abs(a - b) > 1e-9]
    content_scored = sum(1 for s in baseline_scores if s > 1.5)

    clear_caches()
    eviomni_scores, eviomni_s = timed(lambda: run_method("eviomni"))
    evinote_scores, evinote_s = timed(lambda: run_method("evinote"))

    table = Table(title=f"Pure rewards on {n} synthetic responses ({GROUP_SIZE} per prompt)")
    table.add_column("scorer")
    table.add_column("responses/s", justify="right")
    table.add_column("ms / response", justify="right")
    table.add_column("mean score", justify="right")
    rows = [
        ("eviomni.compute_score", eviomni_s, eviomni_scores),
        ("evinote.compute_score (EQR given)", evinote_s, evinote_scores),
        ("grace.compute_score, cold caches", grace_cold_s, grace_cold),
        ("grace.compute_score, warm caches", grace_warm_s, grace_warm),
        ("grace baseline (RougeScorer per response)", baseline_s, baseline_scores),
    ]
    for label, seconds, scores in rows:
        table.add_row(label, f"{n / seconds:,.0f}", f"{1000 * seconds / n:.3f}", f"{sum(scores) / n:.4f}")
    console.print(table)

    ratio_cold = baseline_s / grace_cold_s
    ratio_warm = baseline_s / grace_warm_s
    ratios = Table(title="GRACE speed-up over the rouge-score baseline (same run, same scores)")
    ratios.add_column("comparison")
    ratios.add_column("ratio", justify="right")
    ratios.add_column(f"target >= {TARGET_RATIO:g}x", justify="center")
    ratios.add_row("cold caches / baseline", f"{ratio_cold:.1f}x", "yes" if ratio_cold >= TARGET_RATIO else "NO")
    ratios.add_row("warm caches / baseline", f"{ratio_warm:.1f}x", "yes" if ratio_warm >= TARGET_RATIO else "NO")
    console.print(ratios)
    console.print(
        f"identical scores: {n - len(set(mismatches))}/{n} "
        f"({content_scored} responses reached the ROUGE-L content term)"
    )
    if mismatches:
        console.print(f"[red]score mismatch at samples {sorted(set(mismatches))[:10]}[/red]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
