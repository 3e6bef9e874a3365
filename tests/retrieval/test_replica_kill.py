"""A second app (2 replicas, bearer token) beside the session server: auth, and a replica killed under load."""

from __future__ import annotations

import threading
import time

import pytest

from retrieval_server.client import RetrievalClient, RetrievalRequestError

pytestmark = [pytest.mark.slow, pytest.mark.one_worker_group]

TOKEN = "t0k-for-tests"
APP = "retrieval-kill"


@pytest.fixture(scope="module")
def two_replica_app(retrieval_server, bundled_index_dir):
    from retrieval_server.config import ServerConfig
    from retrieval_server.launch import start_server

    handle = start_server(
        ServerConfig(
            index_dir=bundled_index_dir,
            app_name=APP,
            route_prefix="/kill",
            num_replicas=2,
            token=TOKEN,
            max_batch_size=8,
        )
    )
    assert not handle.owns_serve  # shares the session's Serve instance and HTTP port
    yield handle
    handle.shutdown()


def _replica_actor_names() -> list[str]:
    import ray

    return sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(f"SERVE_REPLICA::{APP}#")
    )


def _running_replicas() -> int:
    from ray import serve

    deployment = serve.status().applications[APP].deployments["RetrievalServer"]
    return deployment.replica_states.get("RUNNING", 0)


def test_bearer_token_is_required(two_replica_app):
    with RetrievalClient(two_replica_app.url, max_retries=0) as anonymous:
        with pytest.raises(RetrievalRequestError) as info:
            anonymous.retrieve(["Nile"])
        assert info.value.status_code == 401 and "bearer token" in info.value.message
    with (
        RetrievalClient(two_replica_app.url, token="wrong", max_retries=0) as wrong,
        pytest.raises(RetrievalRequestError),
    ):
        wrong.retrieve(["Nile"])
    with RetrievalClient(two_replica_app.url, token=TOKEN) as client:
        assert len(client.retrieve(["Nile"], topk=2)[0]) == 2
        assert client.health()["index_size"] > 0  # health stays open for load balancers


def test_killed_replica_under_load_loses_no_request(two_replica_app):
    import ray

    replicas = _replica_actor_names()
    assert len(replicas) == 2
    stop = threading.Event()
    successes: list[int] = []
    failures: list[str] = []

    def worker(n: int) -> None:
        # Retry budget: 6 retries, backoff 0.25 s doubling (about 16 s in all).
        with RetrievalClient(two_replica_app.url, token=TOKEN, max_retries=6, backoff=0.25, timeout=30) as client:
            i = 0
            while not stop.is_set():
                try:
                    result = client.retrieve([f"worker {n} query {i} about the Nile"], topk=2)
                    assert len(result[0]) == 2
                    successes.append(n)
                except Exception as err:  # counted, never swallowed: the test asserts there are none
                    failures.append(f"{type(err).__name__}: {err}")
                i += 1

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    try:
        _wait(lambda: len(successes) >= 20, "load to start")
        victim = replicas[0]
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
        killed_at = len(successes)
        # Serve notices the death and starts a replacement; keep the load on until it runs and has served.
        _wait(lambda: _replaced(victim), "a replacement replica")
        _wait(lambda: len(successes) >= killed_at + 40, "requests after recovery")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert failures == []
    assert _replaced(victim)


def _replaced(victim: str) -> bool:
    names = _replica_actor_names()
    return len(names) == 2 and victim not in names and _running_replicas() == 2


def _wait(condition, what: str, limit_s: float = 240.0) -> None:
    deadline = time.time() + limit_s
    while not condition():
        if time.time() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {limit_s:.0f}s")
        time.sleep(0.2)
