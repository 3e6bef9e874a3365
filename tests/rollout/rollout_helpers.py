"""Helpers of the rollout tests (importable: pytest puts this directory on sys.path)."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np


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


class OpenAICompatibleServer:
    """vLLM's OpenAI protocol (completions with token-id prompts and ``return_token_ids``, chat
    completions), served by uvicorn on 127.0.0.1 over a scripted model — the GPU engine stand-in."""

    def __init__(self, tokenizer, return_token_ids: bool = True) -> None:
        import uvicorn
        from fastapi import FastAPI

        from retrieval_server.launch import free_port

        app = FastAPI()
        self.requests: list[dict] = []
        self.chat_reply = "<reason> r </reason><extract> The Nile is the longest river. </extract> more"

        def cut(text: str, body: dict) -> tuple[str, str | None]:
            for stop in body.get("stop") or []:
                if stop in text:
                    keep = text.index(stop) + (len(stop) if body.get("include_stop_str_in_output") else 0)
                    return text[:keep], stop
            return text, None

        @app.post("/v1/completions")
        async def completions(body: dict):
            self.requests.append(body)
            text, stop = cut("<answer> Nile </answer> after", body)
            choice = {"index": 0, "text": text, "finish_reason": "stop", "stop_reason": stop, "logprobs": None}
            if return_token_ids:
                choice["token_ids"] = tokenizer.encode(text, add_special_tokens=False)
            return {"id": "c", "object": "text_completion", "created": 0, "model": body["model"], "choices": [choice]}

        @app.post("/v1/chat/completions")
        async def chat(body: dict):
            self.requests.append(body)
            text, _ = cut(self.chat_reply, body)
            message = {"role": "assistant", "content": text}
            return {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
