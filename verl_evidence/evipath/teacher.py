"""The teacher: any OpenAI-compatible chat endpoint, with a resumable cache.

- Bounded concurrency: one ``asyncio.Semaphore`` shared by every request.
- Retries with exponential backoff: the ``openai`` client's own (connection
  errors, 408/409/429/5xx); anything still failing becomes :class:`TeacherError`,
  which the pipeline turns into a rejected trajectory, never a crash.
- Cache: an SQLite file keyed by a hash of (model, messages, params). Every
  completed reply is committed at once, so an interrupted run re-asks nothing
  it already has. Cached replies are counted separately from fresh ones.
- Accounting: prompt/completion tokens from ``usage`` of fresh replies and an
  optional cost per 1k tokens.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class TeacherError(RuntimeError):
    """The endpoint gave no usable reply after all retries."""


@dataclass
class Usage:
    requests: int = 0
    cache_hits: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def cost(self, prompt_cost_per_1k: float = 0.0, completion_cost_per_1k: float = 0.0) -> float:
        return self.prompt_tokens / 1000 * prompt_cost_per_1k + self.completion_tokens / 1000 * completion_cost_per_1k


def cache_key(model: str, messages: list[dict], params: dict[str, Any]) -> str:
    payload = json.dumps({"model": model, "messages": messages, "params": params}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class ReplyCache:
    """SQLite key → reply text store; one row per completed teacher call."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        if self.path is None:
            self._db = sqlite3.connect(":memory:")
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path)
        self._db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, content TEXT NOT NULL, usage TEXT)")
        self._db.commit()

    def get(self, key: str) -> str | None:
        row = self._db.execute("SELECT content FROM replies WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def put(self, key: str, content: str, usage: dict | None) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO replies (key, content, usage) VALUES (?, ?, ?)",
            (key, content, json.dumps(usage or {})),
        )
        self._db.commit()

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM replies").fetchone()[0]

    def close(self) -> None:
        self._db.close()


@dataclass
class TeacherConfig:
    model: str
    base_url: str
    api_key: str = "EMPTY"
    temperature: float = 0.0
    max_tokens: int = 1024
    concurrency: int = 8
    max_retries: int = 4
    timeout: float = 120.0
    extra_params: dict[str, Any] = field(default_factory=dict)
    prompt_cost_per_1k: float = 0.0
    completion_cost_per_1k: float = 0.0

    @property
    def params(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "max_tokens": self.max_tokens, **self.extra_params}


class Teacher:
    """Async chat client with a semaphore, retries, a cache and token accounting."""

    def __init__(self, config: TeacherConfig, cache: ReplyCache | None = None):
        from openai import AsyncOpenAI

        self.config = config
        self.cache = cache if cache is not None else ReplyCache(None)
        self.usage = Usage()
        self._client = AsyncOpenAI(
            base_url=config.base_url,
            api_key=config.api_key,
            max_retries=config.max_retries,
            timeout=config.timeout,
        )
        self._semaphore = asyncio.Semaphore(max(1, config.concurrency))

    async def chat(self, messages: list[dict[str, str]]) -> str:
        """The reply text for ``messages`` (from the cache if it was asked before)."""
        import openai

        params = self.config.params
        key = cache_key(self.config.model, messages, params)
        cached = self.cache.get(key)
        if cached is not None:
            self.usage.cache_hits += 1
            return cached
        async with self._semaphore:
            try:
                response = await self._client.chat.completions.create(
                    model=self.config.model, messages=messages, **params
                )
            except openai.OpenAIError as err:
                self.usage.failures += 1
                raise TeacherError(f"{type(err).__name__}: {err}") from err
        self.usage.requests += 1
        usage = getattr(response, "usage", None)
        if usage is not None:
            self.usage.prompt_tokens += int(usage.prompt_tokens or 0)
            self.usage.completion_tokens += int(usage.completion_tokens or 0)
        choices = getattr(response, "choices", None) or []
        content = choices[0].message.content if choices and choices[0].message else None
        if content is None:
            self.usage.failures += 1
            raise TeacherError("the endpoint returned no message content")
        self.cache.put(key, content, usage.model_dump() if usage is not None else None)
        return content

    def cost(self) -> float:
        return self.usage.cost(self.config.prompt_cost_per_1k, self.config.completion_cost_per_1k)

    async def close(self) -> None:
        await self._client.close()
