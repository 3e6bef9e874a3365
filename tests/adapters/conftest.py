"""Shared fixtures: the tiny tokenizer on disk, verl's composed trainer config, DataProto batches."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    from verl_evidence.local.tiny_models import save_tiny_tokenizer

    return save_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tokenizer"))


@pytest.fixture(scope="session")
def tokenizer():
    from verl_evidence.local.tiny_models import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture(scope="session")
def nli_dir(tmp_path_factory) -> Path:
    """NLI model whose entailment grows with premise/hypothesis token overlap (MiniLM's BERT pair
    tokenizer); entailment at index 1 (MNLI heads often use 0 or 2). Reference values for it:
    ``verl_evidence.local.tiny_models.expected_overlap_entailment``."""
    from verl_evidence.local.tiny_models import overlap_nli_model

    return overlap_nli_model(tmp_path_factory.mktemp("overlap_nli"))


def compose_trainer_config(
    tokenizer_dir: Path, overrides: Sequence[str] = (), config_dir: Path | None = None, config_name: str = "ppo_trainer"
):
    """verl's ``ppo_trainer.yaml`` (or a recipe preset: ``config_dir``/``config_name``) composed by Hydra with
    command-line style overrides."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = str(config_dir or Path(verl.__file__).parent / "trainer" / "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            config_name,
            overrides=[f"actor_rollout_ref.model.path={tokenizer_dir}", *overrides],
        )


@pytest.fixture(scope="session")
def make_config(tokenizer_dir):
    def _make(*overrides: str):
        return compose_trainer_config(tokenizer_dir, overrides)

    return _make


def make_batch(tokenizer, samples: Sequence[dict[str, Any]]):
    """A DataProto shaped like the trainer's: left-padded prompts, right-padded responses.

    Each sample: ``response`` (str), optional ``prompt`` (str), ``ground_truth``,
    ``data_source``, ``extra_info``, ``tool_extra_fields``, ``raw_prompt``.
    """
    from verl import DataProto

    pad = tokenizer.pad_token_id
    prompts = [tokenizer.encode(s.get("prompt", "Question: who wrote the report?")) for s in samples]
    responses = [tokenizer.encode(s["response"]) for s in samples]
    prompt_width = max(len(p) for p in prompts)
    response_width = max(1, max(len(r) for r in responses))
    prompt_tensor = torch.full((len(samples), prompt_width), pad, dtype=torch.long)
    response_tensor = torch.full((len(samples), response_width), pad, dtype=torch.long)
    attention = torch.zeros((len(samples), prompt_width + response_width), dtype=torch.long)
    for row, (p, r) in enumerate(zip(prompts, responses)):
        prompt_tensor[row, prompt_width - len(p) :] = torch.tensor(p)
        attention[row, prompt_width - len(p) : prompt_width] = 1
        if r:
            response_tensor[row, : len(r)] = torch.tensor(r)
            attention[row, prompt_width : prompt_width + len(r)] = 1
    input_ids = torch.cat([prompt_tensor, response_tensor], dim=1)
    position_ids = torch.clamp(torch.cumsum(attention, dim=1) - 1, min=0)

    def column(values):
        array = np.empty(len(values), dtype=object)
        for i, value in enumerate(values):
            array[i] = value
        return array

    non_tensor = {
        "data_source": column([s.get("data_source", "nq") for s in samples]),
        "reward_model": column([{"style": "rule", "ground_truth": s.get("ground_truth")} for s in samples]),
        "extra_info": column([dict(s.get("extra_info", {"index": i})) for i, s in enumerate(samples)]),
        "tool_extra_fields": column([dict(s.get("tool_extra_fields", {})) for s in samples]),
        "raw_prompt": column(
            [s.get("raw_prompt", [{"role": "user", "content": s.get("prompt", "")}]) for s in samples]
        ),
        "__num_turns__": np.array([2] * len(samples)),
    }
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_tensor,
            "responses": response_tensor,
            "attention_mask": attention,
            "input_ids": input_ids,
            "position_ids": position_ids,
        },
        non_tensors=non_tensor,
    )


@pytest.fixture(autouse=True)
def _new_event_loop_per_test(verl_event_loop):
    """Every test builds verl's managers on a fresh loop (tests/conftest.py), closed after it."""
    return verl_event_loop


def run(coroutine):
    """Drive a coroutine on the loop verl's managers cached, found the way they find it."""
    from verl.utils.ray_utils import get_event_loop

    return get_event_loop().run_until_complete(coroutine)


def score_with_worker(config, batch) -> list[dict]:
    """Score ``batch`` the way verl's reward-loop worker does (``load_reward_manager`` + ``run_single``)."""
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    worker = RewardLoopWorker(config)
    return run(worker.compute_score_batch(batch))
