"""The warm-up loop: a short supervised run that teaches the tiny policy the methods' output formats.

Hand-written rather than verl's SFT trainer: on CPU verl's trainer spends about
5x the CPU time per example (see :func:`warm_up`).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from verl_evidence.local.smoke.settings import WARMUP_LR


def example_ids(tokenizer, example: dict) -> tuple[list[int], list[int]]:
    """Token ids and labels of one example: loss on what the policy writes, -100 on prompt and context."""
    messages = list(example["messages"])
    prompt = tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if "segments" not in example:
        full = tokenizer.apply_chat_template(messages, tokenize=False)
        full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
        return full_ids, [-100] * len(prompt_ids) + full_ids[len(prompt_ids) :]
    from verl_evidence.agent_loops.trajectory import assistant_turn_end_ids

    ids, labels = list(prompt_ids), [-100] * len(prompt_ids)
    for segment in example["segments"]:
        piece = segment.get("ids") or tokenizer(segment["text"], add_special_tokens=False)["input_ids"]
        ids += piece
        labels += piece if segment["trained"] else [-100] * len(piece)
    end = assistant_turn_end_ids(tokenizer)  # the turn ends (EOS) after the answer
    return ids + end, labels + end


def warm_up(
    base: Path, examples: list[dict], out: Path, steps: int = 500, lr: float = WARMUP_LR, seed: int = 0
) -> list[float]:
    """Supervised warm-up on ``examples``: loss on the assistant turn only, one example per AdamW step, in an order
    drawn with ``seed``.

    A plain PyTorch loop, not verl's SFT trainer: on CPU verl's trainer spends about
    5x the CPU time per example (0.5 s against 0.09 s measured here for a ~950-token
    example), and the warm-up runs before every first smoke run on a machine and in
    CI. verl's SFT trainer itself is exercised by ``recipes/evipath_sft.sh --smoke``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: one thread does the most work per CPU-second
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="sdpa")
    encoded = [tuple(torch.tensor([part]) for part in example_ids(tokenizer, example)) for example in examples]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    order = random.Random(seed)
    losses: list[float] = []
    model.train()
    queue: list[int] = []
    for _ in range(steps):
        if not queue:
            queue = order.sample(range(len(encoded)), len(encoded))
        ids, labels = encoded[queue.pop()]
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(round(loss.item(), 4))
    model.eval()
    torch.set_num_threads(threads)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return losses
