"""The search client's settings, defined once for the search tool and both agent loops.

Pure (pydantic, no verl): :class:`SearchSettings` is what a :class:`~verl_evidence.tools.search_tool.SearchService`
is built from. The tool's YAML ``config`` uses its field names as they are; the agent loops carry the same
settings as flat, prefixed keys of their own settings (:class:`LoopSearchFields`: ``search_timeout``, ...), so that
``rollout.custom.<loop>.search_timeout=...`` keeps working, with the defaults read from here.
"""

from __future__ import annotations

import dataclasses
import os

from pydantic import BaseModel, ConfigDict, Field

RETRIEVAL_URL_ENV = "VERL_EVIDENCE_RETRIEVAL_URL"
RETRIEVAL_TOKEN_ENV = "VERL_EVIDENCE_RETRIEVAL_TOKEN"
# Seconds a process waits, before its first search, for the server to answer /health: set by a recipe that starts
# the trainer while its own server is still loading the index (0: search at once, fail over to the retry policy).
RETRIEVAL_WAIT_ENV = "VERL_EVIDENCE_RETRIEVAL_WAIT_S"
DEFAULT_TOPK = 3


class SearchSettings(BaseModel):
    """How one caller searches: server, client retries, the per-process rate limit and when to give up on a server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    retrieval_url: str | None = None  # None: env VERL_EVIDENCE_RETRIEVAL_URL
    topk: int = Field(DEFAULT_TOPK, ge=1)
    timeout: float = Field(30.0, gt=0)
    max_retries: int = Field(3, ge=0)
    backoff: float = Field(0.5, ge=0)
    # Retries go on until this many seconds have passed (or max_retries, if that lasts longer): a server whose front
    # restarts (~30 s) is waited for, not failed. max_retries=0: no retries at all.
    retry_deadline_s: float = Field(60.0, ge=0)
    token: str | None = None  # None: env VERL_EVIDENCE_RETRIEVAL_TOKEN
    max_concurrency: int = Field(64, ge=1)
    requests_per_second: float | None = Field(None, gt=0)
    burst: int | None = Field(None, ge=1)
    wait_for_server_s: float | None = None  # None: env VERL_EVIDENCE_RETRIEVAL_WAIT_S, else 0
    # A training step whose failed share of searches in one worker process exceeds this stops the rollout
    # (1: never; verl's ToolAgentLoop turns a tool's exception into text, so only our agent loops stop)...
    failure_threshold: float = Field(0.5, gt=0, le=1)
    # ...once it has made at least this many searches.
    failure_min_searches: int = Field(8, ge=1)

    def resolved(self) -> SearchSettings:
        """The settings with the environment's defaults filled in (URL, token, wait); the URL without a trailing /."""
        url = self.retrieval_url or os.environ.get(RETRIEVAL_URL_ENV)
        if not url:
            raise ValueError(
                f"no retrieval server URL: set `retrieval_url` in the config or the {RETRIEVAL_URL_ENV} env var"
            )
        wait = self.wait_for_server_s
        if wait is None:
            wait = float(os.environ.get(RETRIEVAL_WAIT_ENV) or 0.0)
        token = self.token or os.environ.get(RETRIEVAL_TOKEN_ENV)
        return self.model_copy(update={"retrieval_url": url.rstrip("/"), "wait_for_server_s": wait, "token": token})

    @property
    def limiter_key(self) -> tuple:
        """Callers with equal keys share one rate limiter: same server and same limits."""
        return (self.retrieval_url, self.max_concurrency, self.requests_per_second, self.burst)

    @property
    def client_key(self) -> tuple:
        return (self.retrieval_url, self.timeout, self.max_retries, self.backoff, self.retry_deadline_s, self.token)


_DEFAULTS = SearchSettings()
# loop setting name -> SearchSettings field (retrieval_url and topk keep their names)
LOOP_SEARCH_KEYS = {
    "retrieval_url": "retrieval_url",
    "topk": "topk",
    "search_timeout": "timeout",
    "search_max_retries": "max_retries",
    "search_backoff": "backoff",
    "search_retry_deadline_s": "retry_deadline_s",
    "search_wait_for_server_s": "wait_for_server_s",
    "search_max_concurrency": "max_concurrency",
    "search_requests_per_second": "requests_per_second",
    "search_failure_threshold": "failure_threshold",
    "search_failure_min_searches": "failure_min_searches",
}


@dataclasses.dataclass(frozen=True)
class LoopSearchFields:
    """The search settings of an agent loop's settings dataclass (a base class of both loops' settings)."""

    retrieval_url: str | None = _DEFAULTS.retrieval_url
    topk: int = _DEFAULTS.topk
    search_timeout: float = _DEFAULTS.timeout
    search_max_retries: int = _DEFAULTS.max_retries
    search_backoff: float = _DEFAULTS.backoff
    search_retry_deadline_s: float = _DEFAULTS.retry_deadline_s
    # seconds to wait for /health before the first search (None: env VERL_EVIDENCE_RETRIEVAL_WAIT_S, else 0)
    search_wait_for_server_s: float | None = _DEFAULTS.wait_for_server_s
    search_max_concurrency: int = _DEFAULTS.max_concurrency
    search_requests_per_second: float | None = _DEFAULTS.requests_per_second
    search_failure_threshold: float = _DEFAULTS.failure_threshold
    search_failure_min_searches: int = _DEFAULTS.failure_min_searches

    def search_settings(self) -> SearchSettings:
        return SearchSettings(**{field: getattr(self, key) for key, field in LOOP_SEARCH_KEYS.items()})


__all__ = [
    "DEFAULT_TOPK",
    "LOOP_SEARCH_KEYS",
    "RETRIEVAL_TOKEN_ENV",
    "RETRIEVAL_URL_ENV",
    "RETRIEVAL_WAIT_ENV",
    "LoopSearchFields",
    "SearchSettings",
]
