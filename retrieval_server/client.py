"""HTTP clients (sync and async) for the ``POST /retrieve`` contract.

Retries only what a retry can fix: 5xx responses, connection failures,
timeouts, and Ray Serve's routing 404 ("Path '/retrieve' not found", answered
while its ingress restarts and the app is not routed yet), with exponential
backoff (tenacity runs the retry loop of both clients). Any other 4xx means the
request itself is wrong, so it raises :class:`RetrievalRequestError` at once
with the server's message. The retry budget is ``max_retries`` retries or
``deadline_s`` seconds, whichever lasts longer: an ingress restart (~30 s) is
ridden out. When it is spent, :class:`RetrievalUnavailableError` is raised.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import httpx
from tenacity import (
    AsyncRetrying,
    BaseRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_before_delay,
)

logger = logging.getLogger(__name__)

__all__ = [
    "AsyncRetrievalClient",
    "RetrievalClient",
    "RetrievalError",
    "RetrievalRequestError",
    "RetrievalUnavailableError",
]


class RetrievalError(Exception):
    """Base class of every error the retrieval clients raise."""


class RetrievalRequestError(RetrievalError):
    """The server rejected the request (4xx); retrying the same request cannot help."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"retrieval server rejected the request (HTTP {status_code}): {message}")
        self.status_code = status_code
        self.message = message


class RetrievalUnavailableError(RetrievalError):
    """The server did not answer successfully within the retry budget."""


_RETRYABLE_TRANSPORT_ERRORS = (httpx.TransportError,)  # connect/read/write errors and all timeouts
# Seconds a call keeps retrying by default: longer than HAProxy's manager takes to restart (~30 s).
DEFAULT_DEADLINE_S = 60.0
# The longest wait between two attempts: a long outage is probed every few seconds, not every minute.
MAX_BACKOFF_S = 4.0
# How Ray Serve's front (HAProxy or its Python proxy) answers a path no app is routed on: while it restarts, ours.
_SERVE_ROUTING_404 = re.compile(r"^Path '[^']*' not found\.")


def _error_message(response: httpx.Response) -> str:
    """The human-readable part of an error response (our server sends ``{"detail": ...}``)."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    if isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        return detail if isinstance(detail, str) else str(detail)
    return str(body)


def _retrieve_payload(queries: list[str], topk: int | None, return_scores: bool) -> dict[str, Any]:
    return {"queries": list(queries), "topk": topk, "return_scores": return_scores}


def _parse_result(response: httpx.Response) -> list[list[dict]]:
    try:
        body = response.json()
        return body["result"]
    except (ValueError, KeyError, TypeError) as err:
        raise RetrievalUnavailableError(f"retrieval server sent a malformed response: {response.text[:200]!r}") from err


class _RetryableFailure(Exception):
    """A failed attempt that a retry can fix (5xx, connection error, timeout, Serve's routing 404); ``problem`` says
    what happened, ``retry_after`` the server's Retry-After in seconds, if it sent one."""

    def __init__(self, problem: str, retry_after: float | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.retry_after = retry_after


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    return float(value) if value.isdigit() else None  # the HTTP-date form is not used by our server


class _RetryPolicy:
    """Shared by the two clients: what to retry and how long to wait (tenacity runs the loop, sync or async)."""

    def __init__(
        self, base_url: str, timeout: float, max_retries: int, backoff: float, token: str | None, deadline_s: float
    ) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if deadline_s < 0:
            raise ValueError(f"deadline_s must be >= 0, got {deadline_s}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.deadline_s = deadline_s
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds before retry ``attempt + 1``: ``backoff * 2**attempt`` up to MAX_BACKOFF_S, or the server's
        Retry-After if longer."""
        return max(min(self.backoff * (2**attempt), MAX_BACKOFF_S), retry_after or 0.0)

    def retrying(self, retrying_cls: type[BaseRetrying], method: str, path: str) -> BaseRetrying:
        def log_retry(state: RetryCallState) -> None:
            problem = state.outcome.exception().problem
            wait = state.next_action.sleep
            logger.warning(
                "retrieval %s %s failed (%s); retry %d in %.2fs", method, path, problem, state.attempt_number, wait
            )

        def wait(state: RetryCallState) -> float:
            return self.delay(state.attempt_number - 1, state.outcome.exception().retry_after)

        return retrying_cls(
            # Both must be spent: max_retries retries, and no time left before the deadline for another wait.
            # max_retries=0 asks for no retries at all: the deadline does not add any.
            stop=stop_after_attempt(self.max_retries + 1)
            & stop_before_delay(self.deadline_s if self.max_retries else 0),
            wait=wait,
            retry=retry_if_exception_type(_RetryableFailure),
            before_sleep=log_retry,
            reraise=True,
        )

    def check(self, response: httpx.Response) -> httpx.Response:
        """The response if it succeeded; a 4xx raises now (but Serve's routing 404), a 5xx is retried."""
        if response.status_code < 400:
            return response
        message = _error_message(response)
        if response.status_code < 500 and not (response.status_code == 404 and _SERVE_ROUTING_404.match(message)):
            raise RetrievalRequestError(response.status_code, message)
        raise _RetryableFailure(f"HTTP {response.status_code}: {message}", _retry_after(response))

    def exhausted(
        self, method: str, path: str, failure: _RetryableFailure, state: RetryCallState | None
    ) -> RetrievalUnavailableError:
        attempts = state.attempt_number if state is not None else self.max_retries + 1
        elapsed = f" in {state.seconds_since_start:.1f} s" if state is not None and state.seconds_since_start else ""
        return RetrievalUnavailableError(
            f"{method} {self.base_url}{path} failed after {attempts} attempts{elapsed}: {failure.problem}"
        )


class RetrievalClient:
    """Blocking client; one instance can be shared by threads (httpx.Client is thread-safe).

    A call retries what a retry can fix for ``max_retries`` retries or ``deadline_s`` seconds, whichever lasts
    longer (``deadline_s=0``: the retries only; ``max_retries=0``: no retries), waiting ``backoff * 2**attempt``
    (at most 4 s, or the server's Retry-After) between attempts.
    """

    def __init__(
        self,
        base_url: str,
        timeout: float = 30.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        token: str | None = None,
        deadline_s: float = DEFAULT_DEADLINE_S,
    ) -> None:
        self._policy = _RetryPolicy(base_url, timeout, max_retries, backoff, token, deadline_s)
        self._http = httpx.Client(base_url=self._policy.base_url, timeout=timeout, headers=self._policy.headers)

    @property
    def base_url(self) -> str:
        return self._policy.base_url

    def _request(self, method: str, path: str, json: dict | None = None) -> httpx.Response:
        state = None
        try:
            for attempt in self._policy.retrying(Retrying, method, path):
                state = attempt.retry_state
                with attempt:
                    try:
                        response = self._http.request(method, path, json=json)
                    except _RETRYABLE_TRANSPORT_ERRORS as err:
                        raise _RetryableFailure(f"{type(err).__name__}: {err}") from err
                    return self._policy.check(response)
        except _RetryableFailure as failure:
            raise self._policy.exhausted(method, path, failure, state) from failure
        raise AssertionError("unreachable: tenacity either returns an attempt's value or raises")

    def retrieve(self, queries: list[str], topk: int | None = None, return_scores: bool = True) -> list[list[dict]]:
        """Top-k documents per query: ``[[{"document": {"id", "contents"}, "score"?}, ...], ...]``."""
        response = self._request("POST", "/retrieve", json=_retrieve_payload(queries, topk, return_scores))
        return _parse_result(response)

    def health(self) -> dict:
        return self._request("GET", "/health").json()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RetrievalClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncRetrievalClient:
    """asyncio client with the same behaviour as :class:`RetrievalClient`."""

    def __init__(
        self,
        base_url: str,
        timeout: float = 30.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        token: str | None = None,
        deadline_s: float = DEFAULT_DEADLINE_S,
    ) -> None:
        self._policy = _RetryPolicy(base_url, timeout, max_retries, backoff, token, deadline_s)
        self._http = httpx.AsyncClient(
            base_url=self._policy.base_url,
            timeout=timeout,
            headers=self._policy.headers,
            # Rollout workers fire many concurrent searches through one client.
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )

    @property
    def base_url(self) -> str:
        return self._policy.base_url

    async def _request(self, method: str, path: str, json: dict | None = None) -> httpx.Response:
        state = None
        try:
            async for attempt in self._policy.retrying(AsyncRetrying, method, path):
                state = attempt.retry_state
                with attempt:
                    try:
                        response = await self._http.request(method, path, json=json)
                    except _RETRYABLE_TRANSPORT_ERRORS as err:
                        raise _RetryableFailure(f"{type(err).__name__}: {err}") from err
                    return self._policy.check(response)
        except _RetryableFailure as failure:
            raise self._policy.exhausted(method, path, failure, state) from failure
        raise AssertionError("unreachable: tenacity either returns an attempt's value or raises")

    async def retrieve(
        self, queries: list[str], topk: int | None = None, return_scores: bool = True
    ) -> list[list[dict]]:
        """Top-k documents per query: ``[[{"document": {"id", "contents"}, "score"?}, ...], ...]``."""
        response = await self._request("POST", "/retrieve", json=_retrieve_payload(queries, topk, return_scores))
        return _parse_result(response)

    async def health(self) -> dict:
        return (await self._request("GET", "/health")).json()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncRetrievalClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
