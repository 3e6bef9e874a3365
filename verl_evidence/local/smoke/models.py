"""The smoke runs' models: the random tiny policy, its warmed-up copies per family, and EviNote's NLI judge."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from verl_evidence.local.smoke.settings import POLICY_HIDDEN, POLICY_LAYERS, WARMUP_STEPS, locked, smoke_dir

logger = logging.getLogger(__name__)


def random_policy(directory: Path) -> Path:
    """A randomly initialised 2-layer Qwen2 (hidden 128) with the offline byte-level tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl_evidence.local.tiny_models import tiny_tokenizer

    tok = tiny_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=POLICY_HIDDEN,
        intermediate_size=POLICY_HIDDEN * 2,
        num_hidden_layers=POLICY_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    directory.mkdir(parents=True, exist_ok=True)
    Qwen2ForCausalLM(config).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def built_once(out: Path, marker: str, build) -> Path:
    """``out``, built by ``build(directory)`` once per machine: under ``out``'s lock, into a directory beside it that
    is moved in whole, so a reader who sees ``out/marker`` (taking no lock) sees every file."""
    if not (out / marker).exists():
        with locked(out):
            if not (out / marker).exists():
                tmp = out.with_name(out.name + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                build(tmp)
                shutil.rmtree(out, ignore_errors=True)  # an interrupted build's leftovers, never a finished one
                tmp.replace(out)
    return out


def base_policy() -> Path:
    """The randomly initialised policy every warm-up starts from (``random_policy``), built once per machine."""
    return built_once(smoke_dir() / "random_policy", "model.safetensors", random_policy)


def warmed_up_policy(family: str) -> Path:
    """The tiny policy warmed up on one family's format (HF directory), built once per machine."""
    from verl_evidence.local.smoke.training import warm_up
    from verl_evidence.local.smoke.warmup_data import warmup_examples

    if family not in WARMUP_STEPS:
        raise ValueError(f"unknown warm-up family {family!r}; one of {', '.join(WARMUP_STEPS)}")
    from verl_evidence.local.smoke.settings import warmed_up_policy_name, warmup_seed, warmup_seed_suffix

    root = smoke_dir()
    policy = root / warmed_up_policy_name(family)
    if (policy / "model.safetensors").exists():
        return policy
    with locked(policy):
        if not (policy / "model.safetensors").exists():
            base = base_policy()
            examples = warmup_examples(family, base)
            losses = warm_up(base, examples, policy, steps=WARMUP_STEPS[family], seed=warmup_seed())
            log = root / f"warmup-{family}{warmup_seed_suffix()}.json"
            log.write_text(json.dumps({"steps": len(losses), "loss": losses}))
            logger.info("smoke policy %s: warm-up loss %.3f -> %.3f", family, losses[0], sum(losses[-20:]) / 20)
    return policy


def nli_judge() -> Path:
    from verl_evidence.local.tiny_models import overlap_nli_model

    return built_once(smoke_dir() / "nli", "config.json", overlap_nli_model)
