"""An OpenAI-compatible server (vLLM, SGLang, TGI ...) as the agent loops and the local backends reach it.

The production rollout uses :class:`OpenAIEndpoint` for one thing: a text-level
``chat`` with an external model whose tokenizer differs from the policy's (the
EviOmni evidence extractor, the EviPath executor). The local generation
backend :class:`~verl_evidence.local.backends.OpenAIBackend` builds on it to
stand in for verl's rollout server. Sampling parameters follow vLLM's names,
which is what verl's agent loops send (see :func:`sampling_body`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_TOKENS = 512


def max_tokens_of(sampling_params: dict[str, Any], default: int) -> int:
    """``max_tokens`` (vLLM) or ``max_new_tokens`` (SGLang), at least 1; ``default`` if neither is set."""
    value = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
    return max(1, int(value)) if value is not None else default


def stop_strings_of(sampling_params: dict[str, Any]) -> list[str]:
    """The non-empty ``stop`` strings (one string or a list)."""
    stop = sampling_params.get("stop") or []
    return [stop] if isinstance(stop, str) else [s for s in stop if s]


def sampling_body(sampling_params: dict[str, Any], default_max_tokens: int) -> tuple[dict, dict]:
    """The OpenAI client's arguments and vLLM's ``extra_body`` for ``sampling_params``."""
    args: dict[str, Any] = {"max_tokens": max_tokens_of(sampling_params, default_max_tokens)}
    if "temperature" in sampling_params:
        args["temperature"] = float(sampling_params["temperature"])
    if "top_p" in sampling_params:
        args["top_p"] = float(sampling_params["top_p"])
    stops = stop_strings_of(sampling_params)
    if stops:
        args["stop"] = stops
    extra: dict[str, Any] = {"include_stop_str_in_output": True}
    if sampling_params.get("top_k") not in (None, -1):
        extra["top_k"] = int(sampling_params["top_k"])
    if sampling_params.get("stop_token_ids"):
        extra["stop_token_ids"] = list(sampling_params["stop_token_ids"])
    return args, extra


@dataclass(frozen=True)
class ChatReply:
    """A chat completion's text and why it ended, as the server said.

    ``finish_reason``: ``"stop"`` (EOS, a stop token or a stop string) or ``"length"``. ``matched_stop``: the stop
    string or token the server says ended it (vLLM's ``stop_reason``, SGLang's ``matched_stop``; None: EOS);
    ``reports_match`` is False for servers that send neither field.
    """

    text: str
    finish_reason: str | None
    matched_stop: str | int | None = None
    reports_match: bool = False

    def ended_at(self, stop: str) -> bool:
        """Whether generation ended at the stop string ``stop`` (which a server may have trimmed from ``text``).

        A length cut never did. A server that does not say which stop ended it: only when ``text`` opened the
        block that ``stop`` closes (EOS and the stop string look alike there)."""
        if self.finish_reason != "stop":
            return False
        if self.reports_match:
            return self.matched_stop == stop
        return "<" + stop[2:] in self.text


class OpenAIEndpoint:
    """One model behind an OpenAI-compatible ``/v1`` API."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str = "EMPTY",
        timeout: float = 120.0,
        max_retries: int = 2,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.default_max_tokens = default_max_tokens
        self._clients: dict[int, Any] = {}

    def _client(self):
        from openai import AsyncOpenAI

        # httpx connection pools belong to one event loop.
        key = id(asyncio.get_running_loop())
        if key not in self._clients:
            self._clients[key] = AsyncOpenAI(
                base_url=self.base_url, api_key=self.api_key, timeout=self.timeout, max_retries=self.max_retries
            )
        return self._clients[key]

    async def chat(self, messages: list[dict[str, str]], sampling_params: dict[str, Any] | None = None) -> str:
        """One chat completion, text in and text out (the server applies its own template)."""
        return (await self.chat_reply(messages, sampling_params)).text

    async def chat_reply(
        self, messages: list[dict[str, str]], sampling_params: dict[str, Any] | None = None
    ) -> ChatReply:
        """One chat completion: its text and why it ended (:class:`ChatReply`)."""
        args, extra = sampling_body(sampling_params or {}, self.default_max_tokens)
        response = await self._client().chat.completions.create(
            model=self.model, messages=messages, extra_body=extra, **args
        )
        choice = response.choices[0]
        fields = choice.model_extra or {}
        key = "stop_reason" if "stop_reason" in fields else "matched_stop" if "matched_stop" in fields else None
        return ChatReply(
            text=choice.message.content or "",
            finish_reason=choice.finish_reason,
            matched_stop=fields.get(key) if key else None,
            reports_match=key is not None,
        )
