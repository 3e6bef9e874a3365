"""A real (tiny, random) HF model behind the chat endpoint: garbage in every reply, rejected with reasons."""

from __future__ import annotations

import asyncio
import threading

import pyarrow.parquet as pq
import pytest
import torch

from verl_evidence.evipath.cli import run_synthesis
from verl_evidence.evipath.teacher import TeacherConfig
from verl_evidence.local.tiny_models import tiny_causal_lm, tiny_tokenizer


class TinyModelBackend:
    """Chat template + greedy generation with the tiny random Qwen2, like a vLLM server would do."""

    def __init__(self, max_new_tokens: int = 32):
        self.model = tiny_causal_lm(seed=0)
        self.tokenizer = tiny_tokenizer()
        self.max_new_tokens = max_new_tokens
        self.lock = threading.Lock()
        self.replies: list[str] = []

    def __call__(self, messages: list[dict]) -> str:
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with self.lock, torch.no_grad():
            out = self.model.generate(
                **ids, max_new_tokens=self.max_new_tokens, do_sample=False, pad_token_id=self.tokenizer.pad_token_id
            )
        reply = self.tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
        self.replies.append(reply)
        return reply


@pytest.fixture(scope="module")
def tiny_backend():
    return TinyModelBackend()


def _config(server) -> TeacherConfig:
    return TeacherConfig(model="tiny-qwen2", base_url=server.base_url, api_key="t", concurrency=2, max_retries=0)


def test_garbage_planner_replies_are_all_rejected(chat_server, selector, hotpot_records, tiny_backend, tmp_path):
    chat_server.reset(tiny_backend)
    summary = asyncio.run(
        run_synthesis(hotpot_records, _config(chat_server), tmp_path / "out", tmp_path / "cache.sqlite", selector)
    )
    assert len(tiny_backend.replies) == len(hotpot_records)  # one planner turn each, then rejected
    assert all(isinstance(r, str) for r in tiny_backend.replies)
    assert summary.stats.kept == 0
    assert sum(summary.stats.rejected.values()) == len(hotpot_records)
    assert all(reason.startswith("planner_") for reason in summary.stats.rejected)
    assert pq.read_table(summary.outputs["train"]).num_rows == 0
    lines = summary.outputs["rejections"].read_text().splitlines()
    assert len(lines) == len(hotpot_records)


def test_garbage_executor_replies_are_rejected(chat_server, selector, hotpot_records, tiny_backend, scripted, tmp_path):
    planner = scripted()

    def hybrid(messages):
        if messages[0]["content"] == planner.system["evipath_planner_synth"]:
            return planner(messages)
        return tiny_backend(messages)

    chat_server.reset(hybrid)
    summary = asyncio.run(
        run_synthesis(hotpot_records, _config(chat_server), tmp_path / "out", tmp_path / "cache.sqlite", selector)
    )
    assert summary.stats.kept == 0
    assert sum(summary.stats.rejected.values()) == len(hotpot_records)
    assert all(reason.startswith("executor_") for reason in summary.stats.rejected), summary.stats.rejected
