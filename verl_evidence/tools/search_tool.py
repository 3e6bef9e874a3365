"""Search over the retrieval server, for verl's ``ToolAgentLoop`` and for this project's search loops.

Two layers:

- :class:`SearchService` — the retrieval client plus a rate limit shared by every
  caller in the process that talks to the same server URL (an asyncio
  semaphore bounding in-flight requests and a token bucket bounding requests
  per second). The agent loops use it directly.
- :class:`SearchTool` — a verl ``BaseTool`` named ``search`` whose argument is a
  list of queries. It never raises into the rollout: a down server or
  malformed arguments come back to the model as a short error text.

Documents are shown to the model as ``Doc i (Title: <title>) <text>`` with the
title taken from the first line of the FlashRAG ``contents`` field.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import httpx
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from retrieval_server.client import (
    AsyncRetrievalClient,
    RetrievalError,
    RetrievalRequestError,
    RetrievalUnavailableError,
)

logger = logging.getLogger(__name__)

RETRIEVAL_URL_ENV = "VERL_EVIDENCE_RETRIEVAL_URL"
# Seconds a process waits, before its first search, for the server to answer /health: set by a recipe that starts
# the trainer while its own server is still loading the index (0: search at once, fail over to the retry policy).
RETRIEVAL_WAIT_ENV = "VERL_EVIDENCE_RETRIEVAL_WAIT_S"
DEFAULT_TOPK = 3

SEARCH_TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search a knowledge corpus. Returns the top passages for each query.",
        "parameters": {
            "type": "object",
            "properties": {
                "query_list": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "One or more fully specified search queries.",
                }
            },
            "required": ["query_list"],
        },
    },
}


class Retriever(Protocol):
    """What :class:`SearchService` needs from a client (``AsyncRetrievalClient`` implements it)."""

    async def retrieve(
        self, queries: list[str], topk: int | None = None, return_scores: bool = True
    ) -> list[list[dict]]: ...


# ---------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------


def split_contents(contents: str) -> tuple[str, str]:
    """FlashRAG ``contents`` is ``"Title\\ntext"``; a single line is text without a title."""
    title, sep, text = (contents or "").partition("\n")
    if not sep:
        return "", title.strip()
    return title.strip().strip('"'), text.strip()


def format_documents(results: Sequence[dict]) -> str:
    """``Doc 1 (Title: T) text`` lines for one query's results."""
    lines = []
    for index, item in enumerate(results, start=1):
        document = item.get("document", item) if isinstance(item, dict) else {}
        title, text = split_contents(str(document.get("contents", "")))
        lines.append(f"Doc {index} (Title: {title}) {text}")
    return "\n".join(lines)


def format_search_results(queries: Sequence[str], results: Sequence[Sequence[dict]]) -> str:
    """One block per query; a single query is shown without a header, like Search-R1."""
    if len(queries) == 1:
        return format_documents(results[0])
    return "\n\n".join(
        f"Results for {query!r}:\n{format_documents(docs)}" for query, docs in zip(queries, results, strict=True)
    )


def document_ids(results: Sequence[dict]) -> list[str]:
    return [str((item.get("document") or {}).get("id", "")) for item in results]


def document_texts(results: Sequence[dict]) -> list[str]:
    """Each result's passage text, without its title (what masking must hide wherever it is copied)."""
    texts = [split_contents(str((item.get("document", item) or {}).get("contents", "")))[1] for item in results]
    return [t for t in texts if t]


# ---------------------------------------------------------------------------
# Shared rate limit
# ---------------------------------------------------------------------------


class RateLimiter:
    """At most ``max_concurrency`` requests in flight and ``rate`` requests per second (burst ``burst``)."""

    def __init__(
        self,
        max_concurrency: int,
        rate: float | None,
        burst: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        # clock/sleep are injectable so that the bucket's waits can be checked exactly, without real time.
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if rate is not None and rate <= 0:
            raise ValueError(f"requests_per_second must be > 0 or null, got {rate}")
        self.semaphore = asyncio.Semaphore(max_concurrency)
        self.rate = rate
        self.capacity = float(burst if burst is not None else max(1, int(rate or 1)))
        self.tokens = self.capacity
        self._clock, self._sleep = clock, sleep
        self.updated = clock()
        self._bucket_lock = asyncio.Lock()

    async def _take_token(self) -> None:
        if self.rate is None:
            return
        async with self._bucket_lock:
            while True:
                now = self._clock()
                self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
                self.updated = now
                if self.tokens >= 1.0:
                    self.tokens -= 1.0
                    return
                await self._sleep((1.0 - self.tokens) / self.rate)

    async def __aenter__(self) -> RateLimiter:  # noqa: PYI034  (final class; py3.10 has no typing.Self)
        await self.semaphore.acquire()
        try:
            await self._take_token()
        except BaseException:
            self.semaphore.release()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.semaphore.release()


# asyncio primitives and httpx pools belong to one event loop, so the shared
# state is keyed by (event loop, URL): every worker coroutine of a process
# shares it, and a closed loop's entries go away with the loop.
_LIMITERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CLIENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def shared_rate_limiter(url: str, max_concurrency: int, rate: float | None, burst: int | None = None) -> RateLimiter:
    per_loop = _LIMITERS.setdefault(asyncio.get_running_loop(), {})
    if url not in per_loop:
        per_loop[url] = RateLimiter(max_concurrency, rate, burst)
    return per_loop[url]


def shared_client(url: str, timeout: float, max_retries: int, backoff: float, token: str | None) -> Retriever:
    per_loop = _CLIENTS.setdefault(asyncio.get_running_loop(), {})
    key = (url, timeout, max_retries, backoff, token)
    if key not in per_loop:
        per_loop[key] = AsyncRetrievalClient(
            url, timeout=timeout, max_retries=max_retries, backoff=backoff, token=token
        )
    return per_loop[key]


_READY: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Task]] = weakref.WeakKeyDictionary()


async def _wait_for_health(url: str, wait_s: float, token: str | None, poll_s: float = 1.0) -> None:
    # A bare probe, not the client's health(): a server still loading is expected here, not worth its retry warnings.
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    started = time.monotonic()
    deadline = started + wait_s
    async with httpx.AsyncClient(timeout=2.0, headers=headers) as http:
        while True:
            try:
                if (await http.get(f"{url}/health")).status_code == 200:
                    logger.info("retrieval server %s ready after %.1f s", url, time.monotonic() - started)
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() >= deadline:
                raise RetrievalUnavailableError(f"no retrieval server answered {url}/health within {wait_s:.0f} s")
            await asyncio.sleep(poll_s)


async def wait_until_ready(url: str, wait_s: float, token: str | None = None) -> None:
    """Wait (once per event loop and URL, shared by every caller) until the server answers ``/health``.

    After a failed wait later searches are not held again: they meet the client's own retry policy.
    """
    per_loop = _READY.setdefault(asyncio.get_running_loop(), {})
    if url not in per_loop:
        per_loop[url] = asyncio.ensure_future(_wait_for_health(url, wait_s, token))
    task = per_loop[url]
    if task.done() and (task.cancelled() or task.exception() is not None):
        return  # reported once, to the callers that waited
    await asyncio.shield(task)


def resolve_retrieval_url(url: str | None) -> str:
    url = url or os.environ.get(RETRIEVAL_URL_ENV)
    if not url:
        raise ValueError(
            f"no retrieval server URL: set `retrieval_url` in the config or the {RETRIEVAL_URL_ENV} env var"
        )
    return url.rstrip("/")


class SearchService:
    """Retrieval with a process-wide rate limit; raises :class:`RetrievalError` subclasses on failure.

    ``retriever`` replaces the HTTP client (any object with the client's
    ``retrieve`` coroutine); without it a client shared per event loop and URL
    is used.
    """

    def __init__(
        self,
        retrieval_url: str | None = None,
        topk: int = DEFAULT_TOPK,
        timeout: float = 30.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        token: str | None = None,
        max_concurrency: int = 64,
        requests_per_second: float | None = None,
        burst: int | None = None,
        retriever: Retriever | None = None,
        wait_for_server_s: float | None = None,
    ) -> None:
        self.url = resolve_retrieval_url(retrieval_url) if retriever is None else (retrieval_url or "in-process")
        if wait_for_server_s is None:
            wait_for_server_s = float(os.environ.get(RETRIEVAL_WAIT_ENV) or 0.0)
        self.wait_for_server_s = float(wait_for_server_s)
        self.topk = int(topk)
        self.timeout, self.max_retries, self.backoff = float(timeout), int(max_retries), float(backoff)
        self.token = token or os.environ.get("VERL_EVIDENCE_RETRIEVAL_TOKEN")
        self.max_concurrency = int(max_concurrency)
        self.requests_per_second = requests_per_second
        self.burst = burst
        self.retriever = retriever

    async def search(self, queries: list[str], topk: int | None = None) -> list[list[dict]]:
        if self.retriever is None and self.wait_for_server_s > 0:
            await wait_until_ready(self.url, self.wait_for_server_s, self.token)
        client = self.retriever or shared_client(self.url, self.timeout, self.max_retries, self.backoff, self.token)
        limiter = shared_rate_limiter(self.url, self.max_concurrency, self.requests_per_second, self.burst)
        async with limiter:
            results = await client.retrieve(list(queries), topk=topk or self.topk, return_scores=True)
        if len(results) != len(queries):
            raise RetrievalError(f"retrieval server answered {len(results)} result lists for {len(queries)} queries")
        return results


def parse_query_list(parameters: Any, max_queries: int) -> list[str]:
    """The queries of a tool call, or TypeError/ValueError with a message meant for the model."""
    if not isinstance(parameters, dict):
        raise TypeError('arguments must be a JSON object like {"query_list": ["..."]}')
    queries = parameters.get("query_list", parameters.get("query"))
    if isinstance(queries, str):
        queries = [queries]
    if not isinstance(queries, list) or not queries:
        raise ValueError("`query_list` must be a non-empty list of strings")
    if not all(isinstance(q, str) and q.strip() for q in queries):
        raise ValueError("every entry of `query_list` must be a non-empty string")
    if len(queries) > max_queries:
        raise ValueError(f"at most {max_queries} queries per call, got {len(queries)}")
    return [q.strip() for q in queries]


class SearchTool(BaseTool):
    """verl tool ``search``: ``{"query_list": [str, ...]}`` -> formatted passages.

    Config keys (the ``config`` mapping of the tool YAML): ``retrieval_url``
    (or env ``VERL_EVIDENCE_RETRIEVAL_URL``), ``topk``, ``timeout``,
    ``max_retries``, ``backoff``, ``max_concurrency``, ``requests_per_second``,
    ``burst``, ``max_queries``, ``wait_for_server_s`` (seconds to wait for ``/health``
    before the first search; default: env ``VERL_EVIDENCE_RETRIEVAL_WAIT_S``, else 0).
    """

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        tool_schema = tool_schema or OpenAIFunctionToolSchema.model_validate(SEARCH_TOOL_SCHEMA)
        super().__init__(config or {}, tool_schema)
        cfg = dict(config or {})
        self.max_queries = int(cfg.get("max_queries", 3))
        self.service = SearchService(
            retrieval_url=cfg.get("retrieval_url"),
            topk=int(cfg.get("topk", DEFAULT_TOPK)),
            timeout=float(cfg.get("timeout", 30.0)),
            max_retries=int(cfg.get("max_retries", 3)),
            backoff=float(cfg.get("backoff", 0.5)),
            token=cfg.get("token"),
            max_concurrency=int(cfg.get("max_concurrency", 64)),
            requests_per_second=cfg.get("requests_per_second"),
            burst=cfg.get("burst"),
            wait_for_server_s=cfg.get("wait_for_server_s"),
        )

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        try:
            queries = parse_query_list(parameters, self.max_queries)
        except (TypeError, ValueError) as err:
            logger.info("search tool: malformed arguments %r: %s", parameters, err)
            return ToolResponse(text=f"Search error: {err}."), 0.0, {"error": "bad_arguments"}
        try:
            results = await self.service.search(queries)
        except RetrievalRequestError as err:
            logger.warning("search tool: server rejected %r: %s", queries, err)
            return (
                ToolResponse(text=f"Search error: the request was rejected ({err.message})."),
                0.0,
                {"error": "rejected"},
            )
        except RetrievalError as err:
            logger.warning("search tool: retrieval unavailable: %s", err)
            return (
                ToolResponse(
                    text="Search error: the search engine is unavailable right now. Answer with what you know."
                ),
                0.0,
                {"error": "unavailable"},
            )
        metrics = {"num_queries": len(queries), "retrieved_ids": [document_ids(r) for r in results]}
        return ToolResponse(text=format_search_results(queries, results)), 0.0, metrics
