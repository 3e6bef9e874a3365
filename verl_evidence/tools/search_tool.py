"""Search over the retrieval server, for verl's ``ToolAgentLoop`` and for this project's search loops.

Two layers:

- :class:`SearchService` — the retrieval client plus a rate limit shared by every
  caller in the process with the same server and limits (an asyncio semaphore
  bounding in-flight requests and aiolimiter's leaky bucket bounding requests
  per second), and a count of each training step's failed searches that stops
  the rollout when most of them fail. The agent loops use it directly.
- :class:`SearchTool` — a verl ``BaseTool`` named ``search`` whose argument is a
  list of queries. It never raises into the rollout: a down server or
  malformed arguments come back to the model as a short error text.

Settings: :class:`~verl_evidence.tools.search_settings.SearchSettings`, one class for the tool and both loops.
Documents are shown as :mod:`verl_evidence.tools.documents` formats them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
import weakref
from typing import Any, Protocol

import httpx
from aiolimiter import AsyncLimiter
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from retrieval_server.client import (
    AsyncRetrievalClient,
    RetrievalError,
    RetrievalRequestError,
    RetrievalUnavailableError,
)
from verl_evidence.tools.documents import check_document_format, document_ids, format_search_results
from verl_evidence.tools.search_settings import SearchSettings

logger = logging.getLogger(__name__)

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
# Shared rate limit
# ---------------------------------------------------------------------------


class RateLimiter:
    """At most ``max_concurrency`` requests in flight and ``rate`` requests per second.

    The rate is aiolimiter's leaky bucket: up to ``burst`` requests at once (default
    ``max(1, int(rate))``), then one every ``1 / rate`` seconds.
    """

    def __init__(self, max_concurrency: int, rate: float | None, burst: int | None = None) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if rate is not None and rate <= 0:
            raise ValueError(f"requests_per_second must be > 0 or null, got {rate}")
        self.semaphore = asyncio.Semaphore(max_concurrency)
        self.rate = rate
        self.capacity = int(burst if burst is not None else max(1, int(rate or 1)))
        self.bucket = AsyncLimiter(self.capacity, self.capacity / rate) if rate is not None else None

    async def __aenter__(self) -> RateLimiter:
        await self.semaphore.acquire()
        try:
            if self.bucket is not None:
                await self.bucket.acquire()
        except BaseException:
            self.semaphore.release()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.semaphore.release()


# asyncio primitives and httpx pools belong to one event loop, so the shared
# state is keyed by event loop, then by settings: the worker coroutines of a
# process that use the same server with the same limits share it, and a closed
# loop's entries go away with the loop.
_LIMITERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CLIENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def shared_rate_limiter(settings: SearchSettings) -> RateLimiter:
    """This event loop's limiter for ``settings``' server and limits: callers with other limits get their own."""
    per_loop = _LIMITERS.setdefault(asyncio.get_running_loop(), {})
    key = settings.limiter_key
    if key not in per_loop:
        per_loop[key] = RateLimiter(settings.max_concurrency, settings.requests_per_second, settings.burst)
    return per_loop[key]


def shared_client(settings: SearchSettings) -> Retriever:
    per_loop = _CLIENTS.setdefault(asyncio.get_running_loop(), {})
    key = settings.client_key
    if key not in per_loop:
        per_loop[key] = AsyncRetrievalClient(
            settings.retrieval_url,
            timeout=settings.timeout,
            max_retries=settings.max_retries,
            backoff=settings.backoff,
            token=settings.token,
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


class SearchService:
    """Retrieval with a process-wide rate limit; raises :class:`RetrievalError` subclasses on failure.

    Built from :class:`SearchSettings` (``settings=``) or from its fields as keywords. ``retriever``
    replaces the HTTP client (any object with the client's ``retrieve`` coroutine); without it a client
    shared per event loop and settings is used.
    """

    def __init__(
        self,
        retrieval_url: str | None = None,
        *,
        settings: SearchSettings | None = None,
        retriever: Retriever | None = None,
        **fields: Any,
    ) -> None:
        if settings is None:
            settings = SearchSettings(retrieval_url=retrieval_url, **fields)
        elif retrieval_url is not None or fields:
            raise TypeError("give SearchService either settings or their fields, not both")
        if retriever is None:
            settings = settings.resolved()
        else:  # in-process: no URL needed, nothing to wait for
            url = settings.retrieval_url or "in-process"
            settings = settings.model_copy(update={"retrieval_url": url, "wait_for_server_s": 0.0})
        self.settings = settings
        self.retriever = retriever

    @property
    def url(self) -> str:
        return self.settings.retrieval_url

    @property
    def topk(self) -> int:
        return self.settings.topk

    @property
    def wait_for_server_s(self) -> float:
        return self.settings.wait_for_server_s

    def record(self, step: Any, failure: str | None) -> None:
        """Count a search of training ``step`` for the broken-server check (:func:`record_search`)."""
        record_search(self.settings, step, failure)

    async def search(self, queries: list[str], topk: int | None = None) -> list[list[dict]]:
        s = self.settings
        if self.retriever is None and s.wait_for_server_s > 0:
            await wait_until_ready(s.retrieval_url, s.wait_for_server_s, s.token)
        client = self.retriever or shared_client(s)
        async with shared_rate_limiter(s):
            results = await client.retrieve(list(queries), topk=topk or s.topk, return_scores=True)
        if len(results) != len(queries):
            raise RetrievalError(f"retrieval server answered {len(results)} result lists for {len(queries)} queries")
        return results


class RetrievalBrokenError(RuntimeError):
    """Most searches of a training step failed: the rollout stops instead of training the policy on failures.

    Not a :class:`RetrievalError`: the loops turn those into observations, this one must end the run.
    """


@dataclasses.dataclass
class _StepSearches:
    searches: int = 0
    failures: int = 0
    last_failure: str = ""


# (server URL, global step) -> this worker process's searches; a few recent steps are kept.
_STEP_SEARCHES: dict[tuple[str, Any], _StepSearches] = {}
_STEP_SEARCHES_KEPT = 32
_STEP_LOCK = threading.Lock()


def record_search(settings: SearchSettings, step: Any, failure: str | None) -> None:
    """Count one search of ``step`` (``failure``: what went wrong, None if it succeeded).

    Raises :class:`RetrievalBrokenError` once the step has made ``failure_min_searches`` searches in
    this process and more than ``failure_threshold`` of them failed.
    """
    key = (settings.retrieval_url, step)
    with _STEP_LOCK:
        counts = _STEP_SEARCHES.pop(key, None) or _StepSearches()
        _STEP_SEARCHES[key] = counts  # most recent last: the oldest steps are dropped first
        while len(_STEP_SEARCHES) > _STEP_SEARCHES_KEPT:
            del _STEP_SEARCHES[next(iter(_STEP_SEARCHES))]
        counts.searches += 1
        if failure is None:
            return
        counts.failures += 1
        counts.last_failure = failure
        if counts.searches < settings.failure_min_searches:
            return
        if counts.failures <= settings.failure_threshold * counts.searches:
            return
        searches, failures = counts.searches, counts.failures
    raise RetrievalBrokenError(
        f"retrieval server {settings.retrieval_url} failed {failures} of {searches} searches of training step "
        f"{step} in this worker (more than {settings.failure_threshold:.0%}); last failure: {failure}. "
        "Stopping rather than training on failed searches: check the server, or raise the loop's "
        "search_failure_threshold (1 never stops)."
    )


def step_searches(url: str, step: Any) -> tuple[int, int]:
    """``(searches, failures)`` this process counted for ``step`` at ``url``."""
    with _STEP_LOCK:
        counts = _STEP_SEARCHES.get((url.rstrip("/"), step)) or _StepSearches()
        return counts.searches, counts.failures


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

    Config keys (the ``config`` mapping of the tool YAML): the fields of :class:`SearchSettings`
    (``retrieval_url`` or env ``VERL_EVIDENCE_RETRIEVAL_URL``, ``topk``, ``timeout``, ``max_retries``,
    ``backoff``, ``token``, ``max_concurrency``, ``requests_per_second``, ``burst``, ``wait_for_server_s``:
    seconds to wait for ``/health`` before the first search, default env ``VERL_EVIDENCE_RETRIEVAL_WAIT_S``
    else 0), ``max_queries``, ``document_format`` (``ours``, or ``search_r1`` for a policy trained on Search-R1's
    layout: verl_evidence/tools/documents.py), and verl's own ``type``. Any other key fails, naming it.
    """

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        tool_schema = tool_schema or OpenAIFunctionToolSchema.model_validate(SEARCH_TOOL_SCHEMA)
        super().__init__(config or {}, tool_schema)
        cfg = dict(config or {})
        cfg.pop("type", None)  # verl's tool type (native), not a search setting
        self.max_queries = int(cfg.pop("max_queries", 3))
        self.document_format = check_document_format(str(cfg.pop("document_format", "ours")))
        self.service = SearchService(settings=SearchSettings(**cfg))

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
        return ToolResponse(text=format_search_results(queries, results, self.document_format)), 0.0, metrics
