"""The search client's settings, defined once for the search tool and both agent loops.

Pure (pydantic, no verl): :class:`SearchSettings` is what a :class:`~verl_evidence.tools.search_service.SearchService`
is built from. The tool's YAML ``config`` uses its field names as they are; the agent loops carry the same
settings as flat, prefixed keys of their own settings (:class:`LoopSearchFields`: ``search_timeout``, ...), so that
``rollout.custom.<loop>.search_timeout=...`` works; both are derived from :class:`SearchSettings`' fields.
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
    """How one caller searches: server, client retries, the per-process rate limit and when to give up on a server.

    The one definition of the search settings: the tool's YAML ``config`` keys, the agent loops' ``search_*`` keys
    (:class:`LoopSearchFields`) and the configuration reference are all read from these fields.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    retrieval_url: str | None = Field(None, description=f"retrieval server (null: env `{RETRIEVAL_URL_ENV}`)")
    topk: int = Field(DEFAULT_TOPK, ge=1, description="passages per search")
    timeout: float = Field(30.0, gt=0, description="seconds per retrieval request")
    max_retries: int = Field(
        3, ge=0, description="retries of a failed request (5xx, connection errors, Serve's routing 404)"
    )
    backoff: float = Field(0.5, ge=0, description="retry backoff base, seconds (`backoff * 2**attempt`)")
    retry_deadline_s: float = Field(
        60.0,
        ge=0,
        description="retries go on this long (a restarting server is waited for); 0: max retries only",
    )
    token: str | None = Field(None, description=f"bearer token (null: env `{RETRIEVAL_TOKEN_ENV}`)")
    max_concurrency: int = Field(64, ge=1, description="requests in flight per worker process, server and limits")
    requests_per_second: float | None = Field(
        None, gt=0, description="rate limit per worker process, server and limits (null: none)"
    )
    burst: int | None = Field(
        None, ge=1, description="requests let through at once, then the rate applies (null: max(1, the rate))"
    )
    wait_for_server_s: float | None = Field(
        None,
        description=f"seconds to wait for the server's /health before the first search (null: env "
        f"`{RETRIEVAL_WAIT_ENV}`, which a recipe sets when it starts its own server beside the trainer; else 0)",
    )
    failure_threshold: float = Field(
        0.5,
        gt=0,
        le=1,
        description="stop the rollout when more than this share of a step's searches in one worker failed (1: never)",
    )
    failure_min_searches: int = Field(
        8, ge=1, description="searches of a step in one worker before the threshold can stop it"
    )

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


# Only the agent loops act on these: verl's ToolAgentLoop turns a tool's exception into text, so the tool cannot stop
# a rollout (its config refuses them instead of ignoring them).
LOOP_ONLY_FIELDS = ("failure_threshold", "failure_min_searches")
# Not a loop setting: a token in a Hydra override would be printed with the trainer's config; loops read the env.
TOOL_ONLY_FIELDS = ("token",)
TOOL_FIELDS = tuple(name for name in SearchSettings.model_fields if name not in LOOP_ONLY_FIELDS)


def loop_key(field: str) -> str:
    """A search setting's key in a loop's settings: ``search_<field>``; ``retrieval_url`` and ``topk`` as they are."""
    return field if field in ("retrieval_url", "topk") else f"search_{field}"


# loop setting name -> SearchSettings field
LOOP_SEARCH_KEYS = {loop_key(name): name for name in SearchSettings.model_fields if name not in TOOL_ONLY_FIELDS}


def _search_settings(self) -> SearchSettings:
    return SearchSettings(**{field: getattr(self, key) for key, field in LOOP_SEARCH_KEYS.items()})


def _loop_search_fields() -> type:
    defaults = SearchSettings()
    fields = [
        (
            key,
            SearchSettings.model_fields[name].annotation,
            dataclasses.field(
                default=getattr(defaults, name), metadata={"description": SearchSettings.model_fields[name].description}
            ),
        )
        for key, name in LOOP_SEARCH_KEYS.items()
    ]
    return dataclasses.make_dataclass(
        "LoopSearchFields",
        fields,
        frozen=True,
        namespace={
            "__doc__": "The search settings of an agent loop's settings dataclass (a base class of both loops' "
            "settings): :class:`SearchSettings`' fields under their loop keys (:func:`loop_key`), same defaults.",
            "__module__": __name__,
            "search_settings": _search_settings,
        },
    )


LoopSearchFields = _loop_search_fields()


__all__ = [
    "DEFAULT_TOPK",
    "LOOP_ONLY_FIELDS",
    "LOOP_SEARCH_KEYS",
    "TOOL_FIELDS",
    "RETRIEVAL_TOKEN_ENV",
    "RETRIEVAL_URL_ENV",
    "RETRIEVAL_WAIT_ENV",
    "LoopSearchFields",
    "SearchSettings",
]
