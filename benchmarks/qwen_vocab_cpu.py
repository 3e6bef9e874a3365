"""What the CPU mode would cost on Qwen's real vocabulary (issue 52 item 6), against today's tiny tokenizer.

    python benchmarks/qwen_vocab_cpu.py [--reps 3] [--json-out FILE]

Two arms measured in the same run, each in a fresh process (its own peak memory): ``tiny`` is today's smoke
policy (verl_evidence/local/smoke/models.py: Qwen2, 2 layers, hidden 128, tied embeddings) on the offline test
tokenizer (~600 ids); ``qwen`` is the same policy with Qwen2.5's 151,665-id vocabulary
(verl_evidence/local/qwen_tokenizer.py). Measured per arm:

- prompt tokens of every bundled row of each method, through the arm's chat template (mean and max);
- one smoke training step's model work at the smoke runs' sizes (2 prompts x 8 samples, 160 response tokens, the
  smoke EviOmni prompt (SMOKE_TOPK passages) at the arm's mean length, micro-batches of at most
  MAX_TOKENS_PER_GPU=2048 tokens as the smoke runs pack them): generating the responses with the KV cache, one
  no-grad forward over the sequences (old/ref log-probs; the trainer does it twice) and one
  forward+backward+AdamW step (the update);
- one step of the smoke policies' supervised warm-up (verl_evidence/local/smoke/training.py: one example of the
  smoke EviOmni prompt plus a 40-token reply, loss on the reply, clipping, AdamW), which an empty cache runs
  WARMUP_STEPS times per family before the first smoke run;
- the process's peak resident memory, and the parameters.

CPU seconds (this process's user+system time), not wall time: the machine is shared. Ratios are qwen / tiny.
Results and the verdict (not adopted in the smoke mode): benchmarks/results/2026-12-07-qwen-vocab-cpu.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import statistics
import time
from pathlib import Path

GROUP = 16  # BATCH=2 prompts x GROUP_SIZE=8 samples, the smoke runs' defaults (recipes/_common.sh)
RESPONSE_TOKENS = 160  # RESPONSE_LEN's smoke default
WARMUP_REPLY_TOKENS = 40
WARMUP_STEPS_TIMED = 5
MAX_TOKENS_PER_MICRO_BATCH = 2048  # MAX_TOKENS_PER_GPU's smoke default: the logits of one pass are (2048, vocab)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bundled_prompts() -> dict[str, list[list[dict]]]:
    """Each method's bundled rows' prompts, as data prep writes them (BM25 top-k over the bundled corpus)."""
    from verl_evidence.dataprep import grace as grace_mod
    from verl_evidence.dataprep import rows as rows_mod
    from verl_evidence.dataprep.retrievers import Query, build_retriever
    from verl_evidence.dataprep.templates import load_template
    from verl_evidence.eval.datasets import bundled_qa_records
    from verl_evidence.local.smoke.settings import SMOKE_TOPK

    records, corpus = bundled_qa_records()
    bm25 = build_retriever("bm25", corpus)
    top5 = bm25.retrieve([Query(id=r.id, question=r.question) for r in records], 5)
    docs = [[{"id": i, "contents": corpus[i]} for i in ids] for ids in top5]
    examples, _ = grace_mod.construct(
        [grace_mod.GraceInput(record=r) for r in records], [build_retriever("oracle", corpus), bm25], corpus, k=5
    )
    rows = {
        "search_r1": rows_mod.search_rows(records, "search_r1", load_template("search_r1"), "train"),
        "evinote": rows_mod.search_rows(records, "evinote", load_template("evinote"), "train"),
        "eviomni": rows_mod.eviomni_rows(records, docs, load_template("eviomni"), "train", len),
        "eviomni_smoke": rows_mod.eviomni_rows(
            records, [d[:SMOKE_TOPK] for d in docs], load_template("eviomni"), "train", len
        ),
        "grace": rows_mod.grace_rows(examples, corpus, load_template("grace"), "train"),
    }
    return {method: [row["prompt"] for row in method_rows] for method, method_rows in rows.items()}


def arm_tokenizer(arm: str):
    if arm == "tiny":
        from verl_evidence.local.tiny_models import tiny_tokenizer

        return tiny_tokenizer()
    from verl_evidence.local.qwen_tokenizer import qwen_tokenizer

    return qwen_tokenizer("qwen2.5")


def run_arm(arm: str, reps: int, queue) -> None:
    """One arm in its own process: prompt tokens, then the step's model work; results on ``queue``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl_evidence.local.smoke.settings import POLICY_HIDDEN, POLICY_LAYERS

    torch.set_num_threads(1)  # one core's CPU time, comparable between arms on a busy machine
    tokenizer = arm_tokenizer(arm)
    prompt_tokens = {}
    for method, prompts in bundled_prompts().items():
        counts = [len(tokenizer.apply_chat_template(p, add_generation_prompt=True)["input_ids"]) for p in prompts]
        prompt_tokens[method] = {"mean": statistics.fmean(counts), "max": max(counts), "rows": len(counts)}
    baseline_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=POLICY_HIDDEN,
        intermediate_size=POLICY_HIDDEN * 2,
        num_hidden_layers=POLICY_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=None,  # generate the full response length in both arms
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    prompt_len = round(prompt_tokens["eviomni_smoke"]["mean"])
    prompts = torch.randint(0, len(tokenizer), (GROUP, prompt_len))
    timings: dict[str, list[float]] = {"generate": [], "log_probs": [], "update": [], "warmup_step": []}
    example = torch.randint(0, len(tokenizer), (1, prompt_len + WARMUP_REPLY_TOKENS))
    labels = example.clone()
    labels[:, :prompt_len] = -100
    model.train()
    for _ in range(WARMUP_STEPS_TIMED):
        start = _cpu()
        model(input_ids=example, labels=labels).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        timings["warmup_step"].append(_cpu() - start)
    for _ in range(reps):
        model.eval()
        start = _cpu()
        with torch.no_grad():
            sequences = model.generate(
                prompts, max_new_tokens=RESPONSE_TOKENS, min_new_tokens=RESPONSE_TOKENS, do_sample=True, top_k=0
            )
        timings["generate"].append(_cpu() - start)
        per_micro_batch = max(1, MAX_TOKENS_PER_MICRO_BATCH // sequences.shape[1])
        micro_batches = sequences.split(per_micro_batch)
        start = _cpu()
        with torch.no_grad():
            for micro in micro_batches:
                torch.log_softmax(model(micro).logits[:, prompt_len - 1 : -1].float(), dim=-1)
        timings["log_probs"].append(_cpu() - start)
        model.train()
        start = _cpu()
        for micro in micro_batches:
            logits = model(micro).logits[:, prompt_len - 1 : -1]
            picked = torch.log_softmax(logits.float(), dim=-1).gather(-1, micro[:, prompt_len:, None])
            picked.mean().neg().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        timings["update"].append(_cpu() - start)
    queue.put(
        {
            "arm": arm,
            "vocab": len(tokenizer),
            "parameters": sum(p.numel() for p in model.parameters()),
            "prompt_tokens": prompt_tokens,
            "eviomni_prompt_len": prompt_len,
            "cpu_s": {name: statistics.median(values) for name, values in timings.items()},
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "model_rss_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - baseline_rss) / 1024,
        }
    )


def measure(reps: int) -> dict[str, dict]:
    context = multiprocessing.get_context("spawn")
    results = {}
    for arm in ("tiny", "qwen"):
        queue = context.Queue()
        process = context.Process(target=run_arm, args=(arm, reps, queue))
        process.start()
        results[arm] = queue.get()
        process.join()
    return results


def step_cpu_s(result: dict) -> float:
    """One trainer step's model work: generation, two no-grad passes (old and ref log-probs), one update."""
    cpu = result["cpu_s"]
    return cpu["generate"] + 2 * cpu["log_probs"] + cpu["update"]


def report(results: dict[str, dict]) -> None:
    tiny, qwen = results["tiny"], results["qwen"]
    print(f"vocab: tiny {tiny['vocab']}, qwen {qwen['vocab']}")
    ratio = qwen["parameters"] / tiny["parameters"]
    print(f"parameters: tiny {tiny['parameters']:,}, qwen {qwen['parameters']:,} ({ratio:.1f}x)")
    print("prompt tokens per bundled prompt (mean / max), chat template applied:")
    for method in tiny["prompt_tokens"]:
        t, q = tiny["prompt_tokens"][method], qwen["prompt_tokens"][method]
        print(
            f"  {method:10s} tiny {t['mean']:7.1f} / {t['max']:5d}   qwen {q['mean']:7.1f} / {q['max']:5d}   "
            f"qwen/tiny {q['mean'] / t['mean']:.2f}  ({t['rows']} rows)"
        )
    print(
        f"one smoke step's model work, {GROUP} sequences x (smoke EviOmni prompt {tiny['eviomni_prompt_len']} vs "
        f"{qwen['eviomni_prompt_len']} + {RESPONSE_TOKENS} response tokens), CPU-s on one thread (median):"
    )
    for part in ("generate", "log_probs", "update", "warmup_step"):
        t, q = tiny["cpu_s"][part], qwen["cpu_s"][part]
        print(f"  {part:10s} tiny {t:7.2f}   qwen {q:7.2f}   qwen/tiny {q / t:5.1f}x")
    t, q = step_cpu_s(tiny), step_cpu_s(qwen)
    print(f"  {'RL step':10s} tiny {t:7.2f}   qwen {q:7.2f}   qwen/tiny {q / t:5.1f}x   (+{q - t:.1f} CPU-s per step)")
    from verl_evidence.local.smoke.settings import FAMILIES, WARMUP_STEPS

    warmups = sum(WARMUP_STEPS[family] for family in FAMILIES)
    t, q = tiny["cpu_s"]["warmup_step"] * warmups, qwen["cpu_s"]["warmup_step"] * warmups
    print(f"  warm-ups of an empty cache ({warmups} steps): tiny {t:.0f}, qwen {q:.0f} CPU-s (+{q - t:.0f})")
    print(
        f"peak RSS: tiny {tiny['peak_rss_mb']:.0f} MB, qwen {qwen['peak_rss_mb']:.0f} MB; of it the model's work: "
        f"tiny {tiny['model_rss_mb']:.0f} MB, qwen {qwen['model_rss_mb']:.0f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    started = time.time()
    results = measure(args.reps)
    report(results)
    print(f"({time.time() - started:.0f} s wall)")
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
