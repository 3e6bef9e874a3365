"""Helpers of the rollout tests (importable: pytest puts this directory on sys.path)."""

from __future__ import annotations

import asyncio
import copy
from collections import OrderedDict
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


_WORKERS: OrderedDict[str, Any] = OrderedDict()  # config (as YAML) -> verl's AgentLoopWorker built from it


def loop_worker(config, backend):
    """verl's ``AgentLoopWorker`` for ``config``, generating with ``backend``.

    Built once per config (the loops' own settings aside), as in the trainer (one worker, many batches): building
    one loads the policy's tokenizer twice (tokenizer and processor), ~5 s for Qwen's 151k-token vocabulary. Each
    trajectory's loop gets the worker's ``llm_client`` as its server manager, so a new backend is swapped in there."""
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    if config.actor_rollout_ref.rollout.agent.get("agent_loop_config_path"):
        return AgentLoopWorker(config, backend)  # building it registers the file's loops: every run must
    # the loops read their settings (rollout.custom) from the worker's config at each run: those need no new worker
    key = OmegaConf.to_yaml(with_settings(config, {"actor_rollout_ref.rollout.custom": None}))
    worker = _WORKERS.pop(key, None)
    if worker is None:
        worker = AgentLoopWorker(config, backend)
    worker.config, worker.llm_client = config, backend  # this config object: the loops cache settings by its id
    _WORKERS[key] = worker
    while len(_WORKERS) > 4:  # each holds a tokenizer
        _WORKERS.popitem(last=False)
    return worker


def run_worker(config, backend, rows: Sequence[dict]):
    """verl's AgentLoopWorker.generate_sequences over ``rows``; returns the output DataProto."""
    from verl import DataProto

    worker = loop_worker(config, backend)
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


ASSISTANT_HEADER = "<|im_start|>assistant\n"  # ChatML's, in both test vocabularies' templates


def continues_a_reply(prompt: str) -> bool:
    """Whether a decoded prompt continues an assistant reply the model already began (text after the last header).

    Not ``prompt.endswith("</extract>")``: with Qwen's vocabulary the token that completes a stop string may carry
    the model's next characters, and the prompt then ends in them."""
    return bool(prompt.rpartition(ASSISTANT_HEADER)[2])


def ids_through_stop(tokenizer, text: str, stop: str) -> list[int]:
    """The ids an engine returns for ``text`` with stop string ``stop``: ``text``'s tokens up to and including the
    first one whose prefix decodes to contain ``stop`` (that token may carry characters past it)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    end = next(n for n in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:n]))
    return ids[:end]
