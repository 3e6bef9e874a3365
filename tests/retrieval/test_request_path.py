"""The server's request path under abuse, in this process (no Ray): the deployment's own FastAPI routes over a real
BM25 replica of the bundled index, called through httpx's ASGI transport.

Serve hands each route its replica through a FastAPI dependency; here FastAPI's test override hands it the replica
built in this process. A BM25 replica needs no encoder, so building one takes about a second.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import threading
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from retrieval_server.config import ServerConfig

TOKEN = "s3cret-for-tests"


def _deployment(index_dir, **settings):
    from retrieval_server.app import RetrievalServer

    deployment_class = RetrievalServer.func_or_class.__bases__[0]  # the class under Serve's ASGI wrapper
    return deployment_class(ServerConfig(index_dir=index_dir, method="bm25", **settings).model_dump(mode="json"))


@pytest.fixture
def serve_in_process(bundled_index_dir):
    """serve(**settings) -> (replica, httpx.AsyncClient factory) for the routes of a replica with those settings."""
    from ray.serve._private.http_util import _walk_fastapi_routes

    from retrieval_server.app import fastapi_app

    # Serve's class-based view: every route's `self` is a Depends on the replica of the running Serve replica.
    servable = {
        inspect.signature(route.endpoint).parameters["self"].default.dependency
        for route, _, _ in _walk_fastapi_routes(fastapi_app)
        if "self" in inspect.signature(route.endpoint).parameters
    }

    def serve(**settings):
        replica = _deployment(bundled_index_dir, **settings)
        for dependency in servable:
            fastapi_app.dependency_overrides[dependency] = lambda: replica

        def client() -> httpx.AsyncClient:
            return httpx.AsyncClient(transport=httpx.ASGITransport(app=fastapi_app), base_url="http://replica")

        return replica, client

    yield serve
    fastapi_app.dependency_overrides.clear()


def _gate_search(replica, monkeypatch) -> tuple[threading.Event, list[list[str]]]:
    """Hold every search until the returned event is set; record each batch's queries."""
    real_search = replica.retriever.search
    gate, batches = threading.Event(), []

    def held_search(queries, vectors, k):
        batches.append(list(queries))
        gate.wait(30)
        return real_search(queries, vectors, k)

    monkeypatch.setattr(replica.retriever, "search", held_search)
    return gate, batches


async def _until(condition, what: str, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.005)


def _ids(body: dict) -> list[list[str]]:
    return [[hit["document"]["id"] for hit in hits] for hits in body["result"]]


def _alone(replica, query: str, k: int) -> list[str]:
    rows, _ = replica.retriever.search([query], None, k)
    return [d["id"] for d in replica.retriever.lookup(rows[0][rows[0] >= 0])]


def _shed(replica) -> float:
    return float(re.search(r"^retrieval_shed_requests_total (\S+)$", replica.metrics.render().decode(), re.M)[1])


QUESTIONS = [f"question {i}: which river flows through {place}?" for i, place in enumerate(["Cairo", "Paris"] * 15)]


# ---------------------------------------------------------------- 1. bounded work per batch
def test_a_big_request_is_split_into_batches_bounded_by_queries_and_hits(serve_in_process, monkeypatch):
    replica, client = serve_in_process(max_batch_queries=8, max_batch_hits=40, max_topk=10, result_cache_size=0)
    searched: list[int] = []
    real_search = replica.retriever.search
    monkeypatch.setattr(replica.retriever, "search", lambda q, v, k: searched.append(len(q)) or real_search(q, v, k))

    async def scenario() -> httpx.Response:
        async with client() as http:
            return await http.post("/retrieve", json={"queries": QUESTIONS, "topk": 10})

    response = asyncio.run(scenario())
    assert response.status_code == 200
    # 40 hits a batch at topk 10: four queries each; every query answered as if searched alone.
    assert searched == [4] * 7 + [2]
    assert _ids(response.json()) == [_alone(replica, q, 10) for q in QUESTIONS]


def test_a_small_request_overtakes_a_big_one_that_is_running(serve_in_process, monkeypatch):
    replica, client = serve_in_process(max_batch_queries=4, result_cache_size=0, small_request_queries=0)
    gate, batches = _gate_search(replica, monkeypatch)

    async def scenario() -> list[str]:
        finished: list[str] = []
        async with client() as http:

            async def post(name: str, queries: list[str]) -> None:
                response = await http.post("/retrieve", json={"queries": queries, "topk": 2})
                assert response.status_code == 200
                finished.append(name)

            big = asyncio.create_task(post("big", QUESTIONS))
            await _until(lambda: len(batches) == 1, "the big request's first batch")
            small = asyncio.create_task(post("small", ["Nile"]))
            await _until(lambda: replica.batcher.queued == 8, "the small request to queue")
            gate.set()
            await asyncio.wait_for(asyncio.gather(big, small), 30)
        return finished

    assert asyncio.run(scenario()) == ["small", "big"]
    assert batches[1] == ["Nile"]  # the very next batch, not after the big request's 7 remaining pieces


def test_a_small_request_runs_in_its_own_lane_while_big_batches_hold_every_slot(serve_in_process, monkeypatch):
    """Issue 54's flood: a one-query request waited for a running batch of large pieces, then ran inside the next
    one (honest p99 1.15 s). In its lane it is answered while the large batches are still held."""
    replica, client = serve_in_process(max_batch_queries=4, batch_concurrency=2, result_cache_size=0)
    real_search, held = replica.retriever.search, threading.Event()

    def search_holding_big_batches(queries, vectors, k):
        if "Nile" not in queries:
            held.wait(30)
        return real_search(queries, vectors, k)

    monkeypatch.setattr(replica.retriever, "search", search_holding_big_batches)

    async def scenario() -> tuple[int, bool]:
        async with client() as http:
            big = [asyncio.create_task(http.post("/retrieve", json={"queries": QUESTIONS, "topk": 2})) for _ in "ab"]
            await _until(lambda: replica.batcher._running == 2, "both batch slots to be taken by big pieces")
            small = await asyncio.wait_for(http.post("/retrieve", json={"queries": ["Nile"], "topk": 2}), 10)
            still_held = not any(task.done() for task in big)
            held.set()
            await asyncio.wait_for(asyncio.gather(*big), 30)
        return small.status_code, still_held

    assert asyncio.run(scenario()) == (200, True)


def test_a_full_queue_sheds_a_big_request_with_503_and_retry_after_but_takes_a_small_one(serve_in_process, monkeypatch):
    replica, client = serve_in_process(
        max_batch_queries=4, max_queued_queries=30, result_cache_size=0, small_request_queries=0
    )
    gate, batches = _gate_search(replica, monkeypatch)

    async def scenario() -> tuple[httpx.Response, float, list[int]]:
        async with client() as http:
            first = asyncio.create_task(http.post("/retrieve", json={"queries": QUESTIONS[:4], "topk": 2}))
            await _until(lambda: len(batches) == 1, "a batch to run")
            queued = asyncio.create_task(http.post("/retrieve", json={"queries": QUESTIONS[:28], "topk": 2}))
            await _until(lambda: replica.batcher.queued_size == 28, "28 queries to queue")
            started = time.perf_counter()
            shed = await http.post("/retrieve", json={"queries": QUESTIONS[:8], "topk": 2})
            refusal_s = time.perf_counter() - started
            small = asyncio.create_task(http.post("/retrieve", json={"queries": ["Nile"], "topk": 2}))
            await _until(lambda: replica.batcher.queued_size == 29, "the small request to queue")
            gate.set()
            statuses = [r.status_code for r in await asyncio.wait_for(asyncio.gather(first, queued, small), 30)]
        return shed, refusal_s, statuses

    shed, refusal_s, statuses = asyncio.run(scenario())
    assert shed.status_code == 503 and shed.headers["retry-after"] == "1"
    assert "max_queued_queries=30" in shed.json()["detail"]
    assert refusal_s < 1.0
    assert statuses == [200, 200, 200]
    assert "retrieval_shed_requests_total 1.0" in replica.metrics.render().decode()


def test_concurrent_large_requests_cannot_all_pass_the_queue_bound(serve_in_process, monkeypatch):
    """Admission and queueing happen with no await between: requests arriving together are counted one by one."""
    replica, client = serve_in_process(
        max_batch_queries=4, max_queued_queries=12, result_cache_size=0, small_request_queries=0
    )
    gate, batches = _gate_search(replica, monkeypatch)

    async def scenario() -> tuple[list[int], int]:
        async with client() as http:
            running = asyncio.create_task(http.post("/retrieve", json={"queries": ["Nile"], "topk": 2}))
            await _until(lambda: len(batches) == 1, "a batch to run")
            posts = [http.post("/retrieve", json={"queries": QUESTIONS[i : i + 8], "topk": 2}) for i in range(6)]
            together = asyncio.gather(*posts)
            await _until(lambda: _shed(replica) + replica.batcher.queued / 2 >= 6, "every request admitted or shed")
            queued = replica.batcher.queued_size
            gate.set()
            statuses = [r.status_code for r in await asyncio.wait_for(together, 30)]
            assert (await running).status_code == 200
        return statuses, queued

    statuses, queued = asyncio.run(scenario())
    assert queued <= 12 and statuses.count(200) == 1 and statuses.count(503) == 5


def test_a_request_that_waits_past_its_time_gets_503_with_the_cause(serve_in_process, monkeypatch):
    replica, client = serve_in_process(request_timeout_s=0.5, result_cache_size=0)
    gate, _ = _gate_search(replica, monkeypatch)

    async def scenario() -> tuple[httpx.Response, float]:
        async with client() as http:
            started = time.perf_counter()
            try:
                response = await http.post("/retrieve", json={"queries": ["Nile"]})
            finally:
                gate.set()  # the search thread ends before the loop does
            return response, time.perf_counter() - started

    response, elapsed = asyncio.run(scenario())
    assert response.status_code == 503 and elapsed < 2.0
    assert "longer than request_timeout_s=0.5 s" in response.json()["detail"]


def test_the_queued_pieces_of_a_client_that_left_are_never_searched(serve_in_process, monkeypatch):
    from retrieval_server.app import fastapi_app

    replica, client = serve_in_process(max_batch_queries=4, result_cache_size=0, small_request_queries=0)
    gate, batches = _gate_search(replica, monkeypatch)

    async def leaving_client() -> None:
        """An ASGI conversation: the whole body, then the client hangs up while its request waits."""
        body = json.dumps({"queries": QUESTIONS[:12], "topk": 2}).encode()
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict:
            if messages:
                return messages.pop()
            await _until(lambda: replica.batcher.queued == 3, "the leaver's pieces to queue")
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            pass

        scope = {"type": "http", "method": "POST", "path": "/retrieve", "headers": [], "query_string": b""}
        await fastapi_app(scope, receive, send)

    async def scenario() -> None:
        async with client() as http:
            running = asyncio.create_task(http.post("/retrieve", json={"queries": ["Nile"], "topk": 2}))
            await _until(lambda: len(batches) == 1, "a batch to run")
            await asyncio.wait_for(leaving_client(), 10)
            gate.set()
            assert (await running).status_code == 200
            await asyncio.sleep(0.2)  # room for a worker that would (wrongly) run the leaver's pieces

    asyncio.run(scenario())
    assert batches == [["Nile"]]
    assert "retrieval_client_left_total 1.0" in replica.metrics.render().decode()


# ---------------------------------------------------------------- 3. body size cap
def test_a_body_above_the_cap_gets_413_before_it_is_read_whole(serve_in_process):
    replica, client = serve_in_process(max_body_bytes=4096)
    sent: list[int] = []

    async def big_body() -> AsyncIterator[bytes]:  # chunked: no Content-Length to refuse it by
        yield b'{"queries": ["'
        for _ in range(1000):
            sent.append(1024)
            yield b"x" * 1024
        yield b'"]}'

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with client() as http:
            streamed = await http.post("/retrieve", content=big_body())
            declared = await http.post(
                "/retrieve", content=b"{}", headers={"content-length": str(60 * 2**20), "content-type": "x"}
            )
            return streamed, declared

    streamed, declared = asyncio.run(scenario())
    assert streamed.status_code == 413 and "cap of 4096 bytes" in streamed.json()["detail"]
    assert len(sent) <= 6  # read up to the cap, not the whole megabyte
    assert declared.status_code == 413 and f"{60 * 2**20} bytes" in declared.json()["detail"]


# ---------------------------------------------------------------- 10. the token
def test_with_a_token_everything_but_the_liveness_route_needs_it(serve_in_process):
    replica, client = serve_in_process(token=TOKEN)
    auth = {"authorization": f"Bearer {TOKEN}"}

    async def scenario() -> dict[str, tuple[int, int]]:
        statuses = {}
        async with client() as http:
            for path in ("/health", "/metrics", "/docs", "/openapi.json"):
                statuses[path] = ((await http.get(path)).status_code, (await http.get(path, headers=auth)).status_code)
            statuses["/healthz"] = ((await http.get("/healthz")).status_code, 200)
            statuses["wrong"] = ((await http.get("/health", headers={"authorization": "Bearer s3cret"})).status_code, 0)
            health = (await http.get("/health", headers=auth)).json()
            liveness = (await http.get("/healthz")).text
        return statuses, health, liveness

    statuses, health, liveness = asyncio.run(scenario())
    assert statuses == {
        "/health": (401, 200),
        "/metrics": (401, 200),
        "/docs": (401, 200),
        "/openapi.json": (401, 200),
        "/healthz": (200, 200),
        "wrong": (401, 0),
    }
    assert liveness == "ok"  # no path, pid or size for the unauthenticated
    assert health["index_size"] == replica.retriever.size and "replica_pid" in health


def test_tokens_are_compared_in_constant_time(serve_in_process, monkeypatch):
    import hmac

    replica, client = serve_in_process(token=TOKEN)
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: compared.append((a, b)) or real(a, b))

    async def scenario() -> int:
        async with client() as http:
            return (
                await http.post("/retrieve", json={"queries": ["Nile"]}, headers={"authorization": "Bearer x"})
            ).status_code

    assert asyncio.run(scenario()) == 401
    assert compared == [(b"Bearer x", f"Bearer {TOKEN}".encode())]


# ---------------------------------------------------------------- 11. repeated queries
def test_repeated_queries_are_searched_once_and_answered_identically(serve_in_process, monkeypatch):
    replica, client = serve_in_process(result_cache_size=16)
    searched: list[list[str]] = []
    real_search = replica.retriever.search
    monkeypatch.setattr(replica.retriever, "search", lambda q, v, k: searched.append(list(q)) or real_search(q, v, k))
    grpo = ["Nile", "Nile", "Nile", "capital of Egypt", "Nile"]  # the samples of one prompt repeat its first query

    async def scenario(make_client) -> list[dict]:
        async with make_client() as http:
            first = await http.post("/retrieve", json={"queries": grpo, "topk": 3})
            again = await http.post("/retrieve", json={"queries": ["Nile"], "topk": 3, "return_scores": False})
            other_k = await http.post("/retrieve", json={"queries": ["Nile"], "topk": 2})
        return [r.json() for r in (first, again, other_k)]

    cached = asyncio.run(scenario(client))
    assert searched == [["Nile", "capital of Egypt"], ["Nile"]]  # once per distinct (query, topk)
    metrics = replica.metrics.render().decode()
    assert re.search(r'^retrieval_cache_lookups_total{outcome="hit"} 4.0$', metrics, re.M)
    assert re.search(r"^retrieval_cache_hit_rate 0.571", metrics, re.M)  # 4 of 7 queries answered without a search
    _, no_cache_client = serve_in_process(result_cache_size=0)
    assert asyncio.run(scenario(no_cache_client)) == cached  # exactly what a search answers
    assert cached[0]["result"][0] == cached[0]["result"][1] and _ids(cached[1]) == [_ids(cached[0])[0]]


def test_the_token_comes_from_a_file_or_the_environment_and_a_command_line_token_is_warned_about(
    tmp_path, monkeypatch, caplog
):
    from typer.testing import CliRunner

    from retrieval_server.cli import _bearer_token
    from retrieval_server.cli import app as server_app

    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN}\n")
    monkeypatch.delenv("RETRIEVAL_SERVER_TOKEN", raising=False)
    with caplog.at_level("WARNING", logger="retrieval_server.cli"):
        assert _bearer_token(None, token_file) == TOKEN
        assert _bearer_token(None, None) is None
        monkeypatch.setenv("RETRIEVAL_SERVER_TOKEN", "from-env")
        assert _bearer_token(None, None) == "from-env"
        assert not caplog.records
        assert _bearer_token("on-the-command-line", None) == "on-the-command-line"
    assert ["visible to every user" in r.getMessage() for r in caplog.records] == [True]
    (tmp_path / "empty").write_text("\n")
    for args, problem in (
        (["--token", "x", "--token-file", str(token_file)], "give the token once"),
        (["--token-file", str(tmp_path / "empty")], "holds no token"),
        (["--token-file", str(tmp_path / "missing")], "cannot read"),
    ):
        result = CliRunner().invoke(server_app, ["serve", "--index-dir", str(tmp_path), *args])
        said = " ".join(result.output.replace("│", " ").split())  # rich wraps the message in a box
        assert result.exit_code == 2 and problem in said, result.output
