"""Batches inside the real deployment: a failed batch, mixed topk, and hybrid + rerank through Ray Serve.

The handler tests drive the deployment's own class in this process (its real
Retriever over the bundled index) so that batch membership is deterministic;
the Serve test deploys a hybrid + cross-encoder app beside the session server.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from starlette.requests import Request

from retrieval_server.client import RetrievalClient
from retrieval_server.config import ServerConfig
from retrieval_server.recall import load_qa
from verl_evidence.bundled import qa_path as bundled_qa_path

pytestmark = [pytest.mark.slow, pytest.mark.one_worker_group]

SHALLOW_VICTIM = (
    "What does the Maasai phrase behind the name Nairobi mean?"  # its hybrid top 3 changes when fused 100 deep
)


@pytest.fixture(scope="module")
def replica(bundled_index_dir):
    """The RetrievalServer class behind the Serve deployment, constructed here (hybrid method)."""
    import torch

    from retrieval_server.app import RetrievalServer

    threads = torch.get_num_threads()
    deployment_class = RetrievalServer.func_or_class.__bases__[0]  # the class under Serve's ASGI wrapper
    # No small requests' lane: these tests queue small requests behind a batch that is held
    config = ServerConfig(index_dir=bundled_index_dir, method="hybrid", small_request_queries=0)
    server = deployment_class(config.model_dump(mode="json"))
    torch.set_num_threads(threads)  # the replica sets its own; leave this process's as it was
    return server


async def _post(server, body: dict) -> tuple[int, dict]:
    payload = json.dumps(body).encode()

    async def receive() -> dict:
        return {"type": "http.request", "body": payload, "more_body": False}

    response = await server.retrieve(
        Request({"type": "http", "method": "POST", "path": "/retrieve", "headers": [], "query_string": b""}, receive)
    )
    return response.status_code, json.loads(response.body)


def _count(server, status: str) -> float:
    match = re.search(
        rf'^retrieval_requests_total{{endpoint="retrieve",status="{status}"}} (\S+)$',
        server.metrics.render().decode(),
        re.M,
    )
    return float(match.group(1)) if match else 0.0


def _ids(body: dict) -> list[list[str]]:
    return [[hit["document"]["id"] for hit in hits] for hits in body["result"]]


def _alone(retriever, query: str, k: int) -> list[str]:
    rows, _ = retriever.search([query], retriever.encode([query]), k)
    return [d["id"] for d in retriever.lookup(rows[0][rows[0] >= 0])]


def test_a_failed_batch_answers_503_to_exactly_its_requests(replica, monkeypatch):
    real_search = replica.retriever.search
    searched: list[list[str]] = []
    unblock = threading.Event()

    def search_that_breaks_one_batch(queries, vectors, k):
        searched.append(list(queries))
        if "break this batch" in queries:
            unblock.wait(60)  # hold the batch until the next requests have queued behind it
            raise RuntimeError("injected index failure")
        return real_search(queries, vectors, k)

    monkeypatch.setattr(replica.retriever, "search", search_that_breaks_one_batch)
    before = {status: _count(replica, status) for status in ("200", "503")}

    async def scenario() -> list[tuple[int, dict]]:
        doomed = [
            asyncio.create_task(_post(replica, {"queries": ["break this batch"], "topk": 2})),
            asyncio.create_task(_post(replica, {"queries": ["Who discovered penicillin?"], "topk": 2})),
        ]
        while not searched:
            await asyncio.sleep(0.01)
        spared = [
            asyncio.create_task(_post(replica, {"queries": ["capital city of Australia"], "topk": 2})),
            asyncio.create_task(
                _post(replica, {"queries": ["Which river is the longest in Africa?", "Nile"], "topk": 3})
            ),
        ]
        while replica.batcher.queued < 2:
            await asyncio.sleep(0.01)
        unblock.set()
        return await asyncio.wait_for(asyncio.gather(*doomed, *spared), timeout=120)

    (s1, b1), (s2, b2), (s3, b3), (s4, b4) = asyncio.run(scenario())
    assert searched == [
        ["break this batch", "Who discovered penicillin?"],
        ["capital city of Australia", "Which river is the longest in Africa?", "Nile"],
    ]
    assert (s1, s2) == (503, 503)
    assert b1 == b2 == {"detail": "retrieval failed: RuntimeError: injected index failure"}
    assert (s3, s4) == (200, 200)
    assert _ids(b3) == [_alone(replica.retriever, "capital city of Australia", 2)]
    assert _ids(b4) == [_alone(replica.retriever, q, 3) for q in ("Which river is the longest in Africa?", "Nile")]
    assert _count(replica, "503") - before["503"] == 2 and _count(replica, "200") - before["200"] == 2


def test_one_batch_with_mixed_topk_gives_each_request_its_own_k(replica, monkeypatch):
    real_search = replica.retriever.search
    batches: list[int] = []

    def recording_search(queries, vectors, k):
        batches.append(len(queries))
        return real_search(queries, vectors, k)

    monkeypatch.setattr(replica.retriever, "search", recording_search)
    requests = [
        {"queries": [SHALLOW_VICTIM], "topk": 3},
        {"queries": ["Who discovered penicillin?", "capital city of Australia"], "topk": 100},
        {"queries": ["Nile"], "topk": 1, "return_scores": False},
    ]

    async def scenario() -> list[tuple[int, dict]]:
        return await asyncio.wait_for(asyncio.gather(*(_post(replica, body) for body in requests)), timeout=120)

    responses = asyncio.run(scenario())
    assert batches == [4], "the three requests did not share one batch"
    for body, (status, answer) in zip(requests, responses):
        assert status == 200
        assert _ids(answer) == [_alone(replica.retriever, q, body["topk"]) for q in body["queries"]]
        assert all(len(hits) == body["topk"] for hits in answer["result"])
    assert all(set(hit) == {"document"} for hit in responses[2][1]["result"][0])


# ---------------------------------------------------------------- through Ray Serve


@pytest.fixture(scope="module")
def hybrid_rerank_app(retrieval_server, bundled_index_dir, tiny_cross_encoder):
    """A hybrid + cross-encoder app on the session's Serve instance, with a batch wait so concurrent requests batch."""
    from retrieval_server.launch import start_server

    config = ServerConfig(
        index_dir=bundled_index_dir, app_name="retrieval-hybrid", route_prefix="/hybrid", method="hybrid",
        rerank_model=tiny_cross_encoder, rerank_top_n=8, max_batch_size=16, batch_wait_timeout_s=0.2,
        result_cache_size=0,  # the leaver scene repeats its slow queries: each attempt must search them
        max_batch_queries=512, max_batch_hits=51_200,  # ... in one batch: its slow request (<= 512 x 100) unsplit
        small_request_queries=0,  # and its leaver (7 queries) queued behind that batch, not in the small lane
    )  # fmt: skip
    handle = start_server(config)
    assert not handle.owns_serve
    yield handle, config
    handle.shutdown()


def _histogram_count(metrics_text: str, name: str, le: str) -> float:
    return float(re.search(rf'^{name}_bucket{{le="{re.escape(le)}"}} (\S+)$', metrics_text, re.M).group(1))


def test_hybrid_rerank_through_serve_matches_in_process_with_mixed_topk(hybrid_rerank_app):
    import httpx

    from retrieval_server.search import Retriever

    handle, config = hybrid_rerank_app
    questions = [q["question"] for q in load_qa(bundled_qa_path())[:12]]
    topks = [1, 3, 8, 20, 2, 40, 5, 3, 12, 1, 30, 4]
    health = httpx.get(f"{handle.url}/health", timeout=30).json()
    assert health["method"] == "hybrid" and health["reranker"] == config.rerank_model

    with RetrievalClient(handle.url, timeout=120) as client, ThreadPoolExecutor(max_workers=len(questions)) as pool:
        served = list(pool.map(lambda qk: client.retrieve([qk[0]], topk=qk[1])[0], zip(questions, topks)))

    metrics = httpx.get(f"{handle.url}/metrics", timeout=30).text
    batches = _histogram_count(metrics, "retrieval_batch_requests", "+Inf")
    assert batches - _histogram_count(metrics, "retrieval_batch_requests", "1.0") >= 1, "no batch held two requests"

    retriever = Retriever(config)
    for question, k, hits in zip(questions, topks, served):
        vectors = retriever.encode([question])
        rows, scores = retriever.search([question], vectors, k)
        expected = retriever.lookup(rows[0][rows[0] >= 0])
        assert len(hits) == k
        np.testing.assert_allclose([h["score"] for h in hits], scores[0][: len(expected)], rtol=1e-4, atol=1e-5)
        # The same documents in the same order, except that two whose scores tie to float noise may trade places:
        # the tiny random cross-encoder gives near-equal scores, and a batch of other sizes moves them by ~1e-7.
        expected_position = {doc["id"]: i for i, doc in enumerate(expected)}
        for position, hit in enumerate(hits):
            other = expected_position.get(hit["document"]["id"])
            assert other is not None and hit["document"] == expected[other], (question, position)
            assert abs(scores[0][position] - scores[0][other]) <= 1e-5 + 1e-4 * abs(scores[0][position])


def _metric(metrics_text: str, name: str) -> float:
    return float(re.search(rf"^{name} (\S+)$", metrics_text, re.M).group(1))


SERVE_SETTLE_S = 3.0  # idle time before each scene; see the test's docstring


def _ok_count(metrics_text: str) -> float:
    match = re.search(r'^retrieval_requests_total{endpoint="retrieve",status="200"} (\S+)$', metrics_text, re.M)
    return float(match.group(1)) if match else 0.0


def test_a_request_whose_client_left_before_its_batch_is_never_run(hybrid_rerank_app):
    """A request queued behind a running batch whose client gives up is dropped and never encoded.

    The scene needs Serve to cancel the handler when the client leaves, while the slow batch still runs. Serve
    does not always deliver that cancellation: measured here, right after other requests (a prior test, or a
    quick request one second before) the leaver's handler stayed in flight until the slow batch ended and was
    then run; three seconds later the same scene was cancelled at once. CI once met exactly that. So each
    attempt starts on a replica idle for a few seconds, and an attempt where the cancellation did not land
    before the slow batch answered (told apart exactly by the 200 counter) shows nothing and is repeated.
    """
    import httpx

    handle, _ = hybrid_rerank_app
    # One kept-alive connection for the many metric reads, ten a second: each read costs the client, HAProxy, Serve's
    # proxy and the replica a little CPU, taken from the slow batch this scene times.
    poller = httpx.Client(timeout=30)

    def metrics() -> str:
        return poller.get(f"{handle.url}/metrics").text

    def wait_for(condition, what: str, limit_s: float = 120.0) -> None:
        deadline = time.monotonic() + limit_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"gave up waiting for {what}")
            time.sleep(0.1)

    def attempt(slow_size: int) -> str:
        """'shown' when the client left while the slow batch still ran (then everything is asserted); 'too fast' when
        the slow batch ended within the leaver's timeout; 'not cancelled' when Serve did not cancel the leaver's
        handler before the slow batch ended."""
        wait_for(lambda: _metric(metrics(), "retrieval_requests_in_flight") == 0, "the replica to go idle")
        time.sleep(SERVE_SETTLE_S)
        before = metrics()
        queries_before = _metric(before, "retrieval_batch_queries_sum")
        batches_before = _metric(before, "retrieval_batch_queries_count")
        ok_before = _ok_count(before)
        # Hybrid 100 deep with a cross-encoder: a slow batch.
        slow_queries = [f"question {i} about rivers, deserts and the history of Africa" for i in range(slow_size)]
        with ThreadPoolExecutor(max_workers=2) as pool:
            slow = pool.submit(
                lambda: httpx.post(f"{handle.url}/retrieve", json={"queries": slow_queries, "topk": 100}, timeout=600)
            )
            # Counted when a batch starts: from here on, a new request waits for the next batch.
            wait_for(
                lambda: _metric(metrics(), "retrieval_batch_queries_count") == batches_before + 1,
                "the slow batch to start",
            )
            leaver = pool.submit(
                lambda: httpx.post(f"{handle.url}/retrieve", json={"queries": ["Nile"] * 7, "topk": 2}, timeout=2)
            )
            # Only a request the replica holds is cancelled by Serve when its client leaves.
            wait_for(
                lambda: leaver.done() or _metric(metrics(), "retrieval_requests_in_flight") == 2,
                "the second request to queue behind the slow batch",
            )
            try:
                leaver.result()
            except httpx.TimeoutException:
                pass
            else:  # the slow batch ended in time for the leaver to be served: nothing shown
                assert slow.result().status_code == 200
                return "too fast"
            # Its handler is cancelled with the connection: in-flight falls back to one. That one must still be the
            # slow request (not yet answered 200, in the same snapshot); else the slow batch ended first.
            snapshots: list[str] = []
            wait_for(
                lambda: _metric(snapshots.append(metrics()) or snapshots[-1], "retrieval_requests_in_flight") <= 1,
                "the server to drop the request",
            )
            shown = _ok_count(snapshots[-1]) == ok_before
            assert slow.result().status_code == 200
        wait_for(lambda: _metric(metrics(), "retrieval_requests_in_flight") == 0, "the replica to go idle")
        after = metrics()
        if not shown:  # the slow batch ended before the cancellation was seen: the leaver may have run
            return "not cancelled"
        assert _metric(after, "retrieval_batch_queries_sum") - queries_before == len(slow_queries)  # the 7 never ran
        assert _metric(after, "retrieval_batch_queries_count") == batches_before + 1
        return "shown"

    # The slow batch must outlast the leaver's 2 s timeout; on a fast machine 96 queries may not, so only a batch that
    # ended in time doubles (up to the request cap of 512): a cancellation Serve was late with is tried again as it
    # was, without the CPU of a larger batch.
    size, outcomes = 96, []
    with poller:
        while len(outcomes) < 5 and "shown" not in outcomes:
            outcomes.append(attempt(size))
            size = min(2 * size, 512) if outcomes[-1] == "too fast" else size
    assert outcomes[-1] == "shown", f"Serve never cancelled the leaver in time: {outcomes}"
