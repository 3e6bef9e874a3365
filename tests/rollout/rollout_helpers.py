"""Helpers of the rollout tests (importable: pytest puts this directory on sys.path)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

RESPONSE_LENGTH = 8192  # data.max_response_length of the rollout tests' verl config


def with_settings(config, updates: dict[str, Any]):
    """A copy of ``config`` with dotted keys set (new keys allowed, like Hydra's ``+key=``)."""
    from omegaconf import OmegaConf

    config = copy.deepcopy(config)
    for key, value in updates.items():
        OmegaConf.update(config, key, value, force_add=True)
    return config


def make_row(question: str, agent_name: str, messages: list[dict] | None = None, **extra_info: Any) -> dict:
    return {
        "raw_prompt": messages or [{"role": "user", "content": question}],
        "agent_name": agent_name,
        "extra_info": {"question": question, **extra_info},
        "data_source": "nq",
        "reward_model": {"style": "rule", "ground_truth": {"target": ["unknown"]}},
    }


def run_worker(config, backend, rows: Sequence[dict]):
    """verl's AgentLoopWorker.generate_sequences over ``rows``; returns the output DataProto."""
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    worker = AgentLoopWorker(config, backend)
    non_tensor = {}
    for key in rows[0]:
        column = np.empty(len(rows), dtype=object)
        column[:] = [row[key] for row in rows]
        non_tensor[key] = column
    non_tensor["index"] = np.arange(len(rows))
    non_tensor["priority"] = np.arange(len(rows))  # each sample's place, as verl's AgentLoopManager attaches it
    batch = DataProto.from_dict(non_tensors=non_tensor, meta_info={"validate": False})
    return asyncio.run(worker.generate_sequences(batch))


def unpad(output, row: int = 0) -> dict[str, Any]:
    """One trajectory of the worker's padded batch: prompt ids, response ids, mask, extra fields."""
    prompt_attention = output.batch["attention_mask"][row, : output.batch["prompts"].shape[1]]
    response_attention = output.batch["attention_mask"][row, output.batch["prompts"].shape[1] :]
    prompt_ids = output.batch["prompts"][row][prompt_attention.bool()].tolist()
    n = int(response_attention.sum())
    return {
        "prompt_ids": prompt_ids,
        "response_ids": output.batch["responses"][row, :n].tolist(),
        "response_mask": output.batch["response_mask"][row, :n].tolist(),
        "extra": {k: v[row] for k, v in output.non_tensor_batch.items()},
        "num_turns": int(output.non_tensor_batch["__num_turns__"][row]),
    }
