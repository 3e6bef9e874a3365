"""A second app (2 replicas, bearer token) beside the session server: auth, and a replica killed under load."""

from __future__ import annotations

import threading
import time

import httpx
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
        with pytest.raises(RetrievalRequestError, match="HTTP 401"):
            anonymous.health()  # its paths and pids are for the token's holders
        assert httpx.get(f"{two_replica_app.url}/healthz", timeout=30).text == "ok"  # open for load balancers
    with (
        RetrievalClient(two_replica_app.url, token="wrong", max_retries=0) as wrong,
        pytest.raises(RetrievalRequestError),
    ):
        wrong.retrieve(["Nile"])
    with RetrievalClient(two_replica_app.url, token=TOKEN) as client:
        assert len(client.retrieve(["Nile"], topk=2)[0]) == 2
        assert client.health()["index_size"] > 0


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


def _crash_loop(index, app: str, url: str, max_restarts: int) -> list[tuple[str, float, str]]:
    """Truncate the docstore under a serving replica; post until the watch gives up (pytest.raises checks it):
    every answer's (status or error, seconds, Retry-After and detail)."""
    from retrieval_server.launch import ReplicasKeepDying, ReplicaWatch

    outcomes: list[tuple[str, float, str]] = []
    watch = ReplicaWatch(app, max_restarts=max_restarts)
    with RetrievalClient(url, max_retries=0) as client:
        assert len(client.retrieve(["Nile"])[0]) == 3
    store = index / "docstore.arrow"
    with store.open("r+b") as handle_file:
        handle_file.truncate(store.stat().st_size // 3)
    deadline = time.monotonic() + 240
    with httpx.Client(timeout=60) as http, pytest.raises(ReplicasKeepDying) as info:
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                answer = http.post(f"{url}/retrieve", json={"queries": [f"Nile {started}"]})
                said = f"{answer.headers.get('retry-after')} {answer.text[:160]}"
                outcome = str(answer.status_code)
            except httpx.TransportError as err:  # what a caller sees, recorded
                outcome, said = type(err).__name__, str(err)
            outcomes.append((outcome, time.monotonic() - started, said))
            watch.check()
            time.sleep(0.25)
    assert f"more than --max-replica-restarts {max_restarts}" in str(info.value)
    assert all(outcome != "200" for outcome, _, _ in outcomes[1:])  # nothing answered from the broken store
    return outcomes


def test_a_replica_that_keeps_dying_fails_fast_is_logged_and_given_up_on(
    retrieval_server, bundled_index_dir, tmp_path, caplog
):
    """A docstore truncated under a serving replica (SIGBUS on its next lookup; its replacements cannot open it):
    every request gets a 503 naming what happened, with Retry-After, at once (behind HAProxy, the default front);
    each replica stop is logged with Serve's cause, and the watch gives up."""
    import shutil

    from retrieval_server.config import ServerConfig
    from retrieval_server.launch import start_server

    index = tmp_path / "index"
    shutil.copytree(bundled_index_dir, index)
    handle = start_server(
        ServerConfig(index_dir=index, method="bm25", app_name="crash-loop", route_prefix="/crash", request_timeout_s=5)
    )
    try:
        with caplog.at_level("ERROR", logger="retrieval_server.launch"):
            outcomes = _crash_loop(index, "crash-loop", handle.url, max_restarts=1)
    finally:
        handle.shutdown()
    stops = [r.getMessage() for r in caplog.records if "stopped" in r.getMessage()]
    assert len(stops) >= 2 and "giving up after 1" in stops[0]
    if retrieval_server.ingress == "haproxy":
        # 503 + Retry-After with a JSON detail, never Ray's 500 page or a cut connection; none held until a timeout
        for outcome, seconds, said in outcomes:
            assert outcome == "503" and said.startswith('1 {"detail":'), outcomes
            assert seconds < 5, outcomes
        assert any("no retrieval replica is running" in said for _, _, said in outcomes), outcomes
    else:  # Serve's Python proxy without our front: bounded by its request timeout (docs: Limits)
        assert max(seconds for _, seconds, _ in outcomes) < 35 + 5, outcomes


def test_the_python_proxy_front_refuses_a_crash_loop_at_once_naming_the_cause(
    retrieval_server, bundled_index_dir, tmp_path
):
    """The front deployment `serve --ingress proxy` puts before the replicas (Serve's Python proxy itself holds
    requests while no replica runs): every answer in the crash loop a 503 with Retry-After and a JSON detail
    within 1 s, the cause Serve recorded in it. Deployed on the session's Serve instance (a cluster of its own with
    the Python proxy costs a Ray start); `benchmarks/abuse.py --crash-loop-ingress proxy` runs the real path."""
    import shutil

    from ray import serve

    from retrieval_server.config import ServerConfig
    from retrieval_server.launch import _wait_healthy, build_application

    index = tmp_path / "index"
    shutil.copytree(bundled_index_dir, index)
    config = ServerConfig(index_dir=index, method="bm25", app_name="crash-front", request_timeout_s=5)
    serve.run(build_application(config, python_proxy_front=True), name="crash-front", route_prefix="/crash-front",
              blocking=False)  # fmt: skip
    url = f"http://{retrieval_server.config.host}:{retrieval_server.config.port}/crash-front"  # its HTTP port
    try:
        _wait_healthy(url)
        outcomes = _crash_loop(index, "crash-front", url, max_restarts=1)
    finally:
        serve.delete("crash-front")
    for outcome, seconds, said in outcomes:
        assert outcome == "503" and said.startswith('1 {"detail":'), outcomes
        assert seconds < 1, outcomes
    causes = [said for _, _, said in outcomes if "no retrieval replica is running (" in said]
    assert any("A replica failed to start" in said or "health check failed" in said for said in causes), outcomes
