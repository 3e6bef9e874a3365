"""The /retrieve contract, bad input, Flat == brute force, and batching, against the session's real server."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from retrieval_server.client import RetrievalClient, RetrievalRequestError

pytestmark = pytest.mark.slow

QUERIES = ["Which river is the longest in Africa?", "Who discovered penicillin?", "capital city of Australia"]


def _post(url: str, body) -> httpx.Response:
    return httpx.post(f"{url}/retrieve", json=body, timeout=60)


def test_contract_with_scores(retrieval_server_url):
    response = _post(retrieval_server_url, {"queries": QUERIES, "topk": 4, "return_scores": True})
    assert response.status_code == 200
    result = response.json()["result"]
    assert len(result) == len(QUERIES)
    for hits in result:
        assert len(hits) == 4
        for hit in hits:
            assert set(hit) == {"document", "score"}
            assert set(hit["document"]) == {"id", "contents"}
            assert isinstance(hit["document"]["id"], str) and isinstance(hit["score"], float)
            assert "\n" in hit["document"]["contents"]  # "Title\ntext"
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True)
        assert len({h["document"]["id"] for h in hits}) == 4


def test_contract_without_scores_returns_same_documents(retrieval_server_url):
    with_scores = _post(retrieval_server_url, {"queries": QUERIES, "topk": 3, "return_scores": True}).json()["result"]
    response = _post(retrieval_server_url, {"queries": QUERIES, "topk": 3, "return_scores": False})
    assert response.status_code == 200
    without = response.json()["result"]
    for hits_a, hits_b in zip(with_scores, without):
        assert all(set(h) == {"document"} for h in hits_b)
        assert [h["document"] for h in hits_a] == [h["document"] for h in hits_b]


def test_default_topk_and_null_topk(retrieval_server_url):
    omitted = _post(retrieval_server_url, {"queries": ["Nile"]}).json()["result"]
    null = _post(retrieval_server_url, {"queries": ["Nile"], "topk": None, "return_scores": True}).json()["result"]
    assert len(omitted[0]) == 3 and omitted == null  # server default_topk = 3


def test_results_per_query_do_not_depend_on_batch_companions(retrieval_server_url):
    alone = [_post(retrieval_server_url, {"queries": [q], "topk": 5}).json()["result"][0] for q in QUERIES]
    together = _post(retrieval_server_url, {"queries": QUERIES, "topk": 5}).json()["result"]
    for a, b in zip(alone, together):
        assert [h["document"]["id"] for h in a] == [h["document"]["id"] for h in b]
        np.testing.assert_allclose([h["score"] for h in a], [h["score"] for h in b], rtol=1e-4, atol=1e-5)


def test_flat_results_equal_brute_force_numpy(retrieval_server_url, bundled_index_dir):
    from retrieval_server.config import packaged_minilm_encoder
    from retrieval_server.docstore import DocumentStore
    from retrieval_server.encoders import SentenceEncoder
    from retrieval_server.index import load_shard_embeddings

    passages = load_shard_embeddings(bundled_index_dir)
    ids = DocumentStore(bundled_index_dir / "docstore.arrow").ids()
    query_vectors = SentenceEncoder(packaged_minilm_encoder(), device="cpu").encode_queries(QUERIES)
    brute = query_vectors @ passages.T
    k = 10
    served = _post(retrieval_server_url, {"queries": QUERIES, "topk": k}).json()["result"]
    for q, hits in enumerate(served):
        expected_rows = np.argsort(-brute[q], kind="stable")[:k]
        assert [h["document"]["id"] for h in hits] == [ids[r] for r in expected_rows]
        np.testing.assert_allclose([h["score"] for h in hits], brute[q][expected_rows], rtol=1e-4, atol=1e-4)


def test_health(retrieval_server_url, bundled_index_dir):
    health = httpx.get(f"{retrieval_server_url}/health", timeout=30).json()
    manifest = json.loads((bundled_index_dir / "manifest.json").read_text())
    assert health["status"] == "ok"
    assert health["index_size"] == manifest["count"] >= 1
    assert health["dim"] == 384 and health["model"] == manifest["encoder"]["model"]
    assert health["uptime_s"] > 0


BAD_BODIES = [
    pytest.param(b'{"queries": ["a"', "not valid JSON", id="malformed-json"),
    pytest.param(b"", "not valid JSON", id="empty-body"),
    pytest.param(b'["a", "b"]', "must be a JSON object", id="body-not-object"),
    pytest.param(b"{}", "queries: Field required", id="missing-queries"),
    pytest.param(b'{"queries": []}', "queries: List should have at least 1 item", id="empty-queries"),
    pytest.param(b'{"queries": "who?"}', "queries: Input should be a valid list", id="queries-not-list"),
    pytest.param(b'{"queries": null}', "queries: Input should be a valid list", id="queries-null"),
    pytest.param(b'{"queries": ["ok", 7]}', "queries[1]: Input should be a valid string", id="non-string-item"),
    pytest.param(b'{"queries": [["nested"]]}', "queries[0]: Input should be a valid string", id="nested-list-item"),
    pytest.param(b'{"queries": ["a"], "topk": 0}', "topk: Input should be greater than or equal to 1", id="topk-zero"),
    pytest.param(
        b'{"queries": ["a"], "topk": -3}', "topk: Input should be greater than or equal to 1", id="topk-negative"
    ),
    pytest.param(b'{"queries": ["a"], "topk": 101}', "above this server's cap max_topk=100", id="topk-above-cap"),
    pytest.param(b'{"queries": ["a"], "topk": "5"}', "topk: Input should be a valid integer", id="topk-string"),
    pytest.param(b'{"queries": ["a"], "topk": 2.5}', "topk: Input should be a valid integer", id="topk-float"),
    pytest.param(
        b'{"queries": ["a"], "return_scores": "no"}',
        "return_scores: Input should be a valid boolean",
        id="return-scores-string",
    ),
    pytest.param(json.dumps({"queries": ["q"] * 513}).encode(), "max_queries_per_request=512", id="too-many-queries"),
    pytest.param(
        json.dumps({"queries": ["ok", "x" * 2049]}).encode(), "queries[1] has 2049 characters", id="over-long-query"
    ),
]


@pytest.mark.parametrize(("body", "message"), BAD_BODIES)
def test_bad_input_gets_422_with_clear_message(retrieval_server_url, body, message):
    response = httpx.post(
        f"{retrieval_server_url}/retrieve", content=body, headers={"content-type": "application/json"}, timeout=30
    )
    assert response.status_code == 422, response.text
    assert message in response.json()["detail"]


def test_wrong_method_and_path_are_4xx(retrieval_server_url):
    assert httpx.get(f"{retrieval_server_url}/retrieve", timeout=30).status_code == 405
    assert httpx.post(f"{retrieval_server_url}/nope", json={}, timeout=30).status_code == 404


def test_client_raises_request_error_with_server_message(retrieval_server_url):
    with RetrievalClient(retrieval_server_url, max_retries=3, backoff=0.01) as client:
        with pytest.raises(RetrievalRequestError) as info:
            client.retrieve(["a"], topk=1000)
        assert info.value.status_code == 422 and "max_topk=100" in info.value.message
        hits = client.retrieve(["Nile"], topk=2, return_scores=False)
        assert len(hits) == 1 and len(hits[0]) == 2 and "score" not in hits[0][0]
        assert client.health()["status"] == "ok"


def _histogram(metrics_text: str, name: str) -> dict[float, float]:
    buckets = {}
    for match in re.finditer(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', metrics_text, re.M):
        buckets[float(match.group(1))] = float(match.group(2))
    return buckets


def test_concurrent_requests_are_served_in_batches(retrieval_server_url):
    before = _histogram(httpx.get(f"{retrieval_server_url}/metrics", timeout=30).text, "retrieval_batch_requests")
    questions = [f"question number {i} about rivers and mountains" for i in range(48)]
    with RetrievalClient(retrieval_server_url) as client, ThreadPoolExecutor(max_workers=24) as pool:
        results = list(pool.map(lambda q: client.retrieve([q], topk=2), questions))
    assert all(len(r) == 1 and len(r[0]) == 2 for r in results)
    after = _histogram(httpx.get(f"{retrieval_server_url}/metrics", timeout=30).text, "retrieval_batch_requests")
    batches = after[float("inf")] - before[float("inf")]
    single_request_batches = after[1.0] - before[1.0]
    assert batches < len(questions), "every request ran in its own batch"
    assert batches - single_request_batches >= 1, "no batch held more than one request"
