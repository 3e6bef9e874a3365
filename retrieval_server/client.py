"""HTTP clients (sync and async) for the ``POST /retrieve`` contract.

Retries only what a retry can fix: 5xx responses, connection failures and
timeouts, with exponential backoff (tenacity runs the retry loop of both
clients). A 4xx means the request itself is wrong, so it raises
:class:`RetrievalRequestError` at once with the server's message. When the
retry budget is spent, :class:`RetrievalUnavailableError` is raised.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
from tenacity import (
    AsyncRetrying,
    BaseRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
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
    """A failed attempt that a retry can fix (5xx, connection error, timeout); ``problem`` says what happened."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


class _RetryPolicy:
    """Shared by the two clients: what to retry and how long to wait (tenacity runs the loop, sync or async)."""

    def __init__(self, base_url: str, timeout: float, max_retries: int, backoff: float, token: str | None) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def delay(self, attempt: int) -> float:
        """Seconds before retry ``attempt + 1``: ``backoff * 2**attempt``."""
        return self.backoff * (2**attempt)

    def retrying(self, retrying_cls: type[BaseRetrying], method: str, path: str) -> BaseRetrying:
        def log_retry(state: RetryCallState) -> None:
            problem = state.outcome.exception().problem
            wait = state.next_action.sleep
            logger.warning(
                "retrieval %s %s failed (%s); retry %d in %.2fs", method, path, problem, state.attempt_number, wait
            )

        return retrying_cls(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=lambda state: self.delay(state.attempt_number - 1),
            retry=retry_if_exception_type(_RetryableFailure),
            before_sleep=log_retry,
            reraise=True,
        )

    def check(self, response: httpx.Response) -> httpx.Response:
        """The response if it succeeded; a 4xx raises now, a 5xx is retried."""
        if response.status_code < 400:
            return response
        if response.status_code < 500:
            raise RetrievalRequestError(response.status_code, _error_message(response))
        raise _RetryableFailure(f"HTTP {response.status_code}: {_error_message(response)}")

    def exhausted(self, method: str, path: str, failure: _RetryableFailure) -> RetrievalUnavailableError:
        return RetrievalUnavailableError(
            f"{method} {self.base_url}{path} failed after {self.max_retries + 1} attempts: {failure.problem}"
        )


class RetrievalClient:
    """Blocking client; one instance can be shared by threads (httpx.Client is thread-safe)."""

    def __init__(
        self,
        base_url: str,
        timeout: float = 30.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        token: str | None = None,
    ) -> None:
        self._policy = _RetryPolicy(base_url, timeout, max_retries, backoff, token)
        self._http = httpx.Client(base_url=self._policy.base_url, timeout=timeout, headers=self._policy.headers)

    @property
    def base_url(self) -> str:
        return self._policy.base_url

    def _request(self, method: str, path: str, json: dict | None = None) -> httpx.Response:
        try:
            for attempt in self._policy.retrying(Retrying, method, path):
                with attempt:
                    try:
                        response = self._http.request(method, path, json=json)
                    except _RETRYABLE_TRANSPORT_ERRORS as err:
                        raise _RetryableFailure(f"{type(err).__name__}: {err}") from err
                    return self._policy.check(response)
        except _RetryableFailure as failure:
            raise self._policy.exhausted(method, path, failure) from failure
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
    ) -> None:
        self._policy = _RetryPolicy(base_url, timeout, max_retries, backoff, token)
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
        try:
            async for attempt in self._policy.retrying(AsyncRetrying, method, path):
                with attempt:
                    try:
                        response = await self._http.request(method, path, json=json)
                    except _RETRYABLE_TRANSPORT_ERRORS as err:
                        raise _RetryableFailure(f"{type(err).__name__}: {err}") from err
                    return self._policy.check(response)
        except _RetryableFailure as failure:
            raise self._policy.exhausted(method, path, failure) from failure
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
