"""Client retry/4xx behaviour against a real HTTP server (uvicorn on 127.0.0.1) that fails on command."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from http_servers import ThreadedUvicorn

from retrieval_server.client import (
    AsyncRetrievalClient,
    RetrievalClient,
    RetrievalRequestError,
    RetrievalUnavailableError,
)
from retrieval_server.haproxy_front import free_port

# retries, Retry-After and deadlines waited out: ~8 s for ~0.6 CPU-s (tests/scheduling.py)
pytestmark = pytest.mark.mostly_waits

HIT = {"document": {"id": "p1", "contents": "Title\ntext"}, "score": 0.5}
# What Ray Serve's HAProxy front answers for a path no app is routed on (while its ingress restarts, /retrieve).
SERVE_ROUTING_404 = "serve-404"
SHED_503 = "shed-503"  # our server's answer when its queue is full: 503 with Retry-After


class FlakyServer:
    """Answers /retrieve with the next scripted status (then 200); counts every attempt.

    Each attempt takes its scripted status the moment it arrives, before any
    scripted delay, so a slow handler still sleeping when its client gave up
    cannot consume a status meant for a later attempt. Every test gets its own
    server (function-scoped fixture): handlers left sleeping by one test never
    touch another's counts.
    """

    def __init__(self, script: list[int | str] | None = None, slow_seconds: float = 0.0) -> None:
        self.script: list[int | str] = list(script or [])
        self.attempts = 0
        self.slow_seconds = slow_seconds
        app = FastAPI()

        @app.post("/retrieve")
        async def retrieve(body: dict) -> JSONResponse:
            self.attempts += 1
            status = self.script.pop(0) if self.script else 200
            if self.slow_seconds:
                await asyncio.sleep(self.slow_seconds)
            if status == SERVE_ROUTING_404:
                message = "Path '/retrieve' not found. Ping http://.../-/routes for available routes."
                return PlainTextResponse(message, status_code=404)
            if status == SHED_503:
                return JSONResponse(status_code=503, content={"detail": "server busy"}, headers={"Retry-After": "1"})
            if status != 200:
                return JSONResponse(status_code=status, content={"detail": f"scripted {status}"})
            return JSONResponse({"result": [[HIT] for _ in body["queries"]]})

        @app.get("/health")
        async def health() -> dict:
            return {"status": "ok"}

        self.http = ThreadedUvicorn(app)
        self.url = self.http.url

    def reset(self, script: list[int | str], slow_seconds: float = 0.0) -> None:
        # Only between requests of one test: the event loop is idle, nothing is in flight.
        self.script, self.attempts, self.slow_seconds = list(script), 0, slow_seconds


@pytest.fixture
def flaky() -> Iterator[FlakyServer]:
    server = FlakyServer()
    yield server
    server.http.stop()


def test_retries_5xx_then_succeeds(flaky):
    flaky.reset([503, 500, 502])
    with RetrievalClient(flaky.url, max_retries=3, backoff=0.01) as client:
        result = client.retrieve(["q1", "q2"], topk=1)
    assert result == [[HIT], [HIT]]
    assert flaky.attempts == 4


def test_exhausted_retries_raise_unavailable(flaky):
    flaky.reset([503] * 10)
    with (
        RetrievalClient(flaky.url, max_retries=2, backoff=0.01, deadline_s=0) as client,
        pytest.raises(RetrievalUnavailableError, match="3 attempts.*scripted 503"),
    ):
        client.retrieve(["q"])
    assert flaky.attempts == 3


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_4xx_raises_immediately_with_message(flaky, status):
    flaky.reset([status])
    with (
        RetrievalClient(flaky.url, max_retries=3, backoff=0.01) as client,
        pytest.raises(RetrievalRequestError) as info,
    ):
        client.retrieve(["q"])
    assert info.value.status_code == status and info.value.message == f"scripted {status}"
    assert flaky.attempts == 1


def test_timeouts_are_retried(flaky):
    flaky.reset([], slow_seconds=0.5)
    with (
        RetrievalClient(flaky.url, timeout=0.1, max_retries=1, backoff=0.01, deadline_s=0) as client,
        pytest.raises(RetrievalUnavailableError, match="Timeout"),
    ):
        client.retrieve(["q"])
    # A loaded server may read a timed-out attempt's request only after the client gave up on it.
    deadline = time.monotonic() + 10
    while flaky.attempts < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # room for a third attempt to show up, were the client to send one
    assert flaky.attempts == 2


def test_connection_refused_is_retried_then_unavailable():
    with (
        RetrievalClient(f"http://127.0.0.1:{free_port()}", max_retries=2, backoff=0.01, deadline_s=0) as client,
        pytest.raises(RetrievalUnavailableError, match="3 attempts.*ConnectError"),
    ):
        client.health()


def test_bearer_token_is_sent():
    received = {}
    app = FastAPI()

    @app.get("/health")
    async def health(request: Request) -> dict:
        received["auth"] = request.headers.get("authorization")
        return {"status": "ok"}

    with ThreadedUvicorn(app) as server, RetrievalClient(server.url, token="s3cret") as client:
        assert client.health() == {"status": "ok"}
    assert received["auth"] == "Bearer s3cret"


def test_async_client_retries_and_4xx(flaky):
    async def scenario() -> None:
        async with AsyncRetrievalClient(flaky.url, max_retries=3, backoff=0.01, deadline_s=0) as client:
            flaky.reset([503, 504])
            assert await client.retrieve(["a"], topk=1, return_scores=False) == [[HIT]]
            assert flaky.attempts == 3
            flaky.reset([422])
            with pytest.raises(RetrievalRequestError, match="scripted 422"):
                await client.retrieve(["a"])
            assert flaky.attempts == 1
            flaky.reset([500] * 9)
            with pytest.raises(RetrievalUnavailableError):
                await client.retrieve(["a"])
            assert flaky.attempts == 4
            assert (await client.health())["status"] == "ok"

    asyncio.run(scenario())


def test_retries_wait_backoff_times_two_to_the_attempt_and_say_so(flaky, caplog):
    flaky.reset([503, 502, 500])
    with caplog.at_level("WARNING", logger="retrieval_server.client"):
        with RetrievalClient(flaky.url, max_retries=3, backoff=0.01) as client:
            assert client.retrieve(["q"]) == [[HIT]]

        async def scenario() -> None:
            flaky.reset([503, 502, 500])
            async with AsyncRetrievalClient(flaky.url, max_retries=3, backoff=0.01) as client:
                assert await client.retrieve(["q"]) == [[HIT]]

        asyncio.run(scenario())
    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    expected = [
        "retrieval POST /retrieve failed (HTTP 503: scripted 503); retry 1 in 0.01s",
        "retrieval POST /retrieve failed (HTTP 502: scripted 502); retry 2 in 0.02s",
        "retrieval POST /retrieve failed (HTTP 500: scripted 500); retry 3 in 0.04s",
    ]
    assert retries == expected * 2  # the sync and the async client alike


def test_an_ingress_restart_longer_than_the_retries_is_ridden_out_within_the_deadline(flaky):
    """HAProxy's manager restarting: Serve's routing 404, then 502/503, for longer than max_retries covers."""
    outage = [SERVE_ROUTING_404, SERVE_ROUTING_404, 502, 503, 503, 503, 503]
    flaky.reset(outage)
    with RetrievalClient(flaky.url, max_retries=3, backoff=0.01, deadline_s=30) as client:
        assert client.retrieve(["q"]) == [[HIT]]
    assert flaky.attempts == len(outage) + 1

    async def scenario() -> None:
        flaky.reset(outage)
        async with AsyncRetrievalClient(flaky.url, max_retries=3, backoff=0.01, deadline_s=30) as client:
            assert await client.retrieve(["q"]) == [[HIT]]

    asyncio.run(scenario())
    assert flaky.attempts == len(outage) + 1


def test_retries_stop_at_the_deadline_and_say_how_long_they_tried():
    started = time.monotonic()
    with (
        RetrievalClient(f"http://127.0.0.1:{free_port()}", max_retries=1, backoff=0.1, deadline_s=1.0) as client,
        pytest.raises(
            RetrievalUnavailableError, match=r"failed after [3-9] attempts in (0\.[5-9]|1\.\d) s.*ConnectError"
        ),
    ):
        client.health()
    assert time.monotonic() - started < 3.0


def test_a_routing_404_is_retried_but_a_404_of_the_app_is_final(flaky):
    flaky.reset([SERVE_ROUTING_404])
    with RetrievalClient(flaky.url, max_retries=3, backoff=0.01) as client:
        assert client.retrieve(["q"]) == [[HIT]]
        flaky.reset([404])  # our app's own 404 (a wrong path or route prefix): retrying cannot help
        with pytest.raises(RetrievalRequestError, match="scripted 404"):
            client.retrieve(["q"])
    assert flaky.attempts == 1


def test_a_retry_after_from_the_server_is_waited_out(flaky, caplog):
    flaky.reset([SHED_503])
    with (
        caplog.at_level("WARNING", logger="retrieval_server.client"),
        RetrievalClient(flaky.url, backoff=0.01) as client,
    ):
        assert client.retrieve(["q"]) == [[HIT]]
    assert [r.getMessage() for r in caplog.records if "retry" in r.getMessage()] == [
        "retrieval POST /retrieve failed (HTTP 503: server busy); retry 1 in 1.00s"
    ]


def test_max_retries_zero_turns_retrying_off_whatever_the_deadline(flaky):
    flaky.reset([503])
    with RetrievalClient(flaky.url, max_retries=0, deadline_s=60) as client, pytest.raises(RetrievalUnavailableError):
        client.retrieve(["q"])
    assert flaky.attempts == 1
