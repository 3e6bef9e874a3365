"""Both agent loops search with the one SearchSettings: the EviOmni loop honours concurrency, rate and backoff.

A small stdlib HTTP server on 127.0.0.1 answers ``/retrieve`` slowly and records when each request
arrives and how many were in flight; the loops run through verl's AgentLoopWorker as in training.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from rollout_helpers import make_row, run_worker, unpad, with_settings

from verl_evidence.local.backends import ScriptedBackend

pytestmark = pytest.mark.slow

QUESTION = "Which river flows north into the Mediterranean?"
HIT = {"document": {"id": "p1", "contents": "Nile\nThe Nile flows north into the Mediterranean."}, "score": 0.5}


class SlowRetrievalServer:
    """``POST /retrieve`` answers one hit per query after ``delay_s``; arrivals and peak concurrency recorded."""

    def __init__(self, delay_s: float = 0.3) -> None:
        self.arrivals: list[float] = []
        self.in_flight = self.peak = 0
        lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # http.server's name for it
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    server.arrivals.append(time.monotonic())
                    server.in_flight += 1
                    server.peak = max(server.peak, server.in_flight)
                time.sleep(delay_s)
                with lock:
                    server.in_flight -= 1
                payload = json.dumps({"result": [[HIT] for _ in body["queries"]]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def slow_server():
    server = SlowRetrievalServer()
    yield server
    server.stop()


def eviomni_run(base_config, tokenizer, rows: int, **search):
    config = with_settings(base_config, {"actor_rollout_ref.rollout.custom": {"eviomni": search}})
    backend = ScriptedBackend(tokenizer, responder=lambda prompt: "<reason> r </reason><extract> e </extract>")
    output = run_worker(config, backend, [make_row(QUESTION, "eviomni") for _ in range(rows)])
    return [unpad(output, row) for row in range(rows)]


def test_eviomni_loop_honours_max_concurrency(base_config, tokenizer, slow_server):
    outs = eviomni_run(base_config, tokenizer, 4, retrieval_url=slow_server.url, search_max_concurrency=1)
    assert [o["extra"]["retrieved_ids"] for o in outs] == [["p1"]] * 4
    assert slow_server.peak == 1
    slow_server.peak = 0
    eviomni_run(base_config, tokenizer, 4, retrieval_url=slow_server.url, search_max_concurrency=4)
    assert slow_server.peak > 1  # the same rows overlap when the setting allows it


def test_eviomni_loop_honours_the_request_rate(base_config, tokenizer, slow_server):
    eviomni_run(base_config, tokenizer, 3, retrieval_url=slow_server.url, search_requests_per_second=2.0)
    # a burst of max(1, int(rate)) = 2, then one request every 1 / rate = 0.5 s
    arrivals = sorted(slow_server.arrivals)
    assert len(arrivals) == 3
    assert arrivals[2] - arrivals[0] >= 0.45


def test_eviomni_loop_honours_retries_and_backoff(base_config, tokenizer, caplog):
    with socket.socket() as sock:  # a port that refuses: bound, never listening
        sock.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with caplog.at_level("WARNING", logger="retrieval_server.client"):
            (out,) = eviomni_run(
                base_config,
                tokenizer,
                1,
                retrieval_url=refused,
                search_max_retries=2,
                search_backoff=0.05,
                search_retry_deadline_s=0,
            )
    retries = [r.getMessage() for r in caplog.records if r.name == "retrieval_server.client"]
    assert [m.split("; ")[-1] for m in retries] == ["retry 1 in 0.05s", "retry 2 in 0.10s"]
    assert "failed after 3 attempts" in out["extra"]["retrieval_error"]
    assert out["extra"]["retrieval_failed"] == 1.0
